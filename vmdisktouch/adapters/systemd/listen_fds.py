"""The listening sockets systemd passes (socket activation), taken once, as sd_listen_fds(3).

A socket unit (systemd/vmdisktouch-metrics.socket) makes its socket in the
host's namespaces and passes it to the service it triggers as descriptor 3
(``SD_LISTEN_FDS_START``; the next ones 4, 5...), with three variables:
``LISTEN_PID`` (the process meant: a child that inherited the environment
must not take them), ``LISTEN_FDS`` (how many) and ``LISTEN_FDNAMES`` (their
``FileDescriptorName=``, ':'-separated). ``parse`` reads them (pure);
``take`` is ``sd_listen_fds_with_names(unset_environment=1)``: the variables
are unset whatever they said, so no child sees them, and every descriptor
passed is made close-on-exec. ``stream_listener`` checks that one is a
listening TCP socket; accepting on it needs no socket(2) of the daemon's
own, so ``RestrictAddressFamilies=AF_UNIX`` and ``PrivateNetwork=yes`` stay.
"""

from __future__ import annotations

import fcntl
import os
import socket
from typing import Mapping, MutableMapping

from vmdisktouch.errors import ConfigError

SD_LISTEN_FDS_START = 3
VARIABLES = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")
UNNAMED = "unknown"            # sd_listen_fds_with_names' name without LISTEN_FDNAMES
MAX_FDS = 1024                 # more is a corrupt variable, not a socket unit


def parse(environ: Mapping[str, str], pid: int) -> list[tuple[int, str]]:
    """The (descriptor, name) pairs passed to process ``pid``; [] when none are (no
    ``LISTEN_PID``, or another process's). A malformed variable raises ``ConfigError``
    (sd_listen_fds returns -EINVAL: systemd never writes one, so something else did)."""
    if "LISTEN_PID" not in environ:
        return []
    try:
        meant = int(environ["LISTEN_PID"])
        count = int(environ.get("LISTEN_FDS", "0"))
    except ValueError:
        raise ConfigError(f"socket activation: LISTEN_PID={environ['LISTEN_PID']!r} "
                          f"LISTEN_FDS={environ.get('LISTEN_FDS')!r}: not numbers") from None
    if meant <= 0 or not 0 <= count <= MAX_FDS:
        raise ConfigError(f"socket activation: LISTEN_PID={meant} LISTEN_FDS={count}: "
                          "out of range")
    if meant != pid or count == 0:
        return []
    names = environ.get("LISTEN_FDNAMES")
    names = names.split(":") if names is not None else [UNNAMED] * count
    if len(names) != count:
        raise ConfigError(f"socket activation: LISTEN_FDS={count} but LISTEN_FDNAMES names "
                          f"{len(names)}")
    return [(SD_LISTEN_FDS_START + i, name) for i, name in enumerate(names)]


def take(environ: MutableMapping[str, str] | None = None,
         pid: int | None = None) -> list[tuple[int, str]]:
    """``parse`` this process's environment, then unset the variables (always, as
    ``sd_listen_fds(unset_environment=1)`` does) and make every descriptor passed
    close-on-exec."""
    environ = os.environ if environ is None else environ
    try:
        passed = parse(environ, os.getpid() if pid is None else pid)
    finally:
        for name in VARIABLES:
            environ.pop(name, None)
    for fd, name in passed:
        try:
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.fcntl(fd, fcntl.F_GETFD) | fcntl.FD_CLOEXEC)
        except OSError as exc:
            raise ConfigError(f"socket activation: descriptor {fd} ({name!r}) passed, but "
                              f"{exc.strerror or exc}") from None
    return passed


def stream_listener(fd: int, name: str) -> socket.socket:
    """A socket object owning ``fd``, which must be a listening TCP socket (IPv4 or IPv6:
    ``ListenStream=HOST:PORT``); else ``fd`` is closed and ``ConfigError`` says what it is."""
    def refuse(what: str) -> ConfigError:
        os.close(fd)
        return ConfigError(f"the socket passed as {name!r} (descriptor {fd}) is not a "
                           f"listening TCP socket ({what}): its socket unit needs "
                           "ListenStream=HOST:PORT")
    try:
        sock = socket.socket(fileno=fd)        # reads the family and type: no socket(2)
    except OSError as exc:                     # ENOTSOCK: the descriptor is left as it was
        raise refuse(exc.strerror or str(exc)) from None
    try:
        family, kind = sock.family, sock.type
        if family not in (socket.AF_INET, socket.AF_INET6) or kind != socket.SOCK_STREAM:
            what = (f"family {getattr(family, 'name', family)}, "
                    f"type {getattr(kind, 'name', kind)}")
        elif not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            what = "it does not listen"
        else:
            return sock
    except OSError as exc:
        what = exc.strerror or str(exc)
    sock.detach()
    raise refuse(what)
