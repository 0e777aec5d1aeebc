"""Which disks the daemon serves: one interface, two kinds.

Theory of operation
-------------------
``want()`` answers, once a cycle, which image paths to serve and, for each,
what libvirt says of it (``Member``: its domain and target, and whether the
domain is running), or None when that cannot be told now (libvirt
unreachable: the caller keeps what it serves). Both kinds ask the one
``LibvirtWatch`` (a resync a cycle; its events wake the loop):

* ``GivenPaths``: the images named on the command line (``run IMG ...``).
  They are served for the daemon's whole life; with a libvirt URI each one's
  owning domain is followed: while it is shut off (``active`` False) the
  disk's holds are released and none are taken, and they come back when it
  starts. A path no domain uses is not under libvirt (``active`` None) and
  is held; a domain that takes it later (a start, a restore, an incoming
  migration) is followed from the cycle that sees it: while it arrives the
  disk holds nothing (``daemon.arrival``). That cycle must come before QEMU
  activates the disk and drops its page cache, and libvirt sends no event
  before a restore completes: so every open of a path served that no domain
  uses wakes the loop (``opened``; ``system.opens``, inotify), and QEMU opens
  the image first.
  A path that cannot be opened at start, or fails later, is not tried again
  (``retry`` False): systemd restarts a unit whose every disk failed.
* ``RunningDomains`` (``run --libvirt``): the eligible, writable disks of
  every running domain (``libvirt_watch.wanted``); a disk that appears is
  opened, one that goes is released at once, one that cannot be opened is
  tried again each cycle (``retry`` True).

Both check at open that libvirt does not open the image with O_DIRECT
(``check``, refused unless ``--force``). A path given whose image is a drive adopted
through a QEMU's QMP socket (``adopt --qmp``: its record, its QEMU alive) is marked
adopted (``Member.qmp``): the service judges it and releases it when it stops, as it
does a libvirt domain's adopted disk (``daemon.adoption``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace

from vmdisktouch.adapters.libvirt import libvirt_watch
from vmdisktouch.errors import VmdtError
from vmdisktouch.system import opens

log = logging.getLogger("vmdisktouch")


@dataclass(frozen=True)
class Member:
    """One disk to serve, as libvirt knows it (all None: not under libvirt)."""
    path: str
    domain: str | None = None
    target: str | None = None
    active: bool | None = None       # its domain runs; None: no domain uses it
    carried: object = None           # the heat its domain carries for it (``domain_heat``)
    arriving: str = ""               # QEMU has not activated its disks yet: starting,
    #                                  incoming, landed (``domain_state.arriving``)
    activated: bool = True           # QEMU has activated them for certain (running, restored)
    labels: tuple[str, ...] = ()     # its domain's labels (``libvirt_disks.labels_of``)
    adopted: float | None = None     # switched to the page cache by ``vmdisktouch adopt`` since
    qmp: str | None = None           # adopted through a QEMU's QMP socket: ``SOCKET DRIVE``


@dataclass
class Want:
    serve: dict[str, Member]                                # image path -> member
    # (domain, target) -> (code, why): ``report.UNSERVED``'s code, the reason in words
    skipped: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # the skipped a ``vmdisktouch adopt`` could switch -> their domain's labels (``[adopt]``)
    adoptable: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    # of those, the ones their domain carries as adopted (``adopted.mark``)
    readopt: frozenset[tuple[str, str]] = frozenset()


class GivenPaths:
    """The paths named on the command line; their owning domains followed (``watch``)."""

    retry = False

    def __init__(self, paths: list[str], watch: libvirt_watch.LibvirtWatch | None,
                 force: bool = False):
        self.paths = list(paths)
        self.watch = watch
        self.force = force
        self._opens = None                    # system.opens.OpenWatch, with libvirt only
        self._owned: set[str] = set()         # paths a domain was seen to use
        self._last: dict[str, Member] = {p: Member(p) for p in self.paths}

    def check(self, path: str) -> None:
        """Refuse a disk libvirt opens with O_DIRECT (``IneligibleDiskError``)."""
        listed = self.watch.disks() if self.watch is not None else None
        if listed is not None:
            libvirt_watch.require_eligible(libvirt_watch.owners(listed, path), path,
                                           self.force)

    def opened(self, path: str, fd: int | None = None) -> None:
        """The daemon has opened ``path`` (``fd``: its verified descriptor): from now on any
        open of it wakes the loop (with libvirt: the domain that takes it is seen before
        QEMU activates it)."""
        if self.watch is None or self.watch.wake is None:
            return
        try:
            if self._opens is None:
                self._opens = opens.OpenWatch(self.watch.wake)
        except VmdtError as exc:
            log.warning("%s: opens of the image are not watched (%s): a domain that takes "
                        "it is seen at the next cycle, or at libvirt's next event", path, exc)
            return
        self._opens.add(path, fd)

    def take_opened(self) -> bool:
        """Whether an open of a path served woke the loop since the last ``want``."""
        return self._opens is not None and self._opens.take()

    def want(self) -> Want:
        if self._opens is not None:
            self._opens.take()                # this listing answers every open before it
        listed = self.watch.disks() if self.watch is not None else None
        if listed is not None:
            self._last = {p: self._member(p, libvirt_watch.owners(listed, p))
                          for p in self.paths}
        if self._opens is not None:       # held and no domain: one could take it unseen
            for p, m in self._last.items():
                self._opens.arm(p, m.active is None)
        return Want(adopted_through_qmp(dict(self._last)))

    def _member(self, path: str, found) -> Member:
        if not found:
            # once seen under libvirt, a vanished owner means "not running"
            return Member(path, active=False if path in self._owned else None)
        self._owned.add(path)
        d = found[0]
        why = {o.arriving for o in found if o.active}
        return Member(path, d.domain, d.target, any(bool(o.active) for o in found), d.carried,
                      next((a for a in ("incoming", "landed", "starting") if a in why), ""),
                      any(o.activated for o in found if o.active), d.labels,
                      next((o.adopted for o in found if o.active and o.adopted), None))

    def close(self) -> None:
        if self._opens is not None:
            self._opens.close()
        if self.watch is not None:
            self.watch.close()


def adopted_through_qmp(serve: dict[str, Member]) -> dict[str, Member]:
    """``serve`` with each image that a record of ``adopt --qmp`` names, its QEMU alive,
    marked adopted (``qemu_socket.records``; a record whose QEMU exited goes)."""
    from vmdisktouch.adapters import qemu_socket
    recs = {os.path.realpath(d["path"]): d for d in qemu_socket.records() if d["path"]}
    if not recs:
        return serve
    for path, m in serve.items():
        d = recs.get(os.path.realpath(path))
        if d is not None and m.adopted is None:
            serve[path] = replace(m, adopted=d["since"],
                                  qmp=qemu_socket.key_of(d["socket"], d["drive"]))
    return serve


class RunningDomains:
    """The eligible disks of libvirt's running domains, followed live."""

    retry = True

    def __init__(self, watch: libvirt_watch.LibvirtWatch):
        self.watch = watch

    def check(self, path: str) -> None:
        """``want`` served only eligible disks: nothing more to check."""

    def opened(self, path: str, fd: int | None = None) -> None:
        """A disk is served only while its domain runs: no open to watch for."""

    def take_opened(self) -> bool:
        return False

    def want(self) -> Want | None:
        listed = self.watch.disks()
        if listed is None:
            return None
        w = libvirt_watch.wanted(listed)
        return Want({p: Member(p, d.domain, d.target, True, d.carried, d.arriving, d.activated,
                            d.labels, d.adopted) for p, d in w.serve.items()},
                    dict(w.skipped), dict(w.adoptable), w.readopt)

    def close(self) -> None:
        self.watch.close()
