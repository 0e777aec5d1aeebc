"""``vmdisktouch status``: the live state of every running daemon, from its status file.

Each daemon writes its status JSON (``--status``; the units put it under
``/run/vmdisktouch/``: ``host.json`` for the host service, ``INSTANCE.json``
per disk; a ``run`` without ``--status`` there too, ``adapters.runtime_dir``,
which ``$VMDISKTOUCH_RUNTIME_DIR`` moves). This reads every ``*.json`` there
(``--dir``), or only the entries that serve ``PATH``; ``advise``'s report
kept there (``advice_file.is_report``) is no daemon's and is left out. A file
a clean stop left (``host.stopped``: nothing held) ends ``STOPPED`` and is
not live. A host's file is a **host line** (pid,
version, held of the whole budget, MemAvailable above the floor, the disks
served, skipped and failed, the cycle, the file's age, ``LIVE`` or
``STALE``), then one indented line per disk (``domain/target (path)``, or
the path: held / its share of the budget, the regions, what it wants, and
why it holds less, ``not_held_reason``) and per failed disk. A one-disk
file is one such disk line, with the daemon's source, cycle, pid, version,
age and state: each file is read into the one report model
(``report.HostReport``, an old single-disk file as a host of one), and a
host of one disk, nothing skipped or failed, is shown as that line. An entry is **stale** when its file is older than
``STALE_INTERVALS`` (3) of its daemon's intervals (at least
``STALE_MIN_SECONDS``) or its pid is gone: the daemon died or hangs.
``--json`` prints a JSON array of the documents as read (every key, the
host's included), each with ``file``, ``age_seconds`` and ``stale`` added;
with ``PATH`` their lists of disks hold only PATH's.

**A host of many disks** (``host_lines``). Its disk lines are in one order
(``disk_order``): by what they hold (held bytes) descending, ties by what they
want (wanted bytes) descending, then by the name shown (``domain/target
(path)``, or the path). Its failed disks follow, then its disks skipped (by
domain and target). By default at most ``DEFAULT_TOP`` (20) disk lines are shown,
the served disks' first, then the skipped ones', and one line ends the file's
lines saying what was left out: ``... and 80 more disks holding 1.2G; --all
shows them`` (with ``, 3 more skipped`` when skipped disks were left out
too). Never left out, whatever the limit, since they need the operator: a
failed disk (``host.failed``) and a disk whose holder met an error
(``limited_by`` in ``ATTENTION``: the kernel refused a lock, a load failed),
shown in its place in the order beyond the limit. ``--top N`` shows N disk
lines, ``--all`` every one; ``--json`` always prints everything. A bad
``--top`` (not a whole number of at least 1) is a ``ConfigError`` (78), as
every bad value is (docs/exit-codes.md); ``--top`` with ``--all`` is refused
by argparse (2). A one-disk file is one line and is not counted: the limit is
of one host's disk lines.

The exit status is that of ``systemctl is-active``: ``EX_LIVE`` (0) when
at least one file shown is live, ``EX_INACTIVE`` (3) when none is (no file,
every one stale, unreadable or malformed, or the default directory missing:
no daemon has run since boot); a ``--dir`` that cannot be listed (missing
included) and a ``PATH`` no file serves are an ``ImageError`` (66).

The directory may hold anything: a file is opened without following a
symlink or waiting on a FIFO, read only if it is a regular file of at most
``MAX_STATUS_BYTES`` (4 MiB: a status file is a few KiB a disk; a 12 MB file
once took 14-20 s to parse and check, 76 MB of ``--json``), and shown only if
``status_read.check`` accepts it.
Any other file is one line (one ``--json`` entry: ``file``, ``error``,
``stale: true``) saying it is ``unreadable`` or ``malformed`` and why; the
valid entries are shown as ever. A ``time`` in the future by more than the
staleness limit makes its entry stale ("written in the future"; a negative
``age_seconds``). Each file's age is taken against the clock read after that
file is read, so a slow file never makes a live daemon's later write look
written in the future. Every string printed is one line, its control characters
escaped (``status_read.sanitise``); ``--json`` escapes them as JSON does.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import re
import stat
import sys
import time

from vmdisktouch.adapters import advice_file, runtime_dir
from vmdisktouch.commands.status_read import Malformed, check, sanitise
from vmdisktouch.core.advice import TOO_LARGE, TOO_SMALL, not_enough
from vmdisktouch.errors import ConfigError, ImageError, file_kind
from vmdisktouch.daemon.reasons import advice_said
from vmdisktouch.report import DiskLine, DiskReport, HostReport
from vmdisktouch.sizes import format_size

STATUS_DIR = runtime_dir.RUNTIME_DIR     # or $VMDISKTOUCH_RUNTIME_DIR (``default_dir``)
STALE_INTERVALS = 3
STALE_MIN_SECONDS = 15.0
EX_LIVE = 0                 # as ``systemctl is-active``: some daemon is live
EX_INACTIVE = 3             # no status file, or every one stale or bad
MAX_STATUS_BYTES = 4 << 20  # read of one status file at most (see the docstring)
# Disk lines shown of one host by default: a terminal of 24 rows (the VT100's and most
# emulators' default) holds the command, the host line, 20 disk lines, the line saying
# what was left out and the next prompt.
DEFAULT_TOP = 20
# A disk whose holder met an error (``daemon.reasons``): never left out of the lines.
ATTENTION = ("lock_limit", "not_loaded")


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", nargs="?",
                        help="only the daemon(s) serving this disk image")
    lines = parser.add_mutually_exclusive_group()
    lines.add_argument("--all", action="store_true",
                       help="every disk line of a host (every status file is shown either "
                            "way)")
    lines.add_argument("--top", metavar="N",
                       help=f"at most N disk lines of a host, those holding the most (default "
                            f"{DEFAULT_TOP}); a failed disk or one with an error is always "
                            f"shown; --json prints every disk whatever N")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--dir", default=None,
                        help=f"where the status files are (default {STATUS_DIR}, or "
                             f"${runtime_dir.ENV})")


def default_dir() -> str:
    """Where the daemons write their status files: ``STATUS_DIR``, or the runtime
    directory the environment names (``adapters.runtime_dir``)."""
    return os.environ.get(runtime_dir.ENV) or STATUS_DIR


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


class Unreadable(Exception):
    """A status file that cannot be read as one; ``str()`` says why."""


def read_file(path: str) -> tuple[bytes, float]:
    """The bytes and mtime of the regular file ``path``: never a symlink followed, never
    a wait on a FIFO, never more than ``MAX_STATUS_BYTES`` read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable("a symbolic link (not followed)") from None
        try:
            kind = file_kind(os.lstat(path).st_mode)
        except OSError:
            kind = "a regular file"
        raise Unreadable(exc.strerror if kind == "a regular file"
                         else f"{kind}, not a regular file") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"{file_kind(st.st_mode)}, not a regular file")
        too_big = Unreadable(f"larger than {format_size(MAX_STATUS_BYTES)}")
        if st.st_size > MAX_STATUS_BYTES:
            raise too_big
        chunks, size = [], 0
        while size <= MAX_STATUS_BYTES:         # it may grow as it is read: one byte more
            chunk = os.read(fd, min(MAX_STATUS_BYTES + 1 - size, max(st.st_size + 1, 1 << 16)))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_STATUS_BYTES:
            raise too_big
        return b"".join(chunks), st.st_mtime
    except OSError as exc:
        raise Unreadable(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


def parse(data: bytes):
    """The checked document of ``data``; ``Malformed`` when it is not one to show; None
    for the report ``advise`` keeps beside the status files (not a daemon's)."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise Malformed("JSON nested too deep") from None
    except ValueError as exc:           # UnicodeDecodeError and JSONDecodeError included
        raise Malformed(f"not JSON: {exc}") from None
    if advice_file.is_report(doc):
        return None
    check(doc)
    return doc


def read_files(directory: str, clock=time.time) -> list[dict]:
    """One item per ``*.json`` file of ``directory``, sorted by name: its checked
    document (``doc``), ``age_seconds`` and ``stale``; or ``error`` (unreadable or
    malformed, always stale). A directory that cannot be listed is an ``ImageError``.
    ``clock`` is read after each file, for that file's age."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        raise ImageError(f"{sanitise(directory)}: no such directory") from None
    except OSError as exc:
        raise ImageError(f"{sanitise(directory)}: cannot list the status files: "
                         f"{exc.strerror}") from None
    out = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            data, mtime = read_file(path)
            doc = parse(data)
            if doc is None:                 # advise's report: no daemon
                continue
        except Unreadable as exc:
            out.append({"file": path, "error": f"unreadable: {exc}", "stale": True})
            continue
        except Malformed as exc:
            out.append({"file": path, "error": f"malformed: {exc}", "stale": True})
            continue
        report = model(doc)
        out.append({"file": path, "doc": doc, "report": report, "one": one_disk(report),
                    **freshness(report, mtime, clock())})
    return out


def one_disk(r: HostReport) -> bool:
    """A daemon of one disk, nothing skipped or failed: shown as that disk's line."""
    return len(r.lines) == 1 and len(r.disks) == 1 and not r.failed and r.skipped is None


def model(doc: dict) -> HostReport:
    """The report of a checked document; an old single-disk file (the whole file one
    disk's, before the one shape) as a host of that one disk."""
    if "host" not in doc:
        line = {**doc, "share_bytes": doc.get("budget_bytes")}
        doc = {"host": {**doc, "budget_bytes": doc.get("host_budget_bytes"),
                        "disks": [line]}, "disks": [doc]}
    return HostReport.from_json(doc)


def freshness(r: HostReport, mtime: float, now: float) -> dict:
    """``age_seconds`` and ``stale`` of one status report."""
    limit = max(STALE_MIN_SECONDS, STALE_INTERVALS * (r.interval_seconds or 5.0))
    age = now - (mtime if r.time is None else r.time)
    if -limit <= age < 0:
        age = 0.0                       # the clock's granularity, or a small step back
    stale = r.stopped or abs(age) > limit or not pid_alive(r.pid)
    return {"age_seconds": round(age, 1), "stale": stale}


def serving(doc: dict, path: str) -> dict | None:
    """``doc`` with its lists of disks (``disks``, ``host.disks``, ``host.failed``) cut
    to the entries serving ``path``, every other key kept; None when none does."""
    if "host" not in doc:
        return doc if same_file(doc["path"], path) else None
    host = doc["host"]
    cut = {k: [d for d in host[k] if same_file(d["path"], path)]
           for k in ("disks", "failed") if k in host}
    mine = [d for d in doc.get("disks", []) if same_file(d["path"], path)]
    if not (mine or any(cut.values())):
        return None
    return {**doc, "host": {**host, **cut}, **({"disks": mine} if "disks" in doc else {})}


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):       # ValueError: a NUL in a path from a status file
        try:
            return os.path.realpath(a) == os.path.realpath(b)
        except (OSError, ValueError):
            return False


def _size(v) -> str:
    return "?" if v is None else format_size(v)


def _state(item: dict) -> str:
    age = item["age_seconds"]
    when = f"{age:.0f} s ago" if age >= 0 else "written in the future"
    if "report" in item and item["report"].stopped:
        return f"stopped {when}, STOPPED"
    return f"{when}, {'STALE' if item['stale'] else 'LIVE'}"


def disk_name(d: DiskLine) -> str:
    """``domain/target (path)`` when libvirt names the disk, else its path; sanitised."""
    path = sanitise(d.path)
    if d.domain:
        return f"{sanitise(d.domain)}/{sanitise(d.target or '?')} ({path})"
    return path


def advised(v) -> bool:
    """A verdict (``core.advice``) worth a word: too small or too large."""
    return isinstance(v, dict) and v.get("verdict") in (TOO_SMALL, TOO_LARGE) and \
        isinstance(v.get("bytes"), int)


def _of(line: DiskLine, d: DiskReport | None, key: str, theirs: str | None = None):
    """A figure of a disk's line, or of its full report (its field ``theirs``, else
    ``key``) when the line has none."""
    mine = getattr(line, key)
    return mine if mine is not None or d is None else getattr(d, theirs or key)


def disk_order(entry: tuple[DiskLine, DiskReport | None]):
    """The sort key of a host's disk lines: held descending, then wanted descending,
    then the name shown (the figures the line shows)."""
    line, d = entry
    held = _of(line, d, "held_bytes") or 0
    wanted = _of(line, d, "wanted_bytes") or 0
    return (-held, -wanted, disk_name(line))


def attention(entry: tuple[DiskLine, DiskReport | None]) -> bool:
    """A disk whose holder met an error (``ATTENTION``): never left out."""
    line, d = entry
    return _of(line, d, "limited_by") in ATTENTION


def disk_part(line: DiskLine, d: DiskReport | None) -> str:
    """A disk's name, what it holds of its share, and why not more: sanitised. ``d``: its
    full report, when the file has one; what the line leaves out is taken from it."""
    held = _of(line, d, "held_bytes") or 0
    share = _of(line, d, "share_bytes", "budget_bytes")
    out = f"{disk_name(line)}: held {format_size(held)}/{_size(share)}"
    if d is not None and isinstance(d.regions, list):
        n = len(d.regions)
        out += f" in {n} region{'' if n == 1 else 's'}"
    wanted = _of(line, d, "wanted_bytes")
    if wanted is not None and wanted > held:
        out += f", wants {format_size(wanted)}"
    reason = _of(line, d, "not_held_reason")
    if reason:
        out += f" ({sanitise(reason)})"
    out += gain_part(d)
    if advised(line.budget_advice):
        out += f", its share {advice_said(line.budget_advice)}"
    if d is not None and isinstance(d.adopted_since, (int, float)):
        out += f", adopted {time.strftime('%Y-%m-%d %H:%M', time.localtime(d.adopted_since))}"
        out += adopted_gain_part(d)
    if d is not None and d.events_lost:
        out += lost_part(d)
    return out


def adopted_gain_part(d: DiskReport) -> str:
    """An adopted disk's gain measured since the switch, beside the gain advised: the
    guest's mean I/O time before over after (``core.never_slower``); and the taint libvirt
    marks its domain with (QMP through libvirt, docs/adopt.md): none for a drive adopted
    through its QEMU's own QMP socket (no domain)."""
    def ok(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < math.inf
    measured = (f"I/O {d.adopted_gain:.2f}x as fast as before" if ok(d.adopted_gain)
                else "I/O since not measured yet")
    advised = f", {d.advised_gain:.2f}x advised" if ok(d.advised_gain) else ""
    taint = "; libvirt: tainted, custom-monitor" if d.domain else ""
    return f" ({measured}{advised}{taint})"


def lost_part(d: DiskReport) -> str:
    """Lost trace events: this cycle's and the total when the cycle lost some, else the
    total and how long before the cycle the last were lost, since a total alone read as
    a loss going on long after it stopped."""
    t = d.trace if isinstance(d.trace, dict) else {}
    now, at = t.get("lost"), t.get("lost_at")
    if isinstance(now, int) and not isinstance(now, bool) and now > 0:
        return f", {now} events lost in this cycle, {d.events_lost} since start"
    out = f", {d.events_lost} events lost since start"
    if isinstance(at, (int, float)) and not isinstance(at, bool) and \
            isinstance(d.time, (int, float)) and math.isfinite(d.time - at):
        out += f", the last {ago(d.time - at)}"
    return out


def ago(seconds: float) -> str:
    """``12 s ago``, ``3 min ago``, ``5 h ago``, ``2 days ago``."""
    s = max(0.0, seconds)
    if s >= 2 * 86400:
        return f"{s / 86400:.0f} days ago"
    for unit, size in (("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit} ago"
    return f"{s:.0f} s ago"


def _pct(v) -> str:
    return f"{100 * v:.0f} %"


def gain_part(d: DiskReport | None) -> str:
    """What memory served the disk's reads in its last cycle, and what its next GiB would
    (``DiskReport.from_memory``: one definition, docs/status.md), what its curve stands on
    and wants (trace source only); "" without, or before its curve has a read."""
    g = d.gain if d is not None and isinstance(d.gain, dict) else None
    mrc = d.mrc if d is not None and isinstance(d.mrc, dict) else {}
    if not g or not mrc.get("reads"):      # no curve, or no read in it yet
        return ""
    parts = []
    fm = d.from_memory
    if fm is not None:
        parts.append(f"reads {_pct(fm['now'])} from memory")
    if g.get("held_read_share") is not None:
        parts.append(f"{_pct(g['held_read_share'])} on held blocks")
    cost = d.miss_cost.get("seconds") if isinstance(d.miss_cost, dict) else None
    if cost:
        saved = g.get("read_seconds_saved_per_second")
        parts.append(f"a miss costs {cost * 1e6:,.0f} µs" +
                     (f", {saved:,.2f} s of reads saved a second" if saved else ""))
    if fm is not None and fm["plus_gib"] is not None and d.curve:
        parts.append(f"+1G -> {_pct(fm['plus_gib'])} of reads, "
                     f"+{fm['more_reads_per_second']:,.0f} reads/s")
    parts.append(curve_part(g, mrc))
    return "; " + ", ".join(p for p in parts if p)


def curve_part(g: dict, mrc: dict) -> str:
    """What its curve says of a size, and what it stands on (docs/status.md,
    "Confidence"): not enough reads yet, young, or what it wants."""
    seen = (f" ({mrc['reads']:,} reads, {mrc['re_reads']:,} re-reads in "
            f"{ago(mrc['window_seconds']).removesuffix(' ago')})"
            if all(_count(mrc.get(k)) for k in ("reads", "re_reads", "window_seconds")) else "")
    if mrc.get("enough_reads") is False:
        return f"its curve: {not_enough(mrc)}{seen}"
    if g.get("curve_seen") is False:
        return "its curve is young: its heat decides how much"
    if g.get("wants_bytes") is not None:
        return f"its curve wants {format_size(g['wants_bytes'])}{seen}"
    return ""


def _count(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def best_next_gib(r: HostReport) -> str:
    """The host line's figures (``HostReport.from_memory``): the share of reads from memory
    over every disk, and with the next GiB given to the disk where it adds the most reads
    a second, named: the same GiB, the same reads a second as that disk's line."""
    fm = r.from_memory
    if fm is None:
        return ""
    out = f", reads {_pct(fm['now'])} from memory"
    more = fm["more_reads_per_second"]
    if more is None or more <= 0:
        return out
    best = next((x for x, _ in host_disks(r) if x.path == fm["best"]), None)
    return (out + f", +1G -> {_pct(fm['plus_gib'])} of reads: the next GiB would do most for "
            f"{disk_name(best) if best else sanitise(fm['best'])} (+{more:,.0f} reads/s)")


def host_disks(r: HostReport) -> list[tuple[DiskLine, DiskReport | None]]:
    """The host's disks: each its line, and its full report when the file has one (a disk
    with a report and no line shown by its report)."""
    full = {d.path: d for d in r.disks}
    named = {x.path for x in r.lines}
    return ([(x, full.get(x.path)) for x in r.lines]
            + [(line_of(d), d) for d in r.disks if d.path not in named])


def line_of(d: DiskReport) -> DiskLine:
    """A disk's line from its report alone."""
    return DiskLine(d.path, d.domain, d.target, d.held_bytes, d.budget_bytes, d.wanted_bytes,
                    d.limited_by, d.not_held_reason, 0.0, None, 1.0)


def host_lines(item: dict, top: int | None = None) -> list[str]:
    """A host status file: its host line, then one indented line per disk (``disk_order``),
    per failure and per disk skipped (its code and reason; not under ``status PATH``, which
    is about PATH). ``top``: at most that many disk lines, the served disks' first, and a
    line saying what was left out; a failed disk or one needing attention is never left
    out. None: every line."""
    r = item["report"]
    disks = host_disks(r)
    counts = [f"{len(disks)} disk{'' if len(disks) == 1 else 's'} served"]
    if r.skipped is not None:
        counts.append(f"{len(r.skipped)} skipped")
    counts.append(f"{len(r.failed)} failed")
    floor = None if r.stopped else r.above_floor_bytes
    head = (f"host (pid {r.pid}, v{sanitise(r.version)}): held "
            f"{_size(r.held_bytes)} of {_size(r.budget_bytes)} budget, "
            + ("" if floor is None else f"{format_size(floor)} above the floor, ")
            + ", ".join(counts) + f", cycle {r.cycle}, {_state(item)}"
            + ("" if r.stopped else best_next_gib(r))
            + (f", max_hold {advice_said(r.budget_advice)}" if advised(r.budget_advice) else ""))
    served = sorted(disks, key=disk_order)
    skipped = [] if item.get("cut") else sorted(
        r.skipped or (), key=lambda s: (str(s["domain"]), str(s["target"])))
    room = len(served) + len(skipped) if top is None else top
    shown = [e for i, e in enumerate(served) if i < room or attention(e)]
    left = [e for i, e in enumerate(served) if not (i < room or attention(e))]
    room = max(0, room - len(served))
    return ([head] + [f"  {disk_part(x, d)}" for x, d in shown]
            + [f"  {sanitise(f['path'])}: FAILED: {sanitise(f['error'])}"
               for f in r.failed]
            + [f"  {sanitise(str(s['domain']))}{skipped_sep(s)}{sanitise(str(s['target']))}"
               ": skipped"
               + (f" ({sanitise(s['code'])})" if s.get("code") else "")
               + f": {sanitise(s['reason'])}"
               for s in skipped[:room]]
            + left_out(left, len(skipped[room:])))


def skipped_sep(s: dict) -> str:
    """``DOMAIN/TARGET``, or ``SOCKET DRIVE`` for a drive adopted through a QMP socket (a
    socket's path starts with "/", a libvirt domain's name has none)."""
    return " " if str(s["domain"]).startswith("/") else "/"


def left_out(left: list[tuple[DiskLine, DiskReport | None]], skipped: int) -> list[str]:
    """The line saying what the limit left out: the disks served and what they hold, the
    disks skipped; none when nothing was."""
    if not (left or skipped):
        return []
    parts = []
    if left:
        held = sum(_of(x, d, "held_bytes") or 0 for x, d in left)
        parts.append(f"{len(left)} more disk{'' if len(left) == 1 else 's'} holding "
                     f"{format_size(held)}")
    if skipped:
        parts.append(f"{skipped} more skipped")
    return [f"  ... and {', '.join(parts)}; --all shows them"]


def lines_of(item: dict, top: int | None = None) -> list[str]:
    """One status file's lines; every string in them sanitised. ``top``: ``host_lines``."""
    if "error" in item:
        return [f"{sanitise(item['file'])}: {sanitise(item['error'])}"]
    r = item["report"]
    if not item["one"]:
        return host_lines(item, top)
    d = r.disks[0]                       # a daemon of one disk: one line
    return [f"{disk_part(r.lines[0], d)}, source {sanitise(d.access_source or '?')}, "
            f"cycle {d.cycle}, pid {d.pid}, v{sanitise(d.version)}, {_state(item)}"]


def top_of(args) -> int | None:
    """The disk lines to show of a host: ``--top N`` (a whole number of at least 1, else
    ``ConfigError``, 78), None with ``--all`` (every one), else ``DEFAULT_TOP``."""
    if args.all:
        return None
    if args.top is None:
        return DEFAULT_TOP
    text = args.top
    try:
        if not re.fullmatch(r"[+-]?[0-9]+", text):
            raise ValueError
        n = int(text)
    except ValueError:                  # int() refuses more than 4300 digits too
        raise ConfigError(f"bad value {text!r} for --top: not a whole number of disk "
                          f"lines") from None
    if n < 1:
        raise ConfigError(f"bad value {text!r} for --top: at least 1 disk line (--all shows "
                          f"every one)")
    return n


def json_of(item: dict) -> dict:
    """One status file for ``--json``: its document as read, with ``file``,
    ``age_seconds`` and ``stale`` (or ``file``, ``error``, ``stale``)."""
    if "error" in item:
        return item
    return {**item["doc"], "file": item["file"], "age_seconds": item["age_seconds"],
            "stale": item["stale"]}


def main(args) -> int:
    top = top_of(args)
    default = default_dir()
    if args.dir is None:
        args.dir = default
    if args.dir == default and not os.path.isdir(default):
        # The default directory exists once a daemon has run since boot: none has.
        print(f"no status files in {sanitise(default)} (no daemon has run since boot)")
        return EX_INACTIVE
    items = read_files(args.dir)
    if args.path:
        bad = sum("error" in i for i in items)
        items = [{**i, "doc": d, "report": model(d), "cut": True} for i in items if "doc" in i
                 for d in [serving(i["doc"], args.path)] if d is not None]
        if not items:
            also = f" ({bad} unreadable or malformed file(s) there)" if bad else ""
            raise ImageError(f"{sanitise(args.path)}: no status file in {sanitise(args.dir)} "
                             f"serves it{also}")
    if args.json:
        json.dump([json_of(i) for i in items], sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not items:
        print(f"no status files in {sanitise(args.dir)}")
    else:
        for i in items:
            print("\n".join(lines_of(i, top)))
    return EX_LIVE if any(not i["stale"] for i in items) else EX_INACTIVE
