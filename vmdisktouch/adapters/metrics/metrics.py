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

``vmdisktouch_disk_info`` is an info metric: its labels are what never
changes while the disk is served (its access source, chosen when it is
opened), so it is one series for the disk's life. A value that changes is a
gauge of its own: ``vmdisktouch_holding`` is 1 or 0 (as a label of the info
metric, each change of holding made a new series).

* ``metrics_file``: written each cycle through ``outputs`` (checked path,
  atomic replacement, never fatal), for node_exporter's textfile collector;
  removed by ``close()`` (the daemon stopping, its holds about to be
  released), so node_exporter drops the series instead of showing a stopped
  daemon's holds for ever. A SIGKILL runs no code: the file stays, and only
  its age (node_exporter's ``node_textfile_mtime_seconds``) tells.
* ``metrics_listen``: ``metrics_http.Endpoint``, a small HTTP/1.1 server on a
  loopback address, one thread and one ``selectors`` loop, bounded whatever
  its clients do (any local user can connect); ``render`` answers its requests.
* a socket systemd passed as ``metrics`` (systemd/vmdisktouch-metrics.socket,
  ``listen_fds``): the same ``Endpoint`` on it. The socket is made in the
  host's network namespace, so it is reachable under the unit's
  ``PrivateNetwork=yes``, where a ``metrics_listen`` socket is not (and
  ``RestrictAddressFamilies=AF_UNIX`` refuses to make one). It must listen on
  a loopback address, as ``metrics_listen`` must; with ``metrics_listen`` as
  well the start is refused (two endpoints, one of them unreachable under the
  unit, would hide which one Prometheus scrapes).

``start`` takes the passed socket and builds what the settings ask for.
"""

from __future__ import annotations

import errno
import gzip
import logging
import os
import platform
import socket
import threading

from vmdisktouch import __version__
from vmdisktouch.adapters import outputs
from vmdisktouch.adapters.systemd import listen_fds
from vmdisktouch.adapters.metrics.metrics_http import Endpoint, listen
from vmdisktouch.core.mrc import CURVE_POINTS
from vmdisktouch.errors import ConfigError
from vmdisktouch.report import CODES, UNSERVED, DiskReport, HostReport

log = logging.getLogger("vmdisktouch")

# (metric, help, status key): gauges of the last cycle, per disk; a key the status gives
# as None or not at all is 0, but for ``wanted_bytes`` (before the first selection: no sample)
GAUGES = (
    ("held_bytes", "Bytes the daemon holds (mlocks) of the disk image.", "held_bytes"),
    ("budget_bytes", "The disk's share of the host budget: what it was given plus the free "
     "budget it could still take.", "budget_bytes"),
    ("wanted_bytes", "All the disk would hold: its candidate regions (blocks above the "
     "threshold, runs kept by hysteresis), no more than its curve says still pays, "
     "whatever the budget.", "wanted_bytes"),
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
EVENTS_LOST = ("events_lost", "Trace events lost after the start's sizing of the buffer (each "
               "forces a mincore reconciliation): "
               "the kernel's count, and an estimate of those a buffer resize dropped.",
               "events_lost")
EVENTS_LOST_AT_START = ("events_lost_at_start", "Trace events lost while the buffer was "
                        "sized at start (expected; not in events_lost).", "trace.lost_at_start")
# every disk's series: its image path (``disk``), and its libvirt domain and target
# ("" when libvirt does not know the disk)
LABELS = ["disk", "domain", "target"]
# (metric, help, ``HostReport`` field): gauges of the host
HOST_GAUGES = (
    ("host_budget_bytes", "The one budget shared by every disk served.", "budget_bytes"),
    ("host_held_bytes", "Bytes held over every disk served.", "held_bytes"),
    ("host_above_floor_bytes", "MemAvailable above the free-memory floor (min_free): what "
     "holds may still take from the host.", "above_floor_bytes"),
    ("host_disks", "Disks served (with a status yet or not).", "lines"),
    ("host_reads_from_memory_ratio", "The share of every disk's reads served from memory "
     "in the last cycle, weighted by pages read (docs/status.md, \"Reads from memory\").",
     "from_memory.now"),
    ("host_reads_from_memory_next_gib_ratio", "That share with one GiB more held, given to "
     "the disk where it adds the most reads a second.", "from_memory.plus_gib"),
)
# (metric, help, status key): what memory served and would serve (trace source only)
CURVE_GAUGES = (
    ("cache_hit_ratio", "The share of the pages the guest read in the last cycle that "
     "needed no page added to the cache (a lower bound: readahead adds too).",
     "gain.cache_hit_ratio"),
    ("held_read_share", "The share of the last cycle's read events on held blocks.",
     "gain.held_read_share"),
    ("held_reads_per_second", "Read events on held blocks a second, last cycle.",
     "gain.held_reads_per_second"),
    ("reads_from_memory_ratio", "The share of the guest's reads served from memory in the "
     "last cycle, measured (docs/status.md, \"Reads from memory\").", "from_memory.now"),
    ("reads_from_memory_next_gib_ratio", "That share with one GiB more held: the measured "
     "share plus what the curve adds from what is held to a GiB more.",
     "from_memory.plus_gib"),
    ("next_gib_reads_per_second", "Reads a second one GiB more than what is held would "
     "serve from memory, from the curve.", "from_memory.more_reads_per_second"),
    ("curve_wants_bytes", "The memory that still pays, from the curve: past it a GiB more "
     "serves less than 2 % of the reads more (not to act on while curve_enough_reads is 0).",
     "gain.wants_bytes"),
    ("curve_reads", "The reads the curve stands on (decayed: a half-life of 10 minutes).",
     "mrc.reads"),
    ("curve_re_reads", "The re-reads among them: the reuse the curve has seen.",
     "mrc.re_reads"),
    ("curve_window_seconds", "The window those reads span.", "mrc.window_seconds"),
    ("curve_enough_reads", "1 when the curve has enough reads to say a size (a budget "
     "verdict), else 0: \"not enough reads yet\".", "mrc.enough_reads"),
    ("miss_cost_seconds", "What a read the cache misses waits on this disk: the median of "
     "cycles' means of the guest's own misses, timed, or where it missed too little of "
     "timed O_DIRECT reads of pages not cached.", "miss_cost.seconds"),
    ("read_seconds_saved_per_second", "Read time held blocks saved the guest a second, last "
     "cycle: reads on held blocks times the miss cost, at most the guest's queue depth.",
     "gain.read_seconds_saved_per_second"),
)
# FileDescriptorName= of systemd/vmdisktouch-metrics.socket
PASSED_NAME = "metrics"


def _import():
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError("metrics_file, metrics_listen and vmdisktouch-metrics.socket need "
                          "the prometheus_client package: pip install 'vmdisktouch[metrics]' "
                          "(Debian: python3-prometheus-client)") from None
    return prometheus_client


# The series one disk adds to a scrape, at most: its gauges, counters and the gauge of
# when events were lost; a reason each (and one more for a code not in CODES); holding,
# adopted since, the two adopted gains, the info metric; the curve's points and its gauges.
# Bounded by the code, not by the disk, so a scrape of a hundred disks stays small
# (docs/metrics.md#the-size-of-a-scrape).
SERIES_A_DISK = (len(GAUGES) + len(COUNTERS) + 2 + 1 + len(CODES) + 1 + 1 + 1 + 2 + 1
                 + CURVE_POINTS + len(CURVE_GAUGES))


def _labels(d: DiskReport) -> list[str]:
    return [d.path, d.domain or "", d.target or ""]


class Collector:
    """The figures of the last cycle of every disk, and the running totals."""

    def __init__(self):
        self._lock = threading.Lock()
        self._disks: dict[str, DiskReport] = {}   # path -> its last report
        self._totals: dict[str, dict] = {}        # path -> counter -> total
        self._host: HostReport | None = None

    def update(self, report: HostReport) -> None:
        with self._lock:
            live = {d.path: d for d in report.disks}
            self._totals = {p: t for p, t in self._totals.items() if p in live}
            for path, d in live.items():
                t = self._totals.setdefault(path, {name: 0 for name, _, _ in COUNTERS})
                for name, _, key in COUNTERS:       # "cycles" (no key) counts one a cycle
                    t[name] += 1 if key is None else int(d.value(key) or 0)
                t["events_lost"] = int(d.events_lost or 0)
                t["events_lost_at_start"] = int(d.value("trace.lost_at_start") or 0)
            self._disks, self._host = live, report

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        with self._lock:
            disks, totals, host = dict(self._disks), dict(self._totals), self._host
        build = GaugeMetricFamily("vmdisktouch_build_info", "The daemon's version and "
                                  "Python's (1).", labels=["version", "python"])
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        for name, text, key in GAUGES:
            g = GaugeMetricFamily(f"vmdisktouch_{name}", text, labels=LABELS)
            for d in disks.values():
                v = len(d.regions) if key is None else d.value(key)
                if v is not None or key != "wanted_bytes":
                    g.add_metric(_labels(d), float(v or 0))
            yield g
        for name, text, _ in COUNTERS + (EVENTS_LOST, EVENTS_LOST_AT_START):
            c = CounterMetricFamily(f"vmdisktouch_{name}", text, labels=LABELS)
            for path, d in disks.items():
                c.add_metric(_labels(d), totals[path][name])
            yield c
        lost_at = GaugeMetricFamily("vmdisktouch_events_lost_timestamp_seconds", "When a "
                                    "cycle last lost trace events (Unix time; no sample: "
                                    "never since the disk was served).", labels=LABELS)
        for d in disks.values():
            at = d.value("trace.lost_at")
            if at is not None:
                lost_at.add_metric(_labels(d), float(at))
        yield lost_at
        limited = GaugeMetricFamily("vmdisktouch_limited", "Why the disk holds less than it "
                                    "wants (limited_by): 1 for the reason now, else 0.",
                                    labels=LABELS + ["reason"])
        holding = GaugeMetricFamily("vmdisktouch_holding", "1 while holding is on, 0 while "
                                    "it is off (its libvirt domain shut off).", labels=LABELS)
        adopted = GaugeMetricFamily("vmdisktouch_adopted_since_timestamp_seconds", "When "
                                    "vmdisktouch adopt switched the disk to the page cache "
                                    "(Unix time; no sample: not adopted).", labels=LABELS)
        gain = GaugeMetricFamily("vmdisktouch_adopted_gain_ratio", "An adopted disk's "
                                 "guest mean I/O time before the switch over since "
                                 "(measured), and advise's forecast of it (advised); no "
                                 "sample: not adopted or not measured yet.",
                                 labels=LABELS + ["kind"])
        info = GaugeMetricFamily("vmdisktouch_disk_info", "The disk's access source, fixed "
                                 "while it is served (1 per disk).",
                                 labels=LABELS + ["access_source"])
        for d in disks.values():
            now = d.limited_by
            for code in CODES + ((now,) if now and now not in CODES else ()):
                limited.add_metric(_labels(d) + [code], float(code == now))
            holding.add_metric(_labels(d), float(bool(d.holding)))
            info.add_metric(_labels(d) + [str(d.access_source)], 1)
            if isinstance(d.adopted_since, (int, float)):
                adopted.add_metric(_labels(d), float(d.adopted_since))
            for kind, v in (("measured", d.adopted_gain), ("advised", d.advised_gain)):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    gain.add_metric(_labels(d) + [kind], float(v))
        yield from (limited, holding, adopted, gain, info)
        yield from _curve_families(disks.values())
        if host is not None:
            yield _unserved_family(host.skipped or ())
            for name, text, key in HOST_GAUGES:
                head, _, part = key.partition(".")
                v = getattr(host, head)
                v = len(v) if isinstance(v, list) else v
                v = (v or {}).get(part) if part else v
                if v is not None:
                    yield GaugeMetricFamily(f"vmdisktouch_{name}", text, value=float(v))


def _unserved_family(skipped):
    """Each disk of a running domain not served (``HostReport.skipped``): 1, its reason a
    code of ``report.UNSERVED`` ("other" for any else), so the series stay as few as the
    disks."""
    from prometheus_client.core import GaugeMetricFamily
    g = GaugeMetricFamily("vmdisktouch_disk_unserved", "A disk of a running libvirt domain "
                          "the host service does not serve, with why (1 per disk).",
                          labels=["domain", "target", "reason"])
    for s in skipped:
        code = s.get("code")
        g.add_metric([str(s["domain"]), str(s["target"]),
                      code if code in UNSERVED else "other"], 1)
    return g


def _curve_families(disks):
    """The miss-ratio curve at its sizes (``size_bytes`` label), and the gain (trace
    source's disks only: a mincore disk has no series here)."""
    from prometheus_client.core import GaugeMetricFamily
    curve = GaugeMetricFamily("vmdisktouch_curve_hit_ratio", "The disk's miss-ratio curve: "
                              "the share of the guest's reads an LRU page cache of "
                              "size_bytes would serve (sampled reuse distances).",
                              labels=LABELS + ["size_bytes"])
    gains = [(GaugeMetricFamily(f"vmdisktouch_{name}", text, labels=LABELS), key)
             for name, text, key in CURVE_GAUGES]
    for d in disks:
        for size, ratio in d.curve or ():
            curve.add_metric(_labels(d) + [str(int(size))], float(ratio))
        for g, key in gains:
            v = d.value(key)
            if v is not None:
                g.add_metric(_labels(d), float(v))
    yield curve
    yield from (g for g, _ in gains)


def start(config, outputs) -> "Metrics | None":
    """The metrics the settings and systemd ask for, None when none are: ``metrics_file``,
    ``metrics_listen``, a socket passed as ``metrics`` (taken here, whatever is asked)."""
    sock = passed_socket()
    if not (config.metrics_file or config.metrics_listen or sock):
        return None
    try:
        return Metrics(config, outputs, sock)
    except BaseException:
        if sock is not None:
            sock.close()
        raise


def passed_socket() -> socket.socket | None:
    """The listening socket systemd passed as ``metrics``, checked (a TCP socket on a
    loopback address), or None; a descriptor passed under another name is closed."""
    ours = []
    for fd, name in listen_fds.take():
        if name == PASSED_NAME:
            ours.append(fd)
        else:
            log.warning("socket activation: descriptor %d named %r closed: only %r is served",
                        fd, name, PASSED_NAME)
            os.close(fd)
    if len(ours) > 1:
        for fd in ours:
            os.close(fd)
        raise ConfigError(f"socket activation: {len(ours)} sockets named {PASSED_NAME!r} "
                          "passed, the endpoint serves one: one ListenStream= in "
                          "vmdisktouch-metrics.socket")
    if not ours:
        return None
    sock = listen_fds.stream_listener(ours[0], PASSED_NAME)
    from vmdisktouch.config.settings import is_loopback
    if not is_loopback(sock.getsockname()[0]):
        url = _url(sock)
        sock.close()
        raise ConfigError(f"the socket passed as {PASSED_NAME!r} listens on {url}, not on a "
                          "loopback address: the endpoint has no authentication; use "
                          "ListenStream=127.0.0.1:PORT (and node_exporter's textfile "
                          "collector, metrics_file, or a proxy for a remote Prometheus)")
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


class Metrics:
    """Publishes the collector: to ``metrics_file`` each cycle; on ``metrics_listen`` or
    on ``passed``, the listening socket systemd passed (``start`` takes it)."""

    def __init__(self, config, outputs, passed: socket.socket | None = None):
        if passed is not None and config.metrics_listen:
            raise ConfigError(f"metrics_listen {config.metrics_listen} and a socket passed by "
                              f"systemd ({_url(passed)}): serve one; remove metrics_listen "
                              "(under the unit only the socket can be reached) or stop "
                              "vmdisktouch-metrics.socket")
        self.pc = pc = _import()
        self.outputs, self.path = outputs, config.metrics_file
        self.collector = Collector()
        self.registry = pc.CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.server = None
        self._cycle, self._page = 0, (-1, b"", None)   # (cycle, text, gzipped) last rendered
        if passed is not None:
            self.server = Endpoint(passed, self.render)
            log.info("metrics on %s (a socket passed by systemd)", _url(passed))
        elif config.metrics_listen:
            from vmdisktouch.config.settings import split_listen
            host, port = split_listen(config.metrics_listen)
            try:
                sock = listen(host, port)
            except OSError as exc:
                hint = ("; under the unit (RestrictAddressFamilies=AF_UNIX, PrivateNetwork=yes) "
                        "enable vmdisktouch-metrics.socket instead"
                        if exc.errno == errno.EAFNOSUPPORT else "")
                raise ConfigError(f"metrics_listen {config.metrics_listen}: cannot listen: "
                                  f"{exc.strerror or exc}{hint}") from None
            from vmdisktouch.config.settings import is_loopback
            if not is_loopback(sock.getsockname()[0]):     # a name resolved otherwise since
                url = _url(sock)
                sock.close()
                raise ConfigError(f"metrics_listen {config.metrics_listen} listened on {url}, "
                                  "not on a loopback address: the endpoint has no "
                                  "authentication; use 127.0.0.1 or ::1")
            self.server = Endpoint(sock, self.render)
            log.info("metrics on http://%s/metrics", config.metrics_listen)

    def publish(self, report: HostReport) -> None:
        self.collector.update(report)
        self._cycle += 1                     # after the update: a page of it is rendered anew
        if self.path:
            self.outputs.write("metrics_file", self.path, self.page())

    def page(self, packed: bool = False) -> bytes:
        """The exposition of the last cycle published (``packed``: gzipped). Rendered once a
        cycle, and gzipped at most once, since the collector changes only when a cycle is
        published: scrapes back to back cost a send each, not a render and a compression
        (scrapes in a loop cost 99 % of a core). A cycle published while it renders is rendered again at
        the next request."""
        cycle, text, gz = self._page
        if cycle != self._cycle:
            cycle, gz = self._cycle, None
            text = self.pc.generate_latest(self.registry)
        if packed and gz is None:
            gz = gzip.compress(text)
        self._page = (cycle, text, gz)
        return gz if packed else text

    def render(self, head: str) -> tuple[bytes, list[str]] | None:
        """The exposition and its headers, for a request whose header lines are ``head``;
        None before the first cycle is published, since a page without samples would be a
        scrape that succeeded with no series (the endpoint answers 503)."""
        if self._cycle == 0:
            return None
        body = self.page()
        headers = [f"Content-Type: {self.pc.CONTENT_TYPE_LATEST}"]
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept-encoding" and any(
                    e.split(";")[0].strip().lower() == "gzip" for e in value.split(",")):
                body = self.page(packed=True)
                headers.append("Content-Encoding: gzip")
                break
        return body, headers

    def close(self) -> None:
        """Stop the endpoint; remove the metrics file (the daemon is stopping: a file left
        would show its holds for ever). Never raises for the file: logged."""
        if self.server is not None:
            self.server.close()
            self.server = None
        if self.path:
            try:
                outputs.remove(self.path, "metrics_file", self.outputs.protected)
            except OSError as exc:
                log.warning("cannot remove --metrics-file %s: %s; node_exporter shows its "
                            "last figures until it is removed", self.path, exc.strerror or exc)
