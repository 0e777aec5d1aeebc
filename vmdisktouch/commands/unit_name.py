"""``vmdisktouch unit-name PATH``: the systemd unit that keeps PATH warm (``unitname``).

A PATH that has no unit name (empty, a NUL byte, a ``..`` component, a name
longer than systemd allows) is a bad command line: exit 2, one line
(docs/exit-codes.md); nothing is printed for the PATHs before it.
"""

from __future__ import annotations

import argparse

from vmdisktouch.errors import ConfigError, UsageError
from vmdisktouch.unitname import escape_path, unit_name


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Print the systemd unit that keeps PATH warm, e.g. "
        "vmdisktouch@var-lib-libvirt-images-vm1.img.service; enable it with "
        "`systemctl enable --now \"$(vmdisktouch unit-name PATH)\"`. The name is exactly "
        "what `systemd-escape --path --template=vmdisktouch@.service PATH` prints; a "
        "relative PATH is made absolute against the current directory first.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="disk image path (file or block device); need not exist")
    parser.add_argument("--instance", action="store_true",
                        help="print only the instance string (the %%i of the unit, also the "
                             "name of its config file /etc/vmdisktouch/INSTANCE.toml)")


def main(args) -> int:
    try:
        names = [escape_path(p) if args.instance else unit_name(p) for p in args.paths]
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print("\n".join(names))
    return 0
