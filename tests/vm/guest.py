"""A booted Debian 12 guest and the way to run commands in it.

Theory of operation
-------------------
QEMU boots the cached image (guest_image) on a qcow2 overlay of its own, with the
root's kernel and initrd given directly (``-kernel``/``-initrd``: no boot loader), KVM
where /dev/kvm works and TCG otherwise. systemd is PID 1 in the guest. The test talks
to qemu-guest-agent over virtio-serial: ``guest-exec`` runs ``bash -c CMD`` as root and
``guest-exec-status`` returns its exit status and output once it is done. The agent's
socket speaks JSON, one object per line, one request at a time; ``guest-sync`` first
drops whatever a previous, interrupted exchange left in the channel.

A command that must outlive its call (a reader on an image) is started with
``systemd-run``: a process left holding guest-exec's pipes would keep the call open.
The serial console goes to ``console.log`` in the run's directory: the kernel's and
systemd's messages for a boot that fails. QEMU is killed by its PID at the end,
whatever happened.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

from tests.vm.guest_image import GuestImage

KVM = os.access("/dev/kvm", os.R_OK | os.W_OK)
# Nested KVM can open /dev/kvm and still not run a guest's code (on this machine's
# hypervisor a kernel hangs in its real-mode stub): a KVM boot whose kernel has not
# printed its banner within this many seconds is retried with TCG.
KVM_PROBE_SECONDS = 5
BANNER = b"Linux version"
# TCG's CPU: x86-64 with SSE4.2 and no AVX. QEMU 7.2's TCG emulates AVX2 wrongly enough
# that Debian 12's numpy (1.24, which picks AVX2 loops at run time) dies with SIGSEGV on
# ``np.array(np.zeros(128, np.float32), dtype=np.float32)``; real hosts have real AVX.
TCG_CPU = "Westmere"
MEMORY_MIB = 3072
CPUS = 2
BOOT_TIMEOUT = 240  # seconds until the agent answers; TCG boots take far longer than KVM


class GuestError(AssertionError):
    """The guest did not boot, or its agent failed a request."""


class Result:
    """What a command run in the guest did."""

    def __init__(self, cmd: str, rc: int, out: str, err: str):
        self.cmd, self.rc, self.out, self.err = cmd, rc, out, err

    def __repr__(self) -> str:
        return f"Result(rc={self.rc}, cmd={self.cmd!r}, out={self.out[-1500:]!r}, err={self.err[-1500:]!r})"


class Guest:
    """One booted guest (a context manager: boots on enter, powers off on exit)."""

    def __init__(self, image: GuestImage, payload: Path, workdir: Path, log=print):
        self.image, self.payload, self.dir, self.log = image, payload, workdir, log
        self.overlay = workdir / "overlay.qcow2"
        self.agent_path = workdir / "qga.sock"
        self.console = workdir / "console.log"
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.buf = b""
        self.next_id = 1
        self.accel = ""

    # --- life cycle -------------------------------------------------------------------
    def __enter__(self) -> "Guest":
        try:
            self.boot()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def argv(self, kvm: bool) -> list[str]:
        accel = ["-accel", "kvm"] if kvm else ["-accel", "tcg", "-cpu", TCG_CPU]
        return ["qemu-system-x86_64", *accel, "-M", "q35", "-m", str(MEMORY_MIB),
                "-smp", str(CPUS), "-nodefaults", "-display", "none", "-no-reboot",
                "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
                "-append", "root=/dev/vda rw console=ttyS0,115200 panic=-1 "
                           "systemd.show_status=auto",
                "-drive", f"file={self.overlay},if=virtio,format=qcow2,cache=unsafe",
                "-drive", f"file={self.payload},if=virtio,format=raw,readonly=on",
                "-serial", f"file:{self.console}", "-nic", "none",
                "-device", "virtio-serial-pci",
                "-chardev", f"socket,id=qga0,path={self.agent_path},server=on,wait=off",
                "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"]

    def start_qemu(self, kvm: bool) -> None:
        self.overlay.unlink(missing_ok=True)
        self.console.unlink(missing_ok=True)
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b",
                        str(self.image.root), str(self.overlay)], check=True)
        self.proc = subprocess.Popen(self.argv(kvm), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.accel = "KVM" if kvm else "TCG"

    def kernel_started(self, timeout: float) -> bool:
        """Whether the kernel printed its banner on the console within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if self.console.exists() and BANNER in self.console.read_bytes():
                return True
            time.sleep(0.2)
        return False

    def boot(self) -> None:
        started = time.monotonic()
        self.start_qemu(KVM)
        if KVM and not self.kernel_started(KVM_PROBE_SECONDS):
            self.log(f"vm: KVM ran no kernel code within {KVM_PROBE_SECONDS} s; using TCG")
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.proc.stdout.close()
            self.start_qemu(False)
        deadline = started + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise GuestError(f"QEMU exited {self.proc.returncode}: "
                                 f"{self.proc.stdout.read().decode(errors='replace')[-2000:]}"
                                 f"\nconsole:\n{self.console_tail()}")
            if self.agent_path.exists():
                try:
                    self.connect()
                    self.sync(timeout=2)
                    break
                except (OSError, GuestError, TimeoutError):
                    self.disconnect()
            time.sleep(0.5)
        else:
            raise GuestError(f"the guest's agent did not answer within {BOOT_TIMEOUT} s "
                             f"({self.accel}); console:\n{self.console_tail()}")
        self.wait_system_running()
        self.log(f"vm: booted ({self.accel}) in {time.monotonic() - started:.1f} s")

    def wait_system_running(self, timeout: float = 120) -> None:
        """Until systemd says the boot is done (running, or degraded: a unit failed)."""
        r = self.run(f"timeout {timeout:.0f} systemctl is-system-running --wait", check=False,
                     timeout=timeout + 10)
        if r.out.strip() not in ("running", "degraded"):
            raise GuestError(f"the guest did not finish booting: {r}")

    def close(self) -> None:
        self.disconnect()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        self.proc = None
        self.overlay.unlink(missing_ok=True)

    def console_tail(self, n: int = 4000) -> str:
        try:
            return self.console.read_text(errors="replace")[-n:]
        except OSError:
            return "(no console output)"

    # --- the agent's protocol ---------------------------------------------------------
    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self.agent_path))
        self.buf = b""

    def disconnect(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _read_object(self, deadline: float) -> dict:
        while True:
            line, sep, rest = self.buf.partition(b"\n")
            if sep:
                self.buf = rest
                line = line.strip(b"\xff \r\t")
                if line:
                    return json.loads(line)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the guest's agent did not answer")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise GuestError("the guest's agent closed the channel")
            self.buf += chunk

    def request(self, command: str, timeout: float = 30, **arguments) -> object:
        """One agent command; its ``return`` value (an ``error`` raises GuestError)."""
        msg = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        reply = self._read_object(time.monotonic() + timeout)
        if "error" in reply:
            raise GuestError(f"{command}: {reply['error']}")
        return reply.get("return")

    def sync(self, timeout: float = 10) -> None:
        """Drop stale replies: send guest-sync with a fresh id, read until it comes back."""
        token = int(time.monotonic() * 1000) % (1 << 31) + self.next_id
        self.next_id += 1
        self.sock.sendall(json.dumps({"execute": "guest-sync",
                                      "arguments": {"id": token}}).encode() + b"\n")
        deadline = time.monotonic() + timeout
        while self._read_object(deadline).get("return") != token:
            pass

    # --- commands ---------------------------------------------------------------------
    def run(self, cmd: str, check: bool = True, timeout: float = 120) -> Result:
        """``bash -c cmd`` as root in the guest; with ``check``, a non-zero exit fails."""
        pid = self.request("guest-exec", path="/bin/bash", arg=["-c", cmd],
                           **{"capture-output": True})["pid"]
        deadline = time.monotonic() + timeout
        while True:
            status = self.request("guest-exec-status", pid=pid)
            if status.get("exited"):
                break
            if time.monotonic() > deadline:
                self.request("guest-exec", path="/bin/kill", arg=["-KILL", str(pid)])
                raise GuestError(f"timed out after {timeout} s in the guest: {cmd}")
            time.sleep(0.05)
        decode = lambda k: base64.b64decode(status.get(k, "")).decode(errors="replace")
        rc = status.get("exitcode", 128 + status.get("signal", 0))
        result = Result(cmd, rc, decode("out-data"), decode("err-data"))
        if check and rc != 0:
            raise GuestError(f"failed in the guest: {result}")
        return result

    def out(self, cmd: str, timeout: float = 120) -> str:
        """The standard output of a command that must succeed, stripped."""
        return self.run(cmd, timeout=timeout).out.strip()

    def wait_for(self, cmd: str, timeout: float, what: str, interval: float = 0.5) -> Result:
        """Run ``cmd`` until it exits 0; fails with ``what`` and the last output."""
        deadline = time.monotonic() + timeout
        while True:
            r = self.run(cmd, check=False, timeout=max(5.0, timeout))
            if r.rc == 0:
                return r
            if time.monotonic() > deadline:
                raise GuestError(f"{what} (not within {timeout} s): {r}")
            time.sleep(interval)

    def journal(self, *args: str) -> str:
        """``journalctl --no-pager ARGS`` (output only)."""
        return self.run("journalctl --no-pager " + " ".join(map(shlex.quote, args)),
                        check=False).out
