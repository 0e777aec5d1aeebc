"""The values of a status file, checked and made safe to print, for ``vmdisktouch status``.

Pure: no I/O. A status directory holds whatever was put there, so every file
is checked before it is shown. ``check(doc)`` accepts a document the command
can show (every key it shows, when present, of its documented type and range,
and every number finite) and otherwise raises ``Malformed`` naming the first
key that is wrong: such a file is shown as one line of its own, never as an
entry and never as a crash. ``sanitise(text)`` makes any string one printable
line: control and other non-printable characters (ESC, newlines, bidi
overrides, lone surrogates) escaped as ``\\n``, ``\\xNN``, ``\\uNNNN``,
backslashes doubled, long text cut.
"""

from __future__ import annotations

import math

from vmdisktouch.config.settings import MAX_SECONDS
from vmdisktouch.report import CODES

MAX_PID = (1 << 31) - 1          # a pid_t; larger ones do not fit os.kill
MAX_COUNT = 1 << 63              # bytes, blocks, cycles, events
MAX_TEXT = 4096                  # characters shown of one string (PATH_MAX)


class Malformed(ValueError):
    """The document is not a status the command can show; ``str()`` says why."""


_SHORT = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def sanitise(text, limit: int = MAX_TEXT) -> str:
    """``text`` (any value: ``str()`` of it) as one printable line, at most ``limit``
    characters of it shown."""
    text = str(text)
    cut = len(text) > limit
    out = []
    for ch in text[:limit] if cut else text:
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out) + (f"... ({len(text)} characters)" if cut else "")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < MAX_COUNT


def _seconds(v) -> bool:
    return _number(v) and math.isfinite(v) and v >= 0


def _ranges(v) -> bool:
    return isinstance(v, list) and all(
        isinstance(r, list) and len(r) == 2 and _count(r[0]) and _count(r[1]) for r in v)


def _count_or_null(v) -> bool:
    return v is None or _count(v)


def _text_or_null(v) -> bool:
    return v is None or isinstance(v, str)


# key -> (what it must be, the test); None is allowed only where the daemon writes null
_KINDS = {
    "path": ("a path", lambda v: isinstance(v, str) and v != ""),
    "error": ("a message", lambda v: isinstance(v, str)),
    "reason": ("a message", lambda v: isinstance(v, str)),
    "code": ("a code", lambda v: isinstance(v, str)),
    "version": ("a version", lambda v: isinstance(v, str)),
    "access_source": ("a source name", lambda v: isinstance(v, str)),
    "domain": ("a domain name or null", _text_or_null),
    "target": ("a target name or null", _text_or_null),
    "not_held_reason": ("a reason or null", _text_or_null),
    "limited_by": (f"null or one of {', '.join(CODES)}", lambda v: v is None or v in CODES),
    "pid": ("a process id", lambda v: isinstance(v, int) and not isinstance(v, bool)
            and 0 < v <= MAX_PID),
    "interval_seconds": ("an interval in seconds (at most a day)",
                         lambda v: _seconds(v) and 0 < v <= MAX_SECONDS),
    "time": ("a finite number of seconds", _seconds),
    "cycle_seconds": ("a finite number of seconds", _seconds),
    "held_bytes": ("a byte count", _count),
    "budget_bytes": ("a byte count", _count),
    "host_budget_bytes": ("a byte count", _count),
    "min_free_bytes": ("a byte count", _count),
    "share_bytes": ("a byte count or null", _count_or_null),
    "wanted_bytes": ("a byte count or null", _count_or_null),
    "cap_bytes": ("a byte count or null", _count_or_null),
    "mem_available_bytes": ("a byte count or null", _count_or_null),
    "above_floor_bytes": ("a byte count or null", _count_or_null),
    "heat": ("a number, at least 0", _seconds),
    "weight": ("a number above 0", lambda v: _seconds(v) and v > 0),
    "cycle": ("a count", _count),
    "rewritten_blocks": ("a count", _count),
    "events_lost": ("a count", _count),
    "regions": ("a list of [offset, length] pairs", _ranges),
    "stopped": ("true or false", lambda v: isinstance(v, bool)),
}
DISK_KEYS = ("path", "error", "domain", "target", "pid", "version", "interval_seconds", "time",
             "cycle", "cycle_seconds", "budget_bytes", "host_budget_bytes", "wanted_bytes",
             "held_bytes", "regions", "rewritten_blocks", "access_source", "events_lost",
             "not_held_reason", "limited_by", "mem_available_bytes", "min_free_bytes")
HEAD_KEYS = ("pid", "version", "interval_seconds", "time", "cycle", "cycle_seconds",
             "budget_bytes", "held_bytes", "mem_available_bytes", "min_free_bytes",
             "above_floor_bytes", "stopped")
LINE_KEYS = ("path", "domain", "target", "held_bytes", "share_bytes", "wanted_bytes",
             "limited_by", "not_held_reason", "heat", "cap_bytes", "weight")


def _keys(obj, where: str, keys, required=()) -> None:
    if not isinstance(obj, dict):
        raise Malformed(f"{where or 'the document'} is not a JSON object")
    prefix = f"{where}." if where else ""
    for k in required:
        if k not in obj:
            raise Malformed(f"{prefix}{k} is missing")
    for k in keys:
        if k in obj and not _KINDS[k][1](obj[k]):
            raise Malformed(f"{prefix}{k} is not {_KINDS[k][0]}")


def _list(obj: dict, key: str, where: str) -> list:
    v = obj.get(key, [])
    if not isinstance(v, list):
        raise Malformed(f"{where}{key} is not a list")
    return v


def check(doc) -> None:
    """Raise ``Malformed`` unless ``doc`` is a status ``vmdisktouch status`` can show:
    one disk's object, or a host's (``host`` and ``disks``; docs/status.md)."""
    if isinstance(doc, dict) and "host" in doc:
        _keys(doc["host"], "host", HEAD_KEYS)
        for i, d in enumerate(_list(doc["host"], "disks", "host.")):
            _keys(d, f"host.disks[{i}]", LINE_KEYS, ("path",))
        for i, f in enumerate(_list(doc["host"], "failed", "host.")):
            _keys(f, f"host.failed[{i}]", ("path", "error"), ("path", "error"))
        for i, s in enumerate(_list(doc["host"], "skipped", "host.")):
            _keys(s, f"host.skipped[{i}]", ("domain", "target", "code", "reason"),
                  ("domain", "target", "reason"))
        for i, d in enumerate(_list(doc, "disks", "")):
            _keys(d, f"disks[{i}]", DISK_KEYS, ("path",))
    else:
        _keys(doc, "", DISK_KEYS, ("path",))
    _finite(doc)


def _finite(doc) -> None:
    """Every number of ``doc`` is finite (``--json`` prints no NaN or Infinity): walked
    without recursion, as deep as the parser let it be; the key is named only when
    one is wrong."""
    todo = [(doc, None)]                     # (value, (parent's link, key) or None)
    while todo:
        v, link = todo.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise Malformed(f"{_where(link)} is not a finite number")
        if isinstance(v, dict):
            todo.extend((x, (link, f".{k}")) for k, x in v.items())
        elif isinstance(v, list):
            todo.extend((x, (link, f"[{i}]")) for i, x in enumerate(v))


def _where(link) -> str:
    parts = []
    while link is not None:
        link, key = link
        parts.append(key)
    return "".join(reversed(parts)).lstrip(".") or "the document"
