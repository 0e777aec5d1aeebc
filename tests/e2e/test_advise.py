"""``vmdisktouch advise`` end to end: real QEMU (qemu-nbd) and fio doing real O_DIRECT I/O.

A disk attached with ``cache=none`` never touches the page cache: ``advise``
sees its reads through the kernel's direct I/O tracepoints. Checked here
against what the I/O really was: fio's own rates and latency, and the exact
LRU over the same reads (the test traces them too, in its own instance, and
runs ``core.mrc`` exactly: every page, no sampling). And that it changes
nothing, says one line for bad input, and stops at once on Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest
from PIL import Image

from tests.support.faultkit import ROOT, assert_clean, assert_refused, vmdt
from tests.support.fio import FioJob, FioRun
from tests.support.images import make_image, resident_bytes
from tests.support.nbd import QemuNbd
from vmdisktouch.adapters import advice_file
from tests.support.advise_run import advise_traced

pytestmark = [pytest.mark.qemu, pytest.mark.root]

MiB = 1 << 20
PAGE = 4096
INSTANCES = "/sys/kernel/tracing/instances"


def ours(pid: int | None = None) -> set[str]:
    """advise's tracefs instances (``vmdisktouch@advise-PID-K...``): those of ``pid``, or
    with no pid those left behind by a process that has ended. An advise that another
    process runs meanwhile is alive, so it is never counted (the machine's state is not
    the test's)."""
    out = set()
    for n in os.listdir(INSTANCES):
        if not n.startswith("vmdisktouch@advise-"):
            continue
        owner = n.removeprefix("vmdisktouch@advise-").split("-")[0]
        if pid is not None:
            if owner == str(pid):
                out.add(n)
        elif not os.path.exists(f"/proc/{owner}"):
            out.add(n)
    return out


def hot_zone_job(image: str, size: int, runtime: float, read_mix: int = 90, **kw) -> FioJob:
    """Reads (and a few writes) of which 90 % fall in a 24 MiB zone of the image."""
    return FioJob(filename=image, size=size, hot_zones=[(64 * MiB, 24 * MiB)],
                  read_mix=read_mix, runtime=runtime, seed=7, **kw)


@pytest.fixture
def cache_none_guest(tmp_path):
    """A 256 MiB raw image served by ``qemu-nbd --cache=none --aio=native``, and fio reading
    it through NBD for 40 s: (image, fio run)."""
    image = make_image(tmp_path / "none.raw", 256 * MiB, sparse=False)
    nbd = QemuNbd(image, cache="none", aio="native").start()
    job = hot_zone_job(image, 256 * MiB, 40, nbd_uri=nbd.uri, nbd_fsync=0)
    fio = FioRun(job).start()
    try:
        time.sleep(3)
        yield image, fio
    finally:
        fio.stop()
        nbd.stop()


def test_advise_sees_a_cache_none_disk_its_rates_and_a_curve_within_5_points_of_exact(
        cache_none_guest, tmp_path):
    image, fio = cache_none_guest
    png, saved = tmp_path / "advise.png", tmp_path / "advise.json"
    t0 = time.monotonic() - fio.t0
    r, exact, lost = advise_traced(image, image, "--duration", "15", "--json", "--png", png,
                                   "--save", saved)
    assert lost == 0
    t1 = time.monotonic() - fio.t0
    assert r.returncode == 0, r.stderr
    assert_clean(r.stderr)
    d = json.loads(r.stdout)["disks"][0]
    assert d["cache"] == "none" and d["seen_by"] == "direct I/O", d
    fio_reads = statistics.median(iv.read_iops for iv in fio.intervals if t0 <= iv.t <= t1)
    assert d["reads_per_second"] == pytest.approx(fio_reads, rel=0.15), (d, fio_reads)
    assert d["writes_per_second"] > 0
    assert d["hit_ratio_now"] == 0.0
    assert d["miss_latency_us"] > 0
    # the window's curve against the exact LRU over the same reads; the steady state's
    # (the window's first reads censored) against the same estimate from every read
    for key, steady in (("window_curve", False), ("curve", True)):
        curve = dict((b, h) for b, h in d[key])
        assert len(curve) >= 8 and max(curve) == 256 * MiB
        for size in (16 * MiB, 32 * MiB, 64 * MiB):
            near = min(curve, key=lambda b: abs(b - size))
            truth = float(exact.curve([near / PAGE], steady)[0])
            assert curve[near] == pytest.approx(truth, abs=0.05), (key, near, curve[near],
                                                                   truth)
    advice = d["advice"]
    # a fast disk with writes may come out slower served: a size either way
    assert advice["verdict"] in ("hold", "no_gain"), advice
    assert advice["evidence"]["enough"], advice     # 15 s of a small zone: its pages re-read
    assert 16 * MiB <= advice["bytes"] <= 128 * MiB, advice      # about the 24M zone
    if advice["verdict"] == "hold":
        assert advice["advice"].startswith("with cache=writethrough and ")
        assert advice["more_reads_per_second"] > 0
    else:
        assert advice["advice"].startswith("no gain: with cache=writethrough and ")
        assert advice["more_reads_per_second"] <= 0 and advice["reason"], advice
    assert advice["evidence"]["re_reads"] > 0
    # and of adopting it live: the writes pay the buffered path, not a flush
    adopted = advice["adopted"]
    assert adopted["adopt"] and adopted["advice"].startswith(("adopted with ",
                                                               "no gain: adopted with "))
    assert d["writes_per_second"] > 0 and adopted["write_cost_us"] < advice["write_cost_us"]
    assert d["path_extra_us"] > 0, d        # a read's extra wake-up, measured on this host
    assert d["write_extra_us"] > d["path_extra_us"], d   # a flush on the image's fs
    assert resident_bytes(image) == 0, "advise brought pages of the image into the cache"
    assert not ours(), "a tracefs instance was left behind"
    with Image.open(png) as im:
        assert im.width >= 760 and im.height > 200
        colours = {c for _, c in im.convert("RGB").getcolors(1 << 20)}
    from vmdisktouch.adapters.pictures.host_render import PALETTE
    assert colours & set(PALETTE), "no curve drawn in a disk's colour"
    kept = advice_file.load_advice(str(saved))            # discover's ADVICE column
    assert kept["disks"][image] == advice
    assert advice_file.advice_cell(advice).endswith(
        "reads/s" if advice["verdict"] == "hold" else "none: no gain")


def test_the_miss_latency_is_within_20_percent_of_fio_s_own(tmp_path):
    image = make_image(tmp_path / "direct.raw", 256 * MiB, sparse=False)
    job = hot_zone_job(image, 256 * MiB, 20, extra=["--direct=1"], read_mix=100)
    fio = FioRun(job).start()
    try:
        time.sleep(2)
        r = vmdt("advise", image, "--duration", "10", "--json", "--save", "", timeout=60)
        time.sleep(0.5)
    finally:
        fio.stop()
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)["disks"][0]
    assert d["cache"] == "none", d                      # read from fio's descriptor: O_DIRECT
    clat = fio.final["jobs"][0]["read"]["clat_ns"]["mean"] / 1e3
    assert d["miss_latency_us"] == pytest.approx(clat, rel=0.2), (d["miss_latency_us"], clat)


def test_uniform_reads_are_told_no_size_below_the_image_helps(tmp_path):
    image = make_image(tmp_path / "uniform.raw", 384 * MiB, sparse=False)
    nbd = QemuNbd(image, cache="none", aio="native").start()
    job = FioJob(filename=image, size=384 * MiB, hot_zones=[(0, 384 * MiB)], read_mix=100,
                 runtime=30,
                 seed=3, nbd_uri=nbd.uri, nbd_fsync=0)
    fio = FioRun(job).start()
    try:
        time.sleep(2)
        r = vmdt("advise", image, "--duration", "15", "--json", "--save", "", timeout=60)
    finally:
        fio.stop()
        nbd.stop()
    assert r.returncode == 0, r.stderr
    advice = json.loads(r.stdout)["disks"][0]["advice"]
    assert advice["verdict"] == "uniform", advice
    assert advice["advice"].startswith("no size below the image helps: reads are uniform")


def test_ctrl_c_stops_within_a_second_prints_what_was_measured_and_leaves_no_instance(
        cache_none_guest):
    image, _ = cache_none_guest
    # SIGINT at its default, as in an operator's terminal: a test run started in the
    # background (`make test &`) inherits it ignored, and an ignored SIGINT stays so
    # across exec (Python then installs no KeyboardInterrupt handler).
    p = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "advise", image, "--duration",
                          "60", "--save", ""], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(6)
        assert ours(p.pid), "advise made no instance"
        p.send_signal(signal.SIGINT)
        t = time.monotonic()
        out, err = p.communicate(timeout=10)
        stopped = time.monotonic() - t
    finally:
        if p.poll() is None:
            p.kill()
    assert stopped <= 1.0, stopped
    assert p.returncode == 130, err
    assert_clean(err)
    assert image in out and "interrupted" in out, out
    row = next(line for line in out.splitlines() if line.startswith(image))
    # 6 s of a window: under advise's minimum, so no size, only how much longer to watch
    assert "none" in row and "not enough reads yet: watch for" in row, out
    assert not ours(p.pid)


@pytest.mark.parametrize("seconds", ["1", "5"])
def test_a_window_under_the_minimum_never_prints_a_size(cache_none_guest, seconds):
    """fio reads a hot zone at thousands of reads a second: a window of 1 or 5 s still gives
    no size (a curve of a few seconds has seen only its shortest reuses), it says how much
    longer to watch, and the duration is warned at the start."""
    image, _ = cache_none_guest
    r = vmdt("advise", image, "--duration", seconds, "--json", "--save", "", timeout=60)
    assert r.returncode == 0, r.stderr
    assert_clean(r.stderr)
    assert f"--duration {seconds} is under the 10 s an advice needs" in r.stderr, r.stderr
    d = json.loads(r.stdout)["disks"][0]
    assert d["reads_per_second"] > 1000, d                 # the guest was read
    a = d["advice"]
    assert a["verdict"] == "not_enough" and a["bytes"] == 0, a
    assert a["advice"].startswith("not enough reads yet: watch for "), a
    assert a["evidence"]["window_seconds"] <= float(seconds) + 1, a
    assert a["evidence"]["re_reads"] > 0, a
    text = vmdt("advise", image, "--duration", seconds, "--save", "", timeout=60)
    assert text.returncode == 0, text.stderr
    row = next(line for line in text.stdout.splitlines() if line.startswith(image))
    advice_text = row.split("µs", 1)[-1]                   # past the MISS column
    assert "not enough reads yet" in advice_text and "held" not in advice_text, row
    assert f"{image}: evidence: " in text.stdout, text.stdout


# -- bad input ----------------------------------------------------------------------------

def test_a_path_that_is_not_an_image_is_refused_in_one_line(tmp_path):
    assert_refused(vmdt("advise", tmp_path, "--duration", "1"), 66, "directory")
    assert_refused(vmdt("advise", "/proc/self/status", "--duration", "1"), 66, "pseudo")


def test_a_disk_nobody_reads_exits_3_saying_so(tmp_path):
    image = make_image(tmp_path / "idle.raw", 16 * MiB, sparse=False)
    r = vmdt("advise", image, "--duration", "2", "--cache", "none", "--save", "")
    assert r.returncode == 3, r.stderr
    assert "no disk was read during the window" in r.stderr
    assert "no read in the window" in r.stdout
    assert not ours()


def test_a_user_who_is_not_root_is_refused_with_77(shared_dir):
    image = make_image(os.path.join(shared_dir, "user.raw"), 16 * MiB, sparse=False)
    os.chmod(image, 0o644)
    r = vmdt("advise", image, "--duration", "1",
             prefix=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    assert_refused(r, 77, "run it as root")


def test_a_kernel_without_the_tracepoints_is_told_what_to_upgrade(tmp_path):
    """tracefs as a kernel without the iomap and block events would show it: a private
    mount namespace with an empty events directory over /sys/kernel/tracing."""
    fake = tmp_path / "tracefs"
    (fake / "instances").mkdir(parents=True)
    (fake / "events").mkdir()
    image = make_image(tmp_path / "old.raw", 16 * MiB, sparse=False)
    script = (f"mount --bind {fake} /sys/kernel/tracing && exec {sys.executable} -m "
              f"vmdisktouch advise {image} --cache none --duration 1")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    last = assert_refused(r, 78, "iomap")
    assert os.uname().release in last and "needs Linux 6.4 or later" in last, last
