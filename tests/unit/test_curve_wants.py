"""When a disk's curve speaks for it (caps what it wants, splits the host budget): once
the guest has read enough to show reuse."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vmdisktouch.core.mrc import MissRatioCurve
from vmdisktouch.core.regions import DiskMap
from vmdisktouch.daemon.disk import EVIDENCE, DiskWatcher

PAGE = 4096
MiB = 1 << 20


def watcher(pages: np.ndarray) -> SimpleNamespace:
    mrc = MissRatioCurve(half_life=0)
    mrc.feed(pages)
    mrc.decay(1.0)
    gain = {"wants_bytes": mrc.wants(64 * MiB, PAGE)}
    w = SimpleNamespace(source=SimpleNamespace(mrc=mrc, gain=gain, page_size=PAGE),
                        miss_cost=SimpleNamespace(seconds=0.001), block_size=MiB)
    w._curve_seen = lambda candidates: DiskWatcher._curve_seen(w, candidates)
    return w


def disk_map(candidate_mib: int, heat: np.ndarray | None = None) -> DiskMap:
    """A map of 64 one-MiB blocks whose first ``candidate_mib`` are its candidates."""
    heat = np.ones(64, dtype=np.float32) if heat is None else heat
    return DiskMap(heat, 0.5, candidates=np.arange(64) < candidate_mib)


def test_a_first_pass_leaves_the_wants_to_the_heat():
    """16 MiB read once: no reuse yet, so the curve would want nothing; it has not seen
    EVIDENCE passes of the 16 MiB the heat would hold, so it does not say."""
    once = watcher(np.arange(16 * MiB // PAGE))
    assert once.source.gain["wants_bytes"] == 0
    assert DiskWatcher.curve_wants(once, 16 * MiB) is None


def test_passes_enough_to_show_reuse_let_the_curve_cap_the_wants():
    """A 4 MiB zone read over and over, and each of 12 MiB elsewhere once: the heat
    would hold all 16 MiB; the curve, having seen more than EVIDENCE times that, wants
    the zone."""
    zone = np.tile(np.arange(4 * MiB // PAGE), 2 * EVIDENCE * 4)
    rest = np.arange(4 * MiB // PAGE, 16 * MiB // PAGE)
    w = watcher(np.concatenate((rest, zone)))
    wants = DiskWatcher.curve_wants(w, 16 * MiB)
    assert wants is not None and 4 * MiB <= wants < 16 * MiB
    assert w.source.mrc.reuse_share >= 1 - 1 / EVIDENCE
    assert DiskWatcher.curve_wants(w, 64 * MiB) == wants      # its reads came back: said


def test_a_curve_that_saw_few_re_reads_waits_for_evidence_passes():
    """16 MiB read once and 4 MiB of it again: a fifth of the reads were re-reads, so
    the curve speaks only where the guest has read EVIDENCE times what the heat would
    hold (8 MiB of candidates), not for 16 MiB."""
    pages = np.arange(16 * MiB // PAGE)
    w = watcher(np.concatenate((pages, pages[:4 * MiB // PAGE])))
    assert 0.15 < w.source.mrc.reuse_share < 0.25
    assert DiskWatcher.curve_wants(w, 16 * MiB) is None
    assert not DiskWatcher.demand(w, disk_map(16)).seen
    assert DiskWatcher.curve_wants(w, 8 * MiB) is not None
    assert DiskWatcher.demand(w, disk_map(8)).seen


def test_the_split_hears_a_curve_only_after_evidence_passes():
    """The host budget's split takes a disk's curve (its ``demand``) on the same evidence:
    a first pass over 16 MiB offers the curve its heat implies (its heat's share on its
    hottest blocks); once its zone was re-read, its own, with the curve's hit ratio, read
    rate and miss cost."""
    once = watcher(np.arange(16 * MiB // PAGE))
    heat = np.zeros(64, dtype=np.float32)
    heat[:16] = np.arange(16, 0, -1)            # 16 blocks, the first the hottest
    young = DiskWatcher.demand(once, disk_map(12, heat))
    assert not young.seen and young.pages_per_second == once.source.mrc.reads_per_second
    total = heat.sum()
    assert young.hit_ratio(np.array([0, MiB, 2 * MiB, 12 * MiB, 32 * MiB])) == \
        pytest.approx([0, 16 / total, 31 / total, heat[:12].sum() / total,
                       heat[:12].sum() / total])     # past its candidates: flat
    zone = np.tile(np.arange(4 * MiB // PAGE), 2 * EVIDENCE * 4)
    w = watcher(np.concatenate((np.arange(4 * MiB // PAGE, 16 * MiB // PAGE), zone)))
    d = DiskWatcher.demand(w, disk_map(64), weight=0.5)
    assert d.seen and d.miss_cost == 0.001 and d.weight == 0.5
    assert d.pages_per_second == w.source.mrc.reads_per_second > 0
    hit = d.hit_ratio(np.array([MiB, 8 * MiB]))
    assert hit[1] > 0.5 > hit[0]
