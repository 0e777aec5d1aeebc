"""What every harness module shares: sizes, the harness's error, finding and stopping a tool."""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess

from vmdisktouch.errors import VmdtError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
PAGE = os.sysconf("SC_PAGE_SIZE")
ROOT = pathlib.Path(__file__).resolve().parents[2]   # the checkout tests/support/ belongs to

class WorkloadError(VmdtError):
    """The workload harness cannot run (no cgroup v1 memory controller, no fio...)."""


def require_tool(name: str) -> str:
    """Path of an external tool; raises ``WorkloadError`` when it is missing (in a
    test: an error, never a skip)."""
    path = shutil.which(name)
    if not path:
        raise WorkloadError(f"{name} is not installed: `make deps` (which `make test` runs) installs it")
    return path


def without_bpf() -> list[str]:
    """A command prefix that runs its command as root without CAP_BPF, CAP_PERFMON and
    CAP_SYS_ADMIN (``setpriv``): eBPF refused, the trace reader records reads as events."""
    drop = "-bpf,-perfmon,-sys_admin"
    return [require_tool("setpriv"), f"--inh-caps={drop}", f"--bounding-set={drop}"]


def stop_process(proc: subprocess.Popen | None, sig=signal.SIGTERM, timeout: float = 10.0) -> int | None:
    """Signal one child we started, wait, SIGKILL it if it does not exit."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        except ProcessLookupError:
            pass
    try:
        return proc.wait(5)
    except subprocess.TimeoutExpired:
        return None



def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
