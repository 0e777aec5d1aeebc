"""``python -m vmdisktouch run IMAGE ...`` as a child process: the one wrapper of tests, benchmarks and the demo.

    d = DaemonProc(tmp_dir, image, "--decay", "1", max_hold="16M", interval=0.2)
    d.wait_output("cycle 1:")            # or d.wait_status(lambda st: st["held_bytes"] > 0, "held")
    d.read_status(), d.vmlck(), d.cycles_done(), d.output()
    d.stop()                             # SIGTERM by PID, SIGKILL after `timeout`; idempotent

The process starts in the constructor, in its own session, with ``cwd``
the checkout this file belongs to (``ROOT``), so ``python -m vmdisktouch``
imports that checkout's code; ``cwd=`` another tree (a ``git worktree`` of an
older commit, see ``tests.support.worktree``) runs that tree's code instead.
``prefix`` runs it under a wrapper command (``prlimit``, ``setpriv``, a
sandbox launcher that execs it: ``pid`` is then the daemon's).

Files, all in ``workdir``: the status JSON (``status``, a name or a path;
``None`` leaves ``--status`` to the arguments), and the output:
stdout and stderr together in ``log``, or stdout in ``log`` and stderr in
``err_log`` when that is given. ``log=None`` discards the output.

Only the process this object started is ever signalled, by its PID, and
only while it has not been reaped (``Popen`` guards against a reused PID).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from tests.support.common import MiB, ROOT
from tests.support.procfs import vmlck

SYSTEMD_ENV = ("JOURNAL_STREAM", "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
CYCLE_LINE = re.compile(r"^.*cycle \d+: held", re.M)


def env_without_systemd() -> dict[str, str]:
    """This process's environment without the variables that make the daemon talk to systemd."""
    return {k: v for k, v in os.environ.items() if k not in SYSTEMD_ENV}


def remove_trace_instance(image) -> None:
    """Remove the trace instance a daemon of ``image`` made, if one is left."""
    from vmdisktouch.daemon.sources import instance_name
    from vmdisktouch.system.trace import tracefs
    try:
        root = tracefs.find_root()
    except tracefs.TraceUnavailable:
        return
    name = instance_name(str(image))
    if os.path.isdir(os.path.join(root, "instances", name)):
        tracefs.Instance(root, name).remove()


def hold_text(n: int | str) -> str:
    """``--max-hold`` text of a byte count: ``512M`` when it is whole MiB."""
    if isinstance(n, str):
        return n
    return f"{n >> 20}M" if n % MiB == 0 else str(n)


class DaemonProc:
    """``[*prefix] python -m vmdisktouch run IMAGE [--max-hold M] [--interval S] *args [--status F]``."""

    def __init__(self, workdir, image, *args, max_hold: int | str | None = None,
                 interval: float | None = None, status: str | os.PathLike | None = "status.json",
                 log: str | None = "daemon.log", err_log: str | None = None, prefix=(),
                 env: dict | None = None, cwd: str | os.PathLike = ROOT,
                 python: str = sys.executable):
        self.workdir = pathlib.Path(workdir)
        self.cwd = pathlib.Path(cwd)
        self.status_path = self.workdir / status if status is not None else None
        self.log_path = self.workdir / log if log else None
        self.err_path = self.workdir / err_log if err_log and log else None
        opts = []
        if max_hold is not None:
            opts += ["--max-hold", hold_text(max_hold)]
        if interval is not None:
            opts += ["--interval", f"{interval:g}"]
        if self.status_path is not None:
            opts += ["--status", str(self.status_path)]
        images = [str(x) for x in image] if isinstance(image, (list, tuple)) else [str(image)]
        self.image, self.images = (images[0] if images else None), images
        self.argv = [*map(str, prefix), python, "-m", "vmdisktouch", "run", *images, *opts,
                     *map(str, args)]
        self._files = []
        out = err = subprocess.DEVNULL
        if self.log_path:
            out = err = self._open(self.log_path)
            if self.err_path:
                err = self._open(self.err_path)
            else:
                err = subprocess.STDOUT
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     cwd=self.cwd, env=env, start_new_session=True)

    def _open(self, path):
        f = open(path, "wb")
        self._files.append(f)
        return f

    # -- the process ------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def returncode(self) -> int | None:
        return self.proc.poll()

    def vmlck(self) -> int:
        """Bytes the daemon has mlocked (``VmLck``); 0 once it is gone."""
        return vmlck(self.pid) if self.alive() else 0

    def proc_cwd(self) -> str:
        """The working directory of the running daemon (``/proc/PID/cwd``)."""
        return os.readlink(f"/proc/{self.pid}/cwd")

    # -- its files ---------------------------------------------------------------

    def read_status(self) -> dict | None:
        """The status JSON, or None before the first cycle (or when torn)."""
        if self.status_path is None:
            return None
        try:
            return json.loads(self.status_path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _read(self, path) -> str:
        for f in self._files:
            if not f.closed:
                f.flush()
        if not path:
            return ""
        try:
            return pathlib.Path(path).read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def err(self) -> str:
        """What the daemon wrote to stderr (its log lines); all the output without ``err_log``."""
        return self._read(self.err_path or self.log_path)

    def output(self) -> str:
        """Everything the daemon wrote: stdout, then stderr when they are apart."""
        return self._read(self.log_path) + (self._read(self.err_path) if self.err_path else "")

    def log_tail(self, n: int = 5) -> str:
        return "".join(self.err().splitlines(keepends=True)[-n:]).strip()

    def cycles_done(self) -> int:
        """Cycles the daemon ran: the status file's ``cycle`` or the cycle lines logged,
        whichever is more (a quiet cycle is logged at DEBUG only: where the status file
        cannot be written, pass --debug)."""
        st = self.read_status() or {}
        status = int(st.get("cycle", st.get("host", {}).get("cycle", 0)))
        return max(status, len(CYCLE_LINE.findall(self.err())))

    # -- waiting -----------------------------------------------------------------

    def _check_alive(self, what: str) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"daemon exited ({self.proc.returncode}) before {what}; "
                                 f"log:\n{self.output()[-3000:]}")

    def wait_status(self, pred, what: str, timeout: float = 30.0, drive=None) -> dict:
        """Poll the status file until ``pred(status)``; ``drive()`` between polls."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            self._check_alive(what)
            st = self.read_status()
            if st is not None and pred(st):
                return st
            if drive:
                drive()
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; last status {st}; "
                             f"log:\n{self.output()[-3000:]}")

    def wait_output(self, text: str, what: str = "", timeout: float = 30.0,
                    count: int = 1, drive=None) -> str:
        """Wait until ``text`` appears ``count`` times in the daemon's output."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            if out.count(text) >= count:
                return out
            self._check_alive(what or repr(text))
            if drive:
                drive()
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or text!r}; log:\n"
                             f"{self.output()[-3000:]}")

    # -- ending ------------------------------------------------------------------

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the daemon (by PID; nothing once it has been reaped)."""
        self.proc.send_signal(sig)

    def terminate(self, timeout: float = 5.0) -> tuple[int | None, float]:
        """SIGTERM; (exit status, or None if still running after ``timeout``; seconds taken)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        return rc, time.monotonic() - t0

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait ``timeout`` s, then SIGKILL; reap, close the files. Idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.cleanup()

    def kill(self) -> int | None:
        """SIGKILL if still running; reap, close the files. Idempotent."""
        if self.proc.poll() is None:
            self.proc.kill()
        return self.cleanup()

    def cleanup(self) -> int | None:
        """Reap the process (waits for it: signal it first) and close the output files.

        A daemon killed by SIGKILL leaves its trace instance behind (the next
        start of the same image would remove it); once the process is gone
        it is removed here, so no test or benchmark leaves one enabled.
        """
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for f in self._files:
            f.close()
        if self.proc.returncode is not None:
            for image in self.images:
                remove_trace_instance(image)
        return self.proc.returncode

    def __enter__(self) -> "DaemonProc":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
