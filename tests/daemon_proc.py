"""A real ``vmdisktouch run`` process for tests: start it, poll its status, stop it by PID."""

from __future__ import annotations

import json
import pathlib
import re
import signal
import subprocess
import sys
import time

from vmdisktouch.system import meminfo

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Daemon:
    """``vmdisktouch run PATH *args --status DIR/status.json``, output in DIR/daemon.log.

    ``status=None`` leaves ``--status`` to ``args``; ``prefix`` runs the
    daemon under a wrapper command (``prlimit``, ``setpriv``...).
    ``stop()`` sends SIGTERM to this process only (by PID) and waits; it is
    idempotent, so a fixture can always call it.
    """

    def __init__(self, tmp_path, path, *args, status="status.json", prefix=(), env=None):
        self.status = tmp_path / (status or "status.json")
        self.log = open(tmp_path / "daemon.log", "w+")
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "vmdisktouch", "run", str(path), *args,
             *(["--status", str(self.status)] if status else [])],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=ROOT, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def read_status(self) -> dict | None:
        try:
            return json.loads(self.status.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def wait_status(self, pred, what: str, timeout: float = 30.0, drive=None) -> dict:
        """Poll the status file until pred(status); call drive() between polls."""
        deadline = time.monotonic() + timeout
        st = None
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, \
                f"daemon exited ({self.proc.returncode}): {self.output()}"
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
            assert self.proc.poll() is None, \
                f"daemon exited ({self.proc.returncode}) before {text!r}: {out[-3000:]}"
            if drive:
                drive()
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what or text!r}; log:\n"
                             f"{self.output()[-3000:]}")

    def cycles_logged(self) -> int:
        return len(re.findall(r"^.*cycle \d+: held", self.output(), re.M))

    def vmlck(self) -> int:
        """VmLck of the daemon, in bytes."""
        return meminfo.vm_locked(self.pid)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.log.close()
        return self.proc.returncode
