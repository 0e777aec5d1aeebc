"""Holders and readers besides the daemon: ``vmtouch -l`` of a range (the oracle), a zone reader."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.support.common import PAGE, WorkloadError, require_tool, stop_process
from tests.support.images import resident_bytes
from tests.support.procfs import vmlck

ZONE_READER = ("import os, sys, time\n"
               "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
               "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)\n"
               "off, n, pause = int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])\n"
               "while True:\n"
               "    for o in range(off, off + n, 1 << 20): os.pread(fd, 1 << 20, o)\n"
               "    time.sleep(pause)\n")


def zone_reader_argv(path: str, offset: int, length: int, pause: float = 0.1) -> list[str]:
    """A guest that reads ``[offset, offset+length)`` of ``path`` over and over (no readahead)."""
    return [sys.executable, "-c", ZONE_READER, path, str(offset), str(length), str(pause)]


class VmtouchLock:
    """``vmtouch -l`` of ``[offset, offset+length)`` of a file, in the foreground, until stopped.

    ``vmtouch -l`` mlocks the mapping (faulting the pages in) and then blocks
    until killed. ``-m`` is raised above the file size (its default, 500M,
    would skip big images). Run outside the workload's cgroup, the pages it
    faults in are charged to our own group.
    """

    def __init__(self, path: str, offset: int = 0, length: int | None = None):
        self.path = path
        size = os.path.getsize(path)
        self.offset = offset
        self.length = size - offset if length is None else length
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        size = os.path.getsize(self.path)
        rng = f"{self.offset}-{self.offset + self.length}"
        return [require_tool("vmtouch"), "-l", "-q", "-m", str(size + PAGE), "-p", rng, self.path]

    def start(self, timeout: float = 300.0) -> float:
        """Start and wait until the range is locked; returns the seconds it took."""
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # VmLck counts the range as soon as mlock marks the mapping, before the
        # pages are read in; so also wait until the range is resident.
        want = self.length - 2 * PAGE
        while vmlck(self.proc.pid) < want or resident_bytes(self.path, self.offset,
                                                            self.length) < want:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace").strip()
                raise WorkloadError(f"vmtouch -l exited ({self.proc.returncode}): {err}")
            if time.monotonic() - t0 > timeout:
                raise WorkloadError(f"vmtouch -l did not lock {self.length} bytes in {timeout:.0f} s")
            time.sleep(0.1)
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def vmlck(self) -> int:
        """Bytes vmtouch has mlocked (``VmLck``); 0 when not running."""
        return vmlck(self.pid) if self.proc else 0

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

