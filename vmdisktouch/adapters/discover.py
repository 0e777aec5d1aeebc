"""``vmdisktouch discover``: list every libvirt domain's disks and whether each can be held.

For each disk: the domain and its state, the target, the source path, file or
block, the format, the cache and io modes, eligible yes/no with the reason,
and the systemd unit to enable. ``--json`` prints a JSON array with one
object per disk (keys: see ``libvirt_disks.Disk``; at least ``domain``,
``state``, ``target``, ``source``, ``type``, ``format``, ``cache``, ``io``,
``eligible``, ``reason`` and ``unit``).
"""

from __future__ import annotations

import argparse
import json
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


def _row(d: Disk) -> tuple[str, ...]:
    cache = d.cache + ("*" if d.cache_default else "")
    io = d.io + ("*" if d.io_default else "")
    return (d.domain, d.state, d.target, d.type, d.format, cache, io,
            "yes" if d.eligible else "no", d.source or "-")


def format_table(disks: list[Disk]) -> str:
    """The human listing: a table, and under each disk its reason and unit."""
    rows = [COLUMNS] + [_row(d) for d in disks]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]

    def line(r):
        return "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]

    out = [line(COLUMNS).rstrip()]
    for d, r in zip(disks, rows[1:]):
        out.append(line(r).rstrip())
        out.append(f"    {'why' if d.eligible else 'why not'}: {d.reason}")
        if d.eligible and d.unit:
            out.append(f"    enable: systemctl enable --now '{d.unit}'")
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
    if args.json:
        json.dump([d.to_json() for d in disks], sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not disks:
        print(f"no disks: no libvirt domain at {args.uri} has a disk")
    else:
        print(format_table(disks))
    return 0
