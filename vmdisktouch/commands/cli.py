"""Command-line entry point: dispatches to the subcommand modules.

Each subcommand module exposes ``set_argparser(parser)`` and ``main(args) ->
int``. This module is the single place that turns exceptions into a one-line
message and an exit status, the same for every subcommand (the table:
docs/exit-codes.md): a ``VmdtError`` prints ``vmdisktouch: <message>`` and
exits with its class's code (``errors``: 1, 2, 66, 75 or 78); a command line
argparse refuses is one line too, exit 2, never a page of usage
(``Parser.error``); a closed standard output (``| head``) is one line, exit
1; anything unexpected is a bug, printed as a one-line internal error with
exit 70; ``--debug`` re-raises so the traceback is shown.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys

from vmdisktouch import __version__
from vmdisktouch.adapters.systemd import journal
from vmdisktouch.errors import EX_ERROR, EX_SOFTWARE, EX_USAGE, VmdtError

# subcommand -> (module, one-line help)
COMMANDS = {
    "snapshot": ("vmdisktouch.commands.snapshot", "report page-cache residency of disk images"),
    "run": ("vmdisktouch.commands.run", "keep the hot regions of a disk image in the page cache"),
    "discover": ("vmdisktouch.commands.discover", "list libvirt domains' disks and whether each is eligible"),
    "unit-name": ("vmdisktouch.commands.unit_name", "print the systemd unit name that keeps a disk warm"),
    "status": ("vmdisktouch.commands.status", "show the live state of every running daemon"),
    "advise": ("vmdisktouch.commands.advise", "watch disks, changing nothing, and say what host memory would buy each"),
    "adopt": ("vmdisktouch.commands.adopt", "switch a running domain's cache=none disk to the host page cache, live"),
    "release": ("vmdisktouch.commands.release", "switch adopted disks back to O_DIRECT (cache=none), live"),
    "config": ("vmdisktouch.commands.config", "print the example config file, or check one as run reads it"),
}

EXIT_ERROR = EX_ERROR
EXIT_USAGE = EX_USAGE
EXIT_INTERNAL = EX_SOFTWARE


class Parser(argparse.ArgumentParser):
    """argparse, with a refused command line said in one line (exit 2, as argparse's).

    A value that starts with ``-`` and a digit (``--max-hold -1M``, ``--interval -5``)
    is taken as the option's value, so the value's own check says what is wrong with
    it, rather than "expected one argument": no option of vmdisktouch starts with a
    digit. The subcommands' parsers are of this class too (``add_subparsers``).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message: str):
        command = self.prog.partition(" ")[2]
        where = f"{command}: " if command else ""
        _fatal(f"{where}{message} (see: {self.prog} --help)")
        sys.exit(EX_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="vmdisktouch",
        description="Keep the hot parts of QEMU/KVM disk images in the host page cache.")
    parser.add_argument("--version", action="version", version=f"vmdisktouch {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (modname, helptext) in COMMANDS.items():
        module = importlib.import_module(modname)
        p = sub.add_parser(name, help=helptext, description=helptext)
        # also after the subcommand; SUPPRESS keeps the top-level value when it is absent
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show tracebacks and debug logs")
        module.set_argparser(p)
        p.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args._main(args) or 0)
        sys.stdout.flush()        # a closed pipe is seen here, not at the interpreter's exit
        return code
    except VmdtError as exc:
        if args.debug:
            raise
        _fatal(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``| head``): nothing more can be printed; the
        # interpreter must not try to flush stdout again at exit (a second message)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        _fatal("standard output closed (broken pipe): output cut short")
        return EXIT_ERROR
    except Exception as exc:  # noqa: BLE001 - the one place that hides tracebacks
        if args.debug:
            raise
        logging.getLogger("vmdisktouch").debug("internal error", exc_info=True)
        _fatal(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug)")
        return EXIT_INTERNAL


def _fatal(message: str) -> None:
    """The last line before a failed exit: one line, at priority 3 wherever the log goes
    (``journal.fatal``: the same decision as the log's, so the journal sees why it died)."""
    journal.fatal(message)
