"""The daemon's side of the heat carried in a domain's metadata (``adapters.libvirt.domain_heat``).

``arrive`` starts a disk just opened from its domain's summary when that is
newer than the local warm state; ``Carrier`` writes each served domain's
summary into its live definition (when: ``domain_heat``'s docstring).
Neither ever stops the daemon: carried heat is an optimisation, and a
failure is one line (with the journal's ``DOMAIN``: a line about a domain, not
one disk).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from vmdisktouch.adapters.libvirt import domain_heat
from vmdisktouch.adapters.systemd import journal
from vmdisktouch.adapters.libvirt.domain_heat import DiskHeat
from vmdisktouch.adapters.warm_state import Saved
from vmdisktouch.errors import VmdtError
from vmdisktouch.sizes import counted, format_size

log = logging.getLogger("vmdisktouch")


def arrive(watcher, carried: DiskHeat | str | None, local_saved_at: float | None,
           now_wall: float, label: str) -> bool:
    """Start ``watcher`` from ``carried`` (its domain's summary of this disk) unless the
    local warm state is newer; a summary that does not match is ignored in one line.
    True when the carried heat was taken."""
    if carried is None:
        return False
    if isinstance(carried, str):
        log.warning("%s: ignoring the heat carried in the domain's metadata: %s", label,
                    carried)
        return False
    why = domain_heat.check(carried, watcher.image, now_wall)
    if why is not None:
        log.warning("%s: ignoring the heat carried in the domain's metadata: %s", label, why)
        return False
    if local_saved_at is not None and local_saved_at >= carried.saved_at:
        log.info("%s: the local warm state is newer than the heat carried in the domain's "
                 "metadata; starting from it", label)
        return False
    p = watcher.policy.params.heat
    hr = domain_heat.arrival(carried, watcher.policy.nblocks, watcher.block_size, p.decay,
                             p.threshold, now_wall)
    watcher.restore(Saved(hr, np.zeros_like(hr), [], carried.saved_at), 0.0)
    hot = int(np.count_nonzero(hr >= p.threshold))
    log.info("%s: arrived with the heat carried in the domain's metadata (written %.0f s "
             "ago): %s, %s above the threshold", label,
             max(0.0, now_wall - carried.saved_at), counted(len(carried.regions), "region"),
             format_size(hot * watcher.block_size))
    return True


class Carrier:
    """Writes each served domain's summary into its live definition (``domain_heat``)."""

    def __init__(self, watch, interval: float, clock=time.monotonic, wall=time.time):
        self.watch = watch                   # LibvirtWatch: set_metadata(domain, xml)
        self.interval = interval
        self.clock, self.wall = clock, wall
        self.written: dict[str, tuple[float, dict]] = {}   # domain -> (when, what: _shape)
        self.failing: dict[str, str] = {}    # domain -> the error said once

    def maybe_write(self, watchers, enabled) -> None:
        """Write the summary of every running domain ``enabled(watcher)`` carries for, when
        it is due: never written yet and not empty, or its regions moved or its heat
        changed by ``MATERIAL``, and the last write ``interval`` ago. Not while a disk is
        not held (its domain arriving, ``daemon.arrival``): the summary it carries in is
        what the disk starts from when it has arrived."""
        by_domain: dict[str, list] = {}
        for w in watchers:
            if w.domain and w.domain_active and w.hold_enabled and enabled(w):
                by_domain.setdefault(w.domain, []).append(w)
        now = self.clock()
        for domain in set(self.written) - set(by_domain):
            del self.written[domain]         # gone, or no longer carried: written anew later
        for domain, ws in sorted(by_domain.items()):
            last = self.written.get(domain)
            if last is not None and now - last[0] < self.interval:
                continue
            regions = [domain_heat.densest(w.policy.state.total, w.config.threshold)
                       for w in ws]
            shape = {w.target or "?": _shape(r, w.policy.nblocks) for r, w in zip(regions, ws)}
            if not _moved(last[1] if last else None, shape):
                continue
            # The images are read (their fingerprints) only for a summary written.
            sums = [DiskHeat(w.target or "?", int(w.image.size), int(w.block_size),
                             domain_heat.fingerprint(w.image), self.wall(), r)
                    for r, w in zip(regions, ws)]
            try:
                if not self.watch.set_metadata(domain, domain_heat.to_xml(sums)):
                    continue                 # a job runs on it: the next cycle tries again
            except VmdtError as exc:
                if self.failing.get(domain) != str(exc):
                    log.warning("libvirt: %s: cannot write the heat into its metadata: %s",
                                domain, exc, extra=journal.fields(domain=domain))
                self.failing[domain] = str(exc)
                continue
            if self.failing.pop(domain, None) is not None:
                log.info("libvirt: %s: its heat written into its metadata again", domain,
                         extra=journal.fields(domain=domain))
            log.debug("libvirt: %s: heat written into its metadata (%s)", domain,
                      counted(sum(len(s.regions) for s in sums), "region"))
            self.written[domain] = (now, shape)


def _shape(regions, n: int) -> tuple[np.ndarray, float]:
    """(the blocks the regions cover, their summed heat)."""
    m = np.zeros(n, dtype=bool)
    for start, blocks, _ in regions:
        m[start:start + blocks] = True
    return m, sum(blocks * h for _, blocks, h in regions)


def _moved(last: dict | None, now: dict) -> bool:
    """Whether the covered blocks moved, or the summed heat changed, by ``MATERIAL`` (the
    first summary: whether it covers anything)."""
    if last is None:
        return any(m.any() for m, _ in now.values())
    if set(last) != set(now):
        return True
    for target, (m, total) in now.items():
        old, old_total = last[target]
        if old.size != m.size or abs(total - old_total) > domain_heat.MATERIAL * max(
                total, old_total):
            return True
        union = int(np.count_nonzero(old | m))
        if union and np.count_nonzero(old ^ m) >= domain_heat.MATERIAL * union:
            return True
    return False
