"""``vmdisktouch status``: the live state of every running daemon, from its status file.

Each daemon writes its status JSON (``--status``; the units put it under
``/run/vmdisktouch/``: ``host.json`` for the host service, ``INSTANCE.json``
per disk). This reads every ``*.json`` there (``--dir``), or only the
entries that serve ``PATH``, and prints one line per disk: held / budget,
regions, rewritten blocks, the access source, the cycle, the daemon's pid
and version, and the age of the file. An entry is **stale** when its file
is older than ``STALE_INTERVALS`` (3) of its daemon's intervals (at least
``STALE_MIN_SECONDS``) or its pid is gone: the daemon died or hangs.
``--json`` prints the same as a JSON array, each entry with ``file``,
``age_seconds`` and ``stale`` added.

The directory may hold anything: a file is opened without following a
symlink or waiting on a FIFO, read only if it is a regular file of at most
``MAX_STATUS_BYTES``, and shown only if ``status_read.check`` accepts it.
Any other file is one line (one ``--json`` entry: ``file``, ``error``,
``stale: true``) saying it is ``unreadable`` or ``malformed`` and why; the
valid entries are shown as ever, and the command exits 0 (as with stale
entries: it shows what is there). A ``time`` in the future by more than the
staleness limit makes its entry stale ("written in the future"; a negative
``age_seconds``). Every string printed is one line, its control characters
escaped (``status_read.sanitise``); ``--json`` escapes them as JSON does.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
import time

from vmdisktouch.adapters.outputs import MAX_STATUS_BYTES
from vmdisktouch.commands.status_read import Malformed, check, sanitise
from vmdisktouch.errors import ImageError, file_kind
from vmdisktouch.sizes import format_size

STATUS_DIR = "/run/vmdisktouch"
STALE_INTERVALS = 3
STALE_MIN_SECONDS = 15.0


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", nargs="?",
                        help="only the daemon(s) serving this disk image")
    parser.add_argument("--all", action="store_true", help="every status file (the default)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--dir", default=STATUS_DIR,
                        help=f"where the status files are (default {STATUS_DIR})")


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
    """The checked document of ``data``; ``Malformed`` when it is not one to show."""
    try:
        doc = json.loads(data)
    except RecursionError:
        raise Malformed("JSON nested too deep") from None
    except ValueError as exc:           # UnicodeDecodeError and JSONDecodeError included
        raise Malformed(f"not JSON: {exc}") from None
    check(doc)
    return doc


def read_entries(directory: str, now: float) -> list[dict]:
    """One entry per disk of every status file in ``directory``; one entry with
    ``error`` (and no ``path``) per file that is unreadable or malformed."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ImageError(f"{sanitise(directory)}: cannot list the status files: "
                         f"{exc.strerror}") from None
    out = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            data, mtime = read_file(path)
            doc = parse(data)
        except Unreadable as exc:
            out.append({"file": path, "error": f"unreadable: {exc}", "stale": True})
            continue
        except Malformed as exc:
            out.append({"file": path, "error": f"malformed: {exc}", "stale": True})
            continue
        out.extend(entries_of(doc, path, mtime, now))
    return out


def entries_of(doc: dict, path: str, mtime: float, now: float) -> list[dict]:
    """The entries of one checked status document (``status_read.check``)."""
    host = "host" in doc
    head = doc["host"] if host else doc
    limit = max(STALE_MIN_SECONDS, STALE_INTERVALS * head.get("interval_seconds", 5.0))
    age = now - head.get("time", mtime)
    if -limit <= age < 0:
        age = 0.0                       # the clock's granularity, or a small step back
    stale = abs(age) > limit or not pid_alive(head.get("pid"))
    common = {"file": path, "pid": head.get("pid"), "version": head.get("version"),
              "age_seconds": round(age, 1), "stale": stale}
    out = [{**d, **common} for d in (doc.get("disks", []) if host else [doc])]
    for f in head.get("failed", []) if host else []:
        out.append({"path": f["path"], "error": f["error"], **common})
    return out


def line(e: dict) -> str:
    """One entry as one line; every string in it sanitised."""
    if "path" not in e:
        return f"{sanitise(e['file'])}: {sanitise(e.get('error'))}"
    age = e["age_seconds"]
    when = f"{age:.0f} s ago" if age >= 0 else "written in the future"
    who = f"pid {e.get('pid')}, v{sanitise(e.get('version'))}, {when}"
    path = sanitise(e["path"])
    if e.get("error"):
        return (f"{path}: FAILED: {sanitise(e['error'])} ({who})"
                + (" STALE" if e["stale"] else ""))
    held = f"held {format_size(e.get('held_bytes', 0))}/{format_size(e.get('budget_bytes', 0))}"
    why = f" ({sanitise(e['not_held_reason'])})" if e.get("not_held_reason") else ""
    return (f"{path}: {held} in {len(e.get('regions', []))} regions{why}, "
            f"rewritten {e.get('rewritten_blocks', 0)} blocks, source "
            f"{sanitise(e.get('access_source', '?'))}, events lost {e.get('events_lost', 0)}, "
            f"cycle {e.get('cycle')} ({e.get('cycle_seconds', 0):.3f} s), {who}"
            + ("  STALE" if e["stale"] else ""))


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):       # ValueError: a NUL in a path from a status file
        try:
            return os.path.realpath(a) == os.path.realpath(b)
        except (OSError, ValueError):
            return False


def main(args) -> int:
    entries = read_entries(args.dir, time.time())
    if args.path:
        bad = sum("path" not in e for e in entries)
        entries = [e for e in entries if "path" in e and same_file(e["path"], args.path)]
        if not entries:
            also = f" ({bad} unreadable or malformed file(s) there)" if bad else ""
            raise ImageError(f"{sanitise(args.path)}: no status file in {sanitise(args.dir)} "
                             f"serves it{also}")
    if args.json:
        json.dump(entries, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not entries:
        print(f"no status files in {sanitise(args.dir)}")
    else:
        for e in entries:
            print(line(e))
    return 0
