"""End-to-end: ``vmdisktouch run`` as a real process, a real page cache, a real QEMU.

Each test starts the daemon with ``python -m vmdisktouch run IMAGE ...`` in
a subprocess and watches it from outside only: its status JSON, its PNGs,
``VmLck`` in ``/proc/PID/status``, its exit status and stderr, and the
image's page cache (``residency.scan``, which only asks mincore/cachestat,
and util-linux ``fincore``).

* The "guest" is a background thread (``Workload``) that keeps re-reading
  the hot zones with buffered reads (``POSIX_FADV_RANDOM``: no readahead, so
  only the zone is cached) and every half second evicts everything else
  with ``POSIX_FADV_DONTNEED``. The kernel here pages out idle unlocked page
  cache on its own (DAMON, see FIELD-NOTES), so the hot zone is re-read
  continuously until the daemon holds it.
* Guest writes go through a real QEMU's block layer (``tests.support.qemu_vm``:
  ``qemu-io`` over QMP on a ``cache=writethrough`` virtio-blk disk).
* Heat parameters. ``STABLE`` (decay 0.02/s, threshold 0.02) makes a hot
  zone held after 2-3 half-second cycles and keeps a read-only hold for
  ~50 s (feedback suppression makes a held region cool down; see
  ``heat``), longer than any test here, so "held" does not flicker under an
  assertion. ``CHURN`` (decay 0.1/s, threshold 0.05, the defaults)
  makes holds come and go, which the budget test wants.
* Every test checks, from a poller sampling every 10 ms, that ``VmLck``
  never exceeded the budget and that every status it read parsed.

Cycle numbers are the status file's ``cycle``: "within 2 cycles of the
write" means the write was issued when the status said cycle ``c`` and the
first status reporting it has ``cycle <= c + 2``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.support.common import require_tool
from tests.support.images import evict
from tests.support.pagecache import PAGE, fincore_pages, read_range
from tests.support.qemu_vm import QemuVM
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.procfs import vmlck
from vmdisktouch.adapters.pictures import figure, render
from vmdisktouch.system.observe import residency

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
SIZE = 256 * MiB
BUDGET = 64 * MiB
INTERVAL = 0.5
STABLE = ["--decay", "0.02", "--threshold", "0.02"]
CHURN = ["--decay", "0.1", "--threshold", "0.05"]
EXIT_IMAGE_GONE = 75   # errors.ImageGoneError: deleted or replaced while served (EX_TEMPFAIL)

# The hot zone of most tests and the zones that must never be held. The
# Gaussian smoothing reaches 8 blocks (4 sigma, sigma = 2 blocks of 1 MiB)
# beyond a hot zone, so "cold" starts 16 MiB away from it.
HOT = (96 * MiB, 24 * MiB)
COLD = [(0, 80 * MiB), (136 * MiB, SIZE - 136 * MiB)]


# -- helpers ------------------------------------------------------------------

def page_round(n: int) -> int:
    return -(-n // PAGE) * PAGE


def covers(ranges, zone) -> bool:
    """The union of byte ranges [[off, len], ...] covers zone (off, len)."""
    pos, end = zone[0], zone[0] + zone[1]
    for off, n in sorted((int(o), int(n)) for o, n in ranges):
        if off > pos:
            break
        pos = max(pos, off + n)
        if pos >= end:
            return True
    return pos >= end


def intersects(ranges, zone) -> bool:
    a, b = zone[0], zone[0] + zone[1]
    return any(o < b and o + n > a for o, n in ranges)


def random_image(path, size: int = SIZE, seed: int = 1) -> str:
    """A non-sparse image of random data (every block different), written back and evicted."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as f:
        for off in range(0, size, 8 * MiB):
            f.write(rng.bytes(min(8 * MiB, size - off)))
        f.flush()
        os.fsync(f.fileno())
    evict(path)
    return str(path)


def block_pages(path, block_size: int = MiB) -> np.ndarray:
    """Resident pages per block, measured without reading the file."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        return residency.scan(fd, os.fstat(fd).st_size, block_size).counts.copy()
    finally:
        os.close(fd)


def resident_pages(counts: np.ndarray, zone, block_size: int = MiB) -> int:
    """Resident pages of a block-aligned zone."""
    return int(counts[zone[0] // block_size:(zone[0] + zone[1]) // block_size].sum())


def sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * MiB):
            h.update(chunk)
    return h.hexdigest()


class Workload:
    """A guest stand-in: re-reads ``zones`` continuously, evicts the rest every ``evict_every`` s."""

    def __init__(self, path, zones, *, evict_every: float = 0.5, pause: float = 0.02,
                 per_mib: int = MiB):
        self.path = str(path)
        self.per_mib = per_mib          # bytes read at the start of each MiB of a zone
        self._zones = list(zones)
        self.evict_every = evict_every
        self.pause = pause
        self.rounds = 0
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def set_zones(self, zones) -> None:
        with self._lock:
            self._zones = list(zones)

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            last_evict = 0.0
            while not self._stop.is_set():
                with self._lock:
                    zones = sorted(self._zones)
                for off, n in zones:
                    for pos in range(off, off + n, MiB):
                        os.pread(fd, min(self.per_mib, off + n - pos), pos)
                self.rounds += 1
                if time.monotonic() - last_evict >= self.evict_every:
                    pos = 0
                    for off, n in zones + [(os.fstat(fd).st_size, 0)]:
                        if off > pos:
                            os.posix_fadvise(fd, pos, off - pos, os.POSIX_FADV_DONTNEED)
                        pos = max(pos, off + n)
                    last_evict = time.monotonic()
                self._stop.wait(self.pause)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc
        finally:
            os.close(fd)

    def __enter__(self) -> "Workload":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        assert self.error is None, f"workload failed: {self.error!r}"

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class Daemon(DaemonProc):
    """``vmdisktouch run`` in a subprocess (``DaemonProc``), watched by a 10 ms poller thread.

    The poller keeps every status it sees (``history``, by cycle) and the
    largest ``VmLck`` of the process (``max_vmlck``, bytes). ``kill`` (called by
    the fixture in any case) SIGKILLs the process by PID and reaps it.
    """

    LOG_CYCLE = re.compile(r"cycle (\d+): .*rewritten (\d+) blocks")

    def __init__(self, tmp_path: Path, image: str, *extra: str, budget: int = BUDGET,
                 interval: float = INTERVAL, pngs: bool = False):
        self.image = image
        self.budget = budget
        self.interval = interval
        self.dir = tmp_path / "out"
        self.dir.mkdir(exist_ok=True)
        self.map_png = self.dir / "map.png"
        self.heat_png = self.dir / "heat.png"
        if pngs:
            extra = ("--map-png", str(self.map_png), "--heat-png", str(self.heat_png), *extra)
        super().__init__(tmp_path, image, *extra, max_hold=budget, interval=interval,
                         status="out/status.json", log="daemon.stdout", err_log="daemon.stderr",
                         env=env_without_systemd())
        self.history: dict[int, dict] = {}
        self.bad_status: list[str] = []
        self.max_vmlck = 0
        self.vmlck_samples = 0
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, name="status-poller", daemon=True)
        self._poller.start()

    # -- watching -------------------------------------------------------------

    def _poll(self) -> None:
        while not self._stop.is_set():
            held = vmlck(self.pid, missing=None)
            if held is not None:
                self.max_vmlck = max(self.max_vmlck, held)
                self.vmlck_samples += 1
            try:
                text = self.status_path.read_text()
            except FileNotFoundError:
                text = None
            if text is not None:
                try:
                    st = json.loads(text)
                    self.history.setdefault(st["cycle"], st)
                except (ValueError, KeyError) as exc:      # a torn or malformed status file
                    self.bad_status.append(f"{exc}: {text[:200]!r}")
            self._stop.wait(0.01)

    def latest(self) -> dict | None:
        return self.history[max(self.history)] if self.history else None

    @property
    def cycle(self) -> int:
        st = self.latest()
        return st["cycle"] if st else 0

    def wait(self, pred, what: str, timeout: float = 45.0, alive: bool = True) -> dict:
        """The latest status once ``pred(status)`` holds; fails if the daemon dies first."""
        deadline = time.monotonic() + timeout
        while True:
            if alive and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode} while waiting "
                                     f"for {what}; stderr:\n{self.err()[-3000:]}")
            st = self.latest()
            if st is not None and pred(st):
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last "
                                     f"status: {st}; stderr:\n{self.err()[-3000:]}")
            time.sleep(0.02)

    def wait_cycles(self, n: int, what: str = "") -> dict:
        target = self.cycle + n
        return self.wait(lambda s: s["cycle"] >= target, what or f"cycle {target}")

    def wait_held(self, zone, what: str = "the hot zone held", timeout: float = 45.0) -> dict:
        return self.wait(lambda s: covers(s["regions"], zone), what, timeout)

    def log_rewritten(self) -> dict[int, int]:
        """cycle -> rewritten blocks, from the daemon's one log line per cycle."""
        return {int(m.group(1)): int(m.group(2)) for m in self.LOG_CYCLE.finditer(self.err())}

    # -- checks -----------------------------------------------------------------

    def assert_within_budget(self) -> None:
        assert self.vmlck_samples > 50, f"only {self.vmlck_samples} VmLck samples"
        assert self.max_vmlck <= self.budget, \
            f"VmLck reached {self.max_vmlck // 1024} KiB, over the budget of {self.budget // 1024} KiB"
        over = {c: s["held_bytes"] for c, s in self.history.items()
                if s["held_bytes"] > self.budget}
        assert not over, f"status held_bytes over the budget {self.budget}: {over}"
        assert not self.bad_status, f"status file read torn/malformed: {self.bad_status[:3]}"

    def assert_never_held(self, zones) -> None:
        bad = {c: s["regions"] for c, s in self.history.items()
               if any(intersects(s["regions"], z) for z in zones)}
        assert not bad, f"cold zones {zones} were held: {bad}"

    def assert_clean_stderr(self) -> None:
        err = self.err()
        assert "Traceback" not in err, err[-3000:]
        assert "internal error" not in err, err[-3000:]

    # -- ending -----------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL by PID if still running, reap, stop the poller. Idempotent."""
        try:
            super().kill()
        finally:
            self._stop.set()
            self._poller.join(timeout=10)


@pytest.fixture
def daemons(tmp_path):
    """Factory: ``daemons(image, *flags, budget=..., interval=...)``; all killed at the end."""
    started: list[Daemon] = []

    def start(image, *extra, **kw) -> Daemon:
        sub = tmp_path / f"d{len(started)}"
        sub.mkdir()
        d = Daemon(sub, image, *extra, **kw)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()


@pytest.fixture
def image(tmp_path):
    """A 256 MiB random, evicted image; removed at the end (pytest keeps old tmp dirs)."""
    path = random_image(tmp_path / "disk.raw")
    yield path
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@pytest.fixture(autouse=True)
def _tools():
    require_tool("fincore")          # QemuVM requires qemu-system-x86_64 itself (fails, no skip)


# -- 1. a hot zone gets held ----------------------------------------------------------

@pytest.mark.timeout(90)
def test_hot_zone_is_held_within_a_few_cycles(image, daemons):
    with Workload(image, [HOT]) as w:
        d = daemons(image, *STABLE)
        st = d.wait_held(HOT)
        first_held = min(c for c, s in d.history.items() if s["held_bytes"] > 0)
        assert first_held <= 6, f"first hold at cycle {first_held}"
        assert st["cycle"] <= 10, f"hot zone covered only at cycle {st['cycle']}"
        assert 0 < st["held_bytes"] <= BUDGET
        assert st["held_bytes"] >= HOT[1]
        # Nothing far from the hot zone: the regions stay within its smoothing reach.
        near = (HOT[0] - 8 * MiB, HOT[1] + 16 * MiB)
        assert all(near[0] <= o and o + n <= near[0] + near[1] for o, n in st["regions"]), st
        d.wait_cycles(6, "six more cycles of holding")
        assert covers(d.latest()["regions"], HOT)
        w.stop()
    d.assert_never_held(COLD)
    d.assert_within_budget()
    d.assert_clean_stderr()


# -- 2. held pages survive DONTNEED, cold ones do not ------------------------------------

@pytest.mark.timeout(90)
def test_held_pages_survive_dontneed_on_the_whole_file(image, daemons):
    probe = (200 * MiB, 8 * MiB)          # a cold zone, cached by hand just before the eviction
    with Workload(image, [HOT]) as w:
        d = daemons(image, *STABLE)
        d.wait_held(HOT)
        d.wait_cycles(2)
        w.stop()
    before = d.latest()
    held = before["regions"]
    read_range(image, *probe)
    assert resident_pages(block_pages(image), probe) == probe[1] // PAGE
    evict(image)                          # fsync + POSIX_FADV_DONTNEED on the whole file
    counts = block_pages(image)
    fin = fincore_pages(image)
    after = d.latest()
    assert after["regions"] == held, "the holds changed during the measurement; inconclusive"
    for off, n in held:
        assert resident_pages(counts, (off, n)) == n // PAGE, f"held {off}+{n} lost pages"
    assert resident_pages(counts, probe) == 0, "DONTNEED did not evict the unheld probe"
    held_pages = sum(page_round(n) for _, n in held) // PAGE
    assert int(counts.sum()) == held_pages == fin, (int(counts.sum()), held_pages, fin)
    for zone in COLD:
        assert resident_pages(counts, zone) == 0
    # ...and they stay resident over the next cycles, with nobody reading them.
    d.wait_cycles(4)
    counts = block_pages(image)
    assert d.latest()["regions"] == held
    for off, n in held:
        assert resident_pages(counts, (off, n)) == n // PAGE
    d.assert_never_held(COLD + [probe])
    d.assert_within_budget()


# -- 3. VmLck never exceeds the budget ---------------------------------------------------

@pytest.mark.timeout(120)
def test_vmlck_never_exceeds_the_budget_while_holds_move(image, daemons):
    """Three 24 MiB zones, two hot at a time, a 32 MiB budget, churning heat parameters.

    The poller samples VmLck every 10 ms; the holder releases before it
    loads, and regions are cut to the budget, so no sample may exceed it.
    """
    budget = 32 * MiB
    a, b, c = (32 * MiB, 24 * MiB), (112 * MiB, 24 * MiB), (192 * MiB, 24 * MiB)
    with Workload(image, [a, b]) as w:
        d = daemons(image, *CHURN, "--load-rate", "0", budget=budget)
        d.wait(lambda s: s["held_bytes"] >= budget, "the budget filled")
        for zones in ([b, c], [c, a], [a, b]):
            w.set_zones(zones)
            time.sleep(5)
        w.stop()
    assert d.proc.poll() is None, d.err()[-3000:]
    d.assert_within_budget()
    assert d.max_vmlck == budget, f"VmLck peaked at {d.max_vmlck // 1024} KiB"
    zones_held = {name for name, z in (("a", a), ("b", b), ("c", c))
                  if any(intersects(s["regions"], z) for s in d.history.values())}
    assert len(zones_held) >= 2, f"holds never moved: {zones_held}"
    assert sum(s["released_bytes"] for s in d.history.values()) > 0, "nothing was ever released"


# -- 4. QEMU writes into a held region are reported --------------------------------------

def first_cycle_showing(d: Daemon, zone, after: int) -> int | None:
    cycles = [c for c, s in d.history.items() if c > after and covers(s["rewritten_ranges"], zone)]
    return min(cycles) if cycles else None


def rewritten_blocks_at(d: Daemon, cycle: int) -> int:
    """rewritten_blocks of one cycle: from the status seen, else from the daemon's log line."""
    if cycle in d.history:
        return d.history[cycle]["rewritten_blocks"]
    from_log = d.log_rewritten()
    assert cycle in from_log, f"cycle {cycle} was neither seen in the status file nor logged"
    return from_log[cycle]


@pytest.mark.qemu
@pytest.mark.timeout(90)
def test_qemu_write_into_a_held_region_is_reported_within_two_cycles(image, daemons):
    write = (HOT[0] + 4 * MiB, MiB)       # one whole block inside the hot zone
    with QemuVM(image) as vm, Workload(image, [HOT]) as w:
        d = daemons(image, *STABLE)
        d.wait_held(HOT)
        d.wait_cycles(2, "two more cycles (the held blocks have checksums)")
        st = d.latest()
        assert st["rewritten_blocks"] == 0 and st["rewritten_ranges"] == []
        c = st["cycle"]
        vm.write(*write, pattern=0x5A)
        st = d.wait(lambda s: covers(s["rewritten_ranges"], write), "the write reported",
                    timeout=30)
        seen = first_cycle_showing(d, write, c)
        assert seen is not None and seen <= c + 2, \
            f"written at cycle {c}, first reported at cycle {seen}"
        assert rewritten_blocks_at(d, seen) == 1
        assert st["rewritten_ranges"] == [list(write)], st["rewritten_ranges"]
        assert covers(st["regions"], write), "the written block is no longer held"
        # The write really went through QEMU to the image (and the page cache).
        vm.read(*write, pattern=0x5A)
        with open(image, "rb") as f:
            f.seek(write[0])
            assert f.read(write[1]) == b"\x5a" * write[1]
        # It stays reported (red) for --rewritten-seconds, and counted only once.
        d.wait_cycles(3)
        assert covers(d.latest()["regions"], write)
        assert covers(d.latest()["rewritten_ranges"], write)
        assert all(s["rewritten_blocks"] == 0 for cyc, s in d.history.items() if cyc > seen)
        w.stop()
    d.assert_within_budget()
    d.assert_clean_stderr()


@pytest.mark.qemu
@pytest.mark.timeout(90)
def test_qemu_write_in_the_first_cycle_of_a_hold_is_reported(image, daemons):
    """The status says the region is held; the guest writes into it at once.

    The write lands before the next cycle, into a region the status file has
    already reported as held, so it is a write into a held region like any
    other and must be reported within 2 cycles.
    """
    with QemuVM(image) as vm, Workload(image, [HOT]) as w:
        d = daemons(image, *STABLE)
        st = d.wait(lambda s: s["held_bytes"] > 0, "the first hold")
        c = st["cycle"]
        off, n = st["regions"][0]
        write = (off + (n // MiB // 2) * MiB, MiB)       # a whole block in the middle
        vm.write(*write, pattern=0x3C)
        after = d.cycle
        assert after <= c + 1, f"the write took too long to issue (cycle {c} -> {after})"
        d.wait(lambda s: s["cycle"] >= c + 3, "three more cycles")
        held_throughout = all(covers(s["regions"], write)
                              for cyc, s in d.history.items() if c <= cyc <= c + 2)
        assert held_throughout, "the written block was released; inconclusive"
        seen = first_cycle_showing(d, write, c)
        w.stop()
        assert seen is not None and seen <= c + 2, (
            f"a guest write into blocks reported held at cycle {c} was never reported as "
            f"rewritten (checked up to cycle {d.cycle}): the first checksum of newly held "
            "blocks is taken in the next cycle, after the write")
    d.assert_within_budget()


# -- 5. truncation --------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_truncate_shrink_and_grow_back_mid_run(image, daemons):
    hot = (160 * MiB, 32 * MiB)
    sizes_seen = []

    def settle(size: int, what: str) -> dict:
        c = d.cycle
        st = d.wait(lambda s: s["size_bytes"] == size and s["cycle"] >= c + 2, what)
        sizes_seen.append(size)
        return st

    with Workload(image, [hot]) as w:
        d = daemons(image, *STABLE)
        d.wait_held(hot)
        # Shrink through the middle of the held region, to a size that is not block-aligned.
        cut = 176 * MiB + 12345
        os.truncate(image, cut)
        st = settle(cut, "the shrink noticed")
        assert st["regions"] and all(o + n <= cut for o, n in st["regions"]), st["regions"]
        # (with the smoothing's reach in front of the zone: the reads the trace source
        # sees heat ~3 blocks beyond a zone's edge above this test's threshold)
        assert st["held_bytes"] <= page_round(cut - hot[0] + 4 * MiB)
        # Grow back: the daemon follows, and holds the zone's tail again.
        os.truncate(image, SIZE)
        settle(SIZE, "the grow noticed")
        # Shrink below the whole region, then a burst of shrinks and grows at random moments.
        os.truncate(image, 100 * MiB + 1)
        st = settle(100 * MiB + 1, "the big shrink noticed")
        assert st["regions"] == [] and st["held_bytes"] == 0, st
        rng = np.random.default_rng(5)
        for _ in range(8):
            os.truncate(image, int(rng.integers(150 * MiB, SIZE)))
            time.sleep(float(rng.uniform(0, 2 * INTERVAL)))
            os.truncate(image, SIZE)
            time.sleep(float(rng.uniform(0, 2 * INTERVAL)))
        settle(SIZE, "the final size noticed")
        # The truncations left the zone a hole, which is never held (it reads as
        # zeros without I/O); the guest writes it again, and it is held again.
        fd = os.open(image, os.O_WRONLY)
        try:
            os.pwrite(fd, os.urandom(hot[1]), hot[0])
        finally:
            os.close(fd)
        d.wait_held(hot, "the hot zone held again after the truncations")
        w.stop()
    assert d.proc.poll() is None, d.err()[-3000:]
    cycles = sorted(d.history)
    assert cycles[-1] >= len(cycles) and cycles == sorted(set(cycles))
    stale = {c: (s["size_bytes"], s["regions"]) for c, s in d.history.items()
             if any(o + n > s["size_bytes"] for o, n in s["regions"])}
    assert not stale, f"held regions beyond the image's end: {stale}"
    rc, _ = d.terminate()
    assert rc == 0, d.err()[-3000:]
    d.assert_within_budget()
    d.assert_clean_stderr()


# -- 6. SIGTERM -----------------------------------------------------------------------

@pytest.mark.timeout(90)
def test_sigterm_exits_zero_and_leaves_nothing_locked(image, daemons):
    with Workload(image, [HOT]) as w:
        d = daemons(image, *STABLE, pngs=True)
        st = d.wait_held(HOT)
        w.stop()
    held = st["regions"]
    assert vmlck(d.pid) >= sum(n for _, n in held)
    rc, secs = d.terminate(timeout=5)
    assert rc == 0, f"SIGTERM: exit status {rc} after {secs:.1f}s; stderr:\n{d.err()[-3000:]}"
    assert secs < 5
    assert vmlck(d.pid, missing=None) is None                     # gone, and reaped
    evict(image)
    counts = block_pages(image)
    for off, n in held:
        assert resident_pages(counts, (off, n)) == 0, f"{off}+{n} still resident: still pinned"
    assert int(counts.sum()) == 0 == fincore_pages(image)
    leftovers = [p.name for p in d.dir.iterdir() if p.name.startswith(".tmp")]
    assert not leftovers, leftovers
    d.assert_within_budget()
    d.assert_clean_stderr()


@pytest.mark.timeout(90)
def test_sigterm_in_the_middle_of_a_paced_load(image, daemons):
    """A 96 MiB region loads in 32 MiB chunks at 8 MiB/s. SIGTERM between two chunks.

    The guest reads a quarter of each MiB of it, so three quarters of every
    chunk come from the disk: 3 s between chunks (cached bytes are not paced).
    The mincore source: a cold disk's first loads under the trace source are not
    paced (issue 33).
    """
    hot = (64 * MiB, 96 * MiB)
    with Workload(image, [hot], per_mib=256 << 10) as w:
        d = daemons(image, *STABLE, "--load-rate", "8M", "--access-source", "mincore",
                    budget=128 * MiB)
        deadline = time.monotonic() + 45
        while not (d.max_vmlck >= 32 * MiB and vmlck(d.pid) < 64 * MiB):
            assert d.proc.poll() is None, d.err()[-3000:]
            assert time.monotonic() < deadline, "no paced load seen"
            time.sleep(0.01)
        time.sleep(0.3)
        mid_load = vmlck(d.pid) // 1024
        reported = d.latest()["held_bytes"] if d.history else 0
        rc, secs = d.terminate(timeout=5)
        w.stop()
    assert 32 * 1024 <= mid_load < 96 * 1024, f"VmLck {mid_load} KiB: not mid-load"
    assert reported < mid_load * 1024, "the status already reported the load: not mid-cycle"
    assert rc == 0 and secs < 5, f"exit {rc} after {secs:.1f}s; stderr:\n{d.err()[-3000:]}"
    d.assert_within_budget()
    d.assert_clean_stderr()


# -- 7. the daemon never writes the image ------------------------------------------------

@pytest.mark.timeout(90)
def test_image_content_is_unchanged_by_a_run(image, daemons):
    digest, st0 = sha256(image), os.stat(image)
    evict(image)
    with Workload(image, [HOT, (200 * MiB, 16 * MiB)]) as w:
        d = daemons(image, *STABLE, pngs=True)
        d.wait_held(HOT)
        d.wait_held((200 * MiB, 16 * MiB))
        d.wait_cycles(4)
        w.set_zones([(10 * MiB, 8 * MiB)])
        d.wait_cycles(4)
        w.stop()
    rc, _ = d.terminate()
    assert rc == 0
    st1 = os.stat(image)
    assert (st1.st_size, st1.st_mtime_ns, st1.st_ino) == (st0.st_size, st0.st_mtime_ns,
                                                          st0.st_ino)
    assert sha256(image) == digest
    d.assert_within_budget()


# -- 8. the image deleted or replaced ------------------------------------------------------

@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_image_gone_ends_the_daemon_with_one_line(image, daemons, tmp_path, how):
    with Workload(image, [HOT]) as w:
        d = daemons(image, *STABLE)
        d.wait_held(HOT)
        if how == "replaced":
            other = random_image(tmp_path / "other.raw", SIZE, seed=2)
            c = d.cycle
            t0 = time.monotonic()
            os.rename(other, image)
        else:
            c = d.cycle
            t0 = time.monotonic()
            os.unlink(image)
        try:
            rc = d.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            rc = None
        secs = time.monotonic() - t0
        w.stop()
    err = d.err()
    assert rc is not None, f"daemon still running 20 s after the image was {how}"
    assert rc == EXIT_IMAGE_GONE, f"exit status {rc}; stderr:\n{err[-3000:]}"
    assert secs < 5, f"exit took {secs:.1f}s ({INTERVAL}s cycles)"
    assert d.cycle <= c + 2, f"{how} at cycle {c}, still cycling at {d.cycle}"
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("vmdisktouch:")]
    assert len(lines) == 1, err[-3000:]
    assert err.rstrip().splitlines()[-1] == lines[0], "the message is not the last line"
    assert image in lines[0] and how in lines[0], lines[0]
    d.assert_within_budget()


# -- 9. the PNGs ----------------------------------------------------------------------

BPP_WIDTH = 16          # 256 blocks, 1 block per pixel, 16 per row: block b is pixel (b % 16, b // 16)
SCALE = 8


class PngReader:
    """Reads both PNGs in a loop; every read must be a complete PNG of one stable size."""

    def __init__(self, paths):
        self.paths = [str(p) for p in paths]
        self.reads = 0
        self.failures: list[str] = []
        self.sizes: dict[str, set] = {p: set() for p in self.paths}
        self.inodes: dict[str, set] = {p: set() for p in self.paths}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="png-reader", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in self.paths:
                try:
                    with open(p, "rb") as f:
                        ino = os.fstat(f.fileno()).st_ino
                        data = f.read()
                except FileNotFoundError:
                    continue
                try:
                    with Image.open(io.BytesIO(data)) as img:
                        img.load()
                        self.sizes[p].add((img.format, img.size, img.mode))
                    self.inodes[p].add(ino)
                    self.reads += 1
                except Exception as exc:  # noqa: BLE001 - a torn PNG
                    self.failures.append(f"{p}: {len(data)} bytes: {exc!r}")
            self._stop.wait(0.002)

    def __enter__(self) -> "PngReader":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def pixels(path) -> np.ndarray:
    """The map's grid out of the composed figure (``figure``: header, axis, legend)."""
    with Image.open(path) as img:
        rgb = np.asarray(img.convert("RGB"))
    x0, y0 = figure.grid_origin()
    return rgb[y0:y0 + SIZE // MiB // BPP_WIDTH * SCALE, x0:x0 + BPP_WIDTH * SCALE]


def status_and_map(d, map_png, timeout: float = 20.0) -> tuple[dict, np.ndarray]:
    """A status and the map of the same cycle. A cycle's PNGs are written as each disk acts,
    its status (the host's, every disk's) after them: the map read is of the status's
    cycle when the map file (its inode: each write replaces it) did not change while it
    was read, is not newer than the status, and the status did not change meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        before = d.status_path.stat().st_mtime_ns
        st = d.latest()
        p0 = Path(map_png).stat()
        rgb = pixels(map_png)
        p1 = Path(map_png).stat()
        same_png = (p0.st_ino, p0.st_mtime_ns) == (p1.st_ino, p1.st_mtime_ns)
        if (st is not None and same_png and p1.st_mtime_ns <= before
                and d.status_path.stat().st_mtime_ns == before):
            return st, rgb
        assert time.monotonic() < deadline, "no status and map of one cycle"
        time.sleep(0.05)


def block_colour(rgb: np.ndarray, block: int, uniform: bool = True) -> tuple[int, int, int]:
    """A block's colour; ``uniform``: its scale x scale square is all that colour (the
    heat map outlines held regions, so there only the square's inside is)."""
    y, x = divmod(block, BPP_WIDTH)
    cell = rgb[y * SCALE:(y + 1) * SCALE, x * SCALE:(x + 1) * SCALE]
    if not uniform:
        cell = cell[1:-1, 1:-1]
    cell = cell.reshape(-1, 3)
    assert (cell == cell[0]).all(), "a block's pixel is not a uniform scale x scale square"
    return tuple(int(v) for v in cell[0])


def is_blue(c) -> bool:
    return c == render.HELD


def is_red(c) -> bool:
    return c == render.REWRITTEN


@pytest.mark.qemu
@pytest.mark.timeout(120)
def test_pngs_are_replaced_atomically_and_show_held_and_rewritten(image, daemons):
    write = (HOT[0] + 10 * MiB, MiB)
    wblock = write[0] // MiB
    with QemuVM(image) as vm, Workload(image, [HOT]) as w:
        d = daemons(image, *STABLE, "--blocks-per-pixel", "1", "--width", str(BPP_WIDTH),
                    "--scale", str(SCALE), pngs=True)
        map_png, heat_png = d.map_png, d.heat_png
        with PngReader([map_png, heat_png]) as reader:
            d.wait_held(HOT)
            d.wait_cycles(2)
            st, rgb = status_and_map(d, map_png)
            assert rgb.shape == (SIZE // MiB // BPP_WIDTH * SCALE, BPP_WIDTH * SCALE, 3)
            held_blocks = [b for o, n in st["regions"] for b in range(o // MiB, (o + n) // MiB)]
            blue = [b for b in range(SIZE // MiB) if is_blue(block_colour(rgb, b))]
            assert held_blocks and blue == held_blocks, (st["cycle"], st["regions"],
                                                         sorted(set(blue) ^ set(held_blocks)))
            assert not any(is_red(block_colour(rgb, b)) for b in range(SIZE // MiB))
            cold_colours = {block_colour(rgb, b) for z in COLD
                            for b in range(z[0] // MiB, (z[0] + z[1]) // MiB)}
            assert not any(is_blue(col) or is_red(col) for col in cold_colours), cold_colours

            vm.write(*write, pattern=0xC3)
            d.wait(lambda s: covers(s["rewritten_ranges"], write), "the write reported")
            d.wait_cycles(2)
            rgb = pixels(map_png)
            assert is_red(block_colour(rgb, wblock)), block_colour(rgb, wblock)
            others = [b for b in held_blocks if b != wblock]
            assert all(is_blue(block_colour(rgb, b)) for b in others)
            # The heat map: the same grid; cold zones at the cold end of viridis, the hot zone not.
            heat = pixels(heat_png)
            assert heat.shape == rgb.shape
            cold = block_colour(heat, COLD[1][0] // MiB + 20)
            assert cold == (0x44, 0x01, 0x54), cold
            assert block_colour(heat, wblock, uniform=False) != cold
            d.wait_cycles(4)
        w.stop()
    assert not reader.failures, reader.failures[:5]
    assert reader.reads >= 200, f"only {reader.reads} PNG reads"
    for p in (map_png, heat_png):
        assert len(reader.sizes[str(p)]) == 1, reader.sizes[str(p)]
        (fmt, size, _mode), = reader.sizes[str(p)]
        assert fmt == "PNG" and size[0] >= 512 and size[1] > SIZE // MiB // BPP_WIDTH * SCALE
        assert len(reader.inodes[str(p)]) >= 5, "the PNG is not replaced (new file) each cycle"
    d.assert_within_budget()
    d.assert_clean_stderr()
