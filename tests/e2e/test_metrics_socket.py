"""The HTTP metrics under the unit's sandbox: a socket systemd passes (socket activation).

The unit runs the daemon with ``PrivateNetwork=yes`` and
``RestrictAddressFamilies=AF_UNIX``. systemd/vmdisktouch-metrics.socket makes its
socket in the host's network namespace and passes it to the daemon; accepting on it
needs neither a network nor a socket(2) of the daemon's own. Here the test plays
systemd: it listens on 127.0.0.1 in its own (the host's) namespace, and starts the
daemon through tests/support/sandbox_exec.py, which applies the unit's sandbox as read from
the unit file (a new network namespace with its loopback up, the address-family
filter, the system call filter, MDWE, the capability bounding set, the device group)
and passes the socket as descriptor 3 named ``metrics``, with LISTEN_PID set to the
pid the exec keeps. The test scrapes it from the host's namespace and finds the
status file's values.

Controls, for why the socket unit is needed: ``--metrics-listen`` in the private
namespace listens, says so, answers inside that namespace (nsenter), and cannot be
reached from the host (issue 34's report); with the address-family filter as well,
as under the real unit, it cannot even listen (78). systemd's own
``systemd-socket-activate`` passes a socket the daemon serves, so the variables are
read as systemd writes them. Every way a passed socket is refused is one line, 78.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import subprocess
import sys
import urllib.request
from unittest import mock

import pytest

from tests.e2e.test_metrics import agreeing_scrape, assert_the_status_values, free_port
from tests.e2e.test_sandbox import (HOT, LAUNCHER, UNIT, assert_seccomp, daemons,  # noqa: F401
                                    devices_cgroup, image, require_seccomp)
from tests.support.common import require_tool
from tests.support.pagecache import data_image, read_range
from tests.support.sandbox_exec import capability_mask, parse_unit
from tests.support import daemon_proc
from tests.support.daemon_proc import ROOT, DaemonProc, env_without_systemd
from tests.support.procfs import status_fields as proc_status

MiB = 1 << 20
SOCKET_UNIT = parse_unit((ROOT / "systemd" / "vmdisktouch-metrics.socket").read_text())
NAME = SOCKET_UNIT["Socket"]["FileDescriptorName"][0]       # "metrics"
WHOLE = ["--private-network", "--address-families", "--mdwe", "--mdwe-seccomp", "--seccomp",
         "--caps"]


@contextlib.contextmanager
def inheriting(*fds: int):
    """Daemons started in this block inherit ``fds`` (``DaemonProc`` closes every other
    descriptor): the socket reaches the launcher, as systemd's reaches the service."""
    with mock.patch.object(daemon_proc.subprocess, "Popen",
                           functools.partial(subprocess.Popen, pass_fds=fds)):
        yield


def loopback_listener(host: str = "127.0.0.1") -> socket.socket:
    """What the socket unit makes (ListenStream=127.0.0.1:PORT), on a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def queued_scrape(port: int) -> socket.socket:
    """A scrape sent before the daemon runs: it waits in the socket's backlog, as a
    Prometheus scrape that made systemd start the service does, and is the first answered."""
    c = socket.create_connection(("127.0.0.1", port), timeout=60)
    c.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    return c


def answer(c: socket.socket) -> tuple[int, list[str]]:
    """The status code of the response on ``c``, and its sample lines."""
    data = b""
    while chunk := c.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = body.decode().splitlines()
    return int(head.split()[1]), [x for x in lines if x and not x.startswith("#")]


def netns(pid: int | str) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


# -- the socket, scraped from the host -----------------------------------------------------

@pytest.mark.timeout(180)
def test_the_passed_socket_is_scraped_from_the_host_under_the_whole_sandbox(
        tmp_path, image, devices_cgroup, daemons):      # noqa: F811
    require_seccomp()
    assert SOCKET_UNIT["Socket"]["ListenStream"] == ["127.0.0.1:9479"]
    assert UNIT["PrivateNetwork"] == ["yes"] and UNIT["RestrictAddressFamilies"] == ["AF_UNIX"]
    listener = loopback_listener()
    port = listener.getsockname()[1]
    try:
        with inheriting(listener.fileno()):
            d = daemons(tmp_path, image, WHOLE + ["--devices-cgroup", devices_cgroup,
                                                  "--listen-fd", f"{listener.fileno()}:{NAME}"])
        d.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=60,
                      drive=lambda: read_range(image, *HOT))
        assert netns(d.pid) != netns("self")             # its own network namespace
        rep = d.sandbox_report()
        assert rep["private_network"]["netns"] == netns(d.pid)
        assert rep["address_families"]["socket_errno"] == {
            "AF_UNIX": 0, "AF_INET": 97, "AF_INET6": 97}                   # EAFNOSUPPORT
        assert rep["listen_fds"] == {"fds": [3], "names": [NAME], "pid": d.pid}
        status = proc_status(d.pid)
        assert_seccomp(status, filters=3)                 # MDWE, the deny-list, the families
        assert int(status["CapEff"], 16) == capability_mask(UNIT)
        st, m, _ = agreeing_scrape(d, lambda: scrape(port), str(image))
        assert_the_status_values(st, m, str(image))
        assert f"metrics on http://127.0.0.1:{port}/metrics (a socket passed by systemd)" \
            in d.output()
        assert d.stop() == 0, d.output()[-3000:]
        assert "Traceback" not in d.output() and "released all holds" in d.output()
        # systemd's copy outlives the daemon: still listening, for the next start
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        listener.close()


@pytest.mark.timeout(120)
def test_systemd_socket_activate_passes_a_socket_the_daemon_serves(tmp_path):
    """systemd's own tool sets LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES and execs the
    daemon at the first connection, as a socket unit starts its service."""
    exe = require_tool("systemd-socket-activate")
    img = data_image(tmp_path / "disk.raw", 32 * MiB)
    port = free_port()
    d = DaemonProc(tmp_path, img, "--uri", "", "--min-free", "0", max_hold="16M",
                   interval=0.5, env=env_without_systemd(),
                   prefix=(exe, "--listen", f"127.0.0.1:{port}", f"--fdname={NAME}"))
    try:
        d.wait_output(f"Listening on 127.0.0.1:{port}")
        with contextlib.closing(queued_scrape(port)) as first:    # it starts the daemon
            code, lines = answer(first)
        assert code == 503 or (code == 200 and lines), (code, lines)   # before a cycle: 503
        d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
        assert "vmdisktouch_held_bytes" in scrape(port)   # the daemon answers
        d.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=30,
                      drive=lambda: read_range(img, 0, 16 * MiB))
        st, m, _ = agreeing_scrape(d, lambda: scrape(port), img)
        assert_the_status_values(st, m, img)
        assert "(a socket passed by systemd)" in d.output()
    finally:
        assert d.stop() == 0, d.output()[-3000:]


@pytest.mark.timeout(120)
def test_the_first_scrape_through_a_passed_socket_has_samples_or_fails(tmp_path):
    """Issue 45, part 3: the scrape that starts the service came before the first cycle and
    got 200 with HELP and TYPE lines only; Prometheus took it for a target with no disks.
    It must fail (503: the target is down) or have the samples."""
    listener = loopback_listener()
    port = listener.getsockname()[1]
    img = data_image(tmp_path / "disk.raw", 4 * MiB)
    first = queued_scrape(port)
    try:
        with inheriting(listener.fileno()):
            d = DaemonProc(tmp_path, img, "--uri", "", "--min-free", "0", max_hold="1M",
                           interval=0.3, env=env_without_systemd(),
                           prefix=(sys.executable, LAUNCHER, "--listen-fd",
                                   f"{listener.fileno()}:{NAME}", "--"))
        code, lines = answer(first)
        assert code == 503 or (code == 200 and lines), (code, lines)
        d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
        assert any(x.startswith("vmdisktouch_held_bytes{") for x in scrape(port).splitlines())
        assert d.stop() == 0, d.output()[-3000:]
    finally:
        first.close()
        listener.close()


# -- the controls: --metrics-listen under the sandbox -----------------------------------------

SCRAPE_INSIDE = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())
"""


@pytest.mark.timeout(120)
def test_metrics_listen_in_the_private_network_cannot_be_reached_from_the_host(
        tmp_path, image, daemons):      # noqa: F811
    """Issue 34's report: the daemon says where it listens, and that address answers only
    inside its own network namespace."""
    nsenter = require_tool("nsenter")
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    d = daemons(tmp_path, image, ["--private-network"], "--metrics-listen", f"127.0.0.1:{port}")
    d.wait_status(lambda s: s["cycle"] >= 1, "a cycle")
    assert f"metrics on {url}" in d.output()
    inside = subprocess.run([nsenter, f"--net=/proc/{d.pid}/ns/net", sys.executable, "-c",
                             SCRAPE_INSIDE, url], capture_output=True, text=True, timeout=30)
    assert inside.returncode == 0 and "vmdisktouch_held_bytes" in inside.stdout, inside.stderr
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5)
    assert d.stop() == 0, d.output()[-3000:]


@pytest.mark.timeout(120)
def test_metrics_listen_under_the_address_family_filter_cannot_listen(tmp_path, image,
                                                                      daemons):  # noqa: F811
    """Under the real unit it does not even get that far: no AF_INET socket (78, one line
    that points at the socket unit)."""
    require_seccomp()
    d = daemons(tmp_path, image, ["--private-network", "--address-families"],
                "--metrics-listen", f"127.0.0.1:{free_port()}")
    assert d.proc.wait(timeout=60) == 78, d.output()[-3000:]
    last = d.output().strip().splitlines()[-1]
    assert last.startswith("vmdisktouch: metrics_listen 127.0.0.1:"), last
    assert "Address family not supported" in last and "vmdisktouch-metrics.socket" in last
    assert "Traceback" not in d.output()


# -- what a passed socket must be -------------------------------------------------------------

def run_passed(tmp_path, socks: list[tuple[int, str]], *extra, timeout=60):
    """``run`` through the launcher with ``socks`` (descriptor, name) passed; no sandbox."""
    img = data_image(tmp_path / "disk.raw", 4 * MiB)
    specs = [a for fd, name in socks for a in ("--listen-fd", f"{fd}:{name}")]
    return subprocess.run([sys.executable, str(LAUNCHER), *specs, "--", sys.executable, "-m",
                           "vmdisktouch", "run", img, "--max-hold", "1M", "--uri", "", *extra],
                          pass_fds=[fd for fd, _ in socks], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env_without_systemd())


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def unix_listener(tmp_path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "metrics.sock"))
    s.listen(1)
    return s


def bound_tcp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    return s


REFUSED = {
    "udp": (lambda tmp: [udp()], "(family AF_INET, type SOCK_DGRAM)"),
    "unix": (lambda tmp: [unix_listener(tmp)], "(family AF_UNIX, type SOCK_STREAM)"),
    "not listening": (lambda tmp: [bound_tcp()], "(it does not listen)"),
    "all addresses": (lambda tmp: [loopback_listener("0.0.0.0")], "not on a loopback address"),
    "two": (lambda tmp: [loopback_listener(), loopback_listener()],
            "2 sockets named 'metrics' passed"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_passed_socket_that_cannot_serve_is_refused_with_one_line(tmp_path, case):
    make, words = REFUSED[case]
    socks = make(tmp_path)
    try:
        r = run_passed(tmp_path, [(s.fileno(), NAME) for s in socks])
    finally:
        for s in socks:
            s.close()
    assert r.returncode == 78, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("vmdisktouch: ") and words in last, r.stderr
    assert "Traceback" not in r.stderr


def test_a_non_socket_is_refused_with_one_line(tmp_path):
    rfd, wfd = os.pipe()
    try:
        r = run_passed(tmp_path, [(rfd, NAME)])
    finally:
        os.close(rfd)
        os.close(wfd)
    assert r.returncode == 78, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "vmdisktouch: the socket passed as 'metrics' (descriptor 3) is not a listening TCP "
        "socket (Socket operation on non-socket): its socket unit needs ListenStream=HOST:PORT")


def test_metrics_listen_and_a_passed_socket_are_refused_together(tmp_path):
    """Two endpoints, one of them unreachable under the unit: which one Prometheus should
    scrape is the operator's to say."""
    listener = loopback_listener()
    port = listener.getsockname()[1]
    try:
        r = run_passed(tmp_path, [(listener.fileno(), NAME)], "--metrics-listen",
                       f"127.0.0.1:{free_port()}")
    finally:
        listener.close()
    assert r.returncode == 78, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("vmdisktouch: metrics_listen 127.0.0.1:") and "serve one" in last
    assert f"(http://127.0.0.1:{port}/metrics)" in last, last


# -- taking the descriptors -----------------------------------------------------------------

TAKE = """
import fcntl, json, os
from vmdisktouch.adapters.systemd import listen_fds
passed = listen_fds.take()
print(json.dumps({"passed": passed,
                  "env": sorted(k for k in os.environ if k.startswith("LISTEN_")),
                  "cloexec": [bool(fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
                              for fd, _ in passed]}))
"""


def test_take_unsets_the_variables_and_closes_the_descriptors_on_exec():
    a, b = loopback_listener(), loopback_listener()
    try:
        r = subprocess.run([sys.executable, str(LAUNCHER), "--listen-fd", f"{a.fileno()}:{NAME}",
                            "--listen-fd", f"{b.fileno()}:other", "--", sys.executable, "-c",
                            TAKE], pass_fds=(a.fileno(), b.fileno()), capture_output=True,
                           text=True, timeout=60, cwd=ROOT, env=env_without_systemd())
    finally:
        a.close()
        b.close()
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"passed": [[3, NAME], [4, "other"]], "env": [],
                                    "cloexec": [True, True]}


@pytest.mark.timeout(120)
def test_a_socket_under_another_name_is_closed_with_a_warning(tmp_path):
    """Not ours to serve: said once and closed; the daemon runs on without metrics."""
    listener = loopback_listener()
    img = data_image(tmp_path / "disk.raw", 4 * MiB)
    try:
        with inheriting(listener.fileno()):
            d = DaemonProc(tmp_path, img, "--uri", "", "--min-free", "0", max_hold="1M",
                           interval=0.3, env=env_without_systemd(),
                           prefix=(sys.executable, LAUNCHER, "--listen-fd",
                                   f"{listener.fileno()}:other", "--"))
        d.wait_status(lambda s: s["cycle"] >= 2, "two cycles")
        assert "socket activation: descriptor 3 named 'other' closed: only 'metrics' is " \
               "served" in d.output()
        assert "metrics on" not in d.output()
        mine = f"socket:[{os.fstat(listener.fileno()).st_ino}]"
        fds = f"/proc/{d.pid}/fd"
        assert mine not in [os.readlink(f"{fds}/{fd}") for fd in os.listdir(fds)]
        assert d.stop() == 0, d.output()[-3000:]
    finally:
        listener.close()
