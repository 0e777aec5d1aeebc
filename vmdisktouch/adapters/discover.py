"""``vmdisktouch discover``: list every libvirt domain's disks and whether each can be held.

For each disk: the domain and its state, the target, the source path, file or
block, the format, the cache and io modes, eligible yes/no with the reason,
the systemd unit to enable and whether it is enabled and running (and
whether the host service, which serves every eligible disk, is). Empty
removable drives (a CD-ROM with no medium) are left out, with a count.
``--eligible`` lists only the disks vmdisktouch can help. ``--json`` prints
a JSON array with one object per disk (keys: see ``libvirt_disks.Disk``; at
least ``domain``, ``state``, ``target``, ``source``, ``type``, ``format``,
``cache``, ``io``, ``eligible``, ``reason`` and ``unit``, plus
``unit_enabled`` and ``unit_active``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys

from vmdisktouch.adapters import libvirt_disks
from vmdisktouch.adapters.libvirt_disks import DEFAULT_URI, Disk

COLUMNS = ("DOMAIN", "STATE", "TARGET", "TYPE", "FORMAT", "CACHE", "IO", "ELIGIBLE", "SOURCE")


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List every libvirt domain (running or not) and its disks: source, type, format, "
        "cache and io modes, whether vmdisktouch can help it (disks opened with O_DIRECT, "
        "i.e. cache=none/directsync or io=native, cannot be helped), and the systemd unit "
        "to enable for it.")
    parser.add_argument("--uri", default=DEFAULT_URI,
                        help=f"libvirt connection URI (default: {DEFAULT_URI})")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON array with one object per disk")
    parser.add_argument("--eligible", action="store_true",
                        help="list only the disks vmdisktouch can help")

HOST_UNIT = "vmdisktouch.service"


def unit_states(units: list[str]) -> dict[str, tuple[str, str]]:
    """unit -> (UnitFileState, ActiveState) from one ``systemctl show``; empty when
    systemctl is missing or answers nothing (no systemd running)."""
    exe = shutil.which("systemctl")
    if not exe or not units:
        return {}
    try:
        r = subprocess.run([exe, "show", "--property=Id,UnitFileState,ActiveState", "--",
                            *units], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return {}
    out = {}
    for block in r.stdout.strip().split("\n\n"):
        kv = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if kv.get("Id"):
            out[kv["Id"]] = (kv.get("UnitFileState") or "-", kv.get("ActiveState") or "-")
    return out


def _row(d: Disk) -> tuple[str, ...]:
    cache = d.cache + ("*" if d.cache_default else "")
    io = d.io + ("*" if d.io_default else "")
    return (d.domain, d.state, d.target, d.type, d.format, cache, io,
            "yes" if d.eligible else "no", d.source or "-")


def format_table(disks: list[Disk], states: dict | None = None, empty: int = 0) -> str:
    """The human listing: a table, and under each disk its reason, its unit and the
    unit's state; the count of empty drives left out."""
    states = states or {}
    rows = [COLUMNS] + [_row(d) for d in disks]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]

    def line(r):
        return "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]

    out = [line(COLUMNS).rstrip()]
    for d, r in zip(disks, rows[1:]):
        out.append(line(r).rstrip())
        out.append(f"    {'why' if d.eligible else 'why not'}: {d.reason}")
        if d.eligible and d.unit:
            if d.unit in states:
                enabled, active = states[d.unit]
                out.append(f"    unit: {d.unit} ({enabled}, {active})")
            if states.get(d.unit, ("", ""))[1] != "active":
                out.append(f"    enable: systemctl enable --now '{d.unit}'")
    host = states.get(HOST_UNIT)
    if host is not None and any(d.eligible for d in disks):
        out.append("")
        out.append(f"host service {HOST_UNIT}: {host[0]}, {host[1]}"
                   + (" (it serves every eligible disk of a running domain)"
                      if host[1] == "active" else ""))
    if empty:
        out.append("")
        out.append(f"{empty} empty removable drive{'s' if empty != 1 else ''} (no medium) "
                   "not listed")
    if any(d.cache_default or d.io_default for d in disks):
        out.append("")
        out.append("* not set in the domain XML: QEMU's default (cache=writeback, io=threads)")
    return "\n".join(out)


def main(args) -> int:
    conn = libvirt_disks.connect(args.uri)
    try:
        disks = libvirt_disks.list_disks(conn)
    finally:
        conn.close()
    shown = [d for d in disks if not is_empty_drive(d)]
    empty = len(disks) - len(shown)
    if args.eligible:
        shown = [d for d in shown if d.eligible]
    states = unit_states(sorted({d.unit for d in shown if d.eligible and d.unit}
                                | {HOST_UNIT}))
    if args.json:
        json.dump([dict(d.to_json(), unit_enabled=states.get(d.unit, (None, None))[0],
                        unit_active=states.get(d.unit, (None, None))[1]) for d in shown],
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not shown:
        print(f"no {'eligible ' if args.eligible else ''}disks at {args.uri}"
              + (f" ({empty} empty removable drives)" if empty else ""))
    else:
        print(format_table(shown, states, empty))
    return 0


def is_empty_drive(d: Disk) -> bool:
    """A CD-ROM or floppy drive with no medium: nothing to hold, only noise."""
    return d.source is None and d.type != "network" and d.device in ("cdrom", "floppy")
