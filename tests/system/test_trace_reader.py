"""TraceReader against this machine's real tracefs and page cache.

Every reader is a private tracefs instance named ``vdt_test_<pid>_<n>``; the
``reader`` fixture closes each one and checks that its directory is gone.
Files live under ``tmp_path`` (ext4 here, never tmpfs: tmpfs reads do not
pass the filemap tracepoints) and are deleted at teardown; loop devices are
detached in a finalizer. Where tracefs cannot be used, the tests FAIL with
the reason (``tracefs_root``), they never skip.

Cold reads use ``POSIX_FADV_RANDOM`` so a read caches exactly its pages (no
readahead), and files are evicted with fsync + ``POSIX_FADV_DONTNEED`` first,
so their page-cache folios are the single pages the tests then make.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from tests.support.common import require_tool
from tests.support.images import evict
from tests.support.tracing import PAGE, instance_name, reader, scratch, tracefs_root  # noqa: F401
from vmdisktouch.system.trace import tracefs
from vmdisktouch.system.trace.tracefs import read_text
from vmdisktouch.system.trace.trace_reader import (ADD, DELETE, READ, WRITE, TraceReader,
                                             TraceUnavailable, kernel_dev)

ROOT_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def open_random(path: str, flags: int = os.O_RDONLY) -> int:
    fd = os.open(path, flags)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    return fd


def of_kind(events, kind) -> list[tuple[int, int]]:
    sel = events.kind == kind
    return list(zip(events.first[sel].tolist(), events.last[sel].tolist()))


def test_buffered_reads_come_back_as_reads_of_their_exact_pages(scratch, reader):
    path, other = scratch(), scratch()
    fd, ofd = open_random(path), open_random(other)
    try:
        r = reader(fd)
        assert r.target == f"inode {os.stat(path).st_ino} on " \
                           f"{os.major(os.stat(path).st_dev)}:{os.minor(os.stat(path).st_dev)}"
        assert len(r.drain()) == 0                     # the start's own read is not reported
        os.pread(fd, PAGE, 3 * PAGE)                   # a miss
        os.pread(fd, 100, 100 * PAGE + 17)             # part of a page
        os.pread(fd, 3 * PAGE, 200 * PAGE)             # three pages
        os.pread(ofd, PAGE, 777 * PAGE)                # another file: not seen
        os.pread(fd, PAGE, 3 * PAGE)                   # a hit
        ev = r.drain()
        assert of_kind(ev, READ) == [(3, 3), (100, 100), (200, 202), (3, 3)]
        assert of_kind(ev, ADD) == [(3, 3), (100, 100), (200, 200), (201, 201), (202, 202)]
        assert 777 not in ev.first and of_kind(ev, WRITE) == [] and ev.lost == 0
        assert ev.kind.dtype.name == "uint8" and ev.first.dtype.name == "int64"
        assert (ev.ts.dtype.name, ev.last.dtype.name) == ("int64", "int64")
        assert (ev.ts[1:] >= ev.ts[:-1]).all()
    finally:
        os.close(fd)
        os.close(ofd)


def test_timestamps_are_clock_monotonic_nanoseconds(scratch, reader):
    fd = open_random(scratch())
    try:
        r = reader(fd, name=f"vmdisktouch@var-my\\x2dvm\\x20{os.getpid()}.raw")   # unit-escaped
        r.drain()
        stamps = []
        for page in (5, 9, 11):
            before = time.monotonic_ns()
            os.pread(fd, PAGE, page * PAGE)
            stamps.append((before, time.monotonic_ns()))
            time.sleep(0.01)
        ev = r.drain()
        assert of_kind(ev, READ) == [(5, 5), (9, 9), (11, 11)]
        assert ev.kind.tolist() == [ADD, READ] * 3     # each a miss: the page added, then read
        for pair, (lo, hi) in zip(ev.ts.reshape(3, 2).tolist(), stamps):
            assert lo <= pair[0] <= pair[1] <= hi, (lo, pair, hi)
    finally:
        os.close(fd)


def test_writes_come_back_for_exactly_the_pages_written_and_idle_gives_nothing(scratch, reader):
    path = scratch()
    fd = open_random(path, os.O_RDWR)
    try:
        r = reader(fd)
        r.drain()
        os.pread(fd, PAGE, 50 * PAGE)                  # reads are no writes
        assert of_kind(r.drain(), WRITE) == []
        for page in (10, 20, 21, 700):
            os.pwrite(fd, b"w" * PAGE, page * PAGE)
        os.pwrite(fd, b"x" * 10, 30 * PAGE + 100)      # a part of a page
        os.fdatasync(fd)
        assert sorted(of_kind(r.drain(), WRITE)) == [(p, p) for p in (10, 20, 21, 30, 700)]
        time.sleep(0.3)
        assert len(r.drain()) == 0                     # an idle file: no events at all
    finally:
        os.close(fd)


def test_a_write_is_seen_when_it_dirties_a_clean_folio_once_per_write_with_o_dsync(
        scratch, reader):
    """Kernel behaviour the daemon relies on (6.18): writeback_dirty_folio fires when a clean
    folio turns dirty and names the folio's first page: again after each O_DSYNC write, but
    once for buffered rewrites of a page still dirty; a 16 KiB write made a 4-page folio."""
    path = scratch()
    fd = open_random(path, os.O_RDWR)
    dfd = os.open(path, os.O_RDWR | os.O_DSYNC)
    try:
        r = reader(fd)
        r.drain()
        for _ in range(3):
            os.pwrite(dfd, b"d" * PAGE, 5 * PAGE)
        assert of_kind(r.drain(), WRITE) == [(5, 5)] * 3
        for _ in range(3):
            os.pwrite(fd, b"b" * PAGE, 6 * PAGE)
        os.fdatasync(fd)
        assert of_kind(r.drain(), WRITE) == [(6, 6)]
        os.pwrite(fd, b"f" * 4 * PAGE, 40 * PAGE)      # one 4-page folio
        os.fdatasync(fd)
        ev = r.drain()
        assert of_kind(ev, WRITE) == [(40, 40)] and (40, 43) in of_kind(ev, ADD)
    finally:
        os.close(fd)
        os.close(dfd)


def test_a_miss_is_an_add_and_an_eviction_a_delete(scratch, reader):
    fd = open_random(scratch())
    try:
        r = reader(fd)
        r.drain()
        os.pread(fd, PAGE, 30 * PAGE)
        ev = r.drain()
        assert of_kind(ev, ADD) == [(30, 30)] and of_kind(ev, READ) == [(30, 30)]
        os.pread(fd, PAGE, 30 * PAGE)                  # a hit: no ADD
        assert of_kind(r.drain(), ADD) == []
        os.posix_fadvise(fd, 30 * PAGE, PAGE, os.POSIX_FADV_DONTNEED)
        assert of_kind(r.drain(), DELETE) == [(30, 30)]
    finally:
        os.close(fd)


def test_the_loading_thread_is_excluded_from_reads_and_adds_but_not_deletes(scratch, reader):
    fd = open_random(scratch())
    try:
        r = reader(fd, exclude_tid=threading.get_native_id())
        r.drain()
        os.pread(fd, PAGE, 12 * PAGE)                  # this thread: not seen
        other = threading.Thread(target=os.pread, args=(fd, PAGE, 13 * PAGE))
        other.start()
        other.join()
        os.posix_fadvise(fd, 12 * PAGE, PAGE, os.POSIX_FADV_DONTNEED)
        ev = r.drain()
        assert of_kind(ev, READ) == [(13, 13)] and of_kind(ev, ADD) == [(13, 13)]
        assert of_kind(ev, DELETE) == [(12, 12)]
    finally:
        os.close(fd)


def test_reads_and_writes_through_a_loop_device_are_seen_on_its_bdev_inode(loop_device_of, reader):
    loop_device = loop_device_of(64 << 20)
    fd = open_random(loop_device, os.O_RDWR)
    try:
        r = reader(fd)
        rdev = os.stat(loop_device).st_rdev
        ino = kernel_dev(rdev)
        assert ino == os.major(rdev) << 20 | os.minor(rdev)
        assert r.target.startswith(f"block device {os.major(rdev)}:{os.minor(rdev)} "
                                   f"(bdev inode {ino:#x} on ")
        r.drain()
        os.pread(fd, PAGE, 33 * PAGE)
        os.pread(fd, 2 * PAGE, 1000 * PAGE)
        os.pwrite(fd, b"z" * PAGE, 40 * PAGE)
        os.fdatasync(fd)
        ev = r.drain()
        assert of_kind(ev, READ) == [(33, 33), (1000, 1001)], list(zip(ev.kind, ev.first))
        assert of_kind(ev, WRITE) == [(40, 40)], list(zip(ev.kind, ev.first))
    finally:
        os.close(fd)


def test_lost_events_are_counted_once_and_grow_the_buffer(scratch, reader):
    fd = open_random(scratch())
    try:
        os.pread(fd, PAGE, 0)
        r = reader(fd, buffer_kb=4, max_buffer_kb=4)
        r.drain()
        n = 20_000
        for _ in range(n):
            os.pread(fd, PAGE, 0)                      # cached: READ events only
        ev = r.drain()
        assert ev.lost > 0
        assert len(ev) + ev.lost == n                  # the overrun counter and page flags
        assert r.buffer_kb == 4                        # at its maximum
        grow = reader(fd, buffer_kb=4, max_buffer_kb=16)
        grow.drain()
        for _ in range(n):
            os.pread(fd, PAGE, 0)
        assert grow.drain().lost > 0 and grow.buffer_kb == 8
    finally:
        os.close(fd)


CHILD = textwrap.dedent("""
    import os, sys, time
    from vmdisktouch.system.trace.trace_reader import TraceReader
    fd = os.open(sys.argv[1], os.O_RDONLY)
    r = TraceReader(fd, name=sys.argv[2])
    print("ready", flush=True)
    time.sleep(600)
""")


def test_an_instance_left_by_a_sigkilled_reader_is_replaced(scratch, reader, tracefs_root):
    path, name = scratch(), instance_name()
    child = subprocess.Popen([sys.executable, "-c", CHILD, path, name], cwd=ROOT_DIR,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready", child.stderr.read()
        busy = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(TraceUnavailable, match="in use by another process"):
                TraceReader(busy, name=name)           # its owner is alive: left alone
        finally:
            os.close(busy)
        assert read_text(os.path.join(tracefs_root, "instances", name, "events", "filemap",
                                      "mm_filemap_get_pages", "enable")).strip() == "1"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    where = os.path.join(tracefs_root, "instances", name)
    assert os.path.isdir(where)                        # left behind, still recording
    fd = open_random(path)
    try:
        r = reader(fd, name=name)
        assert len(r.drain()) == 0                     # the stale instance's events are gone
        os.pread(fd, PAGE, 8 * PAGE)
        assert of_kind(r.drain(), READ) == [(8, 8)]
        r.close()
        assert not os.path.exists(where)
        r.close()                                      # idempotent
    finally:
        os.close(fd)


def test_refusals_are_one_line_and_leave_no_instance(scratch, reader, tmp_path, tracefs_root):
    fd = open_random(scratch())
    try:
        cases = [dict(root=str(tmp_path)), dict(name="a/b"), dict(name="x" * 300)]
        for kw in cases:
            with pytest.raises(TraceUnavailable) as info:
                reader(fd, **kw)
            assert "\n" not in str(info.value) and str(info.value), kw
        assert "is not a tracefs mount" in str(pytest.raises(
            TraceUnavailable, reader, fd, root=str(tmp_path)).value)
        name = instance_name()
        with pytest.raises(TraceUnavailable, match=r"has no tracepoint filemap:no_such_event"):
            tracefs.Instance.create(name, {"filemap/no_such_event": ""})
        with pytest.raises(TraceUnavailable, match=r"Invalid argument \(event filter parse"):
            tracefs.Instance.create(name, {"filemap/mm_filemap_get_pages": "i_ino === 5"})
        assert not os.path.exists(os.path.join(tracefs_root, "instances", name))
        rfd, wfd = os.pipe()
        with pytest.raises(TraceUnavailable, match="a FIFO"):
            reader(rfd)
        os.close(rfd)
        os.close(wfd)
    finally:
        os.close(fd)
    sfd, shm = tempfile.mkstemp(prefix="vdt-test-trace-", dir="/dev/shm")   # tmpfs: its reads
    os.write(sfd, b"s" * PAGE)                                              # pass no filemap event
    os.close(sfd)
    sfd = os.open(shm, os.O_RDONLY)
    name = instance_name()
    try:
        with pytest.raises(TraceUnavailable, match=f"the page cache of {shm} is not on inode"):
            reader(sfd, name=name)
    finally:
        os.close(sfd)
        os.unlink(shm)
    assert not os.path.exists(os.path.join(tracefs_root, "instances", name))


def test_find_root_reads_the_mount_table(tmp_path, tracefs_root):
    table = tmp_path / "mounts"
    escaped = tracefs_root.replace(" ", "\\040")
    table.write_text(f"proc /proc proc rw 0 0\nnodev {escaped} tracefs rw,relatime 0 0\n")
    assert tracefs.find_root(str(table), default=str(tmp_path)) == tracefs_root
    table.write_text("proc /proc proc rw 0 0\n")     # not listed: the default, if it works
    assert tracefs.find_root(str(table), default=tracefs_root) == tracefs_root


NOBODY_CHILD = textwrap.dedent("""
    import os, sys
    from vmdisktouch.system.trace.trace_reader import TraceReader, TraceUnavailable
    try:
        TraceReader(os.open(sys.argv[1], os.O_RDONLY), name=sys.argv[2])
    except TraceUnavailable as exc:
        print(exc)
""")


def test_without_root_the_refusal_is_one_line(tmp_path, tracefs_root):
    """The unprivileged user nobody: tracefs is 0700 (root's), mounting is not allowed."""
    shared = tempfile.mkdtemp(prefix="vmdt-trace-", dir="/var/tmp")
    try:
        os.chmod(shared, 0o755)
        path = os.path.join(shared, "img.raw")
        with open(path, "wb") as f:
            f.write(b"n" * PAGE)
        os.chmod(path, 0o644)
        out = subprocess.run([require_tool("setpriv"), "--reuid=65534", "--regid=65534",
                              "--clear-groups", sys.executable, "-c", NOBODY_CHILD, path,
                              instance_name()], cwd=ROOT_DIR, capture_output=True, text=True,
                             timeout=60)
    finally:
        shutil.rmtree(shared)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout == f"permission denied on {tracefs_root}: kernel tracing needs root\n"


@pytest.fixture
def read_only_tracefs(tmp_path, tracefs_root, request):
    """A read-only bind mount of tracefs, unmounted (and its directory removed) at teardown."""
    mount, umount = require_tool("mount"), require_tool("umount")
    where = tmp_path / "ro-tracing"
    where.mkdir()
    request.addfinalizer(where.rmdir)
    subprocess.run([mount, "--bind", tracefs_root, str(where)], check=True)
    request.addfinalizer(lambda: subprocess.run([umount, str(where)], check=True))
    subprocess.run([mount, "-o", "remount,bind,ro", str(where)], check=True)
    return str(where)


def test_a_read_only_tracefs_is_refused_in_one_line(scratch, reader, read_only_tracefs):
    fd = open_random(scratch())
    try:
        with pytest.raises(TraceUnavailable) as info:
            reader(fd, root=read_only_tracefs)
    finally:
        os.close(fd)
    assert str(info.value) == f"tracefs at {read_only_tracefs} is mounted read-only"


# -- #31: the instance changed from outside, and instances left behind ------------------------

def test_a_changed_switch_is_found_within_one_turn_and_every_one_set_back(scratch, reader,
                                                                          tracefs_root):
    fd = open_random(scratch())
    try:
        r = reader(fd)
        inst = os.path.join(tracefs_root, "instances", r.name)
        assert [r.check_instance() for _ in range(4)] == [{}] * 4      # as set up: nothing
        ev = "filemap/mm_filemap_add_to_page_cache"
        with open(f"{inst}/events/{ev}/filter", "w") as f:
            f.write("0\n")
        with open(f"{inst}/tracing_on", "w") as f:
            f.write("0\n")
        changed = r.check_instance()            # tracing_on is read every call
        assert changed == {f"events/{ev}/filter": "none", "tracing_on": "0"}
        assert read_text(f"{inst}/tracing_on").strip() == "1"
        assert "i_ino == " in read_text(f"{inst}/events/{ev}/filter")
        with open(f"{inst}/events/{ev}/enable", "w") as f:
            f.write("0\n")
        found = [r.check_instance() for _ in range(4)]   # one event a call, in turn
        assert sum(1 for c in found if c) == 1, found
        assert read_text(f"{inst}/events/{ev}/enable").strip() == "1"
        r.drain()
        r.probe()                                  # a read of its own comes back ...
        assert r.drain().kind.size == 0 and r.probe_seen is True      # ... taken out
        with open(f"{inst}/set_event_pid", "w") as f:
            f.write("1\n")
        r.probe()
        r.drain()
        assert r.probe_seen is False and r.check_instance(full=True) == {"set_event_pid": "1"}
    finally:
        os.close(fd)


def test_sweep_removes_only_the_instances_nobody_holds(scratch, reader, tracefs_root):
    prefix = f"vdt_test_sweep_{os.getpid()}_"
    inst = os.path.join(tracefs_root, "instances")
    for name in ("orphan", "young", "held"):
        os.mkdir(os.path.join(inst, prefix + name))
    with open(os.path.join(inst, prefix + "orphan", "events", "filemap", "enable"), "w") as f:
        f.write("1\n")                            # left recording
    fd = open_random(scratch())
    held = os.open(os.path.join(inst, prefix + "held", "tracing_on"), os.O_RDONLY)
    try:
        r = reader(fd, name=prefix + "reader")     # a live reader's: held from its mkdir on
        now = os.stat(os.path.join(inst, prefix + "young")).st_ctime
        assert tracefs.sweep(tracefs_root, prefix, now + tracefs.SWEEP_MIN_AGE - 0.5) == []
        removed = tracefs.sweep(tracefs_root, prefix, time.time() + tracefs.SWEEP_MIN_AGE + 1)
        assert removed == [prefix + "orphan", prefix + "young"]
        left = sorted(n for n in os.listdir(inst) if n.startswith(prefix))
        assert left == [prefix + "held", r.name]
        r.drain()
    finally:
        os.close(held)
        os.close(fd)
        os.rmdir(os.path.join(inst, prefix + "held"))


# Run in a mount namespace of its own: tracefs bound read-only over its own mount point,
# as systemd 252's ProtectKernelTunables= leaves it, and (argv[2] "bound") bound a
# second time, writable, where the units' BindPaths= puts it.
SANDBOXED_TRACEFS = textwrap.dedent("""
    set -e
    if [ "$2" = bound ]; then mkdir -p "$3" && mount --bind "$1" "$3"; fi
    mount -o remount,bind,ro "$1"
    exec "$4" -c 'from vmdisktouch.system.trace import tracefs
try:
    print("root", tracefs.find_root())
except tracefs.TraceUnavailable as exc:
    print("refused", exc)'
""")


@pytest.mark.parametrize("bound", [False, True], ids=["read-only", "bound-writable"])
def test_a_read_only_tracefs_is_named_as_such_and_a_writable_bind_is_used(tmp_path,
                                                                          tracefs_root, bound):
    """Under systemd 252, ProtectKernelTunables= leaves /sys/kernel/tracing read-only
    whatever ReadWritePaths= says (tests/vm): the refusal says "read-only", not "needs
    root", and the writable bind the units add (BindPaths=) is the root found."""
    target = tmp_path / "tracefs"
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          SANDBOXED_TRACEFS, "sh", tracefs_root,
                          "bound" if bound else "plain", str(target), sys.executable],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    if bound:
        assert out.stdout.strip() == f"root {target}", out.stdout
    else:
        assert out.stdout.startswith(f"refused tracefs at {tracefs_root} is mounted read-only"), \
            out.stdout
