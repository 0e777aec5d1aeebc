"""The loopback HTTP endpoint of the metrics: one thread, one ``selectors`` loop.

``Endpoint(sock, render)`` serves a listening socket in a daemon thread of
its own: one ``listen(host, port)`` made for ``metrics_listen`` (a loopback
address: ``config.settings.loopback_listen`` refuses others), or the one
systemd passed (``listen_fds``, vmdisktouch-metrics.socket), through the
same loop. ``render(head)`` (``metrics.Metrics.render``) gives the body and
headers of each GET, from the collector's snapshot swapped under a lock.

Why not ``prometheus_client.start_http_server``: it runs one thread per
connection and waits for each client for ever, so ~1,000 idle loopback
connections (any local user can open them) took every descriptor of the
daemon at ``ulimit -n 1024``: /proc/meminfo could not be read (MemAvailable
taken as 0, every hold shed), the status and the watchdog pings stopped, and
its accept loop spun on EMFILE. ``Endpoint`` is one
thread and one ``selectors`` loop, bounded whatever its clients do:

* at most ``MAX_CONNECTIONS`` sockets at once (so at most that many
  descriptors, however many clients connect): a connection beyond the cap
  drops the oldest one still sending its request (a scrape sends its request
  at once, an idle or slow client is the oldest), or is closed at once when
  every slot is sending a response;
* a client has ``REQUEST_SECONDS`` to send its whole request (at most
  ``MAX_REQUEST`` bytes) and ``SEND_SECONDS`` to read the response, however
  slowly it trickles bytes; one request per connection;
* an ``accept`` that fails for want of a descriptor (or of memory) rests the
  listener for ``ACCEPT_REST`` seconds instead of spinning on it;
* at most ``ACCEPT_RATE`` connections are accepted a second (a token bucket of
  ``ACCEPT_TOKENS``): past it the listener rests until a token is due, and the
  connections wait in the kernel's backlog, costing the daemon nothing (issue
  40: connect-and-close from four processes took 80 % of a core). A scrape
  waits behind at most a backlog's worth (128) of them: well under a second.

The page itself is rendered once per cycle by ``render`` (``metrics.Metrics.page``).
Before the daemon's first cycle there is no page (``render`` gives None) and a
request is answered 503: a 200 of HELP and TYPE lines alone would be a scrape
that succeeded with no series, and Prometheus would record the target up with
no disks (the scrape that makes systemd start the service through its socket would).

Dropped connections are logged at most once a minute, with their count. Any
path, GET or HEAD, answers the text format of ``generate_latest`` (gzipped
when the client accepts it), one request per connection; unlike
``start_http_server`` there is no OpenMetrics negotiation and no ``name[]``
filter (Prometheus scrapes the text format as well).
"""

from __future__ import annotations

import errno
import logging
import selectors
import socket
import threading
import time

log = logging.getLogger("vmdisktouch")

MAX_CONNECTIONS = 32     # sockets open at once on the endpoint
REQUEST_SECONDS = 5.0    # to send the whole request, from the connection
SEND_SECONDS = 5.0       # to read the whole response
MAX_REQUEST = 8192       # bytes of request line and headers
ACCEPT_BURST = 64        # connections accepted per wake-up
ACCEPT_REST = 1.0        # the listener rests this long after accept failed (EMFILE...)
ACCEPT_RATE = 1000.0     # connections accepted a second, at most (the rest wait in the backlog)
ACCEPT_TOKENS = 256.0    # ... and at once, after a quiet while
WARN_EVERY = 60.0        # seconds between two lines about dropped connections
NOT_YET = b"no cycle yet: the daemon is starting\n"   # the body of a 503


class _Conn:
    __slots__ = ("sock", "inbox", "outbox", "deadline")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.inbox, self.outbox, self.deadline = sock, b"", None, deadline


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (``metrics_listen``); raises ``OSError``."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


class Endpoint:
    """The HTTP endpoint (see the module docstring) on the listening socket ``sock``, which
    it owns: ``render(head)`` gives the body and headers of a GET (None, before the first
    cycle: 503); ``close()`` stops the thread and closes every socket (a passed socket's
    copy only: systemd keeps its own)."""

    def __init__(self, sock: socket.socket, render):
        self.sock = sock
        try:
            self.sock.setblocking(False)
            self.port = self.sock.getsockname()[1]
            self._wake_r, self._wake_w = socket.socketpair()
        except OSError:
            self.sock.close()
            raise
        self.render = render
        self.conns: dict[socket.socket, _Conn] = {}
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ)
        self.sel.register(self._wake_r, selectors.EVENT_READ)
        self.resting_until = 0.0
        self.tokens, self.filled = ACCEPT_TOKENS, time.monotonic()
        self.dropped, self.last_warned, self.stopping = 0, -WARN_EVERY, False
        self.thread = threading.Thread(target=self._run, name="vmdisktouch-metrics",
                                       daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self.thread.join(timeout=5)
        for sock in list(self.conns):
            self._drop(sock)
        self.sel.close()
        for sock in (self.sock, self._wake_r, self._wake_w):
            sock.close()

    # -- the loop ------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception:          # noqa: BLE001 - said once; the daemon goes on without it
            log.exception("metrics_listen: the endpoint stopped")

    def _loop(self) -> None:
        while not self.stopping:
            now = time.monotonic()
            if self.resting_until and now >= self.resting_until:
                self.resting_until = 0.0
                self.sel.register(self.sock, selectors.EVENT_READ)
            wake = [c.deadline for c in self.conns.values()]
            if self.resting_until:
                wake.append(self.resting_until)
            timeout = max(0.0, min(wake) - now) if wake else None
            for key, _mask in self.sel.select(timeout):
                if key.fileobj is self.sock:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    return
                elif key.fileobj in self.conns:
                    self._serve(key.fileobj)
            now = time.monotonic()
            for sock in [s for s, c in self.conns.items() if c.deadline <= now]:
                self._drop(sock, counted=True)

    def _rest(self, seconds: float) -> None:
        """Stop accepting for ``seconds``: the connections wait in the kernel's backlog."""
        self.sel.unregister(self.sock)
        self.resting_until = time.monotonic() + seconds

    def _accept(self) -> None:
        now = time.monotonic()
        self.tokens = min(ACCEPT_TOKENS, self.tokens + (now - self.filled) * ACCEPT_RATE)
        self.filled = now
        for _ in range(ACCEPT_BURST):
            if self.tokens < 1.0:
                return self._rest((1.0 - self.tokens) / ACCEPT_RATE)
            try:
                sock, _addr = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                self._rest(ACCEPT_REST)           # no descriptor (or memory): never spin
                self._warn(f"cannot accept a connection ({exc.strerror or exc})")
                return
            self.tokens -= 1.0
            if len(self.conns) >= MAX_CONNECTIONS:
                reading = [s for s, c in self.conns.items() if c.outbox is None]
                if not reading:
                    sock.close()
                    self._count_drop()
                    continue
                self._drop(reading[0], counted=True)   # the oldest (dicts keep the order)
            sock.setblocking(False)
            self.conns[sock] = _Conn(sock, time.monotonic() + REQUEST_SECONDS)
            self.sel.register(sock, selectors.EVENT_READ)

    def _serve(self, sock: socket.socket) -> None:
        conn = self.conns[sock]
        try:
            if conn.outbox is None:
                data = sock.recv(4096)
                if not data:
                    return self._drop(sock)
                conn.inbox += data
                end = conn.inbox.find(b"\r\n\r\n")
                if end < 0:
                    if len(conn.inbox) > MAX_REQUEST:
                        self._respond(conn, "431 Request Header Fields Too Large", b"", [])
                    return
                self._answer(conn, conn.inbox[:end].decode("latin-1"))
            if conn.outbox:
                conn.outbox = conn.outbox[sock.send(conn.outbox):]
            if conn.outbox == b"":
                self._drop(sock)
        except BlockingIOError:
            pass
        except OSError:
            self._drop(sock)

    def _answer(self, conn: _Conn, head: str) -> None:
        method = head.split(" ", 1)[0]
        if method not in ("GET", "HEAD"):
            return self._respond(conn, "405 Method Not Allowed", b"", ["Allow: GET, HEAD"])
        try:
            page = self.render(head)
        except Exception as exc:    # noqa: BLE001 - a scrape never ends the endpoint
            log.warning("metrics_listen: cannot render the metrics: %s", exc)
            return self._respond(conn, "500 Internal Server Error", b"", [])
        if page is None:
            return self._respond(conn, "503 Service Unavailable",
                                 b"" if method == "HEAD" else NOT_YET, ["Retry-After: 5"],
                                 length=len(NOT_YET))
        body, headers = page
        self._respond(conn, "200 OK", b"" if method == "HEAD" else body, headers,
                      length=len(body))

    def _respond(self, conn: _Conn, status: str, body: bytes, headers: list[str],
                 length: int | None = None) -> None:
        head = [f"HTTP/1.1 {status}", *headers,
                f"Content-Length: {len(body) if length is None else length}",
                "Connection: close", "", ""]
        conn.outbox = "\r\n".join(head).encode("latin-1") + body
        conn.deadline = time.monotonic() + SEND_SECONDS
        self.sel.modify(conn.sock, selectors.EVENT_WRITE)

    def _drop(self, sock: socket.socket, counted: bool = False) -> None:
        self.conns.pop(sock, None)
        try:
            self.sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        sock.close()
        if counted:
            self._count_drop()

    def _count_drop(self) -> None:
        self.dropped += 1
        self._warn("connections dropped (over the cap of "
                   f"{MAX_CONNECTIONS} at once, or idle or slow past their deadline)")

    def _warn(self, what: str) -> None:
        now = time.monotonic()
        if now - self.last_warned >= WARN_EVERY:
            log.warning("metrics_listen: %s; %d dropped so far", what, self.dropped)
            self.last_warned = now
