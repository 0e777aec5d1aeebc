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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from vmdisktouch.adapters.outputs import MAX_STATUS_BYTES
from vmdisktouch.errors import ImageError
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
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_entries(directory: str, now: float) -> list[dict]:
    """One entry per disk of every status file in ``directory``."""
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise ImageError(f"{directory}: cannot list the status files: {exc.strerror}") from None
    out = []
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, "rb") as f:
                doc = json.loads(f.read(MAX_STATUS_BYTES))
            mtime = os.stat(path).st_mtime
        except (OSError, ValueError) as exc:
            out.append({"file": path, "error": f"unreadable: {exc}", "stale": True})
            continue
        if not isinstance(doc, dict):
            out.append({"file": path, "error": "not a status file", "stale": True})
            continue
        head = doc.get("host", doc)
        interval = head.get("interval_seconds") or 5.0
        age = max(0.0, now - float(head.get("time") or mtime))
        stale = (age > max(STALE_MIN_SECONDS, STALE_INTERVALS * float(interval))
                 or not pid_alive(head.get("pid")))
        common = {"file": path, "pid": head.get("pid"), "version": head.get("version"),
                  "age_seconds": round(age, 1), "stale": stale}
        disks = doc.get("disks") if "host" in doc else [doc]
        for d in disks or []:
            out.append({**d, **common})
        for f in head.get("failed", []) if "host" in doc else []:
            out.append({"path": f.get("path"), "error": f.get("error"), **common})
    return out


def line(e: dict) -> str:
    if "path" not in e or e.get("path") is None:
        return f"{e['file']}: {e.get('error')}"
    who = f"pid {e.get('pid')}, v{e.get('version')}, {e.get('age_seconds'):.0f} s ago"
    if e.get("error"):
        return f"{e['path']}: FAILED: {e['error']} ({who})" + (" STALE" if e["stale"] else "")
    held = f"held {format_size(e.get('held_bytes', 0))}/{format_size(e.get('budget_bytes', 0))}"
    why = f" ({e['not_held_reason']})" if e.get("not_held_reason") else ""
    return (f"{e['path']}: {held} in {len(e.get('regions', []))} regions{why}, "
            f"rewritten {e.get('rewritten_blocks', 0)} blocks, source "
            f"{e.get('access_source', '?')}, events lost {e.get('events_lost', 0)}, cycle "
            f"{e.get('cycle')} ({e.get('cycle_seconds', 0):.3f} s), {who}"
            + ("  STALE" if e["stale"] else ""))


def same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def main(args) -> int:
    entries = read_entries(args.dir, time.time())
    if args.path:
        entries = [e for e in entries if e.get("path") and same_file(e["path"], args.path)]
        if not entries:
            raise ImageError(f"{args.path}: no status file in {args.dir} serves it")
    if args.json:
        json.dump(entries, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not entries:
        print(f"no status files in {args.dir}")
    else:
        for e in entries:
            print(line(e))
    return 0
