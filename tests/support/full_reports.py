"""Reports of a host of many disks with every figure set, as a busy trace-source host's
status gives them: what the metrics, the status and the pictures show at their largest."""

from __future__ import annotations

from vmdisktouch.core.mrc import CURVE_POINTS
from vmdisktouch.report import DiskLine, DiskReport, HostReport

GiB = 1 << 30


def full_disk(i: int, *, size: int = 64 * GiB) -> DiskReport:
    """Disk ``i`` of a libvirt domain (``guest-NNN/vda``), a 64 GiB image, with every
    optional figure given: a curve of ``CURVE_POINTS`` sizes, the gain and the curve's
    evidence, the miss cost, the spill, adopted with both gains, lost events, and a reason
    code the metrics do not know."""
    held = (i % 7) << 24
    return DiskReport(
        path=f"/var/lib/libvirt/images/guest-{i:03d}-vda.raw", domain=f"guest-{i:03d}",
        target="vda", pid=1, version="0", interval_seconds=5.0, cycle=10, cycle_seconds=0.01,
        size_bytes=size, block_size=1 << 20, budget_bytes=held + (1 << 24),
        host_budget_bytes=GiB, wanted_bytes=held + (2 << 24), held_bytes=held,
        resident_bytes=held * 2, regions=[[0, held]], rewritten_blocks=i, rewritten_ranges=[],
        mem_available_bytes=8 * GiB, min_free_bytes=GiB, loaded_bytes=held,
        loaded_from_disk_bytes=held // 2, released_bytes=0, skipped_bytes=0,
        not_held_reason="a reason", limited_by="a-code-not-listed", domain_active=True,
        warmed_from=None, holding=True, lock_cap_bytes=None, charges={},
        access_source="trace", events_lost=3, output_errors={}, time=0.0,
        trace={"lost_at": 1.0e9, "lost_at_start": 2},
        spill={"target_bytes": 1 << 20, "read_bytes": 1 << 20, "stopped": None},
        curve=[[size >> k, 0.9 / (k + 1)] for k in range(CURVE_POINTS)],
        mrc={"reads": 1000.0, "re_reads": 500.0, "window_seconds": 600.0,
             "enough_reads": True},
        gain={"cache_hit_ratio": 0.8, "held_read_share": 0.5,
              "held_reads_per_second": 100.0, "pages_read_per_second": 200.0,
              "next_gib": {"more_reads_per_second": 20.0}, "wants_bytes": held,
              "read_seconds_saved_per_second": 0.01},
        miss_cost={"seconds": 1e-4}, adopted_since=1.0e9, adopted_gain=1.5, advised_gain=1.6)


def full_host(n: int) -> HostReport:
    """A host serving ``n`` such disks."""
    disks = [full_disk(i) for i in range(n)]
    lines = [DiskLine(d.path, d.domain, d.target, 0, None, None, None, None, 0.0, None, 1.0)
             for d in disks]
    return HostReport(pid=1, version="0", interval_seconds=5.0, time=0.0, budget_bytes=GiB,
                      held_bytes=sum(d.held_bytes for d in disks),
                      mem_available_bytes=8 * GiB, min_free_bytes=GiB,
                      above_floor_bytes=7 * GiB, cycle=10, cycle_seconds=0.5, disks=disks,
                      lines=lines)
