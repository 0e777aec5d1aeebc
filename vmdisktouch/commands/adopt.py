"""``vmdisktouch adopt DOMAIN/TARGET``: switch a running domain's ``cache=none`` disk to the
host page cache, live (``adapters.libvirt.adopt``: what it checks first, and why).

The guest's I/O is timed first (``--measure``, by QEMU's own accounting): the host
service compares the disk with it once adopted, and releases it by itself if it got
slower (``core.never_slower``). One line per disk on standard output, and the same in
the journal. A refusal is one
line and a non-zero exit (docs/exit-codes.md): 75 when the domain's state forbids it
now (paused, migrating, a job: try again later), 78 when the disk cannot be adopted as
it is configured, or its pages would not leave the page cache; the disks named before
it stay adopted.
"""

from __future__ import annotations

import argparse
import logging

from vmdisktouch.adapters.advice_file import ADVICE_FILE, advice_path
from vmdisktouch.adapters.libvirt import adopt, libvirt_disks
from vmdisktouch.adapters.libvirt.libvirt_disks import DEFAULT_URI
from vmdisktouch.core import never_slower
from vmdisktouch.errors import UsageError

MEASURE_S = never_slower.BASELINE_WINDOWS * never_slower.WINDOW_S   # the baseline's seconds

log = logging.getLogger("vmdisktouch")


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Switch a running libvirt domain's cache=none disk to the host page cache without "
        "stopping the guest (QEMU's blockdev-reopen; " + adopt.TAINT + "). The image's "
        "pages are dropped from this host's page cache first and must all go. Refused for "
        "a domain that is paused, migrating or running a job, a disk with io='native', "
        "and one advise said would gain nothing (--force). The guest's write cache and "
        "flush contract do not change. vmdisktouch release switches it back.")
    parser.add_argument("disks", nargs="+", metavar="DOMAIN/TARGET",
                        help="the disk, by domain name and target (e.g. web1/vda); with "
                             "--qmp, the -drive id (e.g. drive-scsi0)")
    parser.add_argument("--qmp", metavar="SOCKET",
                        help="a QEMU libvirt does not run, by its QMP socket (Proxmox VE: "
                             "/var/run/qemu-server/VMID.qmp)")
    parser.add_argument("--uri", default=DEFAULT_URI,
                        help=f"libvirt connection URI (default: {DEFAULT_URI})")
    parser.add_argument("--advice", metavar="FILE",
                        help=f"advise's report that may say no gain (default: {ADVICE_FILE}, "
                             f"in the runtime directory)")
    parser.add_argument("--force", action="store_true",
                        help="adopt even where advise's last report said no gain")
    parser.add_argument("--measure", type=float, default=MEASURE_S, metavar="SECONDS",
                        help=f"time the guest's I/O this long before the switch, the "
                             f"baseline the host service releases a disk that got slower "
                             f"against (default: {MEASURE_S:g}; 0: not timed, never "
                             f"released for it)")


def main(args) -> int:
    args.advice = args.advice or advice_path()
    if not 0 <= args.measure <= 3600:
        raise UsageError(f"--measure {args.measure:g}: seconds from 0 to 3600")
    if args.qmp:
        return _through_socket(args)
    for key in args.disks:
        adopt.parse_key(key)                 # every name checked before anything changes
    conn = libvirt_disks.connect(args.uri, readonly=False)
    for key in args.disks:                   # every refusal said before the guests are timed
        adopt.check(conn, key, advice_path=args.advice, force=args.force)
    baselines = adopt.measure(conn, args.disks, args.measure)
    for key in args.disks:
        node, switched = adopt.adopt(conn, key, advice_path=args.advice, force=args.force,
                                     baseline=baselines.get(key))
        line = (f"{node.key}: adopted: {node.path} through the host page cache "
                f"(QEMU node {node.name}, libvirt still says cache={node.cache})"
                if switched else f"{node.key}: adopted already: {node.path}")
        print(line, flush=True)
        log.info("%s", line)
    return 0


def _through_socket(args) -> int:
    """``--qmp SOCKET DRIVE...`` (``adapters.qemu_socket``)."""
    from vmdisktouch.adapters import qemu_socket
    qemu_socket.check_socket(args.qmp)
    for drive in args.disks:                 # every refusal said before the guest is timed
        qemu_socket.check_drive(args.qmp, drive, advice_path=args.advice, force=args.force)
    baselines = qemu_socket.measure(args.qmp, args.disks, args.measure)
    for drive in args.disks:
        path, switched = qemu_socket.adopt_drive(args.qmp, drive, advice_path=args.advice,
                                                 force=args.force,
                                                 baseline=baselines.get(drive))
        line = (f"{args.qmp} {drive}: adopted: {path} through the host page cache"
                if switched else f"{args.qmp} {drive}: adopted already: {path}")
        print(line, flush=True)
        log.info("%s", line)
    return 0
