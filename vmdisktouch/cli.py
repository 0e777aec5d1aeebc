"""Command-line entry point: dispatches to the subcommand modules.

Each subcommand module exposes ``set_argparser(parser)`` and ``main(args) ->
int``. This module is the single place that turns exceptions into a one-line
message and an exit status: a ``VmdtError`` prints ``vmdisktouch: <message>``
and exits 1; anything unexpected prints a one-line internal error and exits
70; ``--debug`` re-raises so the traceback is shown.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from vmdisktouch import __version__
from vmdisktouch.errors import VmdtError

# subcommand -> (module, one-line help)
COMMANDS = {
    "snapshot": ("vmdisktouch.snapshot", "report page-cache residency of disk images"),
    "run": ("vmdisktouch.run", "keep the hot regions of a disk image in the page cache"),
    "discover": ("vmdisktouch.discover", "list libvirt domains' disks and whether each is eligible"),
    "unit-name": ("vmdisktouch.unitname", "print the systemd unit name that keeps a disk warm"),
}

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vmdisktouch",
        description="Keep the hot parts of QEMU/KVM disk images in the host page cache.")
    parser.add_argument("--version", action="version", version=f"vmdisktouch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (modname, helptext) in COMMANDS.items():
        module = importlib.import_module(modname)
        p = sub.add_parser(name, help=helptext, description=helptext)
        module.set_argparser(p)
        p.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except VmdtError as exc:
        if args.debug:
            raise
        print(f"vmdisktouch: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the one place that hides tracebacks
        if args.debug:
            raise
        logging.getLogger("vmdisktouch").debug("internal error", exc_info=True)
        print(f"vmdisktouch: internal error: {type(exc).__name__}: {exc} (rerun with --debug)",
              file=sys.stderr)
        return EXIT_INTERNAL
