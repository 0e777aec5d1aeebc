"""``qemu-nbd`` serving an image through QEMU's block layer, as the guest's disk.

    with QemuNbd(image, cgroup=cg) as nbd:        # started, its socket answering
        fio ... --ioengine=nbd --uri=nbd.uri
    # stopped: SIGTERM by PID, SIGKILL after `timeout`; the socket's directory removed

What a VM with a raw disk attached with ``cache=writethrough`` does on the
host is QEMU's block layer doing the I/O: ``--cache=writethrough`` (buffered,
no ``O_DIRECT``; every write is followed by ``fdatasync`` inside qemu-nbd,
as QEMU emulates FUA when the guest's write cache is off), ``--aio=threads``
(``pread64``/``pwrite64`` in its thread pool), ``-f raw``. ``--persistent``
keeps it up across client connections, ``--shared=1`` serves one client at
a time. Started through ``cgroup.wrap`` the process itself (the shell
``exec``s it, so ``pid`` is qemu-nbd's) and all its threads are in the
group: the page cache it faults in is charged there, as a VM's QEMU's is.

Ready means the server answered on its unix socket: a connection receives
the NBD greeting (``NBDMAGIC``); the probe then disconnects, and a
persistent server goes on. Only the process this object started is ever
signalled, by its PID, while ``Popen`` has not reaped it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from tests.support.common import WorkloadError, require_tool, stop_process
from tests.support.procfs import memory_fields

GREETING = b"NBDMAGIC"


class QemuNbd:
    """``qemu-nbd --cache=CACHE --aio=AIO -f FMT --persistent --shared=1 -k SOCKET IMAGE``."""

    def __init__(self, image: str, cgroup=None, cache: str = "writethrough", aio: str = "threads",
                 fmt: str = "raw", socket_dir: str | None = None, extra: tuple = (),
                 log: str | None = None):
        self.image = image
        self.cgroup = cgroup
        self.cache, self.aio, self.fmt = cache, aio, fmt
        self._own_dir = socket_dir is None
        self.dir = socket_dir or tempfile.mkdtemp(prefix="vmdt-nbd-")
        self.socket = os.path.join(self.dir, "nbd.sock")
        self.extra = tuple(map(str, extra))
        self.log = log
        self.proc: subprocess.Popen | None = None
        self._log_file = None

    @property
    def uri(self) -> str:
        """The NBD URI of the export (libnbd syntax, as fio's ``nbd`` engine takes it)."""
        return f"nbd+unix:///?socket={self.socket}"

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def argv(self) -> list[str]:
        return [require_tool("qemu-nbd"), f"--cache={self.cache}", f"--aio={self.aio}",
                "-f", self.fmt, "--persistent", "--shared=1", "-k", self.socket,
                *self.extra, self.image]

    def start(self, timeout: float = 30.0) -> "QemuNbd":
        """Start it and wait until its socket answers with the NBD greeting."""
        if self.proc is not None:
            raise WorkloadError("qemu-nbd already started")
        argv = self.argv()
        if self.cgroup is not None:
            argv = self.cgroup.wrap(argv)
        out = subprocess.DEVNULL
        if self.log:
            out = self._log_file = open(self.log, "wb")
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no socket yet"
        while True:
            if self.proc.poll() is not None:
                raise WorkloadError(f"qemu-nbd exited ({self.proc.returncode}) before it served "
                                    f"{self.image}" + (f"; see {self.log}" if self.log else ""))
            if os.path.exists(self.socket):
                try:
                    if self._greeting(max(0.1, deadline - time.monotonic())) == GREETING:
                        return
                    last = "no NBD greeting"
                except OSError as exc:
                    last = str(exc)
            if time.monotonic() > deadline:
                raise WorkloadError(f"qemu-nbd on {self.socket} not ready in {timeout:.0f} s: {last}")
            time.sleep(0.05)

    def _greeting(self, timeout: float) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(min(timeout, 5.0))
            s.connect(self.socket)
            got = b""
            while len(got) < len(GREETING):
                chunk = s.recv(len(GREETING) - len(got))
                if not chunk:
                    break
                got += chunk
            return got

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def memory(self) -> dict[str, int]:
        """Its ``VmRSS``/``RssAnon``/``VmHWM`` in bytes ({} when gone)."""
        try:
            return memory_fields(self.pid, ("VmRSS", "RssAnon", "VmHWM")) if self.alive() else {}
        except OSError:
            return {}

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM by PID, SIGKILL after ``timeout``; removes its socket directory. Idempotent."""
        rc = None
        if self.proc is not None:
            rc = stop_process(self.proc, signal.SIGTERM, timeout)
            self.proc = None
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        elif os.path.exists(self.socket):
            os.unlink(self.socket)
        return rc

    def __enter__(self) -> "QemuNbd":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
