"""``vmdisktouch release DOMAIN/TARGET | --all``: switch adopted disks back to O_DIRECT
(``adapters.libvirt.adopt``).

``--all`` releases every disk a record says was adopted and QEMU still has through
the page cache (a domain gone since has nothing left to release: its record goes).
One line per disk, on standard output and in the journal; a disk not adopted is said
as such, exit 0: releasing is safe to repeat. A disk that fails is one line on stderr,
the others are still released, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import logging
import sys

from vmdisktouch.adapters.libvirt import adopt, libvirt_disks
from vmdisktouch.adapters.libvirt.libvirt_disks import DEFAULT_URI
from vmdisktouch.errors import UsageError, VmdtError

log = logging.getLogger("vmdisktouch")


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Switch disks vmdisktouch adopt switched to the host page cache back to O_DIRECT "
        "(cache=none), live. QEMU flushes the disk first; the image's pages are dropped "
        "from the page cache after.")
    parser.add_argument("disks", nargs="*", metavar="DOMAIN/TARGET",
                        help="the disk, by domain name and target (e.g. web1/vda)")
    parser.add_argument("--all", action="store_true",
                        help="every disk adopted on this host")
    parser.add_argument("--uri", default=DEFAULT_URI,
                        help=f"libvirt connection URI (default: {DEFAULT_URI})")


def main(args) -> int:
    if bool(args.disks) == bool(args.all):
        raise UsageError("name the disks (DOMAIN/TARGET) or --all, not both")
    for key in args.disks:
        adopt.parse_key(key)
    conn = libvirt_disks.connect(args.uri, readonly=False)
    keys = list(args.disks) or adopt.recorded_keys(conn)
    failed = 0
    for key in keys:
        try:
            node, switched = adopt.release(conn, key, by_operator=True)
        except VmdtError as exc:
            if not args.all:
                raise
            print(f"vmdisktouch: {exc}", file=sys.stderr, flush=True)
            failed += 1
            continue
        line = (f"{node.key}: released: {node.path} with O_DIRECT again" if switched
                else f"{node.key}: not adopted: QEMU opens {node.path} with O_DIRECT")
        print(line, flush=True)
        log.info("%s", line)
    if args.all and not keys:
        print("no disk is adopted", flush=True)
    return 1 if failed else 0
