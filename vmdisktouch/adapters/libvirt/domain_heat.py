"""The heat travels with the domain: a summary of each disk's hot regions in libvirt's metadata.

Theory of operation
-------------------
A VM that is migrated, saved and restored, or managed-saved at host
shutdown arrives cold: the host it left knew its hot regions. libvirt
carries a domain's live XML, its ``<metadata>`` included, through all
three. So while the daemon serves a domain's disks it keeps, in the
domain's live definition (``virDomainSetMetadata``, ``AFFECT_LIVE``: the
persistent definition is never touched, so a fresh boot starts without
it), one element of its own namespace (``NS``) with a summary of each
disk (``summarize``)::

    <heat version="1">
      <disk target="vda" size="8589934592" block-size="1048576"
            fingerprint="8c2b…" saved-at="1764124800.5">
        <region start="1024" blocks="409" heat="0.8"/>
      </disk>
    </heat>

The regions are the runs of blocks at or above the threshold, the
``MAX_REGIONS`` densest of them (mean heat per block), each with its mean
heat: 64 regions are about 3 KiB a disk. The identity check holds across
hosts on shared storage: the size, and a fingerprint of the image's first
and last pages (where a partition table and its backup live, which a guest
seldom rewrites). A guest that rewrote them since starts cold: a warm-up
lost, never wrong heat.

When the daemon opens a disk whose domain carries a summary (read from the
same live XML the resync lists disks from, so no extra call), it checks the
summary (``parse``, ``check``: any mismatch, a corrupt or foreign element is
ignored with one line) and, when it is newer than the local warm state,
starts from it (``arrival``): each region's blocks get its heat, decayed
for the time since it was written, as a warm restart does. But a guest that
was saved did not run meanwhile, and one in flight was running on the
other host: its hot regions did not cool, and at the default decay (0.1/s)
a summary written 30 s before a save would arrive below the threshold. So
the decay factor is floored where the hottest region arrives at the heat
one cycle of reads gives (``ARRIVAL_HEAT``, relative to the threshold): the
order of the regions is kept, and the first cycle selects them under the
daemon's own budget and floor, before the guest asks. From then on they
cool or heat with the guest's own reads.

When to write (``Carrier``). The XML libvirt sends at a migration's
Begin phase, and the one a save writes into its file, is the live
definition of that moment; a lifecycle event comes after it (too late),
and a libvirt hook may not call libvirt back and runs on the destination,
which does not know the heat. So the summary is written periodically: at
the first cycle that has heat above the threshold, then whenever the regions
moved, or their summed heat changed, by ``MATERIAL`` (an eighth), at most
every ``carry_interval`` (30 s).
A write costs libvirtd one RPC and one write of the domain's status XML
(docs/benchmarks.md, carry-heat). No write is made while a job runs on the
domain (a migration, a save): it would wait for the job's end, up to
libvirt's 30 s, and the daemon's loop with it; the next cycle tries again.
"""

from __future__ import annotations

import hashlib
import logging
import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass

import numpy as np

from vmdisktouch.config.settings import MAX_AMP
from vmdisktouch.core import heat as heatmap
from vmdisktouch.core.runs import consecutive_runs
from vmdisktouch.errors import VmdtError
from vmdisktouch.system import files

log = logging.getLogger("vmdisktouch")

NS = "http://vmdisktouch.org/xmlns/heat/1"
KEY = "vmdisktouch"
VERSION = "1"
MAX_REGIONS = 64
FINGERPRINT_BYTES = 4096      # the same on every host, whatever its page size
ARRIVAL_HEAT = 4.0          # the hottest carried region arrives at >= this x the threshold
ARRIVAL_MAX = heatmap.ARRIVAL_MAX   # ... and at <= this x the threshold (1.0 at the default
#                                     0.05); every loaded heat's cap: ``heat.cap_loaded``
MAX_HEAT = 2 * MAX_AMP      # a block's heat never exceeds amp_resident + amp_rewritten
MAX_SIZE = (1 << 63) - 1    # the largest file offset (off_t)
MATERIAL = 1 / 8            # regions or heat moved by this share: write again
FUTURE_SLACK = 60.0         # seconds: clocks of two hosts may differ this much


@dataclass(frozen=True)
class DiskHeat:
    """One disk's summary: its identity, when, and its hot regions (blocks, mean heat)."""
    target: str
    size: int
    block_size: int
    fingerprint: str
    saved_at: float                       # wall clock, seconds
    regions: tuple[tuple[int, int, float], ...]   # (start block, blocks, mean heat)

    def covered(self) -> set[int]:
        return {b for s, n, _ in self.regions for b in range(s, s + n)}


def fingerprint(image) -> str:
    """BLAKE2b of the image's first and last page: the same disk on another host."""
    size = int(image.size)
    last = max(0, size - FINGERPRINT_BYTES)
    h = hashlib.blake2b(digest_size=8)
    try:
        h.update(files.pread(image.fd, FINGERPRINT_BYTES, 0))
        h.update(files.pread(image.fd, FINGERPRINT_BYTES, last))
    except VmdtError:
        return ""
    return h.hexdigest()


def densest(heat: np.ndarray, threshold: float) -> tuple[tuple[int, int, float], ...]:
    """The ``MAX_REGIONS`` densest runs of ``heat`` at or above ``threshold``, by start:
    (start block, blocks, mean heat at most ``MAX_HEAT``, so what is written is finite)."""
    runs = consecutive_runs(np.flatnonzero(heat >= threshold))
    dense = [(a, b - a, min(float(heat[a:b].mean()), MAX_HEAT)) for a, b in runs]
    dense.sort(key=lambda r: -r[2])
    return tuple((a, n, round(h, 4)) for a, n, h in sorted(dense[:MAX_REGIONS]))


def summarize(heat: np.ndarray, threshold: float, target: str, image, block_size: int,
              now_wall: float) -> DiskHeat:
    """The summary of one disk: its identity and its ``densest`` regions."""
    return DiskHeat(target, int(image.size), int(block_size), fingerprint(image), now_wall,
                    densest(heat, threshold))


def to_xml(disks: list[DiskHeat]) -> str:
    """The metadata element (no namespace: libvirt puts it in ``NS`` under ``KEY``)."""
    root = ET.Element("heat", version=VERSION)
    for d in disks:
        de = ET.SubElement(root, "disk", target=d.target, size=str(d.size),
                           **{"block-size": str(d.block_size), "fingerprint": d.fingerprint,
                              "saved-at": f"{d.saved_at:.3f}"})
        for start, blocks, h in d.regions:
            ET.SubElement(de, "region", start=str(start), blocks=str(blocks), heat=f"{h:.4g}")
    return ET.tostring(root, encoding="unicode")


class Foreign(ValueError):
    """An element that is not a summary this daemon could have written."""


def find(domain_root: ET.Element) -> ET.Element | None:
    """The summary element in a parsed domain XML document, or None."""
    return domain_root.find(f"./metadata/{{{NS}}}heat")


def parse(elem: ET.Element) -> dict[str, DiskHeat | str]:
    """Target -> its summary, or why it cannot be one. ``Foreign`` when the whole element
    is not ours."""
    if elem.get("version") != VERSION:
        raise Foreign(f"version {elem.get('version')!r}, not {VERSION}")
    out: dict[str, DiskHeat | str] = {}
    for de in elem:
        if _local(de.tag) != "disk":
            continue
        target = de.get("target") or "?"
        try:
            out[target] = _disk(de, target)
        except (ValueError, TypeError, OverflowError) as exc:
            out[target] = f"a corrupt summary ({exc})"
    return out


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _disk(de: ET.Element, target: str) -> DiskHeat:
    """One disk's summary, every value within what a daemon could have written: a size
    an image can have, a block size within it, regions within its blocks, at most
    ``MAX_REGIONS``, each with a finite heat from 0 to ``MAX_HEAT`` (a larger heat would
    keep a region nobody reads held for as long as it is watched); ``ValueError``
    otherwise."""
    size, bs = int(de.get("size")), int(de.get("block-size"))
    saved = float(de.get("saved-at"))
    if not (0 < bs <= size <= MAX_SIZE) or not math.isfinite(saved):
        raise ValueError(f"size {size}, block size {bs} or time {saved} out of range")
    n = -(-size // bs)
    regions = []
    for re_ in de:
        if _local(re_.tag) != "region":
            continue
        if len(regions) == MAX_REGIONS:
            raise ValueError(f"more than {MAX_REGIONS} regions")
        s, k, h = int(re_.get("start")), int(re_.get("blocks")), float(re_.get("heat"))
        if not (0 <= s and 0 < k and s + k <= n and 0 <= h <= MAX_HEAT):   # NaN fails too
            raise ValueError(f"region {s}+{k} heat {h} outside the disk (blocks 0 to {n}, "
                             f"heat 0 to {MAX_HEAT:g})")
        regions.append((s, k, h))
    return DiskHeat(target, size, bs, de.get("fingerprint") or "", saved, tuple(regions))


def check(summary: DiskHeat, image, now_wall: float) -> str | None:
    """Why ``summary`` is not of ``image`` (None: it is)."""
    if summary.size != image.size:
        return f"it is of a disk of {summary.size} bytes, this one has {image.size}"
    if summary.saved_at > now_wall + FUTURE_SLACK:
        return f"it was written in the future ({summary.saved_at:.0f})"
    mine = fingerprint(image)
    if not mine or summary.fingerprint != mine:
        return "its fingerprint (first and last page) is not this image's: another image"
    return None


def arrival(summary: DiskHeat, nblocks: int, block_size: int, decay: float, threshold: float,
            now_wall: float) -> np.ndarray:
    """The heat per block (of ``block_size``) the summary stands for on arrival (module
    docstring: decayed for the time since it was written, the hottest at least
    ``ARRIVAL_HEAT`` and at most ``ARRIVAL_MAX`` x the threshold, so a region nobody reads
    is released as one the guest stopped reading is, whatever heat it carried)."""
    heat = np.zeros(nblocks, dtype=np.float32)
    if not summary.regions:
        return heat
    hottest = max(h for _, _, h in summary.regions)
    away = max(0.0, now_wall - summary.saved_at)
    k = math.exp(-decay * away)
    if hottest > 0:
        k = max(k, min(1.0, ARRIVAL_HEAT * threshold / hottest))
        k = min(k, ARRIVAL_MAX * threshold / hottest)
    for start, blocks, h in summary.regions:
        a = start * summary.block_size // block_size
        b = min(nblocks, -(-(start + blocks) * summary.block_size // block_size))
        heat[a:b] = np.maximum(heat[a:b], h * k)
    return heat
