"""Why each disk of a host holds less than it wants (``daemon.reasons``), on real images:
a host of several disks (the mincore source, real holders, the real page cache), one reason
of the set per case, as the status and the log line give it. (The cgroup and lock-limit
reasons need a memory group or a process without CAP_IPC_LOCK: tests/e2e/test_faults_*.)"""

from __future__ import annotations

import logging

from tests.support.pagecache import data_image, held
from tests.system.test_host import host  # noqa: F401 - the fixture: a host of real images
from vmdisktouch.system import meminfo

MiB = 1 << 20


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
    h = host([a, b], "8M", named=True)
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
    h = host([a, b], "16M", named=True)
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
    h = host([a, b, c, d], "16M", named=True, threshold=0.2)
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
    h = host([a, b], "16M", named=True, min_free=floor)
    with held(a, [(0, 4 * MiB)]), held(b, [(0, 4 * MiB)]):
        r = tick(h)
    for p in (a, b):
        assert r[p].held_bytes == 0 and r[p].limited_by == "floor"
        assert "free-memory floor" in r[p].not_held_reason
