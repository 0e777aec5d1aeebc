"""VMDISKTOUCH_RECORD: the daemon's own record of a run replays through the pure policy.

A real daemon serves a real image while the test reads a hot zone and
rewrites part of it; the record it writes is replayed cycle by cycle with
``tests.support.replay.replay``, and every recorded plan must come out of
the policy again: the recorder writes what the cycle really observed and
decided, so the golden traces can be re-recorded with it. A host of three
disks writes one record (``daemon.record``), replayed through a fresh policy
per disk and one shared selection (``tests.support.replay.replay_host``).
"""

from __future__ import annotations

import os

from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.golden_host import record_host
from tests.support.pagecache import data_image, read_range
from tests.support.replay import disk_cycles, read_record, replay, replay_host

MiB = 1 << 20


def test_a_recorded_run_replays_to_the_same_plans(tmp_path):
    image = data_image(tmp_path / "disk.raw", 64 * MiB)
    record = tmp_path / "record.jsonl.gz"
    d = DaemonProc(tmp_path, image, "--min-free", "0", max_hold="16M", interval=0.3,
                   env={**env_without_systemd(), "VMDISKTOUCH_RECORD": str(record)})
    try:
        fd = os.open(image, os.O_WRONLY)
        try:
            for i in range(12):
                read_range(image, 8 * MiB, 8 * MiB)
                os.pwrite(fd, os.urandom(4096), (9 + i % 4) * MiB)
                d.wait_status(lambda s, i=i: s["cycle"] > i, f"cycle {i + 1}")
        finally:
            os.close(fd)
        assert d.stop() == 0
    finally:
        d.cleanup()
    lines = read_record(record)
    assert all(len(h["disks"]) == 1 for h in lines)       # a host of one
    cycles = disk_cycles(lines)
    assert len(cycles) >= 10
    assert any(c["targets"] for c in cycles) and any(c["rewritten"][0] for c in cycles)
    for i, c, plan, _ in replay(lines):
        assert [list(r) for r in plan.targets] == c["targets"], f"cycle {i}"


def test_a_recorded_host_of_three_disks_replays_to_the_same_plans(tmp_path):
    """One record for the host: every cycle has the three disks and the selection, and
    the replay through one shared selection makes every disk's plan and share again."""
    record = tmp_path / "host.jsonl.gz"
    images = record_host(tmp_path, record, cycles=12)
    lines = read_record(record)
    assert len(lines) >= 10
    assert all([d["path"] for d in h["disks"]] == images for h in lines)
    assert {h["budget_blocks"] for h in lines} == {24}
    for path in images:
        assert any(d["targets"] for h in lines for d in h["disks"] if d["path"] == path), path
    # The curves split the budget once one disk's own has come back (the others by the
    # curves their heats imply): the replay splits it again.
    assert any(all(d["demand"] for d in h["disks"]) and
               any(d["demand"]["seen"] for d in h["disks"]) for h in lines)
    for i, h, disks, alloc in replay_host(lines):
        for c, plan, _ in disks:
            assert [list(r) for r in plan.targets] == c["targets"], f"cycle {i}, {c['path']}"
        chosen = [s for s in h["selection"] if s is not None]
        assert [s["runs"] for s in chosen] == [[list(r) for r in rs] for rs in alloc.runs]
        assert [s["share"] for s in chosen] == alloc.share, f"cycle {i}"
        assert [s["limit"] for s in chosen] == alloc.limit, f"cycle {i}"
