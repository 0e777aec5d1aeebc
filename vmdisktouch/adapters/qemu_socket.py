"""Adopt a disk of a QEMU that libvirt does not run, through its QMP socket.

Theory of operation
-------------------
Proxmox VE runs QEMU itself, with a QMP socket per VM
(``/var/run/qemu-server/VMID.qmp``) and each disk a ``-drive`` with an id
(``drive-scsi0``) and ``cache=none`` by default. Such a drive's nodes are named by
QEMU (``#block123``), and ``blockdev-reopen`` cannot name them ("Cannot change the
option 'node-name'"): libvirt's way (``adapters.libvirt.adopt``) does not apply. The
drive's own reopen does: ``qemu-io DRIVE "reopen -c writeback"`` in the human monitor
(QMP ``human-monitor-command``) reopens its top node with ``cache.direct`` false and
every other option kept, and the file node below inherits it, since ``-drive`` sets
its cache on the top node only. ``reopen -c none`` switches it back. The guest-visible
write cache stays on, as under ``cache=none`` (qemu-io refuses to change it under an
attached device). Checked on QEMU 7.2: fdinfo flags 02140000 to 02100000 and back.

Every check of adopting a libvirt domain's disk is made here too, from QMP: the VM
runs (``query-status``), no migration (``query-migrate``), no block job; the drive's
``aio`` (from QEMU's command line: the ``-drive`` with that id, ``threads`` unless
said) is not ``native``; advise's report does not say no gain for its image; and the
image's pages are dropped and verified gone (``adopt.drop_then_switch``). QEMU's own
``cache.direct`` of the drive is read back after each switch.

Before the switch the guest's I/O is timed by QEMU's own accounting (``measure``,
``query-blockstats``: the baseline of ``core.never_slower``), as for a libvirt
domain's disk. A record per drive (``RECORDS``, in the runtime directory) names the
socket, the drive, its image and QEMU's PID (the socket's peer), and keeps the baseline
and the gain advise forecast: ``release --all`` finds them, a host service serving the
image judges the drive against its baseline and releases it when it stops
(``daemon.adoption``), and a record whose QEMU is gone stands for nothing. QMP on a socket serves one client at a time:
each call connects, asks, and closes within ``TIMEOUT_S``.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import socket
import stat
import struct
import time

from vmdisktouch.adapters import atomic, runtime_dir
from vmdisktouch.adapters.libvirt import adopt
from vmdisktouch.adapters.libvirt.adopt import NotNow, Refused
from vmdisktouch.core import never_slower
from vmdisktouch.core.never_slower import Counters, Window
from vmdisktouch.errors import ConfigError, VmdtError

TIMEOUT_S = 10.0
RECORDS = "adopted-qmp"         # under the runtime directory
MIGRATING = ("setup", "active", "postcopy-active", "postcopy-paused", "postcopy-recover",
             "pre-switchover", "device", "wait-unplug")


class QmpError(VmdtError):
    """QMP on the socket failed, or QEMU said no."""


class Monitor:
    """One QMP connection to a QEMU's socket: ``run`` a command, ``hmp`` a human one."""

    def __init__(self, path: str, timeout: float = TIMEOUT_S):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
            creds = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                         struct.calcsize("3i"))
            self.pid = struct.unpack("3i", creds)[0]    # QEMU's
            self.f = self.sock.makefile("rw", encoding="utf-8")
            if "QMP" not in json.loads(self.f.readline() or "{}"):
                raise QmpError(f"{path}: not a QMP socket (no greeting)")
            self.run("qmp_capabilities")
        except (OSError, ValueError) as exc:
            self.sock.close()
            raise QmpError(f"{path}: {getattr(exc, 'strerror', None) or exc}") from None
        except QmpError:
            self.sock.close()
            raise

    def run(self, command: str, **arguments):
        """The command's ``return``; ``QmpError`` with QEMU's reason."""
        try:
            self.f.write(json.dumps({"execute": command, "arguments": arguments}) + "\n")
            self.f.flush()
            while True:
                reply = json.loads(self.f.readline() or "null")
                if reply is None:
                    raise QmpError(f"{self.path}: QEMU closed the socket")
                if "event" not in reply:
                    break
        except (OSError, ValueError) as exc:
            raise QmpError(f"{self.path}: {command}: {exc}") from None
        if "error" in reply:
            raise QmpError(f"{self.path}: {command}: {reply['error'].get('desc', reply)}")
        return reply.get("return")

    def hmp(self, line: str) -> str:
        return self.run("human-monitor-command", **{"command-line": line}) or ""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def drive_options(pid: int, drive: str) -> dict[str, str] | None:
    """The options of the ``-drive`` whose id is ``drive`` on QEMU ``pid``'s command line
    (``key=value`` pairs; ",," is a comma of a value), None when there is none."""
    for value in adopt.qemu_options(pid, "-drive"):
        opts = {}
        for part in value.replace(",,", "\0").split(","):
            k, _, v = part.partition("=")
            opts[k] = v.replace("\0", ",")
        if opts.get("id") == drive:
            return opts
    return None


def _drive(mon: Monitor, drive: str) -> dict:
    """The drive's ``query-block`` entry, inserted; ``Refused`` when there is none."""
    for b in mon.run("query-block") or []:
        if b.get("device") == drive and b.get("inserted"):
            return b["inserted"]
    names = ", ".join(b.get("device") or "?" for b in mon.run("query-block") or [])
    raise Refused(f"{mon.path} {drive}: no such drive with a medium (QEMU has "
                  f"{names or 'none'})")


def _runs(mon: Monitor, key: str) -> None:
    status = (mon.run("query-status") or {}).get("status")
    if status != "running":
        raise NotNow(f"{key}: the VM is {status}, not running: adopt a running VM")
    if (mon.run("query-migrate") or {}).get("status") in MIGRATING:
        raise NotNow(f"{key}: a migration runs: adopt it when it is done")
    jobs = mon.run("query-block-jobs") or []
    if jobs:
        kinds = ", ".join(sorted({j.get("type", "?") for j in jobs}))
        raise NotNow(f"{key}: a block job runs ({kinds}): adopt it when the job is done")


def _switch(mon: Monitor, key: str, drive: str, direct: bool) -> None:
    mon.hmp(f'qemu-io {drive} "reopen -c {"none" if direct else "writeback"}"')
    if bool(_drive(mon, drive).get("cache", {}).get("direct")) != direct:
        raise QmpError(f"{key}: QEMU reopened the drive but reports cache.direct "
                       f"{not direct}")


def _record_path(sock: str, drive: str) -> str:
    tag = hashlib.sha1(os.path.realpath(sock).encode()).hexdigest()[:12]
    return os.path.join(runtime_dir.runtime_dir(), RECORDS, f"{tag}-{drive}.json")


def check_drive(sock: str, drive: str, *, advice_path: str,
                force: bool = False) -> None:
    """Every refusal of adopting ``drive`` that changes nothing (module docstring): said
    before the guest is timed."""
    with Monitor(sock) as mon:
        _check(mon, f"{sock} {drive}", drive, advice_path, force)


def _check(mon: Monitor, key: str, drive: str, advice_path: str,
           force: bool) -> tuple[str, bool, dict | None]:
    """``(image path, direct, advise's forecast)``; ``direct`` False: adopted already."""
    _runs(mon, key)
    inserted = _drive(mon, drive)
    path = inserted.get("file") or ""
    opts = drive_options(mon.pid, drive)
    if opts is None:
        raise Refused(f"{key}: not a -drive on QEMU's command line (pid {mon.pid}): "
                      f"only a -drive with an id is adopted through a QMP socket")
    if not path.startswith("/") or not os.path.exists(path):
        raise Refused(f"{key}: {path or 'its image'} is not a local file or block "
                      f"device: only those are adopted")
    adopt.aio_refusal(key, opts.get("aio", "threads"))
    direct = bool(inserted.get("cache", {}).get("direct"))
    advice = adopt.advice_for(advice_path, path)
    if direct and not force:
        adopt.no_gain_refusal(key, advice)
    return path, direct, advice


def adopt_drive(sock: str, drive: str, *, advice_path: str, force: bool = False,
                baseline: list | None = None) -> tuple[str, bool]:
    """Switch ``drive`` of the QEMU at ``sock`` to the page cache (module docstring):
    ``(image path, switched)``, False when QEMU had it so already. ``baseline``: the
    guest's I/O timed before (``measure``), kept in the record with advise's gain."""
    key = f"{sock} {drive}"
    with Monitor(sock) as mon:
        path, direct, advice = _check(mon, key, drive, advice_path, force)
        if not direct:
            return path, False

        def switch():
            _runs(mon, key)                          # the drop took time: ask again
            _switch(mon, key, drive, direct=False)
        adopt.drop_then_switch(key, path, switch)
        rec = _record_path(sock, drive)
        os.makedirs(os.path.dirname(rec), mode=0o755, exist_ok=True)
        atomic.write_json(rec, {"socket": os.path.realpath(sock), "drive": drive,
                                "path": path, "pid": mon.pid, "since": time.time(),
                                "baseline": None if baseline is None
                                else [w.to_json() for w in baseline],
                                "advised_gain": adopt.advised_gain(advice)})
    return path, True


def counters(sock: str, drive: str) -> Counters:
    """QEMU's block accounting of ``drive`` now (``query-blockstats``), of a drive QEMU
    has through the page cache: when it opens it with O_DIRECT again, the drive is not
    adopted and its record goes (``QmpError``)."""
    key = f"{sock} {drive}"
    with Monitor(sock) as mon:
        if _drive(mon, drive).get("cache", {}).get("direct"):
            forget(sock, drive)
            raise QmpError(f"{key}: QEMU opens it with O_DIRECT: not adopted, its record "
                           f"goes")
        return _counters(mon, key, drive)


def _counters(mon: Monitor, key: str, drive: str) -> Counters:
    for b in mon.run("query-blockstats") or []:
        if b.get("device") == drive:
            return Counters.from_qmp(b.get("stats") or {}, time.monotonic())
    raise QmpError(f"{key}: no block statistics for the drive")


def measure(sock: str, drives: list[str], seconds: float,
            sleep=time.sleep) -> dict[str, list[Window]]:
    """Time the guest's I/O of ``drives`` before their switch (``never_slower.timed``),
    by drive; nothing for 0 s."""
    def read(drive):
        with Monitor(sock) as mon:
            return _counters(mon, f"{sock} {drive}", drive)
    return never_slower.timed({d: lambda d=d: read(d) for d in drives}, seconds, sleep)


def forget(sock: str, drive: str) -> None:
    try:
        os.unlink(_record_path(sock, drive))
    except FileNotFoundError:
        pass


def release_drive(sock: str, drive: str) -> tuple[str, bool]:
    """Switch ``drive`` back to O_DIRECT: ``(image path, switched)``; its record goes."""
    key = f"{sock} {drive}"
    with Monitor(sock) as mon:
        path = _drive(mon, drive).get("file") or ""
        switched = not _drive(mon, drive).get("cache", {}).get("direct")
        if switched:
            _switch(mon, key, drive, direct=True)
            adopt.drop_after_release(path)
    forget(sock, drive)
    return path, switched


def records() -> list[dict]:
    """The record of each adoption whose QEMU still runs (its ``socket``, ``drive``,
    ``path``, ``since``, ``baseline`` and ``advised_gain``); the records of the others go."""
    out = []
    for path in sorted(glob.glob(os.path.join(runtime_dir.runtime_dir(), RECORDS,
                                              "*.json"))):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
            sock, pid = str(doc["socket"]), int(doc["pid"])
            doc.update(drive=str(doc["drive"]), path=str(doc.get("path") or ""),
                       since=float(doc.get("since") or 0.0))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if os.path.exists(f"/proc/{pid}") and os.path.exists(sock):
            out.append(doc)
            continue
        try:
            os.unlink(path)
        except OSError:
            pass                               # gone already, or not ours to remove
    return out


def recorded() -> list[tuple[str, str]]:
    """``(socket, drive)`` of each recorded adoption whose QEMU still runs (``records``)."""
    return [(str(d["socket"]), str(d["drive"])) for d in records()]


def record_of(sock: str, drive: str) -> dict:
    """The record of ``drive``'s adoption ({} when there is none, or it is damaged)."""
    try:
        with open(_record_path(sock, drive), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def key_of(sock: str, drive: str) -> str:
    """A drive as the host service names it: ``SOCKET DRIVE``, the socket's real path
    (absolute: a libvirt disk's ``DOMAIN/TARGET`` never starts with "/")."""
    return f"{os.path.realpath(sock)} {drive}"


def parse_key(key: str) -> tuple[str, str]:
    """``SOCKET DRIVE`` -> (socket, drive): a drive's id has no space."""
    sock, _, drive = key.rpartition(" ")
    return sock, drive


def check_socket(sock: str) -> None:
    """``ConfigError`` unless ``sock`` is a socket (named before anything is asked)."""
    try:
        if not stat.S_ISSOCK(os.stat(sock).st_mode):
            raise ConfigError(f"--qmp {sock}: not a socket")
    except OSError as exc:
        raise ConfigError(f"--qmp {sock}: {exc.strerror}") from None
