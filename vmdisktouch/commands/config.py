"""``vmdisktouch config``: the example config file, and a check of one as ``run`` reads it.

``--check FILE`` refuses exactly what ``run --config FILE`` would refuse at
start: a key or value that is wrong, a missing required setting
(``max_hold``), a budget smaller than one block or a floor above the host's
memory, a bad per-domain or per-disk override, and an output path ``run``
would refuse (``served.check_outputs``, the very check ``run`` makes: its
directory missing or not writable, the config file itself, a file that is not
vmdisktouch's; a PNG path's ``{disk}`` stands for ``SAMPLE_IMAGE``'s name),
in the same one line and exit 78: an "ok" that ``run`` then refuses is a
broken deploy found too late. It prints the warnings ``run``
would log, then ``FILE: ok``. The lock limit (``RLIMIT_MEMLOCK``) is the
running process's, not the unit's (``LimitMEMLOCK=infinity``), so it is only
reported, never refused here.
"""

from __future__ import annotations

import argparse
import sys

from vmdisktouch.config import file as configfile
from vmdisktouch.config import settings
from vmdisktouch.daemon import served
from vmdisktouch.errors import VmdtError
from vmdisktouch.sizes import counted, format_size
from vmdisktouch.system import meminfo


def set_argparser(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--example", action="store_true",
                       help="print the example config file (every key, commented)")
    group.add_argument("--check", metavar="FILE",
                       help="read FILE as `run --config FILE` would; print its warnings, or "
                            "the first thing `run` would refuse and exit 78")


SAMPLE_IMAGE = "/var/lib/libvirt/images/disk.img"   # no image is named: {disk} stands for it


def check(path: str) -> list[str]:
    """The warnings of ``path`` as ``run --config path`` reads it; ConfigError if refused."""
    config, warnings = configfile.resolve_run_config(
        {s.key: None for s in settings.SETTINGS}, path)
    configfile.load_rules(path)
    served.check_outputs(config, [SAMPLE_IMAGE], served.config_protected(path))
    warnings = list(warnings)
    try:
        total = meminfo.mem_total()
    except VmdtError as exc:               # an unreadable /proc only skips this check
        warnings.append(f"{exc}: the budget and the floor are not checked against this host")
    else:
        warnings += settings.check_host(config, total)
    allowance = meminfo.memlock_allowance()
    if allowance is not None and config.max_hold > allowance:
        warnings.append(f"max_hold {format_size(config.max_hold)} is above this shell's lock "
                        f"limit (RLIMIT_MEMLOCK {format_size(allowance)}): fine under the unit "
                        "(LimitMEMLOCK=infinity), refused by a `run` started from here")
    return warnings


def main(args) -> int:
    if args.example:
        sys.stdout.write(configfile.example_config())
        return 0
    warnings = check(args.check)       # a ConfigError: one line, exit 78 (cli)
    for w in warnings:
        print(f"vmdisktouch: warning: {w}", file=sys.stderr)
    print(f"{args.check}: ok" + (f" ({counted(len(warnings), 'warning')})" if warnings else ""))
    return 0
