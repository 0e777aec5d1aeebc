"""VMDISKTOUCH_RECORD: the daemon's own record of a run replays through the pure policy.

A real daemon serves a real image while the test reads a hot zone and
rewrites part of it; the record it writes is replayed cycle by cycle with
``tests.support.replay.replay``, and every recorded plan must come out of
the policy again: the recorder writes what the cycle really observed and
decided, so the golden traces can be re-recorded with it.
"""

from __future__ import annotations

import os

from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.pagecache import data_image, read_range
from tests.support.replay import read_record, replay

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
    cycles = read_record(record)
    assert len(cycles) >= 10
    assert any(c["targets"] for c in cycles) and any(c["rewritten"][0] for c in cycles)
    for i, c, plan, _ in replay(cycles):
        assert [list(r) for r in plan.targets] == c["targets"], f"cycle {i}"
