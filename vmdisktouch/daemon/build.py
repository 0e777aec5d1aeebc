"""The one wiring place: ``build`` makes every part of a disk's cycle and connects them.

Each part gets its dependencies here and nowhere else: the clock, the
``MemAvailable`` reader, the sleep that paces loads (the stop event's wait),
the output paths, the memory-cgroup reader. Tests and benchmarks call
``build`` with fakes at these seams; ``run`` calls it with the real ones.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from vmdisktouch.daemon import sources
from vmdisktouch.adapters import outputs as outputs_mod
from vmdisktouch.core.policy import Policy, PolicyParams
from vmdisktouch.core.rules import RESERVE_FRACTION
from vmdisktouch.daemon.act import Recharger
from vmdisktouch.daemon.emit import Emitter
from vmdisktouch.system import meminfo
from vmdisktouch.system.observe import residency
from vmdisktouch.system.cgroup.charge_tracker import ChargeTracker
from vmdisktouch.system.observe.checksums import BlockChecksums
from vmdisktouch.system.hold.holder import Holder
from vmdisktouch.system.image import Image
from vmdisktouch.system.observe.residency_tracker import ResidencyTracker
from vmdisktouch.system.hold.spill import Spiller
from vmdisktouch.system.observe.miss_cost import MissCost
from vmdisktouch.daemon.disk import DiskWatcher

log = logging.getLogger("vmdisktouch")


def memcg_reader(reader="auto"):
    """The memory-cgroup reader to use, or None (logged once) where it cannot work."""
    if reader != "auto":
        return reader
    from vmdisktouch.system.cgroup import memcg
    reader = memcg.MemcgReader()
    if not reader.available:
        log.info("not checking whose memory cgroup the held pages are charged to: %s",
                 reader.reason)
        reader.close()
        return None
    return reader


def build(image: Image, config, *, clock: Callable[[], float] = time.monotonic,
          mem_available: Callable[[], int] = meminfo.mem_available,
          sleep: Callable[[float], object] = time.sleep,
          out: outputs_mod.Outputs | None = None, memcg="auto",
          mem_free: Callable[[], int] = meminfo.mem_free,
          foreseen_bytes: int = 0) -> DiskWatcher:
    """A ``DiskWatcher`` for ``image`` with ``config``, every part made and connected;
    ``foreseen_bytes``: what a restored heat may spill at once (``sources.choose``)."""
    bs = config.block_size
    residency.validate_block_size(bs)
    # Unreadable MemAvailable reads as 0: nothing is loaded and, with a
    # floor, everything is shed (the floor cannot be checked).
    mem_available = meminfo.FailSafe(mem_available)
    if out is None:
        out = outputs_mod.Outputs([outputs_mod.Protected.of_fd(
            image.fd, f"the disk image {image.path}")])
    nblocks = image.block_count(bs)
    holder = Holder(image, bs, config.max_hold, config.min_free,      # alone until a Host adopts it
                    mem_available=mem_available, load_rate=config.load_rate, sleep=sleep)
    charges = ChargeTracker(memcg_reader(memcg), bs, nblocks)
    source = sources.choose(image, config, ResidencyTracker(image, bs),
                            lambda: BlockChecksums(image, bs), nblocks, foreseen_bytes)
    return DiskWatcher(
        image, config,
        policy=Policy(nblocks, PolicyParams.of(config), sparse_file=image.is_regular),
        holder=holder,
        source=source,
        recharger=Recharger(holder, charges, image.path),
        emitter=Emitter(out),
        clock=clock, mem_available=mem_available,
        # Unreadable MemFree reads as 0: nothing is spilled.
        spiller=Spiller(image, bs, mem_free=meminfo.FailSafe(mem_free),
                        own_room=own_room(charges.reader), load_rate=config.load_rate,
                        sleep=sleep),
        miss_cost=MissCost(image, bs))


def own_room(reader) -> Callable[[], int | None]:
    """The room left in the daemon's own memory cgroup (None: no limit, or unknown): its
    limit minus its usage minus the reserve kept for its reclaim (``policy``'s rules)."""
    def room() -> int | None:
        group = reader.own() if reader is not None else None
        if group is None or group.limit is None:
            return None
        return group.limit - group.usage - int(group.limit * RESERVE_FRACTION)
    return room
