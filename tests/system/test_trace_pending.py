"""``TraceReader.pending()``: one poll(2) of the per-CPU ``trace_pipe_raw``, on this kernel.

What is relied on (6.18): with the instance's ``buffer_percent`` at 0 (as
``tracefs.Instance.create`` sets it) a poll of a CPU's ``trace_pipe_raw``
says POLLIN as soon as that CPU holds one event, and not when it is empty,
including after a drain emptied it; at the default 50 % one event is not enough
for a poll, while a non-blocking read gives it all the same.
Each event here is a cached read of one page, pinned to one CPU: exactly one
READ, on that CPU's buffer.
"""

from __future__ import annotations

import os
import select

import pytest

from tests.support.pagecache import read_range
from tests.support.tracing import PAGE, instance_name, scratch, tracefs_root  # noqa: F401
from vmdisktouch.errors import ClosedError
from vmdisktouch.system.trace import tracefs
from vmdisktouch.system.trace.trace_reader import READ, TraceReader


@pytest.fixture
def traced(scratch, tracefs_root):
    """(reader, fd, instance path) over a scratch file whose first pages are cached."""
    path = scratch(64)
    read_range(path, 0, 64 * PAGE)
    fd = os.open(path, os.O_RDONLY)
    r = TraceReader(fd, name=instance_name())
    yield r, fd, os.path.join(tracefs_root, "instances", r.name)
    r.close()
    os.close(fd)


def read_on(cpu: int, fd: int, page: int) -> None:
    """A cached read of ``page``, made on ``cpu``: one READ event in that CPU's buffer."""
    was = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        os.pread(fd, PAGE, page * PAGE)
    finally:
        os.sched_setaffinity(0, was)


def readable(inst: str, cpus) -> set[int]:
    """The CPUs whose ``trace_pipe_raw`` a poll(2) with timeout 0 says readable."""
    fds = {os.open(f"{inst}/per_cpu/cpu{c}/trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK): c
           for c in cpus}
    try:
        p = select.poll()
        for fd in fds:
            p.register(fd, select.POLLIN)
        return {fds[fd] for fd, ev in p.poll(0) if ev & select.POLLIN}
    finally:
        for fd in fds:
            os.close(fd)


def set_percent(inst: str, value: int) -> None:
    with open(f"{inst}/buffer_percent", "w") as f:
        f.write(f"{value}\n")


def test_pending_is_one_buffered_event_on_any_cpu_and_false_once_drained(traced):
    r, fd, inst = traced
    with open(f"{inst}/buffer_percent") as f:
        assert f.read().strip() == "0"
    cpus = sorted(os.sched_getaffinity(0))
    r.drain()
    assert r.pending() is False and readable(inst, cpus) == set()
    for cpu in cpus:
        read_on(cpu, fd, 3)
        assert readable(inst, cpus) == {cpu}           # that CPU only, after one event
        assert r.pending() is True
        ev = r.drain()
        assert ev.kind.tolist() == [READ] and ev.first.tolist() == [3]
        assert r.pending() is False and readable(inst, cpus) == set()
    for page in range(2000):                           # many pages of events, then drained
        os.pread(fd, PAGE, page % 64 * PAGE)
    assert r.pending() is True
    assert len(r.drain()) == 2000 and r.pending() is False


def test_at_the_default_buffer_percent_a_poll_waits_a_read_does_not_and_it_is_set_back(traced):
    r, fd, inst = traced
    cpu = min(os.sched_getaffinity(0))
    r.drain()
    set_percent(inst, 50)
    read_on(cpu, fd, 5)
    assert readable(inst, [cpu]) == set()              # why create sets 0
    assert r.drain().first.tolist() == [5]             # non-blocking reads ignore it
    read_on(cpu, fd, 6)
    assert r.check_instance(full=True) == {"buffer_percent": "50"}
    assert readable(inst, [cpu]) == {cpu} and r.pending() is True
    assert r.drain().first.tolist() == [6] and r.pending() is False


def test_where_buffer_percent_cannot_be_set_pending_is_always_true(scratch, tracefs_root,
                                                                   monkeypatch):
    put = tracefs.Instance._put

    def refuse(self, rel, text):
        if rel == "buffer_percent":
            raise PermissionError(13, "refused by the test")
        put(self, rel, text)
    monkeypatch.setattr(tracefs.Instance, "_put", refuse)
    fd = os.open(scratch(16), os.O_RDONLY)
    r = TraceReader(fd, name=instance_name())
    try:
        r.drain()
        assert r.pending() is True and r.drain().kind.size == 0
        assert "buffer_percent" not in r._inst.switches()
    finally:
        r.close()
        os.close(fd)


def test_pending_after_close_raises_as_drain_does(traced):
    r, _, _ = traced
    r.close()
    for call in (r.pending, r.drain):
        with pytest.raises(ClosedError, match="used after close"):
            call()
