"""``vmdisktouch release DOMAIN/TARGET | --qmp SOCKET DRIVE | --all``: switch adopted disks
back to O_DIRECT (``adapters.libvirt.adopt``, ``adapters.qemu_socket``).

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
    parser.add_argument("--qmp", metavar="SOCKET",
                        help="a QEMU libvirt does not run, by its QMP socket: the disks are "
                             "its -drive ids")


def main(args) -> int:
    from vmdisktouch.adapters import qemu_socket
    from vmdisktouch.adapters.libvirt import adopted
    if bool(args.disks) == bool(args.all):
        raise UsageError("name the disks (DOMAIN/TARGET) or --all, not both")
    if args.qmp and args.all:
        raise UsageError("--all releases every adopted disk already: no --qmp with it")
    if args.qmp:
        qemu_socket.check_socket(args.qmp)
    else:
        for key in args.disks:
            adopt.parse_key(key)
    drives = ([(args.qmp, d) for d in args.disks] if args.qmp
              else qemu_socket.recorded() if args.all else [])
    failed, done = release_each(
        [(f"{sock} {drive}", lambda sock=sock, drive=drive: qemu_socket.release_drive(
            sock, drive)) for sock, drive in drives], args.all)
    if not args.qmp and (args.disks or adopted.records()):   # else no libvirt to ask
        conn = libvirt_disks.connect(args.uri, readonly=False)

        def one(key):
            node, switched = adopt.release(conn, key, by_operator=True)
            return node.path, switched
        more = release_each([(key, lambda key=key: one(key))
                             for key in list(args.disks) or adopt.recorded_keys(conn)],
                            args.all)
        failed, done = failed + more[0], done + more[1]
    if args.all and not done and not failed:
        say("no disk is adopted")
    return 1 if failed else 0


def release_each(disks: list, keep_going: bool) -> tuple[int, int]:
    """Release each ``(name, release)``: one line each; a failure is said and counted
    when ``keep_going`` (``--all``), else raised. ``(failed, released or said)``."""
    failed = done = 0
    for name, release in disks:
        try:
            path, switched = release()
        except VmdtError as exc:
            if not keep_going:
                raise
            print(f"vmdisktouch: {exc}", file=sys.stderr, flush=True)
            failed += 1
            continue
        done += 1
        say(f"{name}: released: {path} with O_DIRECT again" if switched
            else f"{name}: not adopted: QEMU opens {path} with O_DIRECT")
    return failed, done


def say(line: str) -> None:
    print(line, flush=True)
    log.info("%s", line)
