"""``vmdisktouch discover``: list every libvirt domain's disks and whether each can be held.

The human listing opens with the recommended way to serve them: the host
service ``vmdisktouch.service`` (``run --libvirt``: every eligible disk of
every running domain under one budget, ``max_hold`` in
``/etc/vmdisktouch/host.toml``), how to enable it, or its state once it runs.
Then, for each disk: the domain and its state, the target, the source path,
file or block, the format, the cache and io modes, eligible yes/no with the
reason, and the per-disk unit with its state (enabled, running): the
alternative, a footnote says how to enable one. Empty removable drives (a
CD-ROM with no medium) are left out, with a count. ``--eligible`` lists only
the disks vmdisktouch can help. ``--json`` prints a JSON array with one
object per disk (keys: see ``libvirt_disks.Disk``; at least ``domain``,
``state``, ``target``, ``source``, ``type``, ``format``, ``cache``, ``io``,
``eligible``, ``reason``, ``code``, ``labels`` and ``unit``, plus ``unit_enabled``,
``unit_active`` and ``out_of_scope``: why the host service's config file leaves an
eligible disk out, or null). What is wrong with a domain's XML is said under each of
its disks (``problem``: its metadata cannot be parsed, so the heat it
carries is ignored); a domain whose XML cannot be read at all (over
libvirt's 4 MiB message limit) is one row of its own (``unread``), its
target ``-``, not eligible, with the reason.
"""

from __future__ import annotations

import shutil
import subprocess
import time

from vmdisktouch.adapters.libvirt.libvirt_disks import Disk
from vmdisktouch.adapters.advice_file import advice_cell, advice_of, advice_line

HOST_UNIT = "vmdisktouch.service"
HOST_CONFIG = "/etc/vmdisktouch/host.toml"
DISK_CONFIG = "/etc/vmdisktouch/default.toml"
COLUMNS = ("DOMAIN", "STATE", "TARGET", "TYPE", "FORMAT", "CACHE", "IO", "ELIGIBLE", "ADVICE",
           "SOURCE")
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


def _row(d: Disk, advice: dict | None) -> tuple[str, ...]:
    cache = d.cache + ("*" if d.cache_default else "")
    io = d.io + ("*" if d.io_default else "")
    said = advice_cell(advice_of(advice, d.domain, d.target, d.source))
    return (d.domain, d.state, d.target, d.type, d.format, cache, io,
            "yes" if d.eligible else "no", said, d.source or "-")


def host_line(state: tuple[str, str] | None) -> str:
    """The host service first: its state once it runs, else how to enable it."""
    if state is not None and state[1] in ("active", "reloading"):
        return (f"host service {HOST_UNIT}: {state[0]}, {state[1]} (it serves every eligible "
                "disk of every running domain, under one budget)")
    return (f"recommended: set max_hold in {HOST_CONFIG}, then systemctl enable --now "
            f"{HOST_UNIT}" + (f"  (now {state[0]}, {state[1]})" if state else ""))


def format_table(disks: list[Disk], states: dict | None = None, empty: int = 0,
                 advice: dict | None = None, now: float | None = None,
                 scope: dict | None = None) -> str:
    """The human listing: the host service's line (when a disk is eligible), a table,
    and under each disk its reason, why the host service's scope leaves it out (``scope``:
    (domain, target) -> why) and its per-disk unit with the unit's state; the
    count of empty drives left out; where ADVICE comes from (``load_advice``)."""
    states, scope = states or {}, scope or {}
    rows = [COLUMNS] + [_row(d, advice) for d in disks]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]

    def line(r):
        return "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]

    out = []
    if any(d.eligible for d in disks):
        out += [host_line(states.get(HOST_UNIT)), ""]
    out.append(line(COLUMNS).rstrip())
    for d, r in zip(disks, rows[1:]):
        out.append(line(r).rstrip())
        out.append(f"    {'why' if d.eligible else 'why not'}: {d.reason}")
        if (d.domain, d.target) in scope:
            out.append(f"    host service: out of scope: {scope[(d.domain, d.target)]}")
        if d.problem and d.problem != d.reason:
            out.append(f"    problem: {d.problem}")
        if d.eligible and d.unit:
            state = f" ({states[d.unit][0]}, {states[d.unit][1]})" if d.unit in states else ""
            out.append(f"    per-disk unit: {d.unit}{state}")
    if any(d.eligible and d.unit for d in disks):
        out.append("")
        out.append("per-disk unit: the alternative, for a disk outside libvirt (max_hold in "
                   f"{DISK_CONFIG}, then systemctl enable --now 'UNIT'); never with the host "
                   "service for one image")
    if empty:
        out.append("")
        out.append(f"{empty} empty removable drive{'s' if empty != 1 else ''} (no medium) "
                   "not listed")
    out.append("")
    out.append(advice_line(advice, time.time() if now is None else now))
    if any(d.cache_default or d.io_default for d in disks):
        out.append("")
        out.append("* not set in the domain XML: QEMU's default (cache=writeback, io=threads)")
    return "\n".join(out)


def is_empty_drive(d: Disk) -> bool:
    """A CD-ROM or floppy drive with no medium: nothing to hold, only noise."""
    return d.source is None and d.type != "network" and d.device in ("cdrom", "floppy")


def unread(domain: str, state: str, why: str) -> Disk:
    """The row of a domain whose disks cannot be read (``why``): listed, not eligible."""
    return Disk(domain=domain, state=state, active=None, target="-", device="-", source=None,
                type="-", format="-", cache="-", cache_default=False, io="-",
                io_default=False, readonly=False, eligible=False,
                reason=f"{why}; its disks are not known", problem=why)
