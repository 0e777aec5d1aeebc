"""sd_listen_fds(3) as ``listen_fds`` reads it: the variables parsed (ours only, names
or "unknown", a malformed one refused), always unset by ``take``; and what a passed
descriptor must be to serve metrics (a listening TCP socket), checked on real sockets."""

from __future__ import annotations

import os
import socket

import pytest

from vmdisktouch.adapters.systemd import listen_fds
from vmdisktouch.errors import ConfigError

PID = 4242


def env(**kw) -> dict:
    return {k: str(v) for k, v in kw.items()}


def test_the_sockets_passed_to_this_process_with_their_names():
    e = env(LISTEN_PID=PID, LISTEN_FDS=2, LISTEN_FDNAMES="metrics:other")
    assert listen_fds.parse(e, PID) == [(3, "metrics"), (4, "other")]
    assert listen_fds.parse(env(LISTEN_PID=PID, LISTEN_FDS=1), PID) == [(3, "unknown")]


@pytest.mark.parametrize("e", [
    {},                                                            # not socket-activated
    env(LISTEN_PID=PID + 1, LISTEN_FDS=1, LISTEN_FDNAMES="metrics"),  # a parent's: inherited
    env(LISTEN_PID=PID, LISTEN_FDS=0),
    env(LISTEN_FDS=1, LISTEN_FDNAMES="metrics"),                   # no LISTEN_PID
])
def test_none_for_another_process_or_none_passed(e):
    assert listen_fds.parse(e, PID) == []


@pytest.mark.parametrize("e, words", [
    (env(LISTEN_PID="me", LISTEN_FDS=1), "not numbers"),
    (env(LISTEN_PID=PID, LISTEN_FDS="one"), "not numbers"),
    (env(LISTEN_PID=PID, LISTEN_FDS=-1), "out of range"),
    (env(LISTEN_PID=0, LISTEN_FDS=1), "out of range"),
    (env(LISTEN_PID=PID, LISTEN_FDS=2, LISTEN_FDNAMES="metrics"), "names 1"),
])
def test_a_malformed_variable_is_refused_in_one_line(e, words):
    with pytest.raises(ConfigError) as exc:
        listen_fds.parse(e, PID)
    assert words in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("e", [
    env(LISTEN_PID=PID + 1, LISTEN_FDS=1, LISTEN_FDNAMES="metrics"),
    env(LISTEN_PID="me", LISTEN_FDS=1),
    env(LISTEN_PID=PID, LISTEN_FDS=0, LISTEN_FDNAMES=""),
])
def test_take_unsets_the_variables_whatever_they_said(e):
    e["PATH"] = "/usr/bin"
    try:
        assert listen_fds.take(e, PID) == []
    except ConfigError:
        pass
    assert e == {"PATH": "/usr/bin"}


def test_take_refuses_a_descriptor_that_is_not_open():
    fd = os.open("/dev/null", os.O_RDONLY)
    os.close(fd)              # the lowest free descriptor: 3 .. fd-1 are open (Python's own,
    if fd < 3:                # close-on-exec already), fd is not
        pytest.fail(f"descriptor {fd} free below 3: stdin/stdout/stderr closed")
    e = env(LISTEN_PID=PID, LISTEN_FDS=fd - 2, LISTEN_FDNAMES=":".join(["x"] * (fd - 2)))
    with pytest.raises(ConfigError, match=f"descriptor {fd} .*passed, but Bad file descriptor"):
        listen_fds.take(e, PID)
    assert e == {}


# -- stream_listener, on real sockets ------------------------------------------------------

def fd_of(sock: socket.socket) -> int:
    return sock.detach()                     # stream_listener owns it from here


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def test_a_listening_tcp_socket_is_taken():
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        s = socket.socket(family, socket.SOCK_STREAM)
        s.bind((host, 0))
        s.listen(1)
        port = s.getsockname()[1]
        got = listen_fds.stream_listener(fd_of(s), "metrics")
        try:
            assert (got.family, got.type, got.getsockname()[1]) == (family, socket.SOCK_STREAM,
                                                                    port)
        finally:
            got.close()


def refused(fd: int) -> str:
    with pytest.raises(ConfigError) as exc:
        listen_fds.stream_listener(fd, "metrics")
    assert not is_open(fd)                   # closed, not left behind
    return str(exc.value)


def test_what_is_not_a_listening_tcp_socket_is_refused_and_closed(tmp_path):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    assert "(family AF_INET, type SOCK_DGRAM)" in refused(fd_of(udp))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    assert "(it does not listen)" in refused(fd_of(tcp))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "s"))
    unix.listen(1)
    assert "(family AF_UNIX, type SOCK_STREAM)" in refused(fd_of(unix))
    r, w = os.pipe()
    os.close(w)
    msg = refused(r)
    assert msg == (f"the socket passed as 'metrics' (descriptor {r}) is not a listening TCP "
                   "socket (Socket operation on non-socket): its socket unit needs "
                   "ListenStream=HOST:PORT")
