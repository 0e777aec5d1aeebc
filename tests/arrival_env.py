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
* ``checked_domain_xml``: ``tests.libvirt_env.domain_xml`` with that emulator.
* ``SlowFeed``: a FIFO that hands a save image to ``virsh restore FILE`` over
  some seconds, so the restore's incoming phase (QEMU started, disks not yet
  activated) lasts long enough for a daemon's 1 s cycle to see it.
* ``QemuLog``: a domain's QEMU log read from an offset (what one arrival wrote).
* ``DestLibvirtd``: a libvirtd in its own mount and UTS namespaces, copied
  from benchmarks/bench_carry_heat.py (tests must not import benchmarks), so
  a live migration runs between two libvirtds on one machine; optionally with
  a bindfs ``kernel_cache`` mount of its own (a page cache of its own over
  shared files). The wrapper can also fill a domain's RAM at reset
  (``fill_ram``: a long migration stream) or leave it unchecked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

from tests.libvirt_env import _tool, domain_xml
from tools.common import stop_process

QEMU_LOG = "/var/log/libvirt/qemu/{name}.log"
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


# -- the destination of a migration: a second libvirtd on this machine ---------------------
# Copied from benchmarks/bench_carry_heat.py (DestLibvirtd), with ``extra`` shell lines run
# in its namespace before libvirtd starts (e.g. a FUSE mount of its own).

NS_SCRIPT = """set -e
hostname {host}
for d in /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt/qemu; do
    mount -t tmpfs -o mode=0755 vdt-arrive "$d"
done
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/cache/libvirt/qemu
mount --bind {dir}/qemu.conf /etc/libvirt/qemu.conf
{extra}
exec {libvirtd} -f {dir}/libvirtd.conf -p {dir}/libvirtd.pid
"""


def vsh(uri: str, *args: str, check: bool = True, timeout: float = 300) -> str:
    r = subprocess.run([_tool("virsh"), "-q", "-c", uri, *args], capture_output=True,
                       text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"virsh -c {uri} {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


class DestLibvirtd:
    """A libvirtd of its own (a migration's destination, or any libvirtd no other session's
    daemon sees) in its own mount and UTS namespaces (its own hostname, host UUID, sockets,
    tmpfs over its run/state/log dirs, no cgroup controllers, QEMU's stdio to a file); the
    same network namespace and files. ``uri`` reaches it; ``stop()`` destroys
    its domains and stops it (SIGTERM by PID)."""

    def __init__(self, tmp: Path, extra: str = "", name: str = "dst",
                 fuse: tuple[Path, Path] | None = None):
        """``fuse``: (directory, mount point): bindfs mounts the directory there with
        ``kernel_cache`` in this libvirtd's mount namespace only: a page cache of its own
        over the same files (two such libvirtds: two hosts on shared storage)."""
        self.dir = tmp / name
        self.fuse = fuse
        if fuse is not None:
            src, target = fuse
            bindfs = _tool("bindfs")
            extra += (f"\nmkdir -p {target}\n{bindfs} -f -o kernel_cache {src} {target} &"
                      f"\necho $! > {self.dir}/bindfs.pid\ni=0\n"
                      f"while ! mountpoint -q {target}; do i=$((i+1)); [ $i -lt 100 ] || exit 1; "
                      f"sleep 0.1; done\n")
        self.sock = self.dir / "sock"
        self.sock.mkdir(parents=True)
        self.uri = f"qemu+unix:///system?socket={self.sock}/libvirt-sock"
        self.host = f"vdt-arrive-{name}-{os.getpid()}"
        (self.dir / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{self.sock}"\nhost_uuid = "{uuid.uuid4()}"\n')
        qemu = Path("/etc/libvirt/qemu.conf").read_text() if os.path.exists(
            "/etc/libvirt/qemu.conf") else ""
        (self.dir / "qemu.conf").write_text(qemu + '\nstdio_handler = "file"\n'
                                            'cgroup_controllers = [ ]\n')
        script = NS_SCRIPT.format(host=self.host, dir=self.dir, extra=extra,
                                  libvirtd=_tool("libvirtd"))
        self.log = open(self.dir / "libvirtd.log", "wb")
        self.proc = subprocess.Popen([_tool("unshare"), "-m", "-u", "--propagation", "private",
                                      "sh", "-c", script], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while True:
                assert self.proc.poll() is None, \
                    f"the second libvirtd exited ({self.proc.returncode}): {self.log_tail()}"
                r = subprocess.run([_tool("virsh"), "-q", "-c", self.uri, "hostname"],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    self.hostname = r.stdout.strip()
                    break
                assert time.monotonic() < deadline, \
                    f"the second libvirtd does not answer: {r.stderr.strip()}"
                time.sleep(0.3)
            vsh(self.uri, "domcapabilities", timeout=120)   # its capability probe, now
        except BaseException:
            self.stop()
            raise

    def log_tail(self, n: int = 8) -> str:
        self.log.flush()
        return " | ".join((self.dir / "libvirtd.log").read_text(errors="replace")
                          .strip().splitlines()[-n:])

    def qemu_log(self, name: str) -> str:
        """A domain's QEMU log there (its /var/log/libvirt is a tmpfs of its namespace)."""
        return f"/proc/{self.proc.pid}/root" + QEMU_LOG.format(name=name)

    def root(self) -> str:
        """Its namespace's root, to reach its mounts from here."""
        return f"/proc/{self.proc.pid}/root"

    def stop(self) -> None:
        if self.proc.poll() is None:
            for name in vsh(self.uri, "list", "--all", "--name", check=False).split():
                vsh(self.uri, "destroy", name, check=False)
                vsh(self.uri, "undefine", name, check=False)
        self.unmount()
        stop_process(self.proc, timeout=30)
        self.log.close()

    def unmount(self) -> None:
        """Unmount the FUSE mount (bindfs then exits), from inside its namespace."""
        pidfile = self.dir / "bindfs.pid"
        if self.fuse is None or not pidfile.exists():
            return
        pid = int(pidfile.read_text().strip())
        subprocess.run([_tool("nsenter"), "-t", str(pid), "-m", _tool("fusermount3"), "-u",
                        str(self.fuse[1])], capture_output=True)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            try:
                if open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z":
                    break           # exited: libvirtd, its parent, reaps it or dies
            except OSError:
                break
            time.sleep(0.1)
        else:
            if os.path.exists(f"/proc/{pid}"):
                try:
                    os.kill(pid, 15)
                except ProcessLookupError:
                    pass
        pidfile.unlink()

    def prefix(self) -> list[str]:
        """A command prefix that runs a program in this libvirtd's mount namespace."""
        return [_tool("nsenter"), "-t", str(self.proc.pid), "-m"]
