"""Adopt a running domain's ``cache=none`` disk: switch QEMU to the host page cache, live, and back.

Theory of operation
-------------------
QEMU opens a ``cache=none`` (or ``directsync``) disk with O_DIRECT, so its reads
never reach the page cache the daemon holds. QEMU 6.1 and later reopen a node in
place (QMP ``blockdev-reopen``): given every option the node was created with and
``cache.direct`` false, QEMU drains the node, flushes it, and opens the file again
without O_DIRECT (``/proc/PID/fdinfo`` flags lose 040000); ``direct`` true switches it
back. The node is the disk's protocol node, the one that holds the descriptor:
libvirt names it ``libvirt-N-storage``, N its live XML's ``<source index=N>``. The
guest-visible write cache (``cache.writeback`` on the device) does not change, so the
guest's flush contract stays ``cache=none``'s: a write it has not flushed may wait in
host memory instead of the device's cache. libvirt still says ``cache='none'`` and
migrates the domain without ``--unsafe``.

QMP goes through libvirt (``libvirt_qemu.qemuMonitorCommand``), which marks the domain
tainted (custom-monitor) from the first call: only the domain named, or one a record
says was adopted, is asked. Whether a disk is adopted is QEMU's answer (the node's
``cache.direct``, ``query-named-block-nodes``), never only ours: a record in the
runtime directory (``adopted``) says which domains to ask, so ``release --all`` after a
crash of ours finds them.

Every option must be restated with the value it was given (FIELD-NOTES: "Cannot change
the option 'filename'"; one left out is reset to its default). They are read from the
domain's QEMU command line (its ``-blockdev`` JSON with that node name, libvirt's form
since QEMU 4.2): a disk hot-plugged since is not there, and is refused, as is one
whose options are not JSON.

Adopting is refused, with the reason, unless:

* the domain runs: not paused, not arriving, no job (a migration, a save, a dump, a
  snapshot: libvirt's job info), no block job (mirror, commit, backup: QMP
  ``query-block-jobs``);
* the disk is a local file or block device QEMU opens with O_DIRECT, not with
  ``io='native'``: ``aio`` cannot change on a reopen, and Linux AIO on a buffered
  descriptor submits a read that misses synchronously, in QEMU's event loop
  (``io='threads'`` or ``io_uring`` do not);
* ``advise``'s last report did not say "no gain" for it (``--force`` overrides);
* none of its pages stays in this host's page cache once dropped (``system.hold.drop``):
  such a page was not kept current while QEMU read past it, and QEMU's first buffered
  read would give it to the guest. The processes that map the image are named.

Before the switch the guest's I/O is timed by QEMU's own accounting (``measure``: the
baseline of ``core.never_slower``), and the record keeps it with the gain advise
forecast: the host service compares the windows after the switch with it, and releases
a disk that got slower by itself (``daemon.adoption``).

Releasing needs none of it: it is the safe direction, and must work when the domain
is about to migrate or the service stops. QEMU's reopen flushes first; what the
image left in the page cache is dropped after, as it would go stale.
"""

from __future__ import annotations

import json
import logging
import os
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from xml.sax.saxutils import quoteattr

from vmdisktouch.adapters.advice_file import advice_of, load_advice
from vmdisktouch.adapters.libvirt import adopted, libvirt_disks
from vmdisktouch.adapters.libvirt.adopted import (forget, held_back, hold_back, let_go, record,
                                                  records)
from vmdisktouch.adapters.libvirt.domain_state import RUNNING, STATE_NAMES
from vmdisktouch.adapters.libvirt.libvirt_disks import (DIRECT_CACHE_MODES, LibvirtError,
                                                        import_libvirt, libvirt_message)
from vmdisktouch.core import never_slower
from vmdisktouch.core.never_slower import Counters, Window
from vmdisktouch.errors import ConfigError, ImageError, UsageError, VmdtError, EX_TEMPFAIL
from vmdisktouch.system.hold import drop
from vmdisktouch.system.image import open_image

log = logging.getLogger("vmdisktouch")

PROTOCOL_DRIVERS = ("file", "host_device")
BUFFERED_AIO = ("threads", "io_uring")
TAINT = "libvirt marks the domain tainted (custom-monitor)"


class NotNow(VmdtError):
    """The domain's state forbids the switch now (paused, migrating, a job): exit 75, try
    again later."""

    exit_code = EX_TEMPFAIL


class Refused(ConfigError):
    """The disk cannot be adopted as it is configured (exit 78)."""


@dataclass(frozen=True)
class Node:
    """A disk's protocol node: its name, its image, and the options it was created with."""
    domain: str
    uuid: str
    target: str
    path: str
    cache: str                   # libvirt's cache mode (none, directsync...)
    name: str                    # libvirt-N-storage
    options: dict                # the -blockdev JSON, as given
    domain_id: int               # libvirt's ID of the domain's run (new at each start)

    @property
    def key(self) -> str:
        return f"{self.domain}/{self.target}"


def parse_key(key: str) -> tuple[str, str]:
    """``DOMAIN/TARGET`` -> (domain, target); ``UsageError`` (the command line's shape)
    else."""
    domain, sep, target = key.rpartition("/")
    if not sep or not domain or not target:
        raise UsageError(f"{key!r}: expected DOMAIN/TARGET, e.g. web1/vda")
    return domain, target


def qmp(dom, command: str, arguments: dict | None = None):
    """One QMP command through libvirt; its ``return``, or ``LibvirtError`` with QEMU's
    or libvirt's one-line reason."""
    libvirt = import_libvirt()
    try:
        import libvirt_qemu
    except ImportError:
        raise LibvirtError("libvirt_qemu cannot be imported (python3-libvirt)") from None
    cmd = {"execute": command, **({"arguments": arguments} if arguments else {})}
    try:
        reply = json.loads(libvirt_qemu.qemuMonitorCommand(dom, json.dumps(cmd), 0))
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"{dom.name()}: {command}: {libvirt_message(exc)}") from None
    if "error" in reply:
        raise LibvirtError(f"{dom.name()}: {command}: {reply['error'].get('desc', reply)}")
    return reply.get("return")


def qemu_pid(uuid: str) -> int | None:
    """The QEMU process of the domain ``uuid`` (its ``-uuid`` argument), None if none."""
    want = f"-uuid\0{uuid}\0".encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if want in f.read():
                    return int(pid)
        except OSError:
            continue
    return None


def qemu_options(pid: int, flag: str) -> list[str]:
    """The values of each ``flag`` (``-blockdev``, ``-drive``) on QEMU ``pid``'s command
    line; [] when it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        return []
    return [value for f, value in zip(argv, argv[1:]) if f == flag]


def creation_options(pid: int, node: str) -> dict | None:
    """The ``-blockdev`` JSON options of ``node`` on QEMU ``pid``'s command line."""
    for value in qemu_options(pid, "-blockdev"):
        if value.startswith("{"):
            try:
                opts = json.loads(value)
            except ValueError:
                continue
            if opts.get("node-name") == node:
                return opts
    return None


def _source_index(xml: str, target: str) -> int | None:
    root = ET.fromstring(xml)
    for el in root.findall("./devices/disk"):
        t = el.find("target")
        if t is not None and t.get("dev") == target:
            src = el.find("source")
            index = None if src is None else src.get("index")
            return int(index) if index and index.isdigit() else None
    return None


def lookup(conn, domain: str):
    """The libvirt domain named ``domain``; ``ConfigError`` when there is none."""
    libvirt = import_libvirt()
    try:
        return conn.lookupByName(domain)
    except libvirt.libvirtError as exc:
        raise ConfigError(f"{domain}: {libvirt_message(exc)}") from None


def find_node(dom, target: str) -> Node:
    """The protocol node of ``dom``'s disk ``target`` (module docstring), or ``Refused``."""
    xml = dom.XMLDesc(0)
    disks = {d.target: d for d in libvirt_disks.parse_domain_xml(xml, with_units=False)}
    d = disks.get(target)
    key = f"{dom.name()}/{target}"
    if d is None:
        raise Refused(f"{key}: no such disk (the domain has {', '.join(disks) or 'none'})")
    if d.type not in ("file", "block") or not d.source:
        raise Refused(f"{key}: a {d.type} disk: only a local file or block device is adopted")
    index = _source_index(xml, target)
    pid = qemu_pid(d.uuid)
    if index is None or pid is None:
        raise Refused(f"{key}: its QEMU node is unknown (no source index in the live XML, "
                      f"or no QEMU process): is the domain running?")
    name = f"libvirt-{index}-storage"
    opts = creation_options(pid, name)
    if opts is None:
        raise Refused(f"{key}: node {name} is not on QEMU's command line as -blockdev JSON "
                      f"(hot-plugged since start?): its options cannot be restated")
    if opts.get("driver") not in PROTOCOL_DRIVERS or opts.get("filename") != d.source:
        raise Refused(f"{key}: node {name} is {opts.get('driver')} on "
                      f"{opts.get('filename')}, not the disk's {d.source}")
    return Node(dom.name(), d.uuid, target, d.source, d.cache, name, opts, int(dom.ID()))


def direct_now(dom, node: Node) -> bool:
    """QEMU's answer: ``node`` opens its image with O_DIRECT."""
    for n in qmp(dom, "query-named-block-nodes", {"flat": True}) or []:
        if n.get("node-name") == node.name:
            return bool(n.get("cache", {}).get("direct"))
    raise LibvirtError(f"{node.key}: QEMU has no node {node.name}")


def _reopen(dom, node: Node, direct: bool) -> None:
    opts = dict(node.options)
    opts["cache"] = {**opts.get("cache", {}), "direct": direct}
    qmp(dom, "blockdev-reopen", {"options": [opts]})
    if direct_now(dom, node) != direct:
        raise LibvirtError(f"{node.key}: QEMU reopened {node.name} but reports "
                           f"cache.direct {not direct}")


def _running(dom, key: str) -> None:
    libvirt = import_libvirt()
    state, reason = dom.state()
    if state != RUNNING:
        raise NotNow(f"{key}: the domain is {STATE_NAMES.get(state, state)}, not running: "
                     f"adopt a running domain (not paused, not arriving)")
    try:
        job = dom.jobInfo()[0]
    except libvirt.libvirtError:
        job = -1
    if job != libvirt.VIR_DOMAIN_JOB_NONE:
        raise NotNow(f"{key}: a job runs on the domain (a migration, a save, a dump or a "
                     f"snapshot): adopt it when the job is done")
    jobs = qmp(dom, "query-block-jobs") or []
    if jobs:
        kinds = ", ".join(sorted({j.get("type", "?") for j in jobs}))
        raise NotNow(f"{key}: a block job runs ({kinds}): adopt it when the job is done")


def _advice(node: Node, advice_path: str) -> dict | None:
    return advice_for(advice_path, node.path, node.domain, node.target)


def advice_for(advice_path: str, path: str, domain: str | None = None,
               target: str | None = None) -> dict | None:
    """advise's forecast of adopting the disk (its ``adopted``: the guest's write cache
    kept), else of a switch to cache=writethrough (a report from before the first)."""
    a = advice_of(load_advice(advice_path), domain, target, path)
    return (a.get("adopted") or a) if isinstance(a, dict) else None


def no_gain_refusal(key: str, advice: dict | None) -> None:
    """``Refused`` when advise's last report said no gain for the disk."""
    if advice and advice.get("verdict") == "no_gain":
        raise Refused(f"{key}: advise said no gain ({advice.get('reason') or 'no gain'}); "
                      f"--force adopts it anyway")


def aio_refusal(key: str, aio: str) -> None:
    """``Refused`` for an ``aio`` a reopen cannot change and the page cache would stall."""
    if aio not in BUFFERED_AIO:
        raise Refused(f"{key}: io={aio}: QEMU cannot change it on a reopen, and Linux AIO "
                      f"on the page cache stalls QEMU on every miss: needs io='threads' or "
                      f"io='io_uring'")


def advised_gain(a: dict | None) -> float | None:
    """The gain advise forecast for a disk (its mean I/O time now over with the size held),
    None without a forecast of both."""
    try:
        now, then = a["now"]["mean_io_time_us"], a["then"]["mean_io_time_us"]
        return float(now) / float(then) if now and then else None
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None


def counters(dom, target: str) -> Counters:
    """QEMU's block accounting of the disk ``target`` now (libvirt's block statistics:
    no QMP, no taint)."""
    libvirt = import_libvirt()
    try:
        stats = dom.blockStatsFlags(target, 0)
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"{dom.name()}/{target}: block statistics: "
                           f"{libvirt_message(exc)}") from None
    return Counters.from_libvirt(stats, time.monotonic())


def measure(conn, keys: list[str], seconds: float,
            sleep=time.sleep) -> dict[str, list[Window]]:
    """Time the guests' I/O of ``keys`` together over ``seconds``
    (``never_slower.timed``): the baseline each adoption is judged against. Nothing for
    0 s."""
    if seconds <= 0:
        return {}
    doms = {key: (lookup(conn, parse_key(key)[0]), parse_key(key)[1]) for key in keys}
    return never_slower.timed({key: lambda dom=dom, t=t: counters(dom, t)
                               for key, (dom, t) in doms.items()}, seconds, sleep)


def check(conn, key: str, *, advice_path: str, force: bool = False,
          by_config: bool = False):
    """Every refusal of adopting ``key`` that does not change anything (module docstring):
    ``(dom, node, advice, direct)``; ``direct`` False: QEMU has it adopted already.
    ``by_config``: the host service's ``[adopt]`` asks, not the operator: a disk released
    for good in this run of its domain (by the operator, or slower) is refused
    (``adopted.hold_back``)."""
    domain, target = parse_key(key)
    dom = lookup(conn, domain)
    _running(dom, key)
    node = find_node(dom, target)
    why_back = held_back(node) if by_config else None
    if why_back:
        raise Refused(f"{key}: released {why_back} since the domain started: "
                      f"vmdisktouch adopt {key} takes it back")
    if node.cache not in DIRECT_CACHE_MODES:
        raise Refused(f"{key}: cache={node.cache} goes through the page cache already: "
                      f"serve it as it is")
    aio_refusal(key, node.options.get("aio", "threads"))
    direct = direct_now(dom, node)
    advice = _advice(node, advice_path)
    if direct and not force:
        no_gain_refusal(key, advice)
    return dom, node, advice, direct


def mark(dom, target: str, adopting: bool) -> None:
    """Add ``target`` to the adopted targets its domain carries (``adopting``; the
    metadata of ``adopted``), or remove it; the element goes with the last. A failure is said in one line and changes
    nothing else: the switch is QEMU's, the mark only travels. Not during a job (a
    migration): libvirt would make the write wait for its end."""
    libvirt = import_libvirt()
    try:
        before = adopted.marked(ET.fromstring(dom.XMLDesc(0)))
        targets = before | {target} if adopting else before - {target}
        if targets == before:
            return
        if dom.jobInfo()[0] != libvirt.VIR_DOMAIN_JOB_NONE:
            raise libvirt.libvirtError("a job runs on the domain")
        xml = ("<adopted>" + "".join(f"<disk target={quoteattr(t)}/>" for t in sorted(targets))
               + "</adopted>") if targets else None
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml,
                        adopted.MARK_KEY if xml else None, adopted.MARK_NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except (libvirt.libvirtError, ET.ParseError) as exc:
        why = libvirt_message(exc) if isinstance(exc, libvirt.libvirtError) else str(exc)
        log.warning("%s/%s: the adoption's mark in the domain's metadata not %s: %s",
                    dom.name(), target, "written" if adopting else "removed", why)


def drop_then_switch(key: str, path: str, switch) -> None:
    """Drop the image's pages from this host's page cache, check that none stays (the
    module docstring), then ``switch``; ``Refused`` naming who maps a page that stayed."""
    try:
        with open_image(path) as image:
            left = drop.drop(image)
            if left is None:
                raise Refused(f"{key}: this process may not see {path}'s page cache "
                              f"(run as root)")
            if left:
                who = drop.mappers(path)
                raise Refused(f"{key}: {left} page(s) of {path} stay in this host's "
                              f"page cache after dropping them"
                              + (f", mapped by {', '.join(who)}" if who else "")
                              + ": they may be older than the disk, and QEMU would read "
                              "them")
            switch()
    except ImageError as exc:
        raise Refused(f"{key}: {exc}") from None


def drop_after_release(path: str) -> None:
    """What the image left in the page cache goes: it would go stale once QEMU reads past
    it again."""
    try:
        with open_image(path) as image:
            drop.drop(image)
    except ImageError:
        pass                                   # nothing to drop


def adopt(conn, key: str, *, advice_path: str, force: bool = False,
          by_config: bool = False, baseline: list[Window] | None = None) -> tuple[Node, bool]:
    """Switch the disk ``key`` (``DOMAIN/TARGET``) to the page cache (module docstring,
    ``check``): ``(node, switched)``, False when QEMU had it adopted already. The
    operator's own adopt lets a disk released for good go (``adopted.let_go``).
    ``baseline``: the guest's I/O timed before (``measure``), kept in the record."""
    dom, node, advice, direct = check(conn, key, advice_path=advice_path, force=force,
                                      by_config=by_config)
    if not by_config:
        let_go(node.uuid, node.target)
    if not direct:
        record(node)
        return node, False                           # adopted already: recorded again

    def switch():
        _running(dom, key)                           # the drop took time: ask again
        _reopen(dom, node, direct=False)
    drop_then_switch(key, node.path, switch)
    record(node, baseline, advised_gain(advice))
    mark(dom, node.target, True)
    return node, True


def release(conn, key: str, *, by_operator: bool = False,
            why: str | None = None) -> tuple[Node, bool]:
    """Switch the disk ``key`` back to O_DIRECT; ``(node, switched)``, False when QEMU
    had it on O_DIRECT already. Its record goes either way; ``by_operator``, or the host
    service's ``why`` (it got slower): ``[adopt]`` leaves it so for this run of the domain
    (``adopted.hold_back``)."""
    domain, target = parse_key(key)
    dom = lookup(conn, domain)
    node = find_node(dom, target)
    switched = not direct_now(dom, node)
    if switched:
        _reopen(dom, node, direct=True)
        drop_after_release(node.path)
    forget(node.uuid, node.target)
    mark(dom, node.target, False)
    if by_operator or why:
        hold_back(node, why)
    return node, switched


def recorded_keys(conn) -> list[str]:
    """``DOMAIN/TARGET`` of each recorded adoption whose domain still runs a QEMU (by its
    UUID: a rename does not lose it); the records of the others go, since a domain
    without a QEMU has nothing adopted."""
    libvirt = import_libvirt()
    keys = []
    for doc in records():
        try:
            dom = conn.lookupByUUIDString(doc["uuid"])
            active = bool(dom.isActive())
        except libvirt.libvirtError:
            dom, active = None, False
        if not active:
            forget(doc["uuid"], doc["target"])
            continue
        keys.append(f"{dom.name()}/{doc['target']}")
    return keys
