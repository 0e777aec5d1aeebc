"""Following each disk's domain: held while it runs, and nothing held while it arrives.

Theory of operation
-------------------
Each cycle the membership says, for every disk served, what libvirt reports
of its domain (``membership.Member``), and ``Follower.follow`` applies two
rules to the disk:

* **A domain shut off** (``active`` False) releases its disks' holds until
  it runs again; a disk no domain uses (``active`` None) is held.
* **A domain arriving holds nothing.** A domain arrives by an incoming live
  migration, a restore or a start from a managed save: QEMU starts with
  ``-incoming`` and, when the incoming completes, activates its disks and
  drops the image's page cache (``bdrv_invalidate_cache``; for a raw file
  or block device opened without O_DIRECT, QEMU's ``raw_co_invalidate_cache``
  in block/file-posix.c: a flush, then ``posix_fadvise(POSIX_FADV_DONTNEED)``
  over the whole image). On storage that two hosts share, that drop is what
  keeps the destination from reading pages it cached before the source's
  last writes. Linux does not drop a page that is locked or mapped, so a
  page this daemon locked before the drop would survive it, and the guest
  could read bytes it overwrote on the source during the migration. So from
  the moment a disk's domain is seen arriving (``domain_state.arriving``:
  starting up, or paused for a migration while a job runs on it) until
  libvirt reports the incoming complete (the domain running, or paused with
  no job after a completed restore), the disk holds nothing and spills
  nothing. A domain that arrived paused by a migration reports "paused
  (user)", and QEMU activates its disks only when it is resumed (late block
  activation): so once seen in an incoming migration, a disk waits for one
  of those two states, not merely for the job's end. A daemon that starts
  while such a domain waits sees it "landed" (paused by the user, libvirt's
  last completed job an incoming migration) and waits as well; it cannot
  tell that domain from one resumed and paused since, which waits too until
  it runs (safe, and only until then). Starting up alone is
  not enough to wait for: a domain booted paused ("paused (user)" too) has
  its disks active, and a restore's incoming ends "paused (migration)". Its heat is not started either: the local warm state and the
  summary its domain carries are applied when the arrival completes
  (``Served.warm``), so they neither decay meanwhile nor are saved over by
  an empty heat. The daemon's own reads (the trace source's probe, the
  summary's fingerprint) use ``pread`` and never map or lock a page, so the
  drop removes what they read.

The same rules serve an image given by path (``run IMG --uri``) that no domain
used when it was opened, and is held (``active`` None). A domain that takes it
later is said in one line ("libvirt domain D takes it", ``owner``) and from then
on followed like any other: arriving, it releases the holds; running, it holds
again. The host service never holds a disk before its domain runs, but such a
daemon does, so it must see the domain before QEMU activates the disk, and a
restore sends libvirt no event before it completes: every open of a given image
that no domain uses wakes the loop (``membership.GivenPaths.opened``,
``system.opens``), QEMU's included, and that cycle's listing finds the domain
starting up or in its incoming.

Only libvirt can see an arrival: ``run IMG`` without a URI cannot, so on
storage that hosts share the host service (or ``run IMG --uri``) is the
supported mode (docs/algorithm.md).
"""

from __future__ import annotations

import logging

from vmdisktouch.adapters.systemd import journal

log = logging.getLogger("vmdisktouch")


class Follower:
    """Applies each cycle's view of a disk's domain: its name, shut off, arriving."""

    def __init__(self, warm, single: bool):
        self.warm = warm                  # warm(watcher, member): start its heat, once
        self.single = single              # one disk: the log's label has no path
        self.waiting: set[int] = set()    # id(watcher): opened arriving, not warmed yet
        self.arriving: set[int] = set()   # id(watcher): its domain seen arriving (said once)
        self.incoming: set[int] = set()   # id(watcher): seen in an incoming migration
        self.owner: dict[int, str | None] = {}   # id(watcher): the domain last seen using it

    def opened(self, w, m) -> None:
        """A disk just opened: warmed now, or when its domain's arrival completes. A domain
        first seen paused after an incoming migration ("landed") waits until it runs."""
        self.owner[id(w)] = m.domain
        if m.arriving:
            self.waiting.add(id(w))
            if m.arriving == "landed":
                self.incoming.add(id(w))
        else:
            self.warm(w, m)

    def closed(self, w) -> None:
        self.waiting.discard(id(w))
        self.arriving.discard(id(w))
        self.incoming.discard(id(w))
        self.owner.pop(id(w), None)

    def follow(self, w, m) -> None:
        """Hold while the owning domain runs (``active`` None: no domain) and has arrived;
        name the disk by its domain and target wherever it appears."""
        w.domain, w.target, w.adopted = m.domain, m.target, m.adopted
        # The log's label: domain/target when libvirt knows it, and the path of one of many.
        name = " ".join(([f"{m.domain}/{m.target}"] if m.domain else [])
                        + ([] if self.single else [w.image.path]))
        w.emitter.cycles.label = f"{name}: " if name else ""
        key, path = id(w), w.image.path
        with journal.disk_context(path, m.domain, m.target):
            if m.domain != self.owner.get(key, m.domain):
                if m.domain is not None:         # one line, whatever it does next
                    log.info("%s: libvirt domain %s takes it (disk %s, %s)", path, m.domain,
                             m.target, "arriving" if m.arriving else
                             "running" if m.active else "not running")
                self.owner[key] = m.domain
            # seen in an incoming migration: arriving until QEMU activated the disks for
            # certain (a paused domain's migration ends "paused (user)", disks inactive)
            if m.arriving == "incoming":
                self.incoming.add(key)
            if m.arriving in ("starting", "incoming") or (
                    key in self.incoming and not m.activated and m.active is not False):
                if key not in self.arriving:
                    log.info("%s: libvirt domain %s is arriving (%s); releasing the holds, "
                             "holding nothing until QEMU has activated its disks", path,
                             m.domain, "an incoming migration" if m.arriving == "incoming"
                             else "starting: a start, a restore or an incoming migration "
                                  "look alike until QEMU runs")
                    self.arriving.add(key)
                hold = False
            else:
                self.arriving.discard(key)
                self.incoming.discard(key)
                arrived = key in self.waiting and m.active is not False
                if arrived:
                    self.waiting.discard(key)
                    log.info("%s: libvirt domain %s has arrived (QEMU activated its "
                             "disks); holding from now", path, m.domain)
                    self.warm(w, m)
                hold = m.active is not False and key not in self.waiting
                if m.active is False and w.hold_enabled:
                    log.info("%s: its libvirt domain is not running; releasing the holds%s",
                             path, f" ({m.domain})" if m.domain else "")
                elif hold and not w.hold_enabled and not arrived:
                    log.info("%s: libvirt domain %s is running; holding again", path,
                             m.domain)
        w.domain_active = m.active
        w.hold_enabled = hold
