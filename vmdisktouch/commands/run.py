"""``vmdisktouch run``: the daemon's command line; the runtime is ``daemon.service``.

``run PATH [PATH ...]`` serves the images given (a single disk is a host of
one), ``run --libvirt`` the disks of libvirt's running domains; either way
under one budget (``max_hold``), with the settings of defaults < config
file < flags. This module parses the arguments, sets up the log (the
journal's fields, its stream's priorities or a terminal's timestamps:
``adapters.systemd.journal``) and the signal handlers, first, so a SIGHUP or
SIGTERM during start-up is kept, and hands over to the service.
"""

from __future__ import annotations

import argparse
import logging

from vmdisktouch.adapters.systemd import journal
from vmdisktouch.adapters.libvirt.libvirt_disks import DEFAULT_URI
from vmdisktouch.config import file as configfile
from vmdisktouch.config import settings
from vmdisktouch.errors import UsageError
from vmdisktouch.system.signals import LoopSignals

log = logging.getLogger("vmdisktouch")


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", metavar="PATH", nargs="*",
                        help="disk image: raw/qcow2 file or block device; several share "
                             "one budget (max_hold), their regions ranked together")
    parser.add_argument("--libvirt", action="store_true",
                        help="serve every eligible disk of every running libvirt domain "
                             "(--uri), following them live, under one budget; no PATH")
    settings.add_arguments(parser)
    configfile.add_arguments(parser)
    parser.add_argument("--uri", default=DEFAULT_URI,
                        help=f"libvirt URI asked about the disk's cache mode and domain "
                             f"(default: {DEFAULT_URI}; '' to not ask libvirt)")
    parser.add_argument("--force", action="store_true",
                        help="hold a disk even though libvirt opens it with O_DIRECT "
                             "(cache=none/directsync or io=native)")


def main(args) -> int:
    journal.setup(getattr(args, "debug", False))
    sig = LoopSignals().install()     # first: a SIGHUP or SIGTERM during start-up is kept
    try:
        return _start(args, sig)
    finally:
        sig.restore()


def _start(args, sig: LoopSignals) -> int:
    if bool(args.paths) == bool(args.libvirt):
        raise UsageError("run needs disk images (PATH ...) or --libvirt, not both"
                         if args.paths else "run needs a disk image (PATH) or --libvirt")
    from vmdisktouch.daemon import service    # numpy only once the arguments are good
    cli_values = {s.key: getattr(args, s.key) for s in settings.SETTINGS}
    config, warnings, config_path = service.load_settings(cli_values, args.config)
    for w in warnings:
        log.warning("%s", w)
    return service.serve(args, config, config_path, cli_values, sig)
