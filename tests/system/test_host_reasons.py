"""Why each disk of a host holds less than it wants (``daemon.reasons``), on real images:
a host of several disks (the mincore source, real holders, the real page cache), one reason
of the set per case, as the status and the log line give it. (The cgroup and lock-limit
reasons need a memory group or a process without CAP_IPC_LOCK: tests/e2e/test_faults_*.)"""

from __future__ import annotations

import logging

import pytest

from tests.clocks import Stepped
from tests.pagecache import data_image, held
from vmdisktouch.config import settings
from vmdisktouch.daemon.build import build
from vmdisktouch.daemon.host import Host
from vmdisktouch.system import meminfo
from vmdisktouch.system.image import open_image

MiB = 1 << 20


@pytest.fixture
def host(tmp_path):
    made = []

    def make(paths, budget, **kw):
        clock = Stepped()
        cfg = settings.resolve({"max_hold": budget, "interval": 5.0, "min_free": 0,
                                "access_source": "mincore", "load_rate": 0,
                                "sigma_resident": 0, **kw})
        watchers = [build(open_image(p), cfg, clock=clock, memcg=None) for p in paths]
        for k, w in enumerate(watchers):
            w.domain, w.target = f"vm{k + 1}", "vda"
        h = Host(watchers, cfg.max_hold, cfg.block_size)
        h.test_clock = clock
        made.append(h)
        return h

    yield make
    for h in made:
        h.close()


def tick(h, n=1):
    for _ in range(n):
        h.test_clock.t += 5.0
        h.tick()
    return {w.image.path: w.last_report for w in h.watchers}


def images(tmp_path, n, size=32 * MiB):
    return [data_image(tmp_path / f"{k}.img", size) for k in range(n)]


def test_the_budget_went_to_a_hotter_disk_named_by_domain_and_target(tmp_path, host, caplog):
    caplog.set_level(logging.INFO, logger="vmdisktouch")
    a, b = images(tmp_path, 2)
    h = host([a, b], "8M")
    h.set_override(a, weight=4.0)                     # a's zone is four times as hot
    with held(a, [(0, 8 * MiB)]), held(b, [(0, 8 * MiB)]):
        r = tick(h)
    assert r[a].held_bytes == 8 * MiB and r[a].limited_by is None
    assert r[b].held_bytes == 0 and r[b].limited_by == "budget"
    assert r[b].not_held_reason == "the host budget went to hotter disks (most to vm1/vda)"
    assert any("not holding more: the host budget went to hotter disks (most to vm1/vda)"
               in m for m in caplog.messages)


def test_its_cap_and_its_weight(tmp_path, host):
    a, b = images(tmp_path, 2)
    h = host([a, b], "16M")
    h.set_override(a, cap=4 * MiB)
    h.set_override(b, weight=0.5)
    with held(a, [(0, 12 * MiB)]), held(b, [(0, 16 * MiB)]):
        r = tick(h)
    assert r[a].held_bytes == 4 * MiB and r[a].limited_by == "cap"
    assert r[a].not_held_reason == "its cap (4M) is full"
    assert r[b].held_bytes == 12 * MiB and r[b].limited_by == "weight"
    assert "weight 0.5" in r[b].not_held_reason


def test_no_evidence_nothing_above_the_threshold_and_the_domain_off(tmp_path, host):
    a, b, c, d = images(tmp_path, 4)
    h = host([a, b, c, d], "16M", threshold=0.2)
    off = next(w for w in h.watchers if w.image.path == d)
    off.hold_enabled = False                          # its domain is shut off
    # b: one page in each of its first 8 blocks: heat, but far below the threshold
    with held(a, [(0, 4 * MiB)]), held(b, [(k * MiB, 4096) for k in range(8)]), \
            held(d, [(0, 4 * MiB)]):
        r = tick(h)
    assert r[a].held_bytes == 4 * MiB and r[a].limited_by is None
    assert r[b].limited_by == "below_threshold" and "threshold 0.2" in r[b].not_held_reason
    assert r[c].limited_by == "no_evidence"
    assert r[d].limited_by == "domain_off" and r[d].held_bytes == 0


def test_the_memory_floor(tmp_path, host):
    a, b = images(tmp_path, 2)
    floor = meminfo.mem_available() + (1 << 30)      # above what is free: nothing loads
    h = host([a, b], "16M", min_free=floor)
    with held(a, [(0, 4 * MiB)]), held(b, [(0, 4 * MiB)]):
        r = tick(h)
    for p in (a, b):
        assert r[p].held_bytes == 0 and r[p].limited_by == "floor"
        assert "free-memory floor" in r[p].not_held_reason
