"""A libvirtd of a test's own: one it may SIGSTOP without stalling anyone else's tests.

Other sessions' tests share the libvirtd of qemu:///system (and their host
services serve every domain there), so a stall test must never stop that one,
and a test whose domains no other daemon may touch runs them here. It is also
the destination of a live migration on one machine (benchmarks/bench_carry_heat.py,
tests/e2e/test_arrive_safely.py). ``PrivateLibvirtd`` starts a libvirtd with ``unshare -m -u``
(its own mount and UTS namespaces), tmpfs over /run/libvirt,
/var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt and /etc/libvirt/qemu
(no shared state, no domains, no networks), its own socket directory and
``host_uuid`` (``libvirtd -f``), and a qemu.conf with ``stdio_handler =
"file"`` (no virtlogd) and no cgroup controllers. Same network namespace and
files: the images of the test's tmp directory are seen as they are.

``uri`` reaches it (``qemu+unix:///system?socket=...``); ``virsh``,
``define``, ``qemu_io`` act on it; ``stop()``/``cont()`` SIGSTOP/SIGCONT it
by PID; ``qemu_pid(name)`` is a domain's QEMU, ``qemu_log(name)`` its log.
``fuse=(directory, mount point)``: bindfs mounts the directory there with
``kernel_cache`` in this libvirtd's mount namespace only, a page cache of its
own over the same files (two such libvirtds: two hosts on shared storage).
``close()`` resumes it, destroys and undefines its domains, unmounts its
FUSE mount, SIGTERMs it by PID, and kills by PID any QEMU of its domains
still alive after that (the namespaces end with it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.support import libvirt_env
from tests.support.common import stop_process

QEMU_LOG = "/var/log/libvirt/qemu/{name}.log"

NS_SCRIPT = """set -e
hostname {host}
for d in /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt/qemu; do
    mount -t tmpfs -o mode=0755 vdt-private-libvirt "$d"
done
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/cache/libvirt/qemu
mount --bind {dir}/qemu.conf /etc/libvirt/qemu.conf
{extra}
exec {libvirtd} -f {dir}/libvirtd.conf -p {dir}/libvirtd.pid
"""

FUSE_SCRIPT = """mkdir -p {target}
{bindfs} -f -o kernel_cache {src} {target} &
echo $! > {dir}/bindfs.pid
i=0
while ! mountpoint -q {target}; do i=$((i+1)); [ $i -lt 100 ] || exit 1; sleep 0.1; done
"""


class PrivateLibvirtd:
    """A second libvirtd in namespaces of its own (the module docstring)."""

    def __init__(self, workdir: Path, name: str = "private-libvirt",
                 fuse: tuple[Path, Path] | None = None, timeout: float = 120.0):
        assert os.geteuid() == 0, "a private libvirtd needs root"
        self.dir = Path(workdir) / name
        self.fuse = fuse
        self.sock = self.dir / "sock"
        self.sock.mkdir(parents=True)
        self.uri = f"qemu+unix:///system?socket={self.sock}/libvirt-sock"
        self.names: list[str] = []
        self._qemu_pids: set[int] = set()
        (self.dir / "libvirtd.conf").write_text(
            f'unix_sock_dir = "{self.sock}"\nhost_uuid = "{uuid.uuid4()}"\n')
        qemu = Path("/etc/libvirt/qemu.conf").read_text() if os.path.exists(
            "/etc/libvirt/qemu.conf") else ""
        (self.dir / "qemu.conf").write_text(qemu + '\nstdio_handler = "file"\n'
                                            'cgroup_controllers = [ ]\n')
        extra = "" if fuse is None else FUSE_SCRIPT.format(
            target=fuse[1], src=fuse[0], dir=self.dir, bindfs=libvirt_env._tool("bindfs"))
        script = NS_SCRIPT.format(host=f"vdt-{name}-{os.getpid()}", dir=self.dir, extra=extra,
                                  libvirtd=libvirt_env._tool("libvirtd"))
        self.log = open(self.dir / "libvirtd.log", "wb")
        self.proc = subprocess.Popen([libvirt_env._tool("unshare"), "-m", "-u", "--propagation", "private",
                                      "sh", "-c", script], stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, \
                f"the private libvirtd exited ({self.proc.returncode}): {self.log_tail()}"
            r = self.virsh("hostname", check=False)
            if r.returncode == 0:
                self.hostname = r.stdout.strip()
                break
            assert time.monotonic() < deadline, f"the private libvirtd does not answer: " \
                                                f"{r.stderr.strip()}"
            time.sleep(0.3)
        # its first domain would otherwise wait for the probe of QEMU's capabilities
        self.virsh("domcapabilities", timeout=timeout)

    @property
    def pid(self) -> int:
        return self.proc.pid          # sh exec'd libvirtd: the same process

    def log_tail(self, n: int = 8) -> str:
        self.log.flush()
        return " | ".join((self.dir / "libvirtd.log").read_text(errors="replace")
                          .strip().splitlines()[-n:])

    def virsh(self, *args: str, check: bool = True, timeout: float = 120):
        r = subprocess.run([libvirt_env._tool("virsh"), "-q", "-c", self.uri, *args],
                           capture_output=True, text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"virsh {' '.join(args)}: {r.stderr.strip()}"
        return r

    def define(self, disks: list[str], tag: str = "") -> str:
        """A domain with ``disks`` (``libvirt_env.disk_xml``), started paused."""
        name = f"vdt-private-{tag + '-' if tag else ''}{uuid.uuid4().hex[:8]}"
        xml = self.dir / f"{name}.xml"
        xml.write_text(libvirt_env.domain_xml(name, disks))
        self.names.append(name)
        self.virsh("define", str(xml))
        self.virsh("start", name, "--paused")
        self._qemu_pids.add(self.qemu_pid(name))
        return name

    def qemu_io_argv(self, name: str, command: str, alias: str = "virtio-disk0") -> list[str]:
        """virsh's argv of a qemu-io command through the domain's monitor (FIELD-NOTES)."""
        return [libvirt_env._tool("virsh"), "-q", "-c", self.uri, "qemu-monitor-command",
                name, "--hmp",
                f'qemu-io -d /machine/peripheral/{alias}/virtio-backend "{command}"']

    def qemu_io(self, name: str, command: str) -> str:
        r = subprocess.run(self.qemu_io_argv(name, command), capture_output=True, text=True,
                           timeout=120)
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "error" not in out.lower(), f"qemu-io {command!r}: {out}"
        return r.stdout

    def qemu_pid(self, name: str) -> int:
        """The PID of the domain's QEMU (its pid file in this libvirtd's /run)."""
        return int(Path(f"{self.root()}/run/libvirt/qemu/{name}.pid").read_text().strip())

    def root(self) -> str:
        """Its namespace's root, to reach its mounts (its /run, its logs) from here."""
        return f"/proc/{self.pid}/root"

    def qemu_log(self, name: str) -> str:
        """A domain's QEMU log there (its /var/log/libvirt is a tmpfs of its namespace)."""
        return self.root() + QEMU_LOG.format(name=name)

    def prefix(self) -> list[str]:
        """A command prefix that runs a program in this libvirtd's mount namespace."""
        return [libvirt_env._tool("nsenter"), "-t", str(self.pid), "-m"]

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def cont(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        self.cont()
        if self.proc.poll() is None:
            listed = self.virsh("list", "--all", "--name", check=False, timeout=60).stdout
            for name in set(listed.split()) | set(self.names):   # migrated here ones too
                self.virsh("destroy", name, check=False, timeout=60)
                self.virsh("undefine", name, check=False, timeout=60)
        self.unmount()
        stop_process(self.proc, timeout=30)
        for pid in self._qemu_pids:          # a QEMU libvirtd left behind, by its PID
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu" in cmd:
                os.kill(pid, signal.SIGKILL)
        self.log.close()

    def unmount(self) -> None:
        """Unmount the FUSE mount (bindfs then exits), from inside its namespace."""
        pidfile = self.dir / "bindfs.pid"
        if self.fuse is None or not pidfile.exists():
            return
        pid = int(pidfile.read_text().strip())
        subprocess.run([libvirt_env._tool("nsenter"), "-t", str(pid), "-m",
                        libvirt_env._tool("fusermount3"), "-u", str(self.fuse[1])],
                       capture_output=True)
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
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        pidfile.unlink()


@contextlib.contextmanager
def shared_storage(tmp_path: Path, mounts: Path):
    """Two libvirtds as two hosts on shared storage: each mounts one directory
    (``tmp_path/store``) with bindfs ``kernel_cache`` at the same path (a new directory
    under ``mounts``) in its own mount namespace, so each has its own page cache over the
    same image (a write through one leaves the other's cached pages as they were until
    they are dropped). Yields ``(src, dst, store, shared)``."""
    store = tmp_path / "store"
    store.mkdir()
    shared = mounts / f"shared-{uuid.uuid4().hex[:8]}"
    shared.mkdir()
    src = PrivateLibvirtd(tmp_path, name="src", fuse=(store, shared))
    try:
        dst = PrivateLibvirtd(tmp_path, name="dst", fuse=(store, shared))
    except BaseException:
        src.close()
        raise
    try:
        yield src, dst, store, shared
    finally:
        dst.close()
        src.close()
        shared.rmdir()


@pytest.fixture
def own_libvirtd(libvirt_daemons, tmp_path):
    """A libvirtd in its own mount and UTS namespaces: no other session's host service
    (they serve qemu:///system) sees its domains. Import it with ``libvirt_daemons``."""
    lv = PrivateLibvirtd(tmp_path, name="own")
    yield lv
    lv.close()
