"""A kernel without one of the page-cache tracepoints (Debian 12's 6.1 has no
filemap:mm_filemap_get_pages) is said as such, also when the reader sizes its buffer
for a restored state first: the VM tier saw the host service say "cannot read the
events' formats … No such file or directory" instead."""

from __future__ import annotations

import os

import pytest

from vmdisktouch.system.trace.trace_reader import TraceReader, TraceUnavailable


@pytest.mark.parametrize("foreseen", [0, 100_000], ids=["cold", "restored"])
def test_a_missing_tracepoint_is_named(tmp_path, foreseen):
    root = tmp_path / "tracefs"
    (root / "instances").mkdir(parents=True)
    (root / "events" / "filemap").mkdir(parents=True)      # no mm_filemap_get_pages
    image = tmp_path / "disk.raw"
    image.write_bytes(b"x" * 8192)
    fd = os.open(image, os.O_RDONLY)
    try:
        with pytest.raises(TraceUnavailable, match=r"has no tracepoint filemap:"):
            TraceReader(fd, name="vmdisktouch@test-reason", root=str(root), foreseen=foreseen)
    finally:
        os.close(fd)
    assert os.listdir(root / "instances") == []
