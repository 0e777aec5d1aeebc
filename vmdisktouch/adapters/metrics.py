"""Prometheus metrics (opt-in): a textfile for node_exporter, and/or a loopback HTTP endpoint.

``prometheus_client`` does the exposition: a registry of its own (not the
process-wide default, so no Python process metrics leak in) with one
collector that reports the last cycle of every disk served. Counters
(``*_total``) are summed here from each cycle's figures; a disk no longer
served (unplugged, its domain stopped) drops out of the next scrape.

* ``metrics_file``: written each cycle through ``outputs`` (checked path,
  atomic replacement, never fatal), for node_exporter's textfile collector.
* ``metrics_listen``: ``prometheus_client.start_http_server`` on a loopback
  address (``setting_parsers._loopback_listen`` refuses others), in a daemon
  thread of its own; the collector reads a snapshot swapped under a lock.
"""

from __future__ import annotations

import logging
import threading

from vmdisktouch.errors import ConfigError

log = logging.getLogger("vmdisktouch")

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
                self.server, _thread = pc.start_http_server(port, addr=host,
                                                            registry=self.registry)
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

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
