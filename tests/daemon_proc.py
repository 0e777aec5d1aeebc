"""A real ``vmdisktouch run`` process for tests: start it, poll its status, stop it by PID."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time


class Daemon:
    """``vmdisktouch run PATH *args --status DIR/status.json``, output in DIR/daemon.log.

    ``stop()`` sends SIGTERM to this process only (by PID) and waits; it is
    idempotent, so a fixture can always call it.
    """

    def __init__(self, tmp_path, path, *args):
        self.status = tmp_path / "status.json"
        self.log = open(tmp_path / "daemon.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vmdisktouch", "run", str(path), *args,
             "--status", str(self.status)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
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
