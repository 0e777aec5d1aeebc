"""When a disk's curve speaks for it (caps what it wants, splits the host budget): once
the guest has read enough to show reuse."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from vmdisktouch.core.mrc import MissRatioCurve
from vmdisktouch.daemon.disk import EVIDENCE, DiskWatcher

PAGE = 4096
MiB = 1 << 20


def watcher(pages: np.ndarray) -> SimpleNamespace:
    mrc = MissRatioCurve(half_life=0)
    mrc.feed(pages)
    mrc.decay(1.0)
    gain = {"wants_bytes": mrc.wants(64 * MiB, PAGE)}
    w = SimpleNamespace(source=SimpleNamespace(mrc=mrc, gain=gain, page_size=PAGE),
                        miss_cost=SimpleNamespace(seconds=0.001))
    w._curve_seen = lambda candidates: DiskWatcher._curve_seen(w, candidates)
    return w


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
    assert DiskWatcher.demand(w, 16 * MiB) is None
    assert DiskWatcher.curve_wants(w, 8 * MiB) is not None
    assert DiskWatcher.demand(w, 8 * MiB) is not None


def test_the_split_hears_a_curve_only_after_evidence_passes():
    """The host budget's split takes a disk's curve (its ``demand``) on the same evidence:
    a first pass over 16 MiB has no demand, so the heat splits; once its zone was re-read
    it has, with the curve's hit ratio, read rate and miss cost."""
    once = watcher(np.arange(16 * MiB // PAGE))
    assert DiskWatcher.demand(once, 16 * MiB) is None
    zone = np.tile(np.arange(4 * MiB // PAGE), 2 * EVIDENCE * 4)
    w = watcher(np.concatenate((np.arange(4 * MiB // PAGE, 16 * MiB // PAGE), zone)))
    d = DiskWatcher.demand(w, 64 * MiB, weight=0.5)
    assert d is not None and d.miss_cost == 0.001 and d.weight == 0.5
    assert d.pages_per_second == w.source.mrc.reads_per_second > 0
    hit = d.hit_ratio(np.array([MiB, 8 * MiB]))
    assert hit[1] > 0.5 > hit[0]
