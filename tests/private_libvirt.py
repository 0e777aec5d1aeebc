"""A libvirtd of a test's own: one it may SIGSTOP without stalling anyone else's tests.

Other engineers' tests share the libvirtd of qemu:///system, so a stall test
must never stop that one. ``PrivateLibvirtd`` starts a second libvirtd as
benchmarks/bench_carry_heat.py's ``DestLibvirtd`` does: ``unshare -m -u``
(its own mount and UTS namespaces), tmpfs over /run/libvirt,
/var/lib/libvirt, /var/cache/libvirt, /var/log/libvirt and /etc/libvirt/qemu
(no shared state, no domains, no networks), its own socket directory and
``host_uuid`` (``libvirtd -f``), and a qemu.conf with ``stdio_handler =
"file"`` (no virtlogd) and no cgroup controllers. Same network namespace and
files: the images of the test's tmp directory are seen as they are.

``uri`` reaches it (``qemu+unix:///system?socket=...``); ``virsh``,
``define``, ``qemu_io`` act on it; ``stop()``/``cont()`` SIGSTOP/SIGCONT it
by PID; ``qemu_pid(name)`` is a domain's QEMU. ``close()`` resumes it,
destroys and undefines its domains, SIGTERMs it by PID, and kills by PID any
QEMU of its domains still alive after that (the namespaces end with it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests import libvirt_env

NS_SCRIPT = """set -e
hostname {host}
for d in /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt/qemu; do
    mount -t tmpfs -o mode=0755 vdt-private-libvirt "$d"
done
mkdir -p /var/log/libvirt/qemu /var/lib/libvirt/qemu /var/cache/libvirt/qemu
mount --bind {dir}/qemu.conf /etc/libvirt/qemu.conf
exec {libvirtd} -f {dir}/libvirtd.conf -p {dir}/libvirtd.pid
"""


class PrivateLibvirtd:
    """A second libvirtd in namespaces of its own (the module docstring)."""

    def __init__(self, workdir: Path, timeout: float = 120.0):
        assert os.geteuid() == 0, "a private libvirtd needs root"
        self.dir = Path(workdir) / "private-libvirt"
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
        libvirtd = libvirt_env._tool("libvirtd")
        script = NS_SCRIPT.format(host=f"vdt-private-{os.getpid()}", dir=self.dir,
                                  libvirtd=libvirtd)
        self.log = open(self.dir / "libvirtd.log", "wb")
        self.proc = subprocess.Popen(["unshare", "-m", "-u", "--propagation", "private",
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
            r = self.virsh("list", "--all", check=False)
            if r.returncode == 0:
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
        path = f"/proc/{self.pid}/root/run/libvirt/qemu/{name}.pid"
        return int(Path(path).read_text().strip())

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def cont(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        self.cont()
        if self.proc.poll() is None:
            for name in self.names:
                self.virsh("destroy", name, check=False, timeout=60)
                self.virsh("undefine", name, check=False, timeout=60)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self._qemu_pids:          # a QEMU libvirtd left behind, by its PID
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu" in cmd:
                os.kill(pid, signal.SIGKILL)
        self.log.close()

