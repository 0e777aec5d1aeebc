"""What the tests of the trace source share: the tracefs root, instance names, scratch files.

Import the fixtures by name (``from tests.support.tracing import tracefs_root``).
Where tracefs cannot be used, ``tracefs_root`` fails the test with the
reason, it never skips.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests.support.pagecache import data_image
from vmdisktouch.system import libc
from vmdisktouch.system.trace import tracefs
from vmdisktouch.system.trace.trace_reader import TraceReader, TraceUnavailable

PAGE = libc.PAGE_SIZE          # the unit of the events' page indices
_names = itertools.count()


def instance_name() -> str:
    return f"vdt_test_{os.getpid()}_{next(_names)}"


@pytest.fixture(scope="module")
def tracefs_root() -> str:
    """The tracefs mount (mounted if needed); a clear failure, never a skip, without it."""
    try:
        root = tracefs.find_root()
        tracefs.check_root(root)
    except TraceUnavailable as exc:
        pytest.fail(f"kernel tracing is needed by these tests: {exc}")
    return root


@pytest.fixture
def reader(tracefs_root):
    """Makes TraceReaders on fds; closes them and checks their instances are gone."""
    made: list[TraceReader] = []

    def make(fd: int, **kw) -> TraceReader:
        r = TraceReader(fd, name=kw.pop("name", None) or instance_name(), **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
        assert not os.path.exists(os.path.join(tracefs_root, "instances", r.name))


@pytest.fixture
def scratch(tmp_path):
    """Makes files of random data, written back and evicted; deleted at teardown."""
    made: list[str] = []

    def make(pages: int = 1024) -> str:
        path = data_image(tmp_path / f"img{len(made)}.raw", pages * PAGE)
        made.append(path)
        return path

    yield make
    for path in made:
        os.unlink(path)
