"""Arriving fast (issue 40): a warm restart onto an evicted page cache (a host reboot) holds
the saved hot set at once, its first selection not paced, whatever the access source.

Three data images, each with saved heat over a 54 MiB zone (160 MiB together), written
with ``warm_state.save`` as a stopping daemon writes it; the images are evicted (fsync +
``POSIX_FADV_DONTNEED``) and nothing reads them. The daemon runs with ``--load-rate 16M``:
paced, the hot set would take 10 s to load; the saved heat must be held within 5 s of
the start (a generous deadline: unpaced it takes well under a second here).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.support.pagecache import data_image
from tests.support.images import evict, resident_bytes
from tests.support.daemon_proc import DaemonProc
from vmdisktouch.adapters import warm_state
from vmdisktouch.system.image import open_image

MiB = 1 << 20
ZONE = (32 * MiB, 54 * MiB)
DEADLINE = 5.0


def zone_held(status) -> int:
    end = ZONE[0] + ZONE[1]
    return sum(max(0, min(end, o + n) - max(ZONE[0], o))
               for d in status["disks"] for o, n in d["regions"])


def save_heat(state_dir, path) -> None:
    img = open_image(str(path))
    try:
        n = img.block_count(MiB)
        heat = np.zeros(n, dtype=np.float32)
        heat[ZONE[0] // MiB:(ZONE[0] + ZONE[1]) // MiB] = 1.0
        warm_state.save(str(state_dir), img, MiB, heat, np.zeros_like(heat),
                        [(ZONE[0] // MiB, (ZONE[0] + ZONE[1]) // MiB)], time.time())
    finally:
        img.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["mincore", "trace"])
def test_a_warm_restart_onto_an_evicted_cache_holds_the_hot_set_at_once(tmp_path, source):
    images = [data_image(tmp_path / f"disk{i}.img", 128 * MiB) for i in range(3)]
    state = tmp_path / "state"
    for img in images:
        save_heat(state, img)
        evict(img)
        assert resident_bytes(img) < 4 * MiB
    d = DaemonProc(tmp_path, images, "--max-hold", "256M", "--min-free", "0", "--uri", "",
                   "--load-rate", "16M", "--access-source", source,
                   "--state-dir", str(state))
    try:
        started = time.monotonic()
        st = d.wait_status(lambda s: zone_held(s) >= 0.9 * 3 * ZONE[1],
                           "90 % of the saved hot set held", timeout=30)
        took = time.monotonic() - started
        assert took < DEADLINE, f"90 % of the hot set held after {took:.1f} s"
        assert all(disk["warmed_from"] == "state" for disk in st["disks"]), st["disks"]
    finally:
        assert d.stop() == 0, d.output()[-2000:]
