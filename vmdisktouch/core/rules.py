"""The rules: every constant the core decides with, as data.

Theory of operation
-------------------
Pure core (stdlib only). The operator's settings (budget, threshold, the heat
parameters: ``config.settings``) are the operator's; these are the policy's
own. Each is one ``Rule``: its name, value, unit, what it decides and the key
of its section in docs/rationale.md, where the reason and the measurement
behind it are. The modules that apply a rule import its constant from here
(and keep the name where tests and other modules import it); the table of
docs/algorithm.md is generated from ``RULES`` (``tools/rules_doc.py``).

Not rules: the constants of an implementation that decide nothing the guest
would see (``heat.FLUSH_BELOW``, ``heat.SPARSE_RATIO``, ``heat.TRUNCATE``,
``access.MAX_DELETIONS``), and units of measure (``access.PARTS``, the
sixteenths a block's rewrites are counted in): they stay in their modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Rule:
    """One constant of the policy."""
    name: str                  # the constant's name in this module
    value: Union[int, float]
    unit: str                  # what the value counts ("" for a plain number)
    meaning: str               # what it decides, in one or two sentences
    module: str                # the core module that decides with it (``policy`` passes the
                               # selection's to ``regions`` and ``cuts`` in ``regions.Rules``)
    shown: str = ""            # the value as written in the docs (default: ``value``)

    @property
    def key(self) -> str:
        """Its section in docs/rationale.md: the name, lower case, dashes for underscores."""
        return self.name.lower().replace("_", "-")

    @property
    def text(self) -> str:
        """The value as the docs write it."""
        if self.shown:
            return self.shown
        if isinstance(self.value, float) and self.value.is_integer():
            return str(int(self.value))
        return repr(self.value)


RULES = (
    # -- the selection: candidates and ranking (core.regions, through core.policy) --
    Rule("HOLD_FRACTION", 0.5, "x threshold",
         "A held run stays a candidate while its mean heat is at least threshold x this "
         "(hysteresis: the read-only lease, see core.heat).", "core.policy"),
    Rule("INCUMBENT_WEIGHT", 16.0, "x resident heat",
         "A held block's resident heat counts this many times when runs are ranked "
         "(polling source): an equal unheld candidate does not displace a hold.",
         "core.policy"),
    Rule("TRACED_INCUMBENT", 1.25, "x heat",
         "Trace source: a held block's heat counts this many times when runs are ranked: "
         "the margin a challenger's noisy read intensity must pass.", "core.policy"),
    Rule("REWRITTEN_DENSITY", 1 / 16, "of a block, mean",
         "Polling source: a run is first class when its blocks were rewritten, on average, "
         "at least this share in this cycle or the last. The trace source has no first "
         "class.", "core.policy", shown="1/16"),
    Rule("STAY_WRITE_CONTRAST", 2.0, "x the held blocks' rewrites",
         "Trace source: the held candidates stay when the pick is as many blocks and carries "
         "no more ranking heat, unless the pick's new blocks are rewritten this many times "
         "as densely as those it drops (and at the first class's density).", "core.regions"),
    # -- the policy's memory (core.policy) --
    Rule("GUEST_RESIDENT", 0.5, "of a block",
         "A block at least this share resident before the daemon loaded it was the guest's; "
         "below, its residency after the load is the daemon's, suppressed until the kernel "
         "evicts it.", "core.policy"),
    Rule("RELEASED_GRACE", 20.0, "s",
         "A block released for hotter regions (displaced) has its residency suppressed this "
         "long: it is cached because the daemon held it.", "core.policy"),
    Rule("CEDE_SECONDS", 60.0, "s",
         "A block the guest faulted back during its recharge is left to the guest's own "
         "cache (and memory cgroup) this long.", "core.policy"),
    # -- a memory-limited cgroup's cap (core.charges) --
    Rule("RESERVE_FRACTION", 1 / 16, "of the group's limit",
         "Kept free for a memory-limited group's own reclaim when its cap is computed.",
         "core.charges", shown="1/16"),
    Rule("AT_LIMIT_FRACTION", 1 / 32, "of the group's limit",
         "A group with less headroom than this is at its limit: all its excess is "
         "recharged at once.", "core.charges", shown="1/32"),
    # -- the budget (core.regions; the split through core.policy) --
    Rule("OWN_TRIM_MIN", 16, "blocks",
         "A region at least this long is cut, before the queue, into its core and its ends "
         "below 1/TRIM_CONTRAST of the core's density, each queued on its own density.",
         "core.regions"),
    Rule("TRIM_CONTRAST", 2.0, "x density",
         "A region's end blocks below 1/this of the density of the region waiting next are "
         "queued apart: the smoothing's shoulders and a lukewarm spread are held only after "
         "hotter regions.", "core.regions"),
    Rule("FAIR_BAND", 1.25, "x density",
         "Regions of other disks within this factor of the density of the one that does not "
         "fit share what is left, by their sizes: equal disks get equal shares.",
         "core.regions"),
    Rule("WINDOW_MARGIN", 1.1, "x heat",
         "A window cut to what is left keeps the most held blocks unless the hottest "
         "window carries this many times more heat.", "core.regions"),
    Rule("SPLIT_CONTRAST", 2.0, "peak / mean",
         "Trace source: a region too large for the budget is split where its ranking heat "
         "passes halfway from its mean to its peak, when the peak is at least this many "
         "times the mean.", "core.policy"),
    Rule("SPLIT_MIN_RATIO", 2.0, "x what is left",
         "Trace source: only a region at least this many times what is left of the budget "
         "is split; one that nearly fits is windowed.", "core.policy"),
    Rule("SPLIT_MIN_BLOCKS", 8, "blocks",
         "Trace source: a split's zones and the gaps between them are at least this long; "
         "shorter runs are the noise of a zone read at random.", "core.policy"),
    # -- the read intensity, refaults and thrash (trace source) --
    Rule("RATE_SECONDS", 2.5, "s",
         "Trace source: the time constant of each block's read rate, an exponential "
         "average over the read events' own times.", "core.intensity"),
    Rule("REFAULT_SECONDS", 60.0, "s",
         "Trace source: a page added to the cache less than this after the kernel deleted "
         "it is a refault.", "core.access"),
    Rule("THRASH_WEIGHT", 1.0, "x thrash",
         "Trace source: a block's ranking factor is 1 + this x its thrash (the share of its "
         "pages it refaults or would refault): all of them refaulting ranks it twice as "
         "high.", "core.thrash"),
    Rule("THRASH_MARGIN", 0.25, "of a share",
         "Trace source: an unheld block's refault share counts 1 - this of itself against "
         "the held blocks' estimates, so a hot set read alike all over is not swapped "
         "back and forth.", "core.thrash"),
    Rule("THRASH_SHOWN", 1 / 16, "of a block's pages a cycle",
         "Trace source: an unheld block is shown and reported as thrashing from this refault "
         "share on.", "core.thrash", shown="1/16"),
    # -- the read shift: an early cycle (trace source, core.shift) --
    Rule("WAKE_SHARE", 0.5, "of a drain's reads",
         "Trace source: a drain whose reads outside what is held are at least this share "
         "(and WAKE_RATIO x the baseline) starts a cycle now.", "core.shift"),
    Rule("WAKE_RATIO", 2.0, "x baseline",
         "Trace source: the share outside must also be this many times the baseline, the "
         "lowest share of the last BASELINE_CYCLES scheduled cycles.", "core.shift"),
    Rule("BASELINE_CYCLES", 3, "cycles",
         "Trace source: the baseline is the lowest share outside of this many last "
         "scheduled cycles.", "core.shift"),
    Rule("MIN_READS", 512, "read events",
         "Trace source: a drain of fewer reads never starts a cycle, and a disk none of whose "
         "scheduled cycles saw this many is cold (no baseline).", "core.shift"),
    Rule("MAX_EARLY", 4, "cycles",
         "Trace source: at most this many early cycles in a row.", "core.shift"),
    # -- the budget's advice: a curve's evidence and a steady verdict (core.advice) --
    Rule("CURVE_MIN_SECONDS", 120.0, "s",
         "Trace source: a curve says no size (a budget verdict, status's line) before it "
         "has watched the guest's reads this long: \"not enough reads yet\".", "core.advice"),
    Rule("CURVE_MIN_REREADS", 4096, "re-reads",
         "Trace source: nor before it has seen this many re-reads (pages read again): the "
         "reuse it stands on.", "core.advice"),
    Rule("CURVE_MAX_UNSEEN", 0.01, "of the reads",
         "Trace source: nor while more than this share of its reads were first reads not "
         "read again yet (their reuse is still to come: the curve still rises), unless it "
         "has watched CURVE_SETTLED_SECONDS.", "core.advice"),
    Rule("CURVE_SETTLED_SECONDS", 600.0, "s",
         "Trace source: a curve that has watched this long (its half-life: all the evidence "
         "it weighs) says a size whatever its first reads.", "core.advice"),
    Rule("ADVISE_MIN_SECONDS", 10.0, "s",
         "advise: a window shorter than this says no size, only how much longer to watch "
         "(a --duration under it is warned).", "core.advice"),
    Rule("ADVISE_MIN_REREADS", 200, "re-reads",
         "advise: nor one that saw fewer re-reads (pages read again within the window).",
         "core.advice"),
    Rule("ADVISE_COVER", 2.0, "re-reads a page",
         "advise: nor a size whose pages were not seen read again this many times each, on "
         "average (re-reads over the size's pages).", "core.advice"),
    Rule("VERDICT_CONFIRM_SECONDS", 60.0, "s",
         "A new budget verdict (a disk's share, or max_hold, too small, too large or right) is "
         "said once every cycle has given it for this long (and 3 cycles at least).",
         "core.advice"),
    Rule("VERDICT_HOLD_SECONDS", 600.0, "s",
         "A verdict said stands at least this long, whatever its curve's noise says, unless "
         "the disk's share moves past the verdict's margin (a new max_hold, a disk added or "
         "gone).", "core.advice"),
    # -- an adopted disk is never slower (core.never_slower) --
    Rule("ADOPT_WINDOW_S", 10.0, "s",
         "The guest's I/O (QEMU's accounting) is compared in windows this long, before the "
         "switch and after it.", "core.never_slower"),
    Rule("ADOPT_BASELINE_WINDOWS", 3, "windows",
         "Windows timed before the switch: the baseline, and their spread the disk's noise.",
         "core.never_slower"),
    Rule("ADOPT_SETTLE_WINDOWS", 2, "windows",
         "Windows after the switch not judged: the page cache starts empty.",
         "core.never_slower"),
    Rule("ADOPT_MARGIN", 0.05, "of the mean I/O time",
         "A window is slower when its mean I/O time (at the baseline's mix) is above the "
         "baseline's by more than this plus the noise.", "core.never_slower"),
    Rule("ADOPT_SLOW_WINDOWS", 2, "windows",
         "Slower windows in a row that release an adopted disk by itself.",
         "core.never_slower"),
    Rule("ADOPT_MIN_OPS", 50, "I/Os",
         "A window with fewer I/Os is not judged (and breaks no run of slower ones).",
         "core.never_slower"),
)

BY_NAME = {r.name: r for r in RULES}

HOLD_FRACTION = BY_NAME["HOLD_FRACTION"].value
INCUMBENT_WEIGHT = BY_NAME["INCUMBENT_WEIGHT"].value
TRACED_INCUMBENT = BY_NAME["TRACED_INCUMBENT"].value
REWRITTEN_DENSITY = BY_NAME["REWRITTEN_DENSITY"].value
STAY_WRITE_CONTRAST = BY_NAME["STAY_WRITE_CONTRAST"].value
GUEST_RESIDENT = BY_NAME["GUEST_RESIDENT"].value
RELEASED_GRACE = BY_NAME["RELEASED_GRACE"].value
CEDE_SECONDS = BY_NAME["CEDE_SECONDS"].value
RESERVE_FRACTION = BY_NAME["RESERVE_FRACTION"].value
AT_LIMIT_FRACTION = BY_NAME["AT_LIMIT_FRACTION"].value
OWN_TRIM_MIN = BY_NAME["OWN_TRIM_MIN"].value
TRIM_CONTRAST = BY_NAME["TRIM_CONTRAST"].value
FAIR_BAND = BY_NAME["FAIR_BAND"].value
WINDOW_MARGIN = BY_NAME["WINDOW_MARGIN"].value
SPLIT_CONTRAST = BY_NAME["SPLIT_CONTRAST"].value
SPLIT_MIN_RATIO = BY_NAME["SPLIT_MIN_RATIO"].value
SPLIT_MIN_BLOCKS = BY_NAME["SPLIT_MIN_BLOCKS"].value
RATE_SECONDS = BY_NAME["RATE_SECONDS"].value
REFAULT_SECONDS = BY_NAME["REFAULT_SECONDS"].value
THRASH_WEIGHT = BY_NAME["THRASH_WEIGHT"].value
THRASH_MARGIN = BY_NAME["THRASH_MARGIN"].value
THRASH_SHOWN = BY_NAME["THRASH_SHOWN"].value
WAKE_SHARE = BY_NAME["WAKE_SHARE"].value
WAKE_RATIO = BY_NAME["WAKE_RATIO"].value
BASELINE_CYCLES = BY_NAME["BASELINE_CYCLES"].value
MIN_READS = BY_NAME["MIN_READS"].value
MAX_EARLY = BY_NAME["MAX_EARLY"].value
CURVE_MIN_SECONDS = BY_NAME["CURVE_MIN_SECONDS"].value
CURVE_MIN_REREADS = BY_NAME["CURVE_MIN_REREADS"].value
CURVE_MAX_UNSEEN = BY_NAME["CURVE_MAX_UNSEEN"].value
CURVE_SETTLED_SECONDS = BY_NAME["CURVE_SETTLED_SECONDS"].value
ADVISE_MIN_SECONDS = BY_NAME["ADVISE_MIN_SECONDS"].value
ADVISE_MIN_REREADS = BY_NAME["ADVISE_MIN_REREADS"].value
ADVISE_COVER = BY_NAME["ADVISE_COVER"].value
VERDICT_CONFIRM_SECONDS = BY_NAME["VERDICT_CONFIRM_SECONDS"].value
VERDICT_HOLD_SECONDS = BY_NAME["VERDICT_HOLD_SECONDS"].value
ADOPT_WINDOW_S = BY_NAME["ADOPT_WINDOW_S"].value
ADOPT_BASELINE_WINDOWS = BY_NAME["ADOPT_BASELINE_WINDOWS"].value
ADOPT_SETTLE_WINDOWS = BY_NAME["ADOPT_SETTLE_WINDOWS"].value
ADOPT_MARGIN = BY_NAME["ADOPT_MARGIN"].value
ADOPT_SLOW_WINDOWS = BY_NAME["ADOPT_SLOW_WINDOWS"].value
ADOPT_MIN_OPS = BY_NAME["ADOPT_MIN_OPS"].value
