"""DirectIOTracer against this machine's real kernel: O_DIRECT I/O of files and block devices.

Files live in a directory under /var/tmp (ext4; tmp_path may not be), loop
devices are attached with ``--direct-io=on`` and detached in a finalizer, a
zram device (bio-based, the stand-in for device-mapper, which this kernel
lacks) is removed in one. Every tracer is closed by the ``tracer`` fixture,
which checks that its tracefs instance is gone. Where tracefs cannot be used
the tests FAIL with the reason (``tracefs_root``), they never skip.

I/O is made from Python with ``os.preadv``/``os.pwritev`` on an O_DIRECT
descriptor and an mmap buffer (page-aligned), each call timed: a synchronous
I/O's completion lies within its call, and its latency is shorter than it.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np
import pytest

from tests.support.blockdev import loop_device
from tests.support.common import KiB, MiB, ROOT, require_tool
from tests.support.images import make_image
from tests.support.tracing import instance_name, tracefs_root  # noqa: F401
from vmdisktouch.errors import ClosedError
from vmdisktouch.system.image import open_image
from vmdisktouch.system.trace import direct_io
from vmdisktouch.system.trace.direct_io import (IOMAP_DIO_SINCE, DirectIOTracer,
                                                DirectIOUnavailable, pair, support)

NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def image(shared_dir):
    """Makes data images (every byte written) of a given size in ``shared_dir`` (world-searchable: the unprivileged test reads there)."""
    count = iter(range(1000))
    return lambda size=16 * MiB: make_image(os.path.join(shared_dir, f"img{next(count)}.raw"),
                                            size, sparse=False)


@pytest.fixture
def tracer(tracefs_root):  # noqa: F811
    """Makes DirectIOTracers; closes them and checks their instances are gone."""
    made: list[DirectIOTracer] = []
    images = []

    def make(path: str, **kw) -> DirectIOTracer:
        images.append(open_image(path))
        t = DirectIOTracer(images[-1], name=kw.pop("name", None) or instance_name(), **kw)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()
        assert not os.path.exists(os.path.join(tracefs_root, "instances", t.name))
    for img in images:
        img.close()


def do_direct(path: str, ops) -> list[tuple[int, int, bool, int, int]]:
    """Run ``ops`` ((offset, length, write) each) with O_DIRECT on ``path``: per op
    (offset, bytes done, write, start ns, end ns)."""
    buf = mmap.mmap(-1, max(n for _, n, _ in ops))
    buf.write(os.urandom(len(buf)))
    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    done = []
    try:
        for off, n, write in ops:
            view = memoryview(buf)[:n]
            t0 = time.monotonic_ns()
            got = os.pwritev(fd, [view], off) if write else os.preadv(fd, [view], off)
            done.append((off, got, write, t0, time.monotonic_ns()))
            view.release()
    finally:
        os.close(fd)
        buf.close()
    return done


def assert_exact(ev, done, every: int = direct_io.LATENCY_EVERY) -> None:
    """``ev`` (one drain) is exactly the synchronous I/O ``done``, in order, each
    completed within its own call, and measured within it where its submission was
    traced (1 in ``every`` of the 4 KiB offsets), else -1."""
    assert ev.lost == 0 and ev.unpaired == 0
    assert list(zip(ev.offset.tolist(), ev.length.tolist(), ev.write.tolist())) == \
        [(off, n, w) for off, n, w, _, _ in done]
    for k, (off, _, _, t0, t1) in enumerate(done):
        assert t0 <= ev.ts[k] <= t1
        if (off >> 12) % every == 0:
            assert 0 < ev.latency[k] <= t1 - t0
        else:
            assert ev.latency[k] == -1
    assert {a.dtype.name for a in (ev.ts, ev.offset, ev.length, ev.latency)} == {"int64"}
    assert ev.write.dtype == bool


# offsets whose submissions are traced (a multiple of 32 KiB) and not, reads and writes
OPS = [(8 * KiB, 4 * KiB, False), (64 * KiB, 8 * KiB, True), (0, 4 * KiB, True),
       (MiB, 64 * KiB, False), (3 * MiB, MiB, True), (5 * MiB + 12 * KiB, 4 * KiB, False),
       (20 * KiB, 4 * KiB, True), (7 * MiB + 4 * KiB, 8 * KiB, True)]


# ---------------------------------------------------------------------------
# Regular files (iomap)


def test_a_files_direct_reads_and_writes_come_back_exactly(image, tracer):
    path = image()
    t = tracer(path)
    assert t.kind == "iomap" and t.name.startswith(direct_io.PREFIX)
    st = os.stat(path)
    assert t.target == f"inode {st.st_ino} on {os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    first = t.drain()
    assert len(first) == 0 and first.unpaired == 0     # the start's own read is not reported
    done = do_direct(path, OPS)
    assert_exact(t.drain(), done)
    assert len(t.drain()) == 0


def test_buffered_io_and_another_file_are_not_seen(image, tracer):
    path, other = image(), image()
    t = tracer(path)
    fd = os.open(path, os.O_RDWR)
    try:
        os.pread(fd, 64 * KiB, 2 * MiB)                  # a buffered read (a miss)
        os.pread(fd, 64 * KiB, 2 * MiB)                  # and a hit
        os.pwrite(fd, b"x" * 4096, 6 * MiB)              # a buffered write, written back
        os.fsync(fd)
    finally:
        os.close(fd)
    do_direct(other, [(0, 4 * KiB, False), (MiB, 4 * KiB, True)])
    assert len(t.drain()) == 0
    done = do_direct(path, [(7 * MiB, 4 * KiB, False)])
    assert_exact(t.drain(), done)


def test_a_short_read_at_the_end_counts_what_it_read(image, tracer):
    path = image(MiB)
    t = tracer(path)
    done = do_direct(path, [(MiB - 4 * KiB, 8 * KiB, False), (MiB, 8 * KiB, False)])
    assert [d[1] for d in done] == [4 * KiB, 0]          # the second is past the end
    ev = t.drain()
    # the read past the end completes nothing (no completion event): neither reported
    # nor unpaired
    assert list(zip(ev.offset.tolist(), ev.length.tolist())) == [(MiB - 4 * KiB, 4 * KiB)]
    assert ev.unpaired == 0


def test_aio_completions_pair_with_their_submissions(image, tracer):
    """fio with libaio at queue depth 8 (QEMU aio=native): completions run in softirq or
    a kworker, not in fio; every one is paired, reads and writes as fio counted them."""
    path = image()
    t = tracer(path)
    out = subprocess.run(
        [require_tool("fio"), "--name=aio", f"--filename={path}", "--size=16M", "--bs=4k",
         "--rw=randrw", "--rwmixread=70", "--direct=1", "--ioengine=libaio", "--iodepth=8",
         "--io_size=8M", "--randseed=7", "--output-format=json"],
        check=True, capture_output=True, text=True, timeout=120)
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    ev = t.drain()
    assert ev.lost == 0 and ev.unpaired == 0
    assert int((~ev.write).sum()) == job["read"]["total_ios"] > 0
    assert int(ev.write.sum()) == job["write"]["total_ios"] > 0
    assert (ev.length == 4096).all() and (ev.offset % 4096 == 0).all()
    assert ((ev.offset >= 0) & (ev.offset < 16 * MiB)).all()
    assert len(np.unique(ev.offset)) == len(ev)        # fio's random map: each block once
    traced = (ev.offset >> 12) % direct_io.LATENCY_EVERY == 0
    assert (np.diff(ev.ts) >= 0).all() and (ev.latency[traced] > 0).all()
    assert (ev.latency[~traced] == -1).all()
    assert traced.sum() > len(ev) // (2 * direct_io.LATENCY_EVERY)
    # submission to completion is within what fio measured from its own submission
    for ddir, sel in (("read", ~ev.write & traced), ("write", ev.write & traced)):
        assert np.median(ev.latency[sel]) < 2 * job[ddir]["lat_ns"]["mean"]


def test_io_in_flight_at_the_start_completes_unpaired(image, tracer):
    path = image()
    fio = subprocess.Popen(
        [require_tool("fio"), "--name=busy", f"--filename={path}", "--size=16M", "--bs=4k",
         "--rw=randread", "--direct=1", "--ioengine=libaio", "--iodepth=8",
         "--time_based", "--runtime=30", "--output-format=json"], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        t = tracer(path, buffer_kb=8192)
        time.sleep(0.3)
        ev = t.drain()
    finally:
        fio.terminate()
        fio.wait(30)
    assert len(ev) > 100 and ev.lost == 0
    assert ev.unpaired <= 8                              # at most the queue depth
    assert (ev.length == 4096).all() and not ev.write.any()


def test_missing_io_is_never_silent(image, tracer):
    """A small buffer under fio at queue depth 8 overflows and grows (a resize drops what
    is recorded meanwhile, uncounted by the kernel): whatever is missing shows as lost."""
    path = image()
    t = tracer(path, buffer_kb=64)
    fio = subprocess.Popen(
        [require_tool("fio"), "--name=flood", f"--filename={path}", "--size=16M", "--bs=4k",
         "--rw=randread", "--direct=1", "--ioengine=libaio", "--iodepth=8", "--io_size=160M",
         "--output-format=json"], stdout=subprocess.PIPE, text=True)
    seen = lost = 0
    while fio.poll() is None:
        time.sleep(0.1)
        ev = t.drain()
        seen, lost = seen + len(ev), lost + ev.lost
    out = fio.stdout.read()
    ev = t.drain()
    seen, lost = seen + len(ev), lost + ev.lost
    reads = json.loads(out[out.index("{"):])["jobs"][0]["read"]["total_ios"]
    assert t.buffer_kb > 64 and seen <= reads == 40960
    assert lost > 0 if seen < reads else True
    # a lost completion is a read missed, a lost submission none; what a resize drops is an
    # estimate (the last drain's event rate times its time): within a tenth
    assert seen + lost >= 0.9 * reads


# ---------------------------------------------------------------------------
# Block devices


def test_a_loop_devices_direct_io_comes_back_exactly(image, tracer):
    with loop_device(image(), direct_io=True) as dev, \
            loop_device(image(), direct_io=True) as other:
        t = tracer(dev)
        assert t.kind == "block" and "request-based" in t.target
        assert len(t.drain()) == 0
        done = do_direct(dev, OPS[:3] + [(MiB, 256 * KiB, False)])
        do_direct(other, [(0, 4 * KiB, False), (MiB, 4 * KiB, True)])
        assert_exact(t.drain(), done)


@contextlib.contextmanager
def zram_device(size: int):
    """A new zram device (bio-based, like device-mapper), removed at the end."""
    control = "/sys/class/zram-control"
    if not os.path.isdir(control):
        pytest.fail("zram is needed by this test (a bio-based block device; this kernel has "
                    "no device-mapper): modprobe zram")
    with open(f"{control}/hot_add") as f:
        n = f.read().strip()
    try:
        with open(f"/sys/block/zram{n}/disksize", "w") as f:
            f.write(str(size))
        yield f"/dev/zram{n}"
    finally:
        with open(f"{control}/hot_remove", "w") as f:
            f.write(n)


def test_a_bio_based_devices_direct_io_comes_back_exactly(tracer):
    with zram_device(64 * MiB) as dev:
        t = tracer(dev)
        assert t.kind == "block" and "bio-based" in t.target
        done = do_direct(dev, OPS)
        assert_exact(t.drain(), done)
        t.close()
        t.image.close()            # a zram device open anywhere cannot be removed


@contextlib.contextmanager
def partitioned_loop(path: str, start: int, sectors: int):
    """A loop device over ``path`` with one partition (``addpart``: this kernel parses no
    partition table), both detached at the end."""
    losetup = require_tool("losetup")
    dev = subprocess.run([losetup, "--find", "--show", "--partscan", "--direct-io=on", path],
                         check=True, capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run([require_tool("addpart"), dev, "1", str(start), str(sectors)],
                       check=True)
        for _ in range(100):
            if os.path.exists(dev + "p1"):
                break
            time.sleep(0.02)
        yield dev, dev + "p1"
    finally:
        subprocess.run([losetup, "-d", dev], check=True)


def test_a_partition_is_traced_on_its_disk_at_its_own_offsets(image, tracer):
    with partitioned_loop(image(), 2048, 16384) as (disk, part):       # 1 MiB + 8 MiB
        t = tracer(part)
        assert t.kind == "block" and "request-based" in t.target
        done = do_direct(part, [(8 * KiB, 4 * KiB, False), (64 * KiB, 8 * KiB, True)])
        do_direct(disk, [(0, 4 * KiB, False), (12 * MiB, 4 * KiB, True)])   # outside it
        ev = t.drain()
        assert_exact(ev, done)


# ---------------------------------------------------------------------------
# The instance, support() and refusals


def test_close_removes_the_instance_and_is_idempotent(image, tracefs_root):  # noqa: F811
    img = open_image(image(MiB))
    with img, DirectIOTracer(img, name=instance_name()) as t:
        where = os.path.join(tracefs_root, "instances", t.name)
        assert os.path.isdir(where) and t.name.startswith(direct_io.PREFIX)
    assert not os.path.exists(where)
    t.close()
    with pytest.raises(ClosedError):
        t.drain()
    with open_image(img.path) as again:
        named = DirectIOTracer(again, name=f"{direct_io.PREFIX}x-{os.getpid()}")
        assert named.name == f"{direct_io.PREFIX}x-{os.getpid()}"     # not prefixed twice
        named.close()
    assert not os.path.exists(os.path.join(tracefs_root, "instances", named.name))


def test_support_and_refusals(image, shared_dir, tracefs_root):  # noqa: F811
    path = image(MiB)
    assert support(path) is None
    with tempfile.NamedTemporaryFile(dir="/dev/shm") as shm:
        shm.write(b"\0" * 8192)
        shm.flush()
        line = support(shm.name)
        assert line == f"{shm.name} is on tmpfs: only images on ext4 or xfs can be traced " \
                       "(their O_DIRECT I/O passes the iomap tracepoints)"
        with open_image(shm.name) as img:
            assert support(img) == line
            with pytest.raises(DirectIOUnavailable, match="is on tmpfs"):
                DirectIOTracer(img, name=instance_name())
    missing = os.path.join(shared_dir, "missing.raw")
    assert support(missing) == f"{missing}: No such file or directory"
    assert "is a directory" in support(shared_dir)     # the tracer takes an open image
    assert not [n for n in os.listdir(os.path.join(tracefs_root, "instances"))
                if n.startswith(f"{direct_io.PREFIX}vdt_test_{os.getpid()}_")]


def test_support_names_the_missing_tracepoints_the_kernel_and_the_version(image, tmp_path):
    """A kernel before 6.4 (Debian 12's 6.1): a tracefs without the iomap events."""
    root = tmp_path / "tracing"
    (root / "instances").mkdir(parents=True)
    (root / "events" / "block" / "block_rq_issue").mkdir(parents=True)
    (root / "events" / "block" / "block_rq_issue" / "format").write_text("name: x\n")
    path = image(MiB)
    line = support(path, root=str(root))
    assert IOMAP_DIO_SINCE == (6, 4)
    assert line == (f"this kernel ({os.uname().release}) has no tracepoint "
                    "iomap:iomap_dio_rw_begin, iomap:iomap_dio_complete, iomap:iomap_iter: "
                    f"tracing the O_DIRECT I/O of {path} needs Linux 6.4 or later")
    with open_image(path) as img, pytest.raises(DirectIOUnavailable) as err:
        DirectIOTracer(img, name=instance_name(), root=str(root))
    assert str(err.value) == line


def test_support_as_an_unprivileged_user_is_one_line(shared_dir):
    path = make_image(os.path.join(shared_dir, "disk.raw"), MiB, sparse=False)
    code = textwrap.dedent(f"""
        from vmdisktouch.system.trace.direct_io import support
        print(support({path!r}))
    """)
    out = subprocess.run([require_tool("setpriv"), *NOBODY, sys.executable, "-c", code],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1 and "needs root" in out.stdout, out.stdout


# ---------------------------------------------------------------------------
# Pairing (no kernel)


def test_pairing_takes_the_latest_free_submission_of_the_key():
    i64 = (lambda *xs: np.array(xs, dtype=np.int64))
    # key 5: two in flight (B1 B2 C1 C2); key 7: one; key 9: a completion with none; key 3:
    # a completion before its only submission
    sub_ts, sub_key = i64(10, 20, 30, 90), i64(5, 5, 7, 3)
    end_ts, end_key = i64(40, 50, 60, 70, 80), i64(5, 5, 7, 9, 3)
    assert pair(sub_ts, sub_key, end_ts, end_key).tolist() == [1, 0, 2, -1, -1]
    # one key used again and again, in turn: each completion its own submission
    assert pair(i64(1, 3, 5), i64(4, 4, 4), i64(2, 4, 6), i64(4, 4, 4)).tolist() == [0, 1, 2]
    assert pair(i64(), i64(), i64(1), i64(4)).tolist() == [-1]


def test_a_begin_is_a_write_when_its_tasks_next_event_is_a_write_iter_at_its_pos():
    sub = np.zeros(4, direct_io.SUB)
    # task 1: a write at 0 (iters at 0, then 4096: its last call); task 2, interleaved: a
    # read at 0 (no iter), then a write at 8192; task 1 again: a read at 4096
    sub["ts"], sub["pid"], sub["pos"] = [10, 11, 20, 40], [1, 2, 2, 1], [0, 0, 8192, 4096]
    it = np.zeros(3, direct_io.ITERS)
    it["ts"], it["pid"], it["pos"] = [12, 13, 21], [1, 1, 2], [0, 4096, 8192]
    assert direct_io.writes(sub, it).tolist() == [True, False, True, False]


def test_a_drain_of_many_events_loses_none(image, tracer):
    """20480 4 KiB aio reads in one drain, every one paired (its cost is printed with ``-s``;
    benchmarks/bench_advise.py --cost measures what watching costs)."""
    path = image()
    t = tracer(path, buffer_kb=8192)
    subprocess.run([require_tool("fio"), "--name=n", f"--filename={path}", "--size=16M",
                    "--bs=4k", "--rw=randread", "--direct=1", "--ioengine=libaio",
                    "--iodepth=16", "--io_size=80M", "--output-format=terse"],
                   check=True, capture_output=True, timeout=120)
    c0 = time.thread_time()
    ev = t.drain()
    cpu = time.thread_time() - c0
    print(f"drain: {len(ev)} I/Os in {cpu * 1e3:.1f} ms CPU, {cpu / len(ev) * 1e6:.2f} µs each")
    assert len(ev) == 20480 and ev.lost == 0 and ev.unpaired == 0
