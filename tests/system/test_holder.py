"""The holder on real files, real mlock and the real page cache.

Residency is measured with mincore(2) on a separate, never-touched mapping,
at once after each step (the kernel here pages out idle unheld page cache
on its own, see FIELD-NOTES; held pages are mlocked and cannot go).
Locked memory is VmLck of this process, measured against a baseline.
Every test releases its holds (fixture teardown) and works under tmp_path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.support.images import evict, make_image
from tests.support.pagecache import PAGE, read_range
from vmdisktouch.core.runs import (clip_runs, diff_runs, intersect, merge_runs, priority_pieces,
                                   subtract)
from vmdisktouch.errors import ClosedError
from vmdisktouch.system.hold import holder as holder_mod
from tests.support.procfs import vmlck
from vmdisktouch.system import libc
from vmdisktouch.system.hold.holder import ApplyResult, Holder
from vmdisktouch.system.image import open_image

MiB = 1 << 20
GiB = 1 << 30
BS = MiB
PLENTY = 1 << 50          # a fake MemAvailable that never limits


def locked() -> int:
    return vmlck(os.getpid())


def resident_pages(fd: int, offset: int, length: int) -> int:
    """Pages of [offset, offset+length) in the page cache (mincore on a fresh mapping)."""
    start = offset - offset % PAGE
    span = offset + length - start
    if span <= 0:
        return 0
    addr = libc.mmap_file(fd, start, span)
    try:
        vec = np.zeros(-(-span // PAGE), dtype=np.uint8)
        return int((libc.mincore(addr, span, vec) & 1).sum())
    finally:
        libc.munmap(addr, span)


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


def image_maps(path) -> int:
    """Mappings (VMAs) of ``path`` in this process."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip().endswith(real))


@pytest.fixture
def img(tmp_path):
    """A non-sparse 64 MiB image, evicted; yields (path, fd)."""
    path = make_image(tmp_path / "disk.raw", 64 * MiB, sparse=False)
    evict(path)
    fd = os.open(path, os.O_RDONLY)
    yield path, fd
    os.close(fd)


@pytest.fixture
def holders():
    """Makes holders and closes them all at teardown; checks VmLck is back to its baseline.

    A holder holds the image that ``fd`` is open on (opened again with ``open_image``).
    """
    base = locked()
    made = []

    def make(fd, size, *, max_hold=64 * MiB, min_free=0, mem=lambda: PLENTY, rate=0,
             sleep=lambda s: None, block_size=BS, **kw):
        image = open_image(os.readlink(f"/proc/self/fd/{fd}"))
        assert image.size == size
        h = Holder(image, block_size, max_hold, min_free, mem_available=mem,
                   load_rate=rate, sleep=sleep, **kw)
        made.append((h, image))
        return h

    make.base = base
    yield make
    for h, image in made:
        h.close()
        image.close()
    assert locked() == base


# -- pure run arithmetic ---------------------------------------------------

def test_run_arithmetic():
    assert clip_runs([(5, 9), (-2, 3), (8, 20), (30, 40), (4, 4)], 10) == [(5, 9), (0, 3), (8, 10)]
    assert merge_runs([(5, 9), (0, 3), (3, 4), (8, 12), (20, 20)]) == [(0, 4), (5, 12)]
    assert intersect((4, 10), [(0, 5), (6, 7), (9, 30), (31, 32)]) == [(4, 5), (6, 7), (9, 10)]
    assert subtract((4, 10), [(0, 5), (6, 7), (9, 30)]) == [(5, 6), (7, 9)]
    assert subtract((4, 10), []) == [(4, 10)]
    # Overlaps go to the higher-priority (earlier) target; clipping to the file.
    assert priority_pieces([(10, 20), (0, 12), (18, 30), (40, 50)], 45) == [
        (10, 20), (0, 10), (20, 30), (40, 45)]
    assert priority_pieces([(8, 9), (2, 4), (4, 6)], 100) == [(8, 9), (2, 4), (4, 6)]
    assert diff_runs([(0, 10), (20, 30)], [(25, 40), (5, 8)]) == (
        [(0, 5), (8, 10), (20, 25)], [(30, 40)])


def test_run_arithmetic_matches_masks():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 80))
        targets = [tuple(sorted(rng.integers(-5, n + 5, 2).tolist())) for _ in range(rng.integers(0, 8))]
        held_mask = rng.random(n) < 0.4
        held = merge_runs((i, i + 1) for i in np.flatnonzero(held_mask).tolist())
        pieces = priority_pieces(targets, n)
        # Pieces: disjoint, union = union of the clipped targets, each inside its
        # earliest target, in priority order.
        want = np.zeros(n, bool)
        rank = np.full(n, -1)
        for r, (a, b) in enumerate(targets):
            a, b = max(a, 0), min(b, n)
            if b > a:
                rank[a:b] = np.where(rank[a:b] < 0, r, rank[a:b])
                want[a:b] = True
        got = np.zeros(n, bool)
        last_rank = -1
        for a, b in pieces:
            assert b > a and not got[a:b].any()
            got[a:b] = True
            assert len(set(rank[a:b].tolist())) == 1 and rank[a] >= last_rank
            last_rank = rank[a]
        assert (got == want).all()
        release, load = diff_runs(held, pieces)
        rel = np.zeros(n, bool)
        for a, b in release:
            rel[a:b] = True
        lod = np.zeros(n, bool)
        for a, b in load:
            lod[a:b] = True
        assert (rel == (held_mask & ~want)).all()
        assert (lod == (want & ~held_mask)).all()
        assert release == sorted(release)


# -- loading ----------------------------------------------------------------

def test_load_is_resident_locked_exactly_and_read_once(img, holders):
    path, fd = img
    h = holders(fd, 64 * MiB)
    assert resident_pages(fd, 0, 64 * MiB) == 0
    before = read_bytes()
    result = h.apply([(8, 40)])
    read = read_bytes() - before

    assert result == ApplyResult(loaded_bytes=32 * MiB, released_bytes=0, skipped_bytes=0)
    assert h.held_runs() == [(8, 40)] and h.held_bytes() == 32 * MiB
    assert locked() - holders.base == 32 * MiB
    assert resident_pages(fd, 8 * MiB, 32 * MiB) == 32 * MiB // PAGE
    # mlock faults each page in itself, in large sequential reads: the run is read
    # from disk once, and (MADV_SEQUENTIAL) the readahead does not spill past its end.
    assert 32 * MiB <= read <= 32 * MiB + 2 * MiB, read
    assert resident_pages(fd, 40 * MiB, 24 * MiB) <= (2 * MiB) // PAGE

    assert h.release_all() == 32 * MiB
    assert h.held_runs() == [] and locked() == holders.base


def test_small_regions_load_nothing_beyond_their_ends(img, holders):
    """Readahead past a region's end would look like guest use next cycle, and the holds
    would creep outwards lease after lease: loading must cache exactly the targets."""
    path, fd = img
    h = holders(fd, 64 * MiB)
    targets = [(5, 8), (20, 21), (40, 42), (44, 56)]      # 12 MiB: over one WILLNEED cap
    h.apply(targets)
    for a, b in targets:
        assert resident_pages(fd, a * MiB, (b - a) * MiB) == (b - a) * MiB // PAGE
    outside = resident_pages(fd, 0, 64 * MiB) - sum(b - a for a, b in targets) * MiB // PAGE
    assert outside == 0, f"{outside} pages cached outside the targets"


def test_held_pages_survive_dontneed_and_unheld_are_evicted(img, holders):
    path, fd = img
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)
    for _ in range(5):                             # the whole image is cached: read again
        for off in range(0, 64 * MiB, 8 * MiB):    # where this kernel's DAMON pageout took
            os.pread(fd, 8 * MiB, off)             # a few pages meanwhile (14 once)
        if resident_pages(fd, 0, 64 * MiB) == 64 * MiB // PAGE:
            break
    assert resident_pages(fd, 0, 64 * MiB) == 64 * MiB // PAGE
    h = holders(fd, 64 * MiB)
    before = read_bytes()
    h.apply([(40, 48), (4, 12)])
    assert read_bytes() - before == 0              # already cached: locking reads nothing

    evict(path)
    assert resident_pages(fd, 4 * MiB, 8 * MiB) == 8 * MiB // PAGE
    assert resident_pages(fd, 40 * MiB, 8 * MiB) == 8 * MiB // PAGE
    unheld = (resident_pages(fd, 0, 4 * MiB) + resident_pages(fd, 12 * MiB, 28 * MiB)
              + resident_pages(fd, 48 * MiB, 16 * MiB))
    assert unheld == 0


def test_release_cold_runs_first(img, holders):
    path, fd = img
    h = holders(fd, 64 * MiB, max_hold=16 * MiB)
    h.apply([(0, 8), (16, 24)])
    assert h.held_bytes() == 16 * MiB

    # The budget is full: the new run only fits because the cold one goes first.
    result = h.apply([(16, 24), (30, 38)])
    assert result.released_bytes == 8 * MiB and result.loaded_bytes == 8 * MiB
    assert result.skipped_bytes == 0
    assert h.held_runs() == [(16, 24), (30, 38)]
    assert locked() - holders.base == 16 * MiB

    evict(path)
    assert resident_pages(fd, 0, 8 * MiB) == 0
    assert resident_pages(fd, 16 * MiB, 8 * MiB) == 8 * MiB // PAGE

    # Shrinking a run releases just its cold end; an empty target releases everything.
    result = h.apply([(16, 20), (30, 38)])
    assert result.released_bytes == 4 * MiB and h.held_runs() == [(16, 20), (30, 38)]
    assert h.apply([]).released_bytes == 12 * MiB
    assert locked() == holders.base


# -- the budget ---------------------------------------------------------------

def test_never_exceeds_max_hold_even_mid_apply(img, holders):
    path, fd = img
    samples = []

    def sample():
        samples.append(locked() - holders.base)

    def mem():
        sample()
        return PLENTY

    def sleep(seconds):
        sample()

    budget = 20 * MiB
    h = holders(fd, 64 * MiB, max_hold=budget, mem=mem, sleep=sleep, rate=4 * GiB,
                chunk_bytes=2 * MiB)
    # Targets over the budget (a caller's mistake): loads stop exactly at the budget.
    result = h.apply([(0, 8), (20, 28), (40, 48)])
    assert h.held_runs() == [(0, 8), (20, 28), (40, 44)]
    assert result.loaded_bytes == budget and result.skipped_bytes == 4 * MiB
    # A new target entirely elsewhere: released first, so still never above the budget.
    result = h.apply([(50, 64), (10, 16)])
    assert result.released_bytes == budget and h.held_runs() == [(10, 16), (50, 64)]
    sample()
    assert len(samples) > 15
    assert max(samples) <= budget
    assert samples[-1] == h.held_bytes() == budget


def test_sleep_returning_true_stops_loading(img, holders):
    path, fd = img
    h = holders(fd, 64 * MiB, rate=64 * MiB, chunk_bytes=4 * MiB, sleep=lambda s: True)
    result = h.apply([(0, 16), (20, 30)])
    assert result.stopped
    assert h.held_runs() == [(0, 4)] and result.loaded_bytes == 4 * MiB


def test_pacing_spaces_the_chunks(img, holders):
    path, fd = img
    waits = []
    h = holders(fd, 64 * MiB, rate=8 * MiB, chunk_bytes=2 * MiB,
                sleep=lambda s: waits.append(s))
    h.apply([(0, 8)])
    assert len(waits) == 3                        # between the 4 chunks, none after the last
    assert all(0 < w <= 0.25 for w in waits)


def test_a_cold_disks_first_loads_are_not_paced(img, holders):
    """``unpaced`` (the watcher sets it while its trace source is cold): loaded at once,
    from disk all the same; paced again once it is cleared."""
    path, fd = img
    waits = []
    h = holders(fd, 64 * MiB, rate=8 * MiB, chunk_bytes=2 * MiB,
                sleep=lambda s: waits.append(s))
    h.unpaced = True
    h.apply([(0, 8)])
    assert waits == [] and h.held_runs() == [(0, 8)]
    h.unpaced = False
    h.apply([(0, 8), (16, 24)])
    assert len(waits) == 3


def test_only_what_comes_from_disk_is_paced(img, holders):
    """Chunks already cached (a renewed lease) are neither waited for nor read ahead."""
    path, fd = img
    read_range(path, 0, 8 * MiB)                  # blocks 0-7 cached, 8-15 cold
    waits = []
    h = holders(fd, 64 * MiB, rate=8 * MiB, chunk_bytes=2 * MiB,
                sleep=lambda s: waits.append(s))
    h.apply([(0, 16)])
    assert h.held_runs() == [(0, 16)]
    # 8 chunks: the 4 cached ones start no pacing, so only the cold ones are spaced:
    # one wait before each cold chunk that follows a cold chunk.
    assert len(waits) == 3
    assert all(0 < w <= 0.25 for w in waits)


def test_a_lower_budget_cuts_lowest_priority_first(img, holders):
    path, fd = img
    h = holders(fd, 64 * MiB)
    h.apply([(20, 28), (0, 8), (40, 48)])         # priority: 20-28 > 0-8 > 40-48
    assert h.ledger.set_budget(13 * MiB) == 11 * MiB
    assert h.held_runs() == [(0, 5), (20, 28)]
    assert locked() - holders.base == 13 * MiB


# -- the free-memory floor ------------------------------------------------------

def test_floor_blocks_loading(img, holders):
    path, fd = img
    floor = 1 * GiB
    h = holders(fd, 64 * MiB, min_free=floor, mem=lambda: floor - 1)
    result = h.apply([(0, 8)])
    assert result.loaded_bytes == 0 and result.skipped_bytes == 8 * MiB
    assert h.held_runs() == [] and locked() == holders.base


def test_floor_counts_the_chunk_about_to_be_loaded(img, holders):
    path, fd = img
    floor = 1 * GiB
    h = holders(fd, 64 * MiB, min_free=floor, chunk_bytes=4 * MiB)
    h.mem_available = lambda: floor + 5 * MiB - h.held_bytes()   # loading uses memory
    result = h.apply([(0, 16), (30, 40)])
    assert h.held_runs() == [(0, 5)]
    assert result.loaded_bytes == 5 * MiB and result.skipped_bytes == 21 * MiB
    assert result.released_bytes == 0             # exactly at the floor: nothing shed


def test_floor_sheds_lowest_priority_first(img, holders):
    path, fd = img
    floor = 1 * GiB
    mem = {"avail": PLENTY}
    h = holders(fd, 64 * MiB, min_free=floor, mem=lambda: mem["avail"])
    targets = [(30, 38), (0, 8), (50, 58)]       # priority order
    h.apply(targets)
    assert h.held_bytes() == 24 * MiB

    # MemAvailable drops 3 MiB below the floor; releasing gives memory back.
    held0 = h.held_bytes()
    h.mem_available = lambda: floor - 3 * MiB + (held0 - h.held_bytes())
    result = h.apply(targets)
    assert result.loaded_bytes == 0 and result.released_bytes == 3 * MiB
    assert h.held_runs() == [(0, 8), (30, 38), (50, 55)]   # the tail of the lowest priority

    # 10 MiB below: the lowest-priority run goes entirely, then the next one's tail.
    held0 = h.held_bytes()
    h.mem_available = lambda: floor - 10 * MiB + (held0 - h.held_bytes())
    h.apply(targets)
    assert h.held_runs() == [(0, 3), (30, 38)]

    # Memory never comes back: everything is shed, and nothing loads.
    h.mem_available = lambda: floor - 1
    result = h.apply(targets)
    assert result.loaded_bytes == 0 and h.held_runs() == []
    assert locked() == holders.base


# -- size changes -------------------------------------------------------------

def test_resize_after_truncate_drops_holds_beyond_the_end(img, holders):
    path, fd = img
    h = holders(fd, 64 * MiB)
    h.apply([(0, 16), (30, 36), (40, 60)])
    assert h.held_bytes() == 42 * MiB

    new_size = 33 * MiB + 100
    os.truncate(path, new_size)                   # the pages beyond are gone now
    released = h.resize(new_size)
    assert h.held_runs() == [(0, 16), (30, 33)]
    assert released == 23 * MiB
    assert locked() - holders.base == h.held_bytes() == 19 * MiB

    # The new partial last block is held page-rounded.
    result = h.apply([(0, 16), (30, 40)])
    assert h.held_runs() == [(0, 16), (30, 34)]
    assert result.loaded_bytes == PAGE
    assert locked() - holders.base == h.held_bytes() == 19 * MiB + PAGE

    # Growing again: the old partial block is dropped and can be held whole.
    os.truncate(path, 40 * MiB)
    assert h.resize(40 * MiB) == PAGE
    assert h.held_runs() == [(0, 16), (30, 33)]
    # The old partial block (it holds data) is held whole; the grown part is a hole.
    h.apply([(0, 16), (30, 40)])
    assert h.held_runs() == [(0, 16), (30, 34)]
    assert locked() - holders.base == h.held_bytes() == 20 * MiB
    with open(path, "r+b") as f:                  # the guest fills it: held whole
        f.seek(33 * MiB + 100)
        f.write(os.urandom(7 * MiB - 100))
    h.apply([(0, 16), (30, 40)])
    assert h.held_runs() == [(0, 16), (30, 40)]
    assert locked() - holders.base == h.held_bytes() == 26 * MiB


@pytest.mark.parametrize("skip_holes", [True, False])
def test_truncated_before_resize_fails_the_region_not_the_daemon(img, holders, skip_holes):
    path, fd = img
    h = holders(fd, 64 * MiB)
    h.skip_holes = skip_holes       # False: as for a block device (no SEEK_DATA to ask)
    h.apply([(0, 8)])
    os.truncate(path, 20 * MiB)
    # The holder still believes 64 MiB. Past the end SEEK_DATA finds no data, so
    # nothing is tried there; without it mlock beyond the end fails with ENOMEM,
    # which must not be taken for the lock limit.
    result = h.apply([(0, 8), (10, 16), (30, 40)])
    assert h.held_runs() == [(0, 8), (10, 16)]
    assert result.skipped_bytes == (0 if skip_holes else 10 * MiB)
    assert locked() - holders.base == h.held_bytes() == 14 * MiB
    h.resize(20 * MiB)
    assert h.held_runs() == [(0, 8), (10, 16)]


# -- mappings -------------------------------------------------------------------

def test_many_scattered_runs_stay_under_the_segment_cap(tmp_path, holders):
    path = make_image(tmp_path / "small.raw", 64 * MiB, sparse=False)
    fd = os.open(path, os.O_RDONLY)
    try:
        bs = PAGE
        h = holders(fd, 64 * MiB, block_size=bs)
        targets = [(i, i + 1) for i in range(0, 16384, 2)]       # 8192 one-page regions
        result = h.apply(targets)
        cap = holder_mod.MAX_SEGMENTS
        assert h.mapping_count() == cap
        assert image_maps(path) <= cap
        assert result.loaded_bytes == cap * bs
        assert result.skipped_bytes == (len(targets) - cap) * bs
        assert locked() - holders.base == h.held_bytes() == cap * bs
        assert h.held_runs() == targets[:cap]
        h.release_all()
        assert image_maps(path) == 0
    finally:
        os.close(fd)


def test_a_growing_region_is_merged_into_few_mappings(img, holders):
    path, fd = img
    h = holders(fd, 64 * MiB)
    for k in range(12):                           # grows a block at each end, every cycle
        h.apply([(30 - k, 31 + k)])
        assert h.held_runs() == [(30 - k, 31 + k)]
        assert h.mapping_count() <= holder_mod.MAX_PIECES_PER_RUN
        assert image_maps(path) <= h.mapping_count()
        assert locked() - holders.base == h.held_bytes() == (2 * k + 1) * MiB
    evict(path)
    assert resident_pages(fd, 19 * MiB, 23 * MiB) == 23 * MiB // PAGE
    # A drifting window: load one block at the front, release one at the back.
    for k in range(10):
        h.apply([(19 + k, 42 + k)])
        assert h.held_runs() == [(19 + k, 42 + k)]
        assert h.mapping_count() <= holder_mod.MAX_PIECES_PER_RUN
        assert locked() - holders.base == h.held_bytes() == 23 * MiB


def test_a_large_mapping_keeps_its_lock_while_its_window_drifts(img, holders, monkeypatch):
    """Only mappings up to MERGE_MAX_BYTES are merged: a drifting window over a large hold
    moves the locks of the small pieces at its ends, never the large one's."""
    from vmdisktouch.system.hold import mappings as mappings_mod
    path, fd = img
    monkeypatch.setattr(mappings_mod, "MERGE_MAX_BYTES", 8 * MiB)
    h = holders(fd, 64 * MiB)
    h.apply([(10, 30)])                           # 20 MiB: large
    locks = []
    real = libc.mlock
    monkeypatch.setattr(libc, "mlock", lambda addr, n: locks.append(n) or real(addr, n))
    for k in range(1, 12):                        # load one block at the front, release one
        h.apply([(10 + k, 30 + k)])
        assert h.held_runs() == [(10 + k, 30 + k)]
        assert locked() - holders.base == h.held_bytes() == 20 * MiB
    assert max(locks) <= 8 * MiB                  # the large mapping's lock never moved
    assert sum(locks) >= 11 * MiB                 # the pieces were loaded, and merged
    assert h.mapping_count() <= holder_mod.MAX_PIECES_PER_RUN


# -- the lock limit ----------------------------------------------------------------

def test_lock_limit_stops_loading_keeps_what_is_locked_and_is_explained(img):
    """Without CAP_IPC_LOCK, RLIMIT_MEMLOCK stops mlock: the locked prefix stays, nothing
    stray is locked, loading is not retried until a new budget, and the reason says how
    to raise the limit."""
    path, fd = img
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(path, 0o644)
    child = textwrap.dedent(f"""
        import os, resource
        from vmdisktouch.system.hold.holder import Holder
        from vmdisktouch.system.image import open_image
        from tests.support.procfs import vmlck
        image = open_image({path!r})
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (4 << 20, 4 << 20))
        os.setgroups([]); os.setgid(65534); os.setuid(65534)     # drops CAP_IPC_LOCK
        h = Holder(image, 1 << 20, 64 << 20, 0, mem_available=lambda: 1 << 50,
                   load_rate=0, sleep=lambda s: None, chunk_bytes=2 << 20)
        r = h.apply([(0, 16)])
        print("REFUSED", h.held_bytes(), vmlck("self"), h.lock_cap, r.lock_refused)
        r = h.apply([(0, 16)])
        print("AGAIN", r.loaded_bytes, r.lock_refused)
        h.set_floor(0)
        print("RESET", h.lock_cap)
        h.close()
        print("AFTER", vmlck("self"))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                         timeout=60)
    assert out.returncode == 0, out.stderr
    first, again, reset, after = out.stdout.splitlines()
    assert first.startswith("REFUSED"), out.stdout
    _, held, vmlck, cap, *msg = first.split()
    assert 0 < int(held) == int(vmlck) == int(cap) <= 4 * MiB   # the locked prefix, no stray
    assert "LimitMEMLOCK=infinity" in " ".join(msg) and "CAP_IPC_LOCK" in " ".join(msg)
    assert again == "AGAIN 0 None"            # capped: no read, no refused mlock each cycle
    assert reset == "RESET None"              # a reload tries again
    assert after == "AFTER 0"


def test_closed_holder_refuses_work(img):
    path, fd = img
    with open_image(path) as image:
        h = Holder(image, BS, 8 * MiB, 0, mem_available=lambda: PLENTY, load_rate=0,
                   sleep=lambda s: None)
        h.apply([(0, 2)])
        h.close()
        h.close()
        assert h.held_bytes() == 0
        with pytest.raises(ClosedError):
            h.apply([(0, 2)])


# -- holes of sparse files -------------------------------------------------

def test_holes_of_a_sparse_file_are_not_held_and_written_holes_are_held_next(tmp_path, holders):
    """A hole reads as zeros without disk I/O: locking it would spend the budget on nothing."""
    path = make_image(tmp_path / "sparse.raw", 64 * MiB)          # all hole
    data = os.urandom(MiB)
    with open(path, "r+b") as f:                                   # data in blocks 10 and 12-13
        for off, n in ((10 * MiB + 5 * PAGE, PAGE), (12 * MiB, 2 * MiB)):
            f.seek(off)
            f.write(data[:n] if n <= MiB else data + data)
        f.flush()
        os.fsync(f.fileno())
    evict(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        h = holders(fd, 64 * MiB)
        r = h.apply([(0, 20), (40, 50)])                           # (40, 50) is all hole
        assert h.held_runs() == [(10, 11), (12, 14)]
        assert r.loaded_bytes == h.held_bytes() == 3 * MiB == locked() - holders.base
        assert resident_pages(fd, 0, 10 * MiB) == 0                # the hole before: not read
        assert resident_pages(fd, 10 * MiB, MiB) == MiB // PAGE    # a data block is held whole
        # The guest writes into a hole of the target: held at the next apply.
        wfd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(wfd, data[:PAGE], 45 * MiB)
            os.fsync(wfd)
        finally:
            os.close(wfd)
        r = h.apply([(0, 20), (40, 50)])
        assert h.held_runs() == [(10, 11), (12, 14), (45, 46)]
        assert r.loaded_bytes == MiB and r.released_bytes == 0
    finally:
        os.close(fd)


def test_a_block_device_is_held_whole(loop_device_of, holders):
    """Block devices have no holes to skip: a loop device over a sparse file is held as asked."""
    dev = loop_device_of(16 * MiB)
    fd = os.open(dev, os.O_RDONLY)
    try:
        h = holders(fd, 16 * MiB)
        assert not h.skip_holes
        h.apply([(2, 6)])
        assert h.held_runs() == [(2, 6)] and h.held_bytes() == 4 * MiB
        h.release_all()
    finally:
        os.close(fd)
