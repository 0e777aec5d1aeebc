"""Test harness: a paused QEMU with one raw disk, driven through QMP.

No guest OS is needed to make QEMU read and write a disk image through its
real block layer (see FIELD-NOTES, "Driving real QEMU I/O without a guest
OS"): QEMU is started paused (``-S``) with the image attached as a
virtio-blk device on ``cache=writethrough,aio=threads`` (so its I/O goes
through the host page cache), and ``qemu-io`` is run on the device's
backend through HMP over QMP (``human-monitor-command``), exactly like a
guest's virtio-blk requests. ``-d`` and the backend path are needed because
the attached device holds the drive's write lock.

Usage::

    with QemuVM(image) as vm:
        vm.write(10 * MiB, MiB, pattern=0xAB)
        vm.read(10 * MiB, MiB, pattern=0xAB)     # read and verify the pattern

QEMU is always killed by its PID and reaped on exit, and its QMP socket and
private directory are removed, whatever happened inside the block. A
missing ``qemu-system-x86_64`` fails the test (never a silent skip).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

from tests.support.common import require_tool

KVM = os.access("/dev/kvm", os.R_OK | os.W_OK)
DEVICE_ID = "vd0"
BACKEND = f"/machine/peripheral/{DEVICE_ID}/virtio-backend"


def _qmp_class():
    try:
        from qemu.qmp.legacy import QEMUMonitorProtocol
    except ImportError as exc:    # never skip: the package is a test dependency
        raise AssertionError(f"qemu.qmp is not installed ({exc}): run `make test`, "
                             "which installs the test dependencies") from None
    return QEMUMonitorProtocol


class QemuError(AssertionError):
    """QEMU failed to start, or a qemu-io command reported an error."""


class QemuVM:
    """A paused ``qemu-system-x86_64`` with ``image`` as a raw virtio-blk disk.

    ``cache`` and ``aio`` are QEMU's drive options (writethrough/threads:
    the host page cache sees every write). ``accel`` defaults to kvm where
    /dev/kvm works, else tcg.
    """

    def __init__(self, image, *, cache: str = "writethrough", aio: str = "threads",
                 accel: str | None = None, start_timeout: float = 30.0):
        self.image = os.path.abspath(str(image))
        self.cache = cache
        self.aio = aio
        self.accel = accel or ("kvm" if KVM else "tcg")
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.qmp = None
        # A short private directory: unix socket paths are limited to 108 bytes,
        # and pytest's tmp_path can be longer than that.
        self.dir = tempfile.mkdtemp(prefix="vdt-qemu-", dir="/tmp")
        self.sock = os.path.join(self.dir, "qmp.sock")
        self.log_path = os.path.join(self.dir, "qemu.log")

    # -- life cycle ---------------------------------------------------------

    def command_line(self) -> list[str]:
        drive = (f"file={self.image},format=raw,if=none,id=d0,"
                 f"cache={self.cache},aio={self.aio}")
        return [require_tool("qemu-system-x86_64"), "-accel", self.accel, "-M", "q35",
                "-m", "64", "-S", "-display", "none", "-nodefaults", "-no-user-config",
                "-drive", drive, "-device", f"virtio-blk-pci,drive=d0,id={DEVICE_ID}",
                "-qmp", f"unix:{self.sock},server=on,wait=off"]

    def start(self) -> "QemuVM":
        cls = _qmp_class()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command_line(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        last_exc = None
        while True:
            if self.proc.poll() is not None:
                raise QemuError(f"qemu exited with status {self.proc.returncode} at start-up: "
                                f"{self.log()}")
            if os.path.exists(self.sock):
                qmp = cls(self.sock)
                try:
                    qmp.connect()
                    self.qmp = qmp
                    break
                except Exception as exc:  # noqa: BLE001 - socket not listening yet
                    last_exc = exc
                    try:
                        qmp.close()
                    except Exception:  # noqa: BLE001
                        pass
            if time.monotonic() > deadline:
                raise QemuError(f"qemu's QMP socket {self.sock} did not answer within "
                                f"{self.start_timeout:g}s ({last_exc}); log: {self.log()}")
            time.sleep(0.05)
        self.qmp.settimeout(30.0)
        status = self.qmp.cmd("query-status")
        if status.get("running"):
            raise QemuError(f"qemu should be paused (-S), query-status says {status}")
        return self

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace").strip()[-2000:]
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def close(self) -> None:
        """Kill QEMU by PID (SIGKILL), reap it, remove the socket and directory. Idempotent."""
        try:
            if self.qmp is not None:
                qmp, self.qmp = self.qmp, None
                try:
                    qmp.close()
                except Exception:  # noqa: BLE001 - QEMU may be gone already
                    pass
        finally:
            try:
                if self.proc is not None and self.proc.poll() is None:
                    self.proc.kill()                 # Popen.kill: os.kill(self.proc.pid, SIGKILL)
                if self.proc is not None:
                    self.proc.wait(timeout=30)
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "QemuVM":
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc) -> None:
        self.close()

    # -- I/O through QEMU's block layer -------------------------------------

    def hmp(self, command_line: str) -> str:
        assert self.qmp is not None, "QEMU is not running"
        return self.qmp.cmd("human-monitor-command", **{"command-line": command_line})

    def qemu_io(self, command: str, expect: str | None = None) -> str:
        """Run one qemu-io command (``write -P 0xab 10M 1M``) on the disk; return its output.

        QEMU 7.2 prints qemu-io's output on its own stdout, not in the
        monitor's reply, so the output is taken from QEMU's log (what was
        appended while the command ran). ``expect``: a line the output must
        contain (waited for briefly). qemu-io reports its errors in that
        text, not as a QMP error; they are turned into ``QemuError`` here.
        """
        start = os.path.getsize(self.log_path)
        reply = self.hmp(f'qemu-io -d {BACKEND} "{command}"')
        deadline = time.monotonic() + 5.0
        while True:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                out = reply + f.read().decode(errors="replace")
            low = out.lower()
            if any(w in low for w in ("error", "failed", "not found", "invalid", "usage")):
                raise QemuError(f"qemu-io {command!r}: {out.strip()}")
            if expect is None or expect in out or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if expect is not None and expect not in out:
            raise QemuError(f"qemu-io {command!r}: expected {expect!r}, got {out.strip()!r}")
        return out

    def write(self, offset: int, length: int, pattern: int = 0xAB) -> str:
        return self.qemu_io(f"write -P {pattern:#x} {offset} {length}",
                            expect=f"wrote {length}/{length} bytes at offset {offset}")

    def read(self, offset: int, length: int, pattern: int | None = None) -> str:
        """Read through QEMU; with ``pattern``, qemu-io verifies every byte."""
        p = "" if pattern is None else f"-P {pattern:#x} "
        return self.qemu_io(f"read {p}{offset} {length}",
                            expect=f"read {length}/{length} bytes at offset {offset}")

    def query_block(self) -> list[dict]:
        assert self.qmp is not None, "QEMU is not running"
        return self.qmp.cmd("query-block")
