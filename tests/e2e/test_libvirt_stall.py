"""libvirt never blocks the daemon's loop: a stopped libvirtd, a QEMU monitor held by a job.

A real ``vmdisktouch run --libvirt`` host service (1 s cycles) serves a
domain of a private libvirtd (``tests.support.private_libvirt``: the shared one is
never stopped), started paused with one raw ``cache=writethrough`` disk the
"guest" reads through QEMU (``qemu-io``). The test plays systemd's part
(``NOTIFY_SOCKET``, ``WATCHDOG_USEC``, as tests/e2e/test_run_notify.py) and
watches the status file's modification times.

* libvirtd SIGSTOPped for twice the watchdog period: the holds stay (VmLck),
  the status file is rewritten every cycle (longest gap at most the interval
  + 1 s), no watchdog period passes without a ping; the domain's QEMU
  killed meanwhile is released within 2 cycles (+ 1 s for libvirtd to see
  it) of SIGCONT; a SIGTERM while libvirtd is stopped exits within 2 s.
* A synchronous monitor command (``qemu-io ... "sleep 15000"``): a write of
  the domain's heat summary (``--carry-interval 1``: one every few cycles as
  the heat decays) waits for it in libvirtd, the loop does not; a SIGTERM
  meanwhile exits within 2 s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from tests.support.libvirt_env import disk_xml
from tests.support.pagecache import data_image
from tests.support.private_libvirt import PrivateLibvirtd
from tests.support.daemon_proc import DaemonProc, env_without_systemd

MiB = 1 << 20
INTERVAL = 1.0
WATCHDOG = 3.0                   # WATCHDOG_USEC, in seconds
GAP = INTERVAL + 1.0             # the longest a status rewrite may wait
EXIT = 2.0                       # SIGTERM to exit


@pytest.fixture(scope="module")
def plv(tmp_path_factory):
    p = PrivateLibvirtd(tmp_path_factory.mktemp("plv"))
    yield p
    p.close()


def served(status) -> set[str]:
    return {d["path"] for d in status["host"]["disks"]}


class Watch:
    """In a thread: the status file's rewrite times, the sd_notify messages, the least
    VmLck seen since ``mark()``."""

    def __init__(self, d: DaemonProc, sock: socket.socket):
        self.d, self.sock = d, sock
        self.rewrites: list[float] = []
        self.pings: list[float] = []
        self.least_lck: int | None = None
        self.done = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._files,
                                                                           self._notify)]
        for t in self.threads:
            t.start()

    def _files(self):
        last = None
        while not self.done.wait(0.05):
            try:
                m = os.stat(self.d.status_path).st_mtime_ns
            except FileNotFoundError:
                continue
            if m != last:
                self.rewrites.append(time.monotonic())
                last = m
            lck = self.d.vmlck()
            self.least_lck = lck if self.least_lck is None else min(self.least_lck, lck)

    def _notify(self):
        while not self.done.is_set():
            try:
                msg = self.sock.recv(4096).decode()
            except (socket.timeout, OSError):
                continue
            if "WATCHDOG=1" in msg.splitlines():
                self.pings.append(time.monotonic())

    def mark(self):
        self.least_lck = None

    def longest(self, times, t0, t1) -> float:
        inside = [t for t in times if t0 <= t <= t1]
        edges = [t0, *inside, t1]
        return max(b - a for a, b in zip(edges, edges[1:]))

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(5)


@pytest.fixture
def service(plv, tmp_path):
    """(daemon, watch, domain, image): the host service holding the domain's disk."""
    img = data_image(tmp_path / "vm.raw", 64 * MiB)
    name = plv.define([disk_xml("vda", img)], tag="stall")
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.1)
    env = dict(env_without_systemd(), NOTIFY_SOCKET=sock_path,
               WATCHDOG_USEC=str(int(WATCHDOG * 1e6)))
    # --carry-interval 1: the heat summary is written every few cycles as it decays, so a
    # write meets the monitor's job (``setMetadata`` waits for it; ``jobInfo`` says none)
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", plv.uri, "--min-free", "0",
                   "--interval", f"{INTERVAL:g}", "--carry-interval", "1", max_hold="64M",
                   status="status.json", env=env)
    w = Watch(d, sock)
    try:
        d.wait_status(lambda s: img in served(s), "the domain's disk", timeout=60)
        plv.qemu_io(name, "read 0 32M")                   # the guest reads: held
        d.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold", timeout=30)
        yield d, w, name, img
    finally:
        plv.cont()
        w.stop()
        d.stop()
        sock.close()
        if name in plv.names:
            plv.names.remove(name)
            plv.virsh("destroy", name, check=False)
            plv.virsh("undefine", name, check=False)


def sigterm_exit_time(d: DaemonProc) -> float:
    t = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    try:
        d.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    return time.monotonic() - t


@pytest.mark.timeout(300)
def test_a_stopped_libvirtd_never_stalls_the_loop(plv, service):
    d, w, name, img = service
    qemu = plv.qemu_pid(name)
    w.mark()
    t_stop = time.monotonic()
    plv.stop()
    time.sleep(2 * WATCHDOG - 1.0)
    os.kill(qemu, signal.SIGKILL)                        # destroyed while libvirtd is stopped
    time.sleep(1.0)
    t_cont = time.monotonic()
    plv.cont()
    stall_gap = w.longest(w.rewrites, t_stop, t_cont)
    ping_gap = w.longest(w.pings, t_stop, t_cont)
    held_throughout = w.least_lck
    st = d.wait_status(lambda s: img not in served(s), "the destroyed domain released",
                       timeout=30)
    released = time.monotonic() - t_cont
    print(f"libvirtd stopped {t_cont - t_stop:.1f} s: longest status gap {stall_gap:.2f} s, "
          f"longest watchdog gap {ping_gap:.2f} s, least VmLck {held_throughout}; released "
          f"{released:.2f} s after SIGCONT")
    assert held_throughout and held_throughout > 0, "a hold was dropped during the stall"
    assert stall_gap <= GAP, f"the status file waited {stall_gap:.1f} s"
    assert ping_gap < WATCHDOG, f"no watchdog ping for {ping_gap:.1f} s"
    assert released <= 2 * INTERVAL + 1.0, f"released {released:.1f} s after SIGCONT"
    assert st["host"]["held_bytes"] == 0
    deadline = time.monotonic() + 5
    while d.vmlck() > 0:
        assert time.monotonic() < deadline, "the holds were not unlocked"
        time.sleep(0.1)
    assert "libvirt at" in d.output() and "answers again" in d.output(), d.output()[-2000:]

    plv.stop()                                           # SIGTERM while libvirtd is stopped
    time.sleep(2 * INTERVAL + 0.5)                       # the worker now waits in libvirt
    took = sigterm_exit_time(d)
    plv.cont()
    assert d.proc.returncode == 0, d.output()[-2000:]
    assert took <= EXIT, f"SIGTERM took {took:.1f} s"


@pytest.mark.timeout(300)
def test_a_monitor_held_by_a_synchronous_job_never_stalls_the_loop(plv, service):
    d, w, name, img = service
    job = threading.Thread(target=subprocess.run, daemon=True,
                           args=(plv.qemu_io_argv(name, "sleep 15000"),),
                           kwargs=dict(capture_output=True, timeout=120))
    t0 = time.monotonic()
    job.start()
    try:
        time.sleep(6.0)
        t1 = time.monotonic()
        gap = w.longest(w.rewrites, t0, t1)
        ping_gap = w.longest(w.pings, t0, t1)
        assert job.is_alive(), "the job ended before the SIGTERM: it tested nothing"
        took = sigterm_exit_time(d)
    finally:
        job.join(60)
    print(f"monitor job: longest status gap {gap:.2f} s, watchdog gap {ping_gap:.2f} s, "
          f"SIGTERM took {took:.2f} s")
    assert gap <= GAP, f"the status file waited {gap:.1f} s"
    assert ping_gap < WATCHDOG, f"no watchdog ping for {ping_gap:.1f} s"
    assert d.proc.returncode == 0, d.output()[-2000:]
    assert took <= EXIT, f"SIGTERM took {took:.1f} s"
