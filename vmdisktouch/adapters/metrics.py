"""Prometheus metrics (opt-in): a textfile for node_exporter, and/or a loopback HTTP endpoint.

``prometheus_client`` does the exposition: a registry of its own (not the
process-wide default, so no Python process metrics leak in) with one
collector that reports the last cycle of every disk served. Counters
(``*_total``) are summed here from each cycle's figures; a disk no longer
served (unplugged, its domain stopped) drops out of the next scrape.
Every metric and label is listed in docs/metrics.md.

Every series of a disk has three labels: ``disk`` (its image path),
``domain`` and ``target`` (its libvirt domain and disk target, "" when
libvirt does not know it), so a dashboard names disks as the operator does.
Why a disk holds less than it wants (``daemon.reasons``) is a state set in
the kube-state-metrics style: ``vmdisktouch_limited{reason=CODE}``, one
series per code, 1 for the reason now and 0 for the others (all 0 when it
holds all it wants), so ``vmdisktouch_limited == 1`` lists the limited disks
and a reason that goes away is a 0, not a vanished series. Not
prometheus_client's ``StateSetMetricFamily``: in the text format its label is
the metric's own name (``vmdisktouch_limited="budget"``), not ``reason``.
prometheus_client escapes the label values (``\\``, ``"``, newline): a domain
may be named anything libvirt allows.

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

# (metric, help, status key): gauges of the last cycle, per disk; a key the status gives
# as None or not at all is 0, but for ``wanted_bytes`` (before the first selection: no sample)
GAUGES = (
    ("held_bytes", "Bytes the daemon holds (mlocks) of the disk image.", "held_bytes"),
    ("budget_bytes", "The disk's share of the host budget: what it was given plus the free "
     "budget it could still take.", "budget_bytes"),
    ("wanted_bytes", "All the disk would hold: its candidate regions (blocks above the "
     "threshold, runs kept by hysteresis), whatever the budget.", "wanted_bytes"),
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
# every disk's series: its image path (``disk``), and its libvirt domain and target
# ("" when libvirt does not know the disk)
LABELS = ["disk", "domain", "target"]
# ``daemon.reasons.CODES`` (a lower layer may not import it; a unit test keeps them equal)
REASONS = ("domain_off", "no_evidence", "below_threshold", "budget", "cap", "weight", "floor",
           "cgroup", "lock_limit", "not_loaded")
# (metric, help, host key): gauges of the host
HOST_GAUGES = (
    ("host_budget_bytes", "The one budget shared by every disk served.", "budget_bytes"),
    ("host_held_bytes", "Bytes held over every disk served.", "held_bytes"),
    ("host_above_floor_bytes", "MemAvailable above the free-memory floor (min_free): what "
     "holds may still take from the host.", "above_floor_bytes"),
    ("host_disks", "Disks served (with a status yet or not).", "disks"),
)


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


def _labels(status: dict) -> list[str]:
    return [status["path"], status.get("domain") or "", status.get("target") or ""]


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
            self._totals = {p: t for p, t in self._totals.items() if p in live}
            for path, d in live.items():
                t = self._totals.setdefault(path, {name: 0 for name, _, _ in COUNTERS})
                for name, _, key in COUNTERS:       # "cycles" (no key) counts one a cycle
                    t[name] += 1 if key is None else int(_field(d, key) or 0)
                t["events_lost"] = int(d.get("events_lost") or 0)
            self._disks, self._host = live, host

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        with self._lock:
            disks, totals, host = dict(self._disks), dict(self._totals), self._host
        for name, text, key in GAUGES:
            g = GaugeMetricFamily(f"vmdisktouch_{name}", text, labels=LABELS)
            for d in disks.values():
                v = len(d.get("regions", [])) if key is None else _field(d, key)
                if v is not None or key != "wanted_bytes":
                    g.add_metric(_labels(d), float(v or 0))
            yield g
        for name, text, _ in COUNTERS + (EVENTS_LOST,):
            c = CounterMetricFamily(f"vmdisktouch_{name}", text, labels=LABELS)
            for path, d in disks.items():
                c.add_metric(_labels(d), totals[path][name])
            yield c
        limited = GaugeMetricFamily("vmdisktouch_limited", "Why the disk holds less than it "
                                    "wants (limited_by): 1 for the reason now, else 0.",
                                    labels=LABELS + ["reason"])
        info = GaugeMetricFamily("vmdisktouch_disk_info", "The access source and whether "
                                 "holding is on (1 per disk).",
                                 labels=LABELS + ["access_source", "holding"])
        for d in disks.values():
            now = d.get("limited_by")
            for code in REASONS + ((now,) if now and now not in REASONS else ()):
                limited.add_metric(_labels(d) + [code], float(code == now))
            info.add_metric(_labels(d) + [str(d.get("access_source", "")),
                                          str(bool(d.get("holding", True))).lower()], 1)
        yield from (limited, info)
        if host is not None:
            figures = {**host, "disks": len(host.get("disks") or ())}
            yield from (GaugeMetricFamily(f"vmdisktouch_{name}", text, value=float(figures[key]))
                        for name, text, key in HOST_GAUGES if figures.get(key) is not None)


class Metrics:
    """Publishes the collector: to ``metrics_file`` each cycle, on ``metrics_listen``."""

    def __init__(self, config, outputs):
        self.pc = pc = _import()
        self.outputs, self.path = outputs, config.metrics_file
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
