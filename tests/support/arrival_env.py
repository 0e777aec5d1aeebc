"""Helpers for the arrival tests (issue 40): QEMU checking its own page-cache drop.

* ``CheckedQemu``: an emulator wrapper for a domain's ``<emulator>``: it execs
  qemu-system-x86_64 with libvirt's arguments, the file blockdev's JSON
  (libvirt 9.0: ``-blockdev {"driver":"file","filename":...}``) given
  ``"x-check-cache-dropped":true``. When the domain arrives (an incoming
  migration or restore completes) QEMU drops the image's page cache and, with
  the option, checks with mincore that nothing stayed: "page cache still in
  use!" in the domain's log when a page did (QEMU 7.2 logs it and goes on).
  It lives in a world-readable directory under /var/tmp: libvirtd probes the
  emulator's capabilities as libvirt-qemu, and pytest's tmp is root-only.
* ``checked_domain_xml``: ``tests.support.libvirt_env.domain_xml`` with that emulator.
* ``SlowFeed``: a FIFO that hands a save image to ``virsh restore FILE`` over
  some seconds, so the restore's incoming phase (QEMU started, disks not yet
  activated) lasts long enough for a daemon's 1 s cycle to see it.
* ``QemuLog``: a domain's QEMU log read from an offset (what one arrival wrote).
* ``vsh``: virsh on a libvirt URI (``tests.support.private_libvirt.PrivateLibvirtd``
  is each test's libvirtd; two of them run a live migration on one machine).
  The wrapper can also fill a domain's RAM at reset (``fill_ram``: a long
  migration stream) or leave it unchecked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tests.support.libvirt_env import _tool, domain_xml
from tests.support.private_libvirt import QEMU_LOG

STILL_IN_USE = "page cache still in use"

WRAPPER = """#!/usr/bin/python3
# vmdisktouch tests: QEMU with x-check-cache-dropped on every file blockdev.
import os, sys
PREFIX = '{"driver":"file",'
args = [a.replace(PREFIX, PREFIX + '"x-check-cache-dropped":true,', 1)
        if a.startswith(PREFIX) else a for a in sys.argv[1:]]
# RAM filled at reset from DIR/NAME.ram when there is one (a migration with a long stream)
name = next((a.split("guest=", 1)[1].split(",")[0] for a in args if a.startswith("guest=")),
            None)
ram = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.ram")
if name and os.path.exists(ram[:-4] + ".nocheck"):     # this domain runs unchecked
    args = sys.argv[1:]
if name and os.path.exists(ram):
    args += ["-device", f"loader,file={ram},addr=0x1000000,force-raw=on"]
os.execv(%(qemu)r, [%(qemu)r] + args)
"""


class CheckedQemu:
    """The wrapper script (``path``) in a directory of its own; ``remove()`` deletes it."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="vdt-arrival-", dir="/var/tmp"))
        os.chmod(self.dir, 0o755)
        self.path = self.dir / "qemu-checked"
        self.path.write_text(WRAPPER % {"qemu": _tool("qemu-system-x86_64")})
        os.chmod(self.path, 0o755)

    def fill_ram(self, name: str, size: int) -> None:
        """Domain ``name``'s QEMU loads ``size`` random bytes into its RAM at 16 MiB at
        reset (``-device loader``): a migration of it sends that much."""
        with open(self.dir / f"{name}.ram", "wb") as f:
            for _ in range(size >> 20):
                f.write(os.urandom(1 << 20))
        os.chmod(self.dir / f"{name}.ram", 0o644)

    def unchecked(self, name: str) -> None:
        """Domain ``name``'s QEMU runs without the check (the RAM filler still applies)."""
        (self.dir / f"{name}.nocheck").write_text("")

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def checked_domain_xml(name: str, disks: list[str], emulator: str | os.PathLike,
                       memory_mib: int = 64) -> str:
    xml = domain_xml(name, disks).replace("<memory unit='MiB'>64</memory>",
                                          f"<memory unit='MiB'>{memory_mib}</memory>")
    qemu = f"<emulator>{_tool('qemu-system-x86_64')}</emulator>"
    assert qemu in xml
    return xml.replace(qemu, f"<emulator>{emulator}</emulator>")


class SlowFeed:
    """A FIFO at ``path`` that a thread fills with ``source``'s bytes over ``seconds``
    (in 16 KiB pieces, evenly spaced); ``join()`` waits for it and says what failed."""

    PIECE = 16 * 1024

    def __init__(self, source: Path, path: Path, seconds: float):
        self.source, self.path, self.seconds = source, path, seconds
        self.error: BaseException | None = None
        self.done_at: float | None = None
        os.mkfifo(path)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            data = self.source.read_bytes()
            pieces = max(1, -(-len(data) // self.PIECE))
            gap = self.seconds / pieces
            with open(self.path, "wb") as f:      # blocks until libvirtd opens it
                for i in range(0, len(data), self.PIECE):
                    f.write(data[i:i + self.PIECE])
                    f.flush()
                    time.sleep(gap)
            self.done_at = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self, timeout: float = 60) -> None:
        self.thread.join(timeout)
        if self.thread.is_alive():          # nobody opened it: unblock the writer
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
                os.close(fd)
            except OSError:
                pass
            self.thread.join(5)
        assert self.error is None, f"feeding {self.path}: {self.error!r}"


class QemuLog:
    """A domain's QEMU log (``path``, default libvirt's) from the size it had at creation."""

    def __init__(self, name: str, path: str | None = None):
        self.path = path or QEMU_LOG.format(name=name)
        try:
            self.start = os.path.getsize(self.path)
        except FileNotFoundError:
            self.start = 0

    def new(self) -> str:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.start)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""


def vsh(uri: str, *args: str, check: bool = True, timeout: float = 300) -> str:
    r = subprocess.run([_tool("virsh"), "-q", "-c", uri, *args], capture_output=True,
                       text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"virsh -c {uri} {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def qemu_io_at(uri: str, name: str, command: str) -> str:
    """A qemu-io command on the domain's first virtio disk, through its monitor."""
    out = vsh(uri, "qemu-monitor-command", name, "--hmp",
              f'qemu-io -d /machine/peripheral/virtio-disk0/virtio-backend "{command}"')
    assert "error" not in out.lower() and "failed" not in out.lower(), out
    return out
