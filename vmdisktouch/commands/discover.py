"""``vmdisktouch discover``: every libvirt domain's disks and whether each can be helped
(the table and its rules: ``commands.discover_table``), and, by the host service's config
file (``--config``), which eligible disks its ``[scope]`` leaves out, with why. A domain whose XML cannot be read is
listed as such and the others as ever, and the exit status is 1, with one line on
stderr per such domain: a script must not take the listing for complete."""

from __future__ import annotations

import argparse
import json
import os
import sys

from vmdisktouch.adapters.libvirt import libvirt_disks
from vmdisktouch.adapters.advice_file import ADVICE_FILE, advice_of, advice_path, load_advice
from vmdisktouch.commands.discover_table import (HOST_UNIT, format_table, is_empty_drive,
                                                 unit_states, unread)
from vmdisktouch.adapters.libvirt.libvirt_disks import DEFAULT_URI
from vmdisktouch.config import file as configfile
from vmdisktouch.errors import ConfigError
from vmdisktouch.commands.discover_table import HOST_CONFIG


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "List every libvirt domain (running or not) and its disks: source, type, format, "
        "cache and io modes, whether vmdisktouch can help it (disks opened with O_DIRECT, "
        "i.e. cache=none/directsync or io=native, cannot be helped) and its per-disk "
        "systemd unit. The recommended way to serve them is the host service: set max_hold "
        "in /etc/vmdisktouch/host.toml, then systemctl enable --now vmdisktouch.service "
        "(every eligible disk of every running domain, under one budget); a per-disk unit "
        "is the alternative, for a disk outside libvirt.")
    parser.add_argument("--uri", default=DEFAULT_URI,
                        help=f"libvirt connection URI (default: {DEFAULT_URI})")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON array with one object per disk")
    parser.add_argument("--advice", metavar="FILE",
                        help="the ADVICE column from this report of vmdisktouch advise "
                             f"(default: {ADVICE_FILE} in the runtime directory, where advise "
                             f"keeps its last one)")
    parser.add_argument("--eligible", action="store_true",
                        help="list only the disks vmdisktouch can help")
    parser.add_argument("--config", metavar="FILE",
                        help="the host service's config file whose [scope] and [domain...] "
                             "exclude say which eligible disks it leaves out (default: "
                             f"{HOST_CONFIG}, when it exists)")


def main(args) -> int:
    rules = host_rules(args.config)          # a bad file is refused before libvirt is asked
    conn = libvirt_disks.connect(args.uri)
    memo = libvirt_disks.Memo(say=lambda *_: None)      # said here, in the listing
    try:
        disks = libvirt_disks.list_disks(conn, memo=memo)
    finally:
        conn.close()
    known = {d.domain for d in disks}
    unreadable = {name: p for name, p in memo.problems.items() if name not in known}
    disks = sorted(disks + [unread(n, state, why) for n, (why, state) in unreadable.items()],
                   key=lambda d: (d.domain, d.target))
    shown = [d for d in disks if not is_empty_drive(d)]
    empty = len(disks) - len(shown)
    if args.eligible:
        shown = [d for d in shown if d.eligible]
    states = unit_states(sorted({d.unit for d in shown if d.eligible and d.unit}
                                | {HOST_UNIT}))
    advice = load_advice(args.advice or advice_path())
    scope = out_of_scope(shown, *rules)
    if args.json:
        json.dump([dict(d.to_json(), unit_enabled=states.get(d.unit, (None, None))[0],
                        unit_active=states.get(d.unit, (None, None))[1],
                        advice=advice_of(advice, d.domain, d.target, d.source),
                        out_of_scope=scope.get((d.domain, d.target))) for d in shown],
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif not shown:
        print(f"no {'eligible ' if args.eligible else ''}disks at {args.uri}"
              + (f" ({empty} empty removable drives)" if empty else ""))
    else:
        print(format_table(shown, states, empty, advice, scope=scope))
    for name, (why, _) in sorted(unreadable.items()):
        print(f"vmdisktouch: {name}: {why}; its disks are not listed", file=sys.stderr)
    return 1 if unreadable else 0


def host_rules(config: str | None):
    """(the host service's rules, their file): ``--config``, else the default file only when
    it exists; ConfigError (exit 78) when it is bad or a named one is missing."""
    path = config if config is not None else (HOST_CONFIG if os.path.exists(HOST_CONFIG)
                                              else None)
    if path is not None and not os.path.exists(path):
        raise ConfigError(f"{path}: no such config file")
    return configfile.load_rules(path), path


def out_of_scope(disks, rules, path) -> dict[tuple[str, str], str]:
    """(domain, target) -> why the host service leaves that eligible disk out, by its rules
    (``overrides.Rules.out_of_scope``, the service's own verdict)."""
    out = {}
    for d in disks:
        said = rules.out_of_scope(d.domain, d.target, d.labels) if d.eligible else None
        if said is not None:
            out[(d.domain, d.target)] = f"{said[1]} ({path})"
    return out
