"""Prometheus metrics (opt-in): a textfile for node_exporter, and/or a loopback HTTP endpoint.

``prometheus_client`` does the exposition: a registry of its own (not the
process-wide default, so no Python process metrics leak in) with one
collector that reports the last cycle of every disk served. Counters
(``*_total``) are summed here from each cycle's figures; a disk no longer
served (unplugged, its domain stopped) drops out of the next scrape.

* ``metrics_file``: written each cycle through ``outputs`` (checked path,
  atomic replacement, never fatal), for node_exporter's textfile collector.
* ``metrics_listen``: ``Endpoint``, a small HTTP/1.1 server on a loopback
  address (``setting_parsers._loopback_listen`` refuses others), in a daemon
  thread of its own; the collector reads a snapshot swapped under a lock and
  ``prometheus_client.generate_latest`` renders it.

Why not ``prometheus_client.start_http_server``: it runs one thread per
connection and waits for each client for ever, so ~1,000 idle loopback
connections (any local user can open them) took every descriptor of the
daemon at ``ulimit -n 1024``: /proc/meminfo could not be read (MemAvailable
taken as 0, every hold shed), the status and the watchdog pings stopped, and
its accept loop spun on EMFILE (issue 31, case 3). ``Endpoint`` is one
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
  listener for ``ACCEPT_REST`` seconds instead of spinning on it.

Dropped connections are logged at most once a minute, with their count. Any
path, GET or HEAD, answers the text format of ``generate_latest`` (gzipped
when the client accepts it), one request per connection; unlike
``start_http_server`` there is no OpenMetrics negotiation and no ``name[]``
filter (Prometheus scrapes the text format as well).
"""

from __future__ import annotations

import errno
import gzip
import logging
import selectors
import socket
import threading
import time

from vmdisktouch.errors import ConfigError

log = logging.getLogger("vmdisktouch")

MAX_CONNECTIONS = 32     # sockets open at once on the endpoint
REQUEST_SECONDS = 5.0    # to send the whole request, from the connection
SEND_SECONDS = 5.0       # to read the whole response
MAX_REQUEST = 8192       # bytes of request line and headers
ACCEPT_BURST = 64        # connections accepted per wake-up
ACCEPT_REST = 1.0        # the listener rests this long after accept failed (EMFILE...)
WARN_EVERY = 60.0        # seconds between two lines about dropped connections

# (metric, help, status key): gauges of the last cycle, per disk
GAUGES = (
    ("held_bytes", "Bytes the daemon holds (mlocks) of the disk image.", "held_bytes"),
    ("budget_bytes", "The disk's budget (its share of the host budget with several disks).",
     "budget_bytes"),
    ("resident_bytes", "Bytes of the image in the page cache, as last seen.", "resident_bytes"),
    ("regions", "Held regions.", None),
    ("cycle_seconds", "Duration of the disk's last cycle.", "cycle_seconds"),
    ("mem_available_bytes", "MemAvailable at the last cycle.", "mem_available_bytes"),
    ("size_bytes", "Size of the disk image.", "size_bytes"),
    ("spill_bytes", "Bytes of the regions ranked next past the budget, kept cached unlocked "
     "in the last cycle (trace source, --spill).", "spill.target_bytes"),
)
# (metric, help, status key summed each cycle)
COUNTERS = (
    ("cycles", "Cycles run.", None),
    ("loaded_bytes", "Bytes loaded and locked.", "loaded_bytes"),
    ("loaded_from_disk_bytes", "Of the bytes loaded, those not in the page cache before.",
     "loaded_from_disk_bytes"),
    ("released_bytes", "Bytes released (unlocked).", "released_bytes"),
    ("rewritten_blocks", "Blocks found rewritten by the guest (summed over cycles).",
     "rewritten_blocks"),
    ("spill_read_bytes", "Bytes the spill read from disk into the page cache.",
     "spill.read_bytes"),
)
# the source keeps this total itself: taken as it is, not summed
EVENTS_LOST = ("events_lost", "Trace events the kernel lost (each forces a mincore "
               "reconciliation).", "events_lost")


def _import():
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("metrics_file and metrics_listen need the prometheus_client "
                          "package: pip install 'vmdisktouch[metrics]'") from None
    return prometheus_client


def _field(status: dict, key: str):
    """``status[key]``; a dotted key names a field of a nested object (``spill.read_bytes``)."""
    for part in key.split("."):
        status = status.get(part) if isinstance(status, dict) else None
    return status


class Collector:
    """The figures of the last cycle of every disk, and the running totals."""

    def __init__(self):
        self._lock = threading.Lock()
        self._disks: dict[str, dict] = {}      # path -> last status
        self._totals: dict[str, dict] = {}     # path -> counter -> total
        self._host: dict | None = None

    def update(self, disks: list[dict], host: dict | None = None) -> None:
        with self._lock:
            live = {d["path"]: d for d in disks}
            for path in list(self._totals):
                if path not in live:
                    del self._totals[path]
            for path, d in live.items():
                t = self._totals.setdefault(path, {name: 0 for name, _, _ in COUNTERS})
                t["cycles"] += 1
                for name, _, key in COUNTERS:
                    if key:
                        t[name] += int(_field(d, key) or 0)
                t["events_lost"] = int(d.get("events_lost") or 0)
            self._disks, self._host = live, host

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        with self._lock:
            disks, totals, host = dict(self._disks), dict(self._totals), self._host
        for name, text, key in GAUGES:
            g = GaugeMetricFamily(f"vmdisktouch_{name}", text, labels=["disk"])
            for path, d in disks.items():
                g.add_metric([path], len(d.get("regions", [])) if key is None
                             else float(_field(d, key) or 0))
            yield g
        for name, text, _ in COUNTERS + (EVENTS_LOST,):
            c = CounterMetricFamily(f"vmdisktouch_{name}", text, labels=["disk"])
            for path, t in totals.items():
                c.add_metric([path], t[name])
            yield c
        info = GaugeMetricFamily("vmdisktouch_disk_info", "The access source and whether "
                                 "holding is on (1 per disk).",
                                 labels=["disk", "access_source", "holding"])
        for path, d in disks.items():
            info.add_metric([path, str(d.get("access_source", "")),
                             str(bool(d.get("holding", True))).lower()], 1)
        yield info
        if host is not None:
            yield GaugeMetricFamily("vmdisktouch_host_budget_bytes",
                                    "The one budget shared by every disk served.",
                                    value=float(host.get("budget_bytes", 0)))
            yield GaugeMetricFamily("vmdisktouch_host_held_bytes",
                                    "Bytes held over every disk served.",
                                    value=float(host.get("held_bytes", 0)))


class Metrics:
    """Publishes the collector: to ``metrics_file`` each cycle, on ``metrics_listen``."""

    def __init__(self, config, outputs):
        pc = _import()
        self.pc = pc
        self.outputs = outputs
        self.path = config.metrics_file
        self.collector = Collector()
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.server = None
        if config.metrics_listen:
            from vmdisktouch.config.parsers import split_listen
            host, port = split_listen(config.metrics_listen)
            try:
                self.server = Endpoint(host, port, self.render)
            except OSError as exc:
                raise ConfigError(f"metrics_listen {config.metrics_listen}: cannot listen: "
                                  f"{exc.strerror or exc}") from None
            log.info("metrics on http://%s/metrics", config.metrics_listen)

    @classmethod
    def wanted(cls, config, outputs) -> "Metrics | None":
        return cls(config, outputs) if config.metrics_file or config.metrics_listen else None

    def publish(self, disks: list[dict], host: dict | None = None) -> None:
        self.collector.update(disks, host)
        if self.path:
            self.outputs.write("metrics_file", self.path, self.pc.generate_latest(self.registry))

    def render(self, head: str) -> tuple[bytes, list[str]]:
        """The exposition and its headers, for a request whose header lines are ``head``."""
        body = self.pc.generate_latest(self.registry)
        headers = [f"Content-Type: {self.pc.CONTENT_TYPE_LATEST}"]
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept-encoding" and any(
                    e.split(";")[0].strip().lower() == "gzip" for e in value.split(",")):
                body = gzip.compress(body)
                headers.append("Content-Encoding: gzip")
                break
        return body, headers

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


class _Conn:
    __slots__ = ("sock", "inbox", "outbox", "deadline")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock, self.inbox, self.outbox, self.deadline = sock, b"", None, deadline


class Endpoint:
    """The loopback HTTP endpoint (see the module docstring): ``render(head)`` gives the
    body and headers of a GET; ``close()`` stops the thread and closes every socket."""

    def __init__(self, host: str, port: int, render):
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.sock = socket.socket(family, kind, proto)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(addr)
            self.sock.listen(128)
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

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            try:
                sock, _addr = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                self.sel.unregister(self.sock)    # no descriptor (or memory): rest, never spin
                self.resting_until = time.monotonic() + ACCEPT_REST
                self._warn(f"cannot accept a connection ({exc.strerror or exc})")
                return
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
            body, headers = self.render(head)
        except Exception as exc:    # noqa: BLE001 - a scrape never ends the endpoint
            log.warning("metrics_listen: cannot render the metrics: %s", exc)
            return self._respond(conn, "500 Internal Server Error", b"", [])
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
