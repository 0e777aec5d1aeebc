"""The daemon's log records as the journal handler sees them, captured in a test."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from vmdisktouch.adapters.systemd import journal


@contextlib.contextmanager
def journal_records() -> Iterator[list]:
    """(level, message, journal fields) of every record logged inside, with the disk
    context's fields added as ``journal.DiskFields`` adds them."""
    got: list = []
    h = logging.Handler(logging.DEBUG)
    h.addFilter(journal.DiskFields())
    h.emit = lambda r: got.append((r.levelno, r.getMessage(), {
        k: getattr(r, k) for k in journal.FIELDS if hasattr(r, k)}))
    lg = logging.getLogger("vmdisktouch")
    old = lg.level
    lg.addHandler(h)
    lg.setLevel(logging.DEBUG)
    try:
        yield got
    finally:
        lg.removeHandler(h)
        lg.setLevel(old)
