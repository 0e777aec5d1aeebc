"""Atomic file replacement: a watcher never sees a half-written file.

Write a temporary file in the target's directory, then ``rename(2)`` it over
the target: rename is atomic for readers within one file system, so a
viewer watching the PNG sees the old picture or the new one, never half.

The daemon runs as root and its output directory may be writable by
others, so nothing here is done by a path an attacker could swap:

* the directory is opened once per write (``files.open_dir``: walked from
  ``/``, its last component never a symlink, a symlink above it followed
  only when root's or the daemon's own and where no one else can change
  it; ``private``: it and every directory above it root's or the daemon's
  user's, none writable by others) and every step works relative to that
  descriptor, so a directory swapped for a symlink, before the write or in
  the middle of it, is never written through (a status directory swapped
  for a symlink after start had the status and map files written into the
  link's target);
* the temporary file is created ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never
  an existing file, never through a symlink), mode 0600, and its final mode
  is set on the open descriptor (``fchmod``): a temp file swapped for a
  symlink to ``/etc/...`` cannot make root chmod that file, as the old
  ``chmod(tmp_path)`` after ``close`` could;
* before the rename the temp name must still be the file just written
  (same device and inode, not a symlink), and the target must be missing
  or a regular file (``lstat``): an output is never written through a
  symlink, and never replaces a device node, a directory or a FIFO.

``OutputRefused`` (an ``OSError``) says which rule refused a write.
"""

from __future__ import annotations

import errno
import io
import json
import os
import secrets
import stat
from typing import Callable

from vmdisktouch.errors import file_kind
from vmdisktouch.system import files

_TMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputRefused(OSError):
    """A write refused because the target or the temporary file is not what it must be."""


def target_problem(st: os.stat_result) -> str | None:
    """Why an existing output path must not be replaced (None: a regular file, fine)."""
    if stat.S_ISREG(st.st_mode):
        return None
    return f"it is {file_kind(st.st_mode)}, not a regular file"


def write_bytes(path: str, data: bytes, mode: int = 0o644, *,
                check: Callable[[os.stat_result], str | None] | None = None,
                private: bool = False) -> tuple[int, int]:
    """Replace ``path`` with ``data`` atomically; returns the new file's (st_dev, st_ino).

    ``check``: called with the ``lstat`` of an existing target (a regular
    file); a string it returns refuses the write with that reason.
    ``private``: the directory must be closed to other users (``files.open_dir``).
    ``files.UnsafePath`` (an ``OSError``) when the directory is refused.
    """
    directory, name = os.path.split(os.path.abspath(path))
    dfd = files.open_dir(directory, private=private)
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            problem = None
        else:
            problem = target_problem(st) or (check(st) if check else None)
        if problem:
            raise OutputRefused(errno.EEXIST, f"refusing to replace {path}: {problem}")
        tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, _TMP_FLAGS, 0o600, dir_fd=dfd)
        try:
            try:
                _write_all(fd, data)
                os.fchmod(fd, mode)
                mine = os.fstat(fd)
            finally:
                os.close(fd)
            now = os.stat(tmp, dir_fd=dfd, follow_symlinks=False)
            # The type too: a swapped-in symlink may get the freed inode's number.
            if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino) \
                    or not stat.S_ISREG(now.st_mode):
                raise OutputRefused(errno.EEXIST, f"refusing to write {path}: its temporary "
                                                  f"file {tmp} was replaced by someone else")
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dfd)
            except OSError:
                pass
            raise
        return mine.st_dev, mine.st_ino
    finally:
        os.close(dfd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_json(path: str, obj) -> tuple[int, int]:
    return write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def write_png(path: str, image) -> tuple[int, int]:
    """Encode a PIL image as PNG and replace ``path`` with it atomically."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return write_bytes(path, buf.getvalue())
