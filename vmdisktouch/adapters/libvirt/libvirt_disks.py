"""The disks of libvirt domains, and whether holding them in the page cache helps.

Two layers:

* **Pure** (no libvirt needed): ``parse_domain_xml`` turns a domain XML
  document into ``Disk`` records, and ``assess`` decides whether each disk is
  *eligible*, with the reason.
* **libvirt** (``libvirt-python``, imported lazily): ``connect`` and
  ``list_disks`` (every domain, active and inactive, with its state);
  ``libvirt_watch`` follows them and finds which domain uses a path.

Eligibility. vmdisktouch keeps pages of the image in the *host* page cache,
so it only helps a disk that QEMU reads and writes through that cache:

* ``cache='none'`` and ``cache='directsync'`` open the image with O_DIRECT:
  the guest bypasses the host page cache, so holding pages helps nothing and
  can collide with direct writes. Ineligible, unless ``vmdisktouch adopt``
  switched this run of the domain to the page cache (``adopted``: libvirt's XML
  does not change). Eligible then, as ``writeback``.
* ``io='native'`` (Linux AIO) needs O_DIRECT too (QEMU refuses it without).
  Ineligible.
* ``writethrough``, ``writeback`` and ``unsafe`` are buffered. Eligible.
  When the ``cache`` attribute is absent (or ``default``) libvirt passes no
  cache option and QEMU's default applies, which is ``writeback``; it is
  reported as ``writeback`` with ``cache_default`` true. Likewise an absent
  ``io`` is QEMU's default, ``threads``.
* ``qcow2`` (and any other non-raw format) is eligible, with the caveat that
  the offsets vmdisktouch sees are host-file offsets, not guest offsets.
* Only local files and block devices can be held: ``network``, ``volume``
  (storage-pool reference), ``nvme``, ``vhostuser`` and ``dir`` disks are
  ineligible, as are empty drives and ``device='lun'`` (SCSI passthrough:
  the guest's commands go to the device with SG_IO, not through the cache).
* Read-only disks (``<readonly/>``) and CD-ROM/floppy images are ineligible:
  the host budget is for the disks guests work on, and each disk served costs
  a trace instance, a lock and a share of a cycle.

``assess`` is the one verdict, with a reason and a code (``report.UNSERVED``): ``discover``
shows it, the host service serves by it (``libvirt_watch.wanted``) and the per-disk check
refuses by it (``libvirt_watch.require_eligible``), so they never disagree.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import sys
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, replace

from vmdisktouch.adapters.libvirt import adopted
from vmdisktouch.adapters.libvirt.domain_state import domain_state
from vmdisktouch.config.overrides import LABEL_NS  # noqa: F401 - where labels_of looks
from vmdisktouch.errors import VmdtError

log = logging.getLogger("vmdisktouch")

DEFAULT_URI = "qemu:///system"

QEMU_DEFAULT_CACHE = "writeback"   # what QEMU does when libvirt passes no cache= option
QEMU_DEFAULT_IO = "threads"        # QEMU's default aio= mode

DIRECT_CACHE_MODES = ("none", "directsync")
O_DIRECT_CONSEQUENCE = ("the guest bypasses the host page cache, so holding pages helps "
                        "nothing and can collide with direct writes")
HOST_OFFSETS_CAVEAT = "offsets are host-file offsets, not guest offsets"
READ_ONLY_CONSEQUENCE = "the host budget is for the disks guests work on"

class LibvirtError(VmdtError):
    """libvirt-python is missing, the daemon is unreachable, or a call failed."""


@dataclass
class Disk:
    domain: str
    state: str                 # domain_state.STATE_NAMES value, or "unknown" without libvirt
    active: bool | None        # the domain has a QEMU process (running, paused...)
    target: str                # guest device name: vda, sdb...
    device: str                # disk, cdrom, floppy, lun
    source: str | None         # file= or dev= path; None for network/empty drives
    type: str                  # file, block, network, volume, ...
    format: str                # raw, qcow2, ...
    cache: str                 # effective cache mode (QEMU default filled in)
    cache_default: bool        # True when the XML names no cache mode
    io: str                    # effective io mode (QEMU default filled in)
    io_default: bool
    readonly: bool
    backing: list[str] = field(default_factory=list)   # backing-chain file/device paths
    eligible: bool = False
    reason: str = ""
    code: str = ""             # why not eligible (``report.UNSERVED``); "" when eligible
    unit: str | None = None    # the systemd unit to enable, for a local source
    uuid: str = ""
    # QEMU has not activated its disks yet: an incoming migration or restore runs
    # (``arriving``; the rule that follows from it: ``daemon.arrival``).
    arriving: str = ""
    # QEMU has activated its disks for certain: running, or paused after a completed
    # restore. A domain paused otherwise may not have, right after it arrived (``daemon.arrival``).
    activated: bool = False
    # The heat its domain carries for it (``domain_heat``): a summary, why it is none, or None.
    carried: object = field(default=None, repr=False, compare=False)
    # What is wrong with its domain's XML (its metadata unreadable, or the XML itself: then
    # this is its last known listing), or None (``Memo``).
    problem: str | None = field(default=None, compare=False)
    # The labels of its domain (``labels_of``), for the host service's scope.
    labels: tuple[str, ...] = ()
    # When ``vmdisktouch adopt`` switched this run's disk to the page cache (epoch s; libvirt
    # still says cache=none), or None (``adopted``).
    adopted: float | None = None
    # Its domain carries it as adopted (``adopted.mark``: it was adopted where the domain ran
    # before a migration or a save): the host service adopts it again here.
    adopt_marked: bool = False

    def to_json(self) -> dict:
        out = asdict(self)
        del out["carried"]
        return out


# ---------------------------------------------------------------------------
# pure part


def unit_name(path: str) -> str | None:
    """The ``vmdisktouch@….service`` unit for ``path``, or None if systemd cannot name it."""
    from vmdisktouch.unitname import unit_name as _unit_name
    try:
        return _unit_name(path)
    except VmdtError:
        return None   # e.g. longer than systemd's 255-character limit, or a '..' component


def assess(disk: Disk) -> tuple[bool, str, str]:
    """(eligible, reason, code) for one disk: the one verdict (the module docstring)."""
    if disk.type not in ("file", "block"):
        return False, f"not a local file or block device (type={disk.type})", "not_local"
    if not disk.source:
        return False, "no source (empty drive)", "no_source"
    if disk.device == "lun":
        return False, ("device=lun passes SCSI commands through to the device (SG_IO), "
                       "bypassing the host page cache"), "passthrough"
    direct = []
    if disk.cache in DIRECT_CACHE_MODES and disk.adopted is None:
        direct.append(f"cache={disk.cache}")
    if disk.io == "native":
        direct.append("io=native")
    if direct:
        return False, f"{' and '.join(direct)} use O_DIRECT: {O_DIRECT_CONSEQUENCE}", "o_direct"
    if disk.readonly or disk.device in ("cdrom", "floppy"):
        return False, (f"read-only {disk.device}: {READ_ONLY_CONSEQUENCE}"), "read_only"
    cache = f"cache={disk.cache}" + (" (QEMU default)" if disk.cache_default else "")
    if disk.adopted is not None:
        cache = (f"adopted {time.strftime('%Y-%m-%d %H:%M', time.localtime(disk.adopted))}; "
                 f"libvirt says cache={disk.cache}")
    notes = [f"buffered I/O through the host page cache ({cache}, io={disk.io})"]
    if disk.format != "raw":
        notes.append(f"{disk.format}: {HOST_OFFSETS_CAVEAT}")
    if disk.backing:
        notes.append(f"backing files are separate images: {', '.join(disk.backing)}")
    return True, "; ".join(notes), ""


def _source_path(elem: ET.Element | None, dtype: str) -> str | None:
    if elem is None:
        return None
    if dtype == "file":
        return elem.get("file") or None
    if dtype == "block":
        return elem.get("dev") or None
    if dtype == "dir":
        return elem.get("dir") or None
    return None


def _backing_chain(disk_el: ET.Element) -> list[str]:
    out = []
    node = disk_el.find("backingStore")
    while node is not None and node.get("type") in ("file", "block"):
        path = _source_path(node.find("source"), node.get("type"))
        if path:
            out.append(path)
        node = node.find("backingStore")
    return out


def parse_domain_xml(xml: str, *, state: str = "unknown", active: bool | None = None,
                     arriving: str = "", with_units: bool = True) -> list[Disk]:
    """The disks of one domain XML document (``virsh dumpxml``), assessed.

    Raises ``LibvirtError`` if the text is not a domain XML document. Metadata that is not
    well-formed (libvirt accepts an element with an undeclared prefix) costs only the
    domain's summary, never its disks: they are read with ``<metadata>`` cut out, and
    the summary is why it is none (``problem``).
    """
    try:
        root, problem = ET.fromstring(xml), None
    except ET.ParseError as exc:
        root, problem = _without_metadata(xml, exc), (
            f"its metadata is not well-formed XML ({exc}): the heat it carries is ignored")
    if root.tag != "domain":
        raise LibvirtError(f"not a domain XML document (root element <{root.tag}>)")
    name = root.findtext("name") or "?"
    uuid = root.findtext("uuid") or ""
    carried = problem or _carried(root)
    labels = labels_of(root)
    marks = adopted.marked(root)
    disks = []
    for el in root.findall("./devices/disk"):
        dtype = el.get("type", "file")
        driver = el.find("driver")
        drv = driver.attrib if driver is not None else {}
        cache_attr = drv.get("cache")
        io_attr = drv.get("io")
        cache_default = cache_attr in (None, "", "default")
        io_default = io_attr in (None, "", "default")
        target_el = el.find("target")
        source = _source_path(el.find("source"), dtype)
        disk = Disk(
            domain=name, uuid=uuid, state=state, active=active, arriving=arriving,
            target=target_el.get("dev", "?") if target_el is not None else "?",
            device=el.get("device", "disk"),
            source=source, type=dtype,
            format=drv.get("type") or "raw",
            cache=QEMU_DEFAULT_CACHE if cache_default else cache_attr,
            cache_default=cache_default,
            io=QEMU_DEFAULT_IO if io_default else io_attr,
            io_default=io_default,
            readonly=el.find("readonly") is not None,
            backing=_backing_chain(el), problem=problem, labels=labels,
        )
        disk.adopt_marked = disk.target in marks
        disk.carried = carried if isinstance(carried, str) else carried.get(disk.target)
        disk.eligible, disk.reason, disk.code = assess(disk)
        if with_units and source and dtype in ("file", "block"):
            disk.unit = unit_name(source)
        disks.append(disk)
    return disks


METADATA = re.compile(r"<metadata\s*/>|<metadata>.*?</metadata>", re.S)


def _without_metadata(xml: str, exc: ET.ParseError) -> ET.Element:
    """The document parsed with its ``<metadata>`` element cut out (libvirt writes every
    element inside it with a prefix, so the first unprefixed end tag is its own);
    ``LibvirtError`` naming the first error when it still cannot be parsed."""
    try:
        return ET.fromstring(METADATA.sub("", xml, count=1))
    except ET.ParseError:
        raise LibvirtError(f"cannot parse domain XML: {exc}") from None


def labels_of(root: ET.Element) -> tuple[str, ...]:
    """The words of the domain's ``<label>`` element in ``LABEL_NS``, in order; () without
    one."""
    elem = root.find(f"./metadata/{{{LABEL_NS}}}label")
    return tuple((elem.text or "").split()) if elem is not None else ()


def _carried(root: ET.Element) -> dict | str:
    """The heat the domain carries per target (``domain_heat.parse``), or why the element
    is not ours."""
    from vmdisktouch.adapters.libvirt import domain_heat
    elem = domain_heat.find(root)
    if elem is None:
        return {}
    try:
        return domain_heat.parse(elem)
    except domain_heat.Foreign as exc:
        return f"a foreign element ({exc})"


def same_file(a: str, b: str) -> bool:
    """Whether two paths name the same image: same realpath, same inode, or same device."""
    if a == b or os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    if stat.S_ISBLK(sa.st_mode) and stat.S_ISBLK(sb.st_mode):
        return sa.st_rdev == sb.st_rdev
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


# ---------------------------------------------------------------------------
# libvirt part


def import_libvirt():
    """The ``libvirt`` module, with its default stderr error printer silenced."""
    try:
        import libvirt
    except ImportError:
        # Name the interpreter: Debian's python3-libvirt is importable only by
        # /usr/bin/python3 (and venvs made from it with --system-site-packages), not by
        # a pyenv or other python3 that comes first on PATH.
        raise LibvirtError(
            f"libvirt-python cannot be imported by {sys.executable} (Python "
            f"{sys.version.split()[0]}): apt install python3-libvirt and run "
            f"vmdisktouch with /usr/bin/python3 (a venv made from it with "
            f"--system-site-packages), or pip install 'vmdisktouch[libvirt]'") from None
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


def libvirt_message(exc: Exception) -> str:
    """The first line of a libvirtError's message."""
    get = getattr(exc, "get_error_message", None)
    msg = ((get() if get else None) or str(exc) or type(exc).__name__).strip()
    return msg.splitlines()[0] if msg else type(exc).__name__


def connect(uri: str = DEFAULT_URI, *, readonly: bool = True):
    """Open a libvirt connection; ``LibvirtError`` with a one-line reason otherwise."""
    libvirt = import_libvirt()
    try:
        return libvirt.openReadOnly(uri) if readonly else libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"cannot connect to {uri}: {libvirt_message(exc)}") from None


class Memo:
    """What ``list_disks`` keeps between listings, per domain (by UUID): the digest of its
    last XML and the disks read from it, so an unchanged domain is not parsed again (2.7 MB
    of foreign metadata parsed each cycle cost a quarter of a core at 1 s cycles); those
    disks again while its XML cannot be read (over libvirt's 4 MiB message limit, say),
    so a served domain is not dropped for it; and each domain's problem, said once
    (``say``) rather than every cycle, and kept by name for the last listing in
    ``problems``.

    ``events``: the caller follows libvirt's events (``libvirt_watch``) and calls ``stale``
    for a domain when one says its XML may have changed (its lifecycle, a device, a block
    job, a medium, its metadata). A domain's XML is then read only when it arrives (a
    UUID not seen yet: defined, migrated or restored here), when an event made it stale,
    when its run changed (its ID or state: a stop and start between two listings), while
    it cannot be read, and at least every ``REFRESH`` s: not at every listing. Reading
    it cost the host service 7-8 ms of CPU per cycle for a domain with 2.7 MB of another
    application's metadata, and libvirtd as much to format it. Without
    ``events`` every listing reads every domain's XML."""

    REFRESH = 60.0          # seconds: a change no event told of is seen within this

    def __init__(self, say=log.warning, events: bool = False, clock=time.monotonic):
        self.say = say
        self.events = events
        self.clock = clock
        self.parsed: dict[str, tuple[bytes, list[Disk]]] = {}
        self.said: dict[str, str] = {}
        self.problems: dict[str, tuple[str, str]] = {}    # name -> (problem, state)
        self.read_at: dict[str, tuple[tuple, float]] = {}   # uuid -> (its run, when read)
        self._lock = threading.Lock()       # ``stale`` is called from libvirt's event thread
        self._stale: set[str] = set()
        self._all_stale = False

    def stale(self, uuid: str | None = None) -> None:
        """Read this domain's XML (every domain's: None) again at the next listing."""
        with self._lock:
            if uuid is None:
                self._all_stale = True
            else:
                self._stale.add(uuid)

    def _take_stale(self) -> tuple[bool, set[str]]:
        with self._lock:
            out = (self._all_stale or not self.events, self._stale)
            self._all_stale, self._stale = False, set()
        return out

    def known(self, uuid: str, run: tuple, every: bool, stale: set[str]) -> bool:
        """Whether the domain's last read XML still stands (``events``: the docstring)."""
        last = self.read_at.get(uuid)
        return (not every and uuid not in stale and last is not None and last[0] == run
                and self.clock() - last[1] < self.REFRESH and uuid in self.parsed)

    def kept(self, uuid: str, name: str, fresh: dict) -> list[Disk]:
        """The disks of a domain whose XML was not read again (``known``), with its state now."""
        listed = self.parsed[uuid][1]
        self._note(uuid, name, listed[0].problem if listed else None, fresh, False)
        return [replace(d, **fresh) for d in listed]

    def disks(self, uuid: str, name: str, xml: str | None, why: str | None, fresh: dict,
              with_units: bool, run: tuple = ()) -> list[Disk]:
        """The disks of one domain (``fresh``: its state now): read from ``xml``, again
        only when it changed; when it cannot be read (``why``), its last known ones."""
        if xml is not None:
            try:
                listed = self._parse(uuid, xml, with_units)
            except LibvirtError as exc:
                why = str(exc)
            else:
                self.read_at[uuid] = (run, self.clock())
                self._note(uuid, name, listed[0].problem if listed else None, fresh, False)
                return [replace(d, **fresh) for d in listed]
        self.read_at.pop(uuid, None)            # read again at the next listing
        last = self.parsed.get(uuid, (b"", []))[1]
        self._note(uuid, name, why, fresh, bool(last))
        return [replace(d, problem=f"{why}; its last known disks", **fresh) for d in last]

    def _parse(self, uuid: str, xml: str, with_units: bool) -> list[Disk]:
        key = hashlib.blake2b(xml.encode(), digest_size=16,
                              person=b"units" if with_units else b"").digest()
        last = self.parsed.get(uuid)
        if last is None or last[0] != key:
            last = self.parsed[uuid] = (key, parse_domain_xml(xml, with_units=with_units))
        return last[1]

    def _note(self, uuid: str, name: str, why: str | None, fresh: dict, kept: bool) -> None:
        if why is None:
            self.said.pop(uuid, None)
            return
        self.problems[name] = (why, fresh["state"])
        if self.said.get(uuid) != why:
            self.said[uuid] = why
            self.say("libvirt: %s: %s%s", name, why,
                     "; keeping its last known disks" if kept else "")

    def forget_all_but(self, uuids: set[str]) -> None:
        """Forget the domains that are gone."""
        for d in (self.parsed, self.said, self.read_at):
            for uuid in set(d) - uuids:
                del d[uuid]


MEMO = Memo()     # the process's own: the daemon's resyncs share it


def _domains_and_disks(conn, *, with_units: bool, memo: Memo):
    """(virDomain, its disks) for every domain, active and inactive (``Memo.disks``).

    A domain that vanished between the listing and the reading is skipped.
    """
    libvirt = import_libvirt()
    try:
        domains = conn.listAllDomains(0)
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"cannot list domains: {libvirt_message(exc)}") from None
    memo.problems = {}
    seen = set()
    every, stale = memo._take_stale()
    for dom in domains:
        xml = why = None
        try:
            uuid, name = dom.UUIDString(), dom.name()
            state, active, arrives, activated_ = domain_state(dom, libvirt)
            run = (_domain_id(dom), state, active, arrives, activated_, with_units)
            if memo.known(uuid, run, every, stale):
                seen.add(uuid)
                yield dom, memo.kept(uuid, name, dict(
                    state=state, active=active, arriving=arrives, activated=activated_))
                continue
            try:
                xml = dom.XMLDesc(0)
            except libvirt.libvirtError as exc:
                if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
                    raise
                why = f"cannot read its XML: {libvirt_message(exc)}"
        except libvirt.libvirtError as exc:
            log.debug("skipping a domain: %s", libvirt_message(exc))
            continue
        seen.add(uuid)
        fresh = dict(state=state, active=active, arriving=arrives, activated=activated_)
        yield dom, memo.disks(uuid, name, xml, why, fresh, with_units, run)
    memo.forget_all_but(seen)


def _domain_id(dom) -> int:
    """The domain's ID (new at each start; -1 while it is shut off): held by the object
    ``listAllDomains`` returned, no call to libvirtd."""
    try:
        return int(dom.ID())
    except Exception:  # noqa: BLE001 - a run unknown: read its XML as before
        return -2


def list_disks(conn, *, with_units: bool = True, memo: Memo | None = None) -> list[Disk]:
    """Every disk of every domain (active and inactive), sorted by domain and target.
    ``memo``: what is kept between listings (default: the process's ``MEMO``); a domain
    whose XML cannot be read is in ``memo.problems``, with its last known disks if any."""
    memo = MEMO if memo is None else memo
    records = adopted.by_disk()
    out = []
    for dom, disks in _domains_and_disks(conn, with_units=with_units, memo=memo):
        out.extend(disks if not records else [_adopted(d, records, dom) for d in disks])
    out.sort(key=lambda d: (d.domain, d.target))
    return out


def _adopted(disk: Disk, records: dict, dom) -> Disk:
    """``disk`` marked adopted when a record says its domain's run was (``adopted``)."""
    rec = records.get((disk.uuid, disk.target))
    if rec is None or not disk.active or rec.get("domain_id") != _domain_id(dom):
        return disk
    disk = replace(disk, adopted=float(rec.get("since") or 0.0))
    disk.eligible, disk.reason, disk.code = assess(disk)
    return disk
