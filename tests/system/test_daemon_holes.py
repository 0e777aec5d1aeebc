"""The daemon's cycle on a thin (sparse) image: the budget goes to data, never to holes.

In process (``DiskWatcher`` with an injected clock), on a real sparse file and
the real page cache. The guest's reads are cached and mlocked by the test
(``held``) so that the kernel's own reclaim cannot change them between cycles.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.pagecache import held, make_image
from vmdisktouch import daemon, settings
from vmdisktouch.system.image import open_image

MiB = 1 << 20
DATA = list(range(10, 26, 2))          # blocks 10, 12, ..., 24 hold data; 11, 13, ... are holes


def write_blocks(path, blocks) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        for b in blocks:
            os.pwrite(fd, os.urandom(MiB), b * MiB)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.fixture
def thin(tmp_path):
    path = make_image(tmp_path / "thin.raw", 64 * MiB)      # all hole
    write_blocks(path, DATA)
    return path


def watcher_for(path, max_hold: str):
    cfg = settings.resolve({"path": path, "max_hold": max_hold, "interval": 5.0, "min_free": 0})
    w = daemon.DiskWatcher(open_image(path), cfg)
    now = [0.0]
    w.clock = lambda: now[0]

    def tick():
        now[0] += 5.0
        return w.tick()
    return w, tick


def held_blocks(w) -> set[int]:
    return {b for s, e in w.holder.held_runs() for b in range(s, e)}


def test_the_budget_goes_to_data_blocks_not_to_the_holes_between_them(thin):
    # The guest reads blocks 10-25 (data and holes alike: a hole read is cached as zeros).
    with held(thin, [(10 * MiB, 16 * MiB)]):
        w, tick = watcher_for(thin, "8M")
        try:
            # The candidates are probed before the first selection: the 8 blocks of
            # budget go to the eight data blocks at once, none of it to the holes
            # between them (learning holes only from the holder's targets held
            # 4 MiB here: the hottest 8 blocks of the region, half of them holes).
            first = tick()
            assert held_blocks(w) == set(DATA) and first.held_bytes == 8 * MiB
            assert set(np.flatnonzero(w.holes).tolist()) >= {11, 13, 15}
            for _ in range(3):
                r = tick()
                assert held_blocks(w) <= set(DATA)

            # The guest fills hole 17 and frees nothing: the allocation changed, the known
            # holes are forgotten and learned again, and block 17 competes as data.
            # Never a hole held on the way; the budget is full of data again within 8 cycles.
            write_blocks(thin, [17])
            r = tick()
            assert not w.holes[17]
            full_at = None
            for k in range(8):
                r = tick()
                assert held_blocks(w) <= set(DATA) | {17}
                if r.held_bytes == 8 * MiB:
                    full_at = k
                    break
            assert full_at is not None, r
            assert not w.holes[17] and w.holes[[11, 13, 15]].all()
        finally:
            w.close()
