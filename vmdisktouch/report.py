"""The report of a cycle: one typed model for 1..N disks, built once, read by every output.

The daemon builds one ``HostReport`` per cycle (``daemon.service``): the
host's figures and one ``DiskReport`` per disk served. Everything the
operator sees reads that one object: the status file (``HostReport.to_json``,
one shape whatever the number of disks), the metrics, the systemd status
line, the host PNG; ``vmdisktouch status`` reads the file back into it
(``HostReport.from_json``). What differs for one disk is presentation
only. The reason codes (``CODES``) live here, so the daemon that gives them
and the metrics that export them share one list.

Compatibility. Before this model, a daemon serving one disk wrote that
disk's status as the whole file. For one release the file of a single disk
also carries that disk's keys at its top level (``LEGACY_TOP``), so readers
of the old keys go on working (docs/status.md says what changed).
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field

# Why a disk holds less than it wants (``limited_by``): docs/status.md has the table.
CODES = ("domain_off", "no_evidence", "below_threshold", "budget", "cap", "weight", "curve",
         "floor", "cgroup", "lock_limit", "not_loaded")

# Why nothing is held in the file a clean stop leaves (``HostReport.stopped_at``).
STOPPED_REASON = "the daemon stopped: every hold released"

# One disk's keys kept at the top level of a single disk's status file, for one release.
LEGACY_TOP = True


def _num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def reads_from_memory(gain: dict | None) -> dict | None:
    """The share of a disk's reads served from memory, now and with one GiB more held: the
    one definition every output takes (docs/status.md, "Reads from memory").

    * ``now``: measured, the last cycle's pages read that needed no page added to the
      cache (``gain.cache_hit_ratio``);
    * ``plus_gib``: ``now`` plus what its curve adds from what is held to one GiB more
      (``gain.next_gib``: its more reads a second over the pages read a second), at
      most 1. Never the curve's own height: an LRU curve counts every first read a miss
      and tops out below what the page cache measured (readahead, the guest's own
      cache), so "91 % now, 69 % with 1 GiB more" was two bases side by side;
    * ``more_reads_per_second``: the reads a second that GiB adds (the curve's).

    None without a measured share (no read in the cycle, the mincore source); no
    ``plus_gib`` without a curve."""
    g = gain if isinstance(gain, dict) else {}
    now = g.get("cache_hit_ratio")
    if not _num(now):
        return None
    out = {"now": round(float(now), 4), "plus_gib": None, "more_reads_per_second": None}
    nxt = g.get("next_gib") if isinstance(g.get("next_gib"), dict) else {}
    more, pages = nxt.get("more_reads_per_second"), g.get("pages_read_per_second")
    if _num(more) and _num(pages) and pages > 0:
        more = max(0.0, float(more))
        out["plus_gib"] = round(min(1.0, float(now) + more / pages), 4)
        out["more_reads_per_second"] = round(more, 1)
    return out


@dataclass
class DiskReport:
    """One disk's last cycle, as the status file gives it (docs/status.md, "A disk")."""
    path: str
    domain: str | None
    target: str | None
    pid: int
    version: str
    interval_seconds: float
    cycle: int
    cycle_seconds: float
    size_bytes: int
    block_size: int
    budget_bytes: int                 # its share of the budget
    host_budget_bytes: int
    wanted_bytes: int | None
    held_bytes: int
    resident_bytes: int
    regions: list                     # [offset, length] pairs, bytes
    rewritten_blocks: int
    rewritten_ranges: list
    mem_available_bytes: int
    min_free_bytes: int
    loaded_bytes: int
    loaded_from_disk_bytes: int
    released_bytes: int
    skipped_bytes: int
    not_held_reason: str | None
    limited_by: str | None            # one of ``CODES``, or None
    domain_active: bool | None
    warmed_from: str | None
    holding: bool
    lock_cap_bytes: int | None
    charges: dict
    access_source: str
    events_lost: int
    output_errors: dict
    time: float
    trace: dict | None = None         # the trace source's figures (None: mincore)
    spill: dict = field(default_factory=dict)
    thrashing_ranges: list = field(default_factory=list)
    curve: list | None = None         # [[bytes, hit_ratio], ...] (``core.mrc``; None: mincore)
    mrc: dict = field(default_factory=dict)   # what the curve stands on, or why there is none
    gain: dict | None = None          # what memory served, what a GiB more would (trace)
    miss_cost: dict | None = None     # what a read the cache misses costs (observe.miss_cost)
    adopted_since: float | None = None   # switched to the page cache by ``vmdisktouch adopt``
    #                                      since (Unix time; libvirt says cache=none); None: not
    adopted_gain: float | None = None    # the guest's mean I/O time before the switch over
    #                                      since (``core.never_slower``); None: not measured
    advised_gain: float | None = None    # what advise forecast of the same ratio

    @property
    def from_memory(self) -> dict | None:
        """The share of its reads from memory now and at one GiB more (``reads_from_memory``):
        what status, the metrics, the PNG and the log say."""
        return reads_from_memory(self.gain)

    @property
    def title(self) -> str:
        """Its name in a picture or a line: ``domain/target  path``, or its path."""
        return f"{self.domain}/{self.target}  {self.path}" if self.domain else self.path

    def value(self, key: str):
        """A figure by its status key; a dotted key names a field of a section
        (``spill.read_bytes``); None when it has none."""
        head, _, rest = key.partition(".")
        v = getattr(self, head, None)
        for part in rest.split(".") if rest else ():
            v = v.get(part) if isinstance(v, dict) else None
        return v

    def to_json(self) -> dict:
        """The disk's object of the status file."""
        d = _shallow(self)
        if d["trace"] is None:
            del d["trace"]
        d["from_memory"] = self.from_memory
        return d

    @classmethod
    def from_json(cls, d: dict) -> "DiskReport":
        return cls(**_known(cls, d))


@dataclass
class DiskLine:
    """A disk's line in the host's figures: every disk served, reported yet or not."""
    path: str
    domain: str | None
    target: str | None
    held_bytes: int
    share_bytes: int | None           # its share of the budget (None: no selection yet)
    wanted_bytes: int | None
    limited_by: str | None
    not_held_reason: str | None
    heat: float                       # the sum of its heat map
    cap_bytes: int | None             # its cap from the config file
    weight: float                     # its weight from the config file
    budget_advice: dict | None = None  # its share too small, too large or right (``core.advice``)

    @classmethod
    def from_json(cls, d: dict) -> "DiskLine":
        return cls(**_known(cls, d))


def _shallow(obj) -> dict:
    """A report's fields as a dict, its values shared, not copied: it is written to JSON at
    once, each cycle, and ``dataclasses.asdict`` would deep-copy every region list."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _known(cls, d: dict) -> dict:
    """The fields of ``cls`` read from ``d``: a key a newer daemon writes is left out, and
    a field an older one (or a partial file) lacks is None, or its default."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in d:
            out[f.name] = d[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            out[f.name] = None
    return out


# Why a disk of a running domain is not served (``HostReport.skipped``'s ``code``, the
# metric ``vmdisktouch_disk_unserved``'s ``reason``): the verdict's
# (``libvirt_disks.assess``) and the host service's scope (``config.overrides``).
UNSERVED = {
    "not_local": "not a local file or block device (network, volume...)",
    "no_source": "no source: an empty drive",
    "passthrough": "device=lun: SCSI commands passed through (SG_IO)",
    "o_direct": "opened with O_DIRECT (cache=none/directsync, io=native)",
    "adopt_slower": "adopted, then released by the service because the guest's I/O got "
                    "slower (vmdisktouch adopt takes it back)",
    "read_only": "read-only: a CD-ROM, a floppy, <readonly/>",
    "excluded": "excluded by the config file ([scope] exclude or exclude_labels, or "
                "[domain...] exclude = true)",
    "not_included": "[scope] has includes and none matches the domain",
}


@dataclass
class HostReport:
    """The host's last cycle: its figures and its disks (docs/status.md, "The host")."""
    pid: int
    version: str
    interval_seconds: float
    time: float
    budget_bytes: int
    held_bytes: int
    mem_available_bytes: int | None
    min_free_bytes: int
    above_floor_bytes: int | None
    cycle: int
    cycle_seconds: float
    disks: list[DiskReport] = field(default_factory=list)
    lines: list[DiskLine] = field(default_factory=list)  # every disk served, reported or not
    failed: list[dict] = field(default_factory=list)     # {path, error}
    skipped: list[dict] | None = None          # {domain, target, code, reason}: libvirt
    budget_advice: dict | None = None     # max_hold too small, too large or right (``core.advice``)
    stopped: bool = False                 # the daemon stopped cleanly: nothing held (``stopped``)

    @property
    def from_memory(self) -> dict | None:
        """The host's share of reads from memory, from its disks' (``reads_from_memory``):
        ``now`` their mean weighted by pages read a second; ``plus_gib`` with the GiB given
        to the disk where it adds the most reads a second (``best``, its path), so the host
        line and that disk's line say the same GiB. None when no disk has one."""
        parts = [(d, d.from_memory, (d.gain or {}).get("pages_read_per_second"))
                 for d in self.disks if isinstance(d.gain, dict)]
        parts = [(d, f, p) for d, f, p in parts if f is not None and _num(p) and p > 0]
        if not parts:
            return None
        pages = sum(p for _, _, p in parts)
        now = sum(f["now"] * p for _, f, p in parts) / pages
        best = max(((f["more_reads_per_second"], d.path) for d, f, _ in parts
                    if f["more_reads_per_second"] is not None), default=None)
        return {"now": round(now, 4),
                "plus_gib": None if best is None else round(min(1.0, now + best[0] / pages), 4),
                "more_reads_per_second": None if best is None else best[0],
                "best": None if best is None else best[1]}

    def stopped_at(self, when: float) -> "HostReport":
        """The report a clean stop leaves behind: this one, with every hold released
        (nothing held, no region), ``stopped`` and the time of the stop; what only a
        running daemon can say (the gain of its holds, the budget's advice) left out."""
        def off(x, **more):
            return dataclasses.replace(x, held_bytes=0, limited_by=None,
                                       not_held_reason=STOPPED_REASON, **more)
        return dataclasses.replace(
            self, time=when, held_bytes=0, stopped=True, budget_advice=None,
            lines=[off(x, budget_advice=None) for x in self.lines],
            disks=[off(d, regions=[], time=when, gain=None) for d in self.disks])

    def to_json(self) -> dict:
        """The status file: ``host`` and ``disks``, for one disk as for many (one disk also
        at the top level for one release, ``LEGACY_TOP``)."""
        head = {k: getattr(self, k) for k in (
            "pid", "version", "interval_seconds", "time", "budget_bytes", "held_bytes",
            "mem_available_bytes", "min_free_bytes", "above_floor_bytes", "cycle",
            "cycle_seconds", "budget_advice")}
        head["from_memory"] = None if self.stopped else self.from_memory
        head.update(disks=[_shallow(x) for x in self.lines], failed=self.failed)
        if self.skipped is not None:
            head["skipped"] = self.skipped
        if self.stopped:
            head["stopped"] = True
        disks = [d.to_json() for d in self.disks]
        out = {"host": head, "disks": disks}
        if LEGACY_TOP and len(disks) == 1 and len(self.lines) == 1:
            out = {**disks[0], **out}
        return out

    @classmethod
    def from_json(cls, doc: dict) -> "HostReport":
        """A status file read back (``host`` and ``disks``; KeyError/TypeError when it is not
        one: ``commands.status_read`` checks it first)."""
        h = doc["host"]
        head = {k: v for k, v in _known(cls, h).items()
                if k not in ("disks", "lines", "failed", "skipped")}
        return cls(**head, disks=[DiskReport.from_json(d) for d in doc.get("disks", [])],
                   lines=[DiskLine.from_json(x) for x in h.get("disks", [])],
                   failed=list(h.get("failed", [])), skipped=h.get("skipped"))
