"""sdnotify: messages reach a real AF_UNIX datagram socket, as systemd's would."""

from __future__ import annotations

import os
import socket
import time
import uuid

import pytest

from vmdisktouch.adapters.systemd import sdnotify


@pytest.fixture
def receiver(tmp_path, monkeypatch):
    """A datagram socket at a path, announced in NOTIFY_SOCKET."""
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield sock
    sock.close()


def recv(sock) -> str:
    return sock.recv(4096).decode()


def test_ready_status_watchdog_stopping(receiver):
    assert sdnotify.ready() is True
    assert recv(receiver) == "READY=1"
    assert sdnotify.ready("held 1G/4G") is True
    assert recv(receiver) == "READY=1\nSTATUS=held 1G/4G"
    assert sdnotify.status("held 512M/4G, rewritten 3 blocks") is True
    assert recv(receiver) == "STATUS=held 512M/4G, rewritten 3 blocks"
    assert sdnotify.watchdog_ping() is True
    assert recv(receiver) == "WATCHDOG=1"
    assert sdnotify.stopping() is True
    assert recv(receiver) == "STOPPING=1"
    assert sdnotify.extend_timeout(90) is True
    assert recv(receiver) == "EXTEND_TIMEOUT_USEC=90000000"
    assert sdnotify.notify("A=1\nB=2") is True
    assert recv(receiver) == "A=1\nB=2"


def test_status_is_one_line(receiver):
    sdnotify.status("line one\nline two")
    assert recv(receiver) == "STATUS=line one line two"


def test_reloading_carries_monotonic_usec(receiver):
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert sdnotify.reloading() is True
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    lines = recv(receiver).split("\n")
    assert lines[0] == "RELOADING=1"
    key, value = lines[1].split("=")
    assert key == "MONOTONIC_USEC" and before <= int(value) <= after


def test_abstract_socket(monkeypatch):
    name = f"vmdisktouch-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(2)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready() is True
        assert recv(sock) == "READY=1"


def test_explicit_environ_wins(receiver, tmp_path):
    other = str(tmp_path / "other")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(other)
        sock.settimeout(2)
        assert sdnotify.status("x", environ={"NOTIFY_SOCKET": other}) is True
        assert recv(sock) == "STATUS=x"
    receiver.settimeout(0.05)
    with pytest.raises(socket.timeout):
        receiver.recv(4096)


def test_without_systemd_everything_is_a_quiet_no_op(monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.ready() is False
    assert sdnotify.status("x") is False
    assert sdnotify.watchdog_ping() is False
    assert sdnotify.reloading() is False
    assert sdnotify.stopping() is False


@pytest.mark.parametrize("value", ["relative/path", "vsock:2:1234", ""])
def test_unusable_socket_address_is_ignored(value):
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": value}) is False


def test_send_failure_is_reported_not_raised(tmp_path):
    gone = str(tmp_path / "no-such-socket")
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": gone}) is False


def test_watchdog_interval():
    pid = str(os.getpid())
    assert sdnotify.watchdog_interval({}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "60000000"}) == 60.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": pid}) == 60.0
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "2500000", "WATCHDOG_PID": pid}) == 2.5
    # below a second: clamped to one (WATCHDOG_USEC=1 made an idle daemon spin)
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": pid}) == 1.0
    # meant for another process (e.g. inherited by a child): not ours to ping
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "60000000",
                                       "WATCHDOG_PID": str(os.getpid() + 1)}) is None
    for bad in ("0", "-5", "sixty", ""):
        assert sdnotify.watchdog_interval({"WATCHDOG_USEC": bad}) is None
    assert sdnotify.watchdog_interval({"WATCHDOG_USEC": "1", "WATCHDOG_PID": "x"}) is None


def test_watchdog_interval_reads_os_environ(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval() == 30.0
