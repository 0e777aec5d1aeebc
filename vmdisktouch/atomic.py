"""Atomic file replacement: a watcher never sees a half-written file.

Write to a temporary file in the same directory, fsync it is not needed for
a viewer (rename is atomic for readers), then ``os.replace`` it over the
target (rename(2) is atomic within one filesystem).
"""

from __future__ import annotations

import io
import json
import os
import tempfile


def write_bytes(path: str, data: bytes, mode: int = 0o644) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json(path: str, obj) -> None:
    write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_png(path: str, image) -> None:
    """Encode a PIL image as PNG and replace ``path`` with it atomically."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    write_bytes(path, buf.getvalue())
