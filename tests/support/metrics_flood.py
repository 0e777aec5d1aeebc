"""The metrics listener's flood harness (issue 31, case 3), shared by
``benchmarks/bench_metrics_conns.py`` (its scenario and figures are described
there) and the fault rows of ``tests/e2e/test_faults_metrics.py`` and
``tests/e2e/test_faults_round3_trace_metrics.py``.

``serve``: the daemon of the scenario under ``prlimit --nofile`` and a played
``Type=notify`` supervisor, holding the hot zone of an image; ``window``: one
scenario's window and its figures; ``Flood``, ``Scraper``: the clients;
``descriptors``: the daemon's side.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import statistics
import tempfile
import threading
import time
import urllib.request

from tests.support.common import ROOT, MiB
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from tests.support.pagecache import read_range
from tests.support.procfs import cpu_seconds

HOT = (8 * MiB, 6 * MiB)
NOFILE = 1024                    # the daemon's RLIMIT_NOFILE (soft and hard)
WATCHDOG_USEC = 2_000_000        # WatchdogSec=2: a ping is due every second
ARGS = ("--max-hold", "16M", "--min-free", "256M", "--interval", "0.2", "--decay", "1",
        "--uri", "")




def raise_nofile(n: int) -> None:
    """This process may open ``n`` descriptors (up to its hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = n if hard == resource.RLIM_INFINITY else min(n, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


# -- the supervisor's side: NOTIFY_SOCKET ----------------------------------------------

class Notify:
    """A bound NOTIFY_SOCKET; a thread keeps the time of every ``WATCHDOG=1``."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="vmdt-notify-")   # a short path
        path = os.path.join(self.dir.name, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.1)
        self.path, self.pings, self.messages, self.done = path, [], [], False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done:
            try:
                data = self.sock.recv(4096).decode(errors="replace")
            except (socket.timeout, OSError):
                continue
            now = time.monotonic()
            self.messages.append((now, data))
            if "WATCHDOG=1" in data.splitlines():
                self.pings.append(now)

    def max_gap(self, t0: float, t1: float) -> float:
        """The longest silence in [t0, t1], its edges counted as pings."""
        marks = [t0] + [t for t in self.pings if t0 < t < t1] + [t1]
        return max(b - a for a, b in zip(marks, marks[1:]))

    def close(self) -> None:
        self.done = True
        self.thread.join(timeout=2)
        self.sock.close()
        self.dir.cleanup()


@contextlib.contextmanager
def serve(workdir, image, port: int, cwd=ROOT):
    """(daemon, notify): the daemon of the scenario holding the hot zone; stopped after."""
    notify, stop = Notify(), threading.Event()
    env = dict(env_without_systemd(), NOTIFY_SOCKET=notify.path,
               WATCHDOG_USEC=str(WATCHDOG_USEC))
    d = DaemonProc(workdir, image, *ARGS, "--metrics-listen", f"127.0.0.1:{port}",
                   prefix=("prlimit", f"--nofile={NOFILE}:{NOFILE}"), env=env, cwd=cwd)
    try:
        d.wait_output("cycle 1:", "the first cycle")
        deadline = time.monotonic() + 30
        while d.vmlck() == 0:
            if not d.alive() or time.monotonic() > deadline:
                raise AssertionError(f"nothing held; log:\n{d.output()[-2000:]}")
            read_range(image, *HOT)
            time.sleep(0.1)
        time.sleep(1.0)                    # the zone fully loaded (one cycle more)
        guest = threading.Thread(target=_guest, args=(image, stop), daemon=True)
        guest.start()
        yield d, notify
    finally:
        stop.set()
        d.stop()
        notify.close()


def _guest(image, stop: threading.Event) -> None:
    """The guest keeps using its hot zone (a read of it every 0.2 s), so it stays held."""
    while not stop.wait(0.2):
        read_range(image, *HOT)


# -- the clients -------------------------------------------------------------------------

class Flood:
    """``n`` loopback connections, opened by a thread one at a time at ``rate`` a second
    without waiting for them (all at once would only overflow the listen backlog, and
    most handshakes would wait for SYN-ACK retransmits, over minutes); ``slow``: each
    sends one more byte of an endless header every second (``trickle``)."""

    HEADER = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100000

    def __init__(self, port: int, n: int, slow: bool = False, rate: float = 1000.0):
        raise_nofile(n + 512)
        self.port, self.n, self.slow, self.rate = port, n, slow, rate
        self.socks, self.sent, self.cut, self.seen = [], [], 0, set()
        self.next_trickle = time.monotonic() + 1.0
        self.done = False
        self.thread = threading.Thread(target=self._open, daemon=True)
        self.thread.start()

    def _open(self) -> None:
        t0 = time.monotonic()
        while len(self.socks) < self.n and not self.done:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", self.port))
            self.sent.append(0)
            self.socks.append(s)
            time.sleep(max(0.0, t0 + len(self.socks) / self.rate - time.monotonic()))

    def look(self) -> None:
        """Mark the connections whose handshake has completed (``established``)."""
        for i, s in enumerate(list(self.socks)):
            if i not in self.seen:
                try:
                    s.getpeername()
                    self.seen.add(i)
                except OSError:
                    pass

    @property
    def established(self) -> int:
        """Connections seen established (whatever the daemon did with them since)."""
        return len(self.seen)

    def trickle(self) -> None:
        if not self.slow or time.monotonic() < self.next_trickle:
            return
        self.next_trickle += 1.0
        for i, s in enumerate(list(self.socks)):
            if self.sent[i] < 0:
                continue
            try:
                self.sent[i] += s.send(self.HEADER[self.sent[i]:self.sent[i] + 1])
            except BlockingIOError:
                pass
            except OSError:
                self.sent[i] = -1           # reset or closed by the daemon
                self.cut += 1

    def close(self) -> None:
        self.done = True
        self.thread.join(timeout=5)
        for s in self.socks:
            s.close()
        self.socks = []


class Scraper:
    """A fresh client scrapes every 0.5 s in a thread: (latency, or None when it failed)."""

    def __init__(self, port: int, every: float = 0.5, timeout: float = 3.0):
        self.url, self.every, self.timeout = f"http://127.0.0.1:{port}/metrics", every, timeout
        self.results: list[float | None] = []
        self.done = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done:
            t0 = time.monotonic()
            try:
                body = urllib.request.urlopen(self.url, timeout=self.timeout).read()
                ok = b"vmdisktouch_held_bytes" in body
            except OSError:
                ok = False
            self.results.append(time.monotonic() - t0 if ok else None)
            time.sleep(max(0.0, self.every - (time.monotonic() - t0)))

    def stop(self) -> list[float | None]:
        self.done = True
        self.thread.join(timeout=self.timeout + 2)
        return self.results


# -- the daemon's side ---------------------------------------------------------------------

def descriptors(pid: int) -> tuple[int, int]:
    """(descriptors, sockets) of the process."""
    fds = socks = 0
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0, 0
    for name in names:
        try:
            socks += os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:")
            fds += 1
        except OSError:
            pass
    return fds, socks


def status_mark(path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def window(d: DaemonProc, notify: Notify, port: int, scenario: str, conns: int,
           seconds: float) -> dict:
    """One scenario's window (see the module docstring), from just before its clients
    connect: its figures."""
    t0, cpu0 = time.monotonic(), cpu_seconds(d.pid)
    held0 = held_min = d.vmlck()
    fds_max = socks_max = 0
    mark, changes, next_look = status_mark(d.status_path), [t0], t0
    flood = Flood(port, conns, slow=scenario == "slowloris") \
        if scenario in ("idle", "slowloris") else None
    try:
        scraper = Scraper(port)
        while time.monotonic() < t0 + seconds:
            now = time.monotonic()
            m = status_mark(d.status_path)
            if m != mark:
                mark = m
                changes.append(now)
            if now >= next_look:
                next_look = now + 0.25
                held_min = min(held_min, d.vmlck())
                fds, socks = descriptors(d.pid)
                fds_max, socks_max = max(fds_max, fds), max(socks_max, socks)
                if flood:
                    flood.look()
                    flood.trickle()
            if d.proc.poll() is not None:
                break
            time.sleep(0.02)
        t1 = time.monotonic()
        cpu1 = cpu_seconds(d.pid) if d.alive() else cpu0
        changes.append(t1)
        scrapes = scraper.stop()
        established = flood.established if flood else 0
        cut = flood.cut if flood else 0
    finally:
        if flood:
            flood.close()
    served = [s for s in scrapes if s is not None]
    return {
        "scenario": scenario, "conns": conns if flood else 0, "established": established,
        "cut_by_daemon": cut, "daemon_sockets_max": socks_max, "daemon_fds_max": fds_max,
        "cpu_pct": 100.0 * (cpu1 - cpu0) / (t1 - t0),
        "status_gap_max_s": max(b - a for a, b in zip(changes, changes[1:])),
        "watchdog_gap_max_s": notify.max_gap(t0, t1),
        "held_start": held0, "held_min": held_min, "held_end": d.vmlck(),
        "scrapes_ok": len(served), "scrapes_failed": len(scrapes) - len(served),
        "scrape_median_ms": 1000 * statistics.median(served) if served else None,
        "scrape_max_ms": 1000 * max(served) if served else None,
        "seconds": t1 - t0, "alive": d.alive(),
    }
