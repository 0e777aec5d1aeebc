"""``vmdisktouch run``: the daemon for one disk image.

Start-up: settings come from defaults < config file < flags
(``configfile.load_for_run``); a disk that libvirt opens with O_DIRECT is
refused unless ``--force`` (``lifecycle.require_eligible``); then the image is
opened and, when libvirt knows it, its domain is followed
(``lifecycle.LifecycleWatcher``): while the domain is shut off the holds are
released and no new ones are taken.

The loop ticks every ``interval`` seconds. Signals only set events, so a
cycle is never cut in half: SIGTERM/SIGINT stop (every hold is released on
the way out), SIGHUP reloads the config file between cycles, keeping the
holds (a smaller budget releases down to it; a bad file is rejected and the
old settings stay). A libvirt lifecycle change wakes the loop at once.

Under systemd (``Type=notify``): ``READY=1`` after the first cycle, a
``STATUS=`` line every cycle, ``WATCHDOG=1`` at least every half watchdog
period, even in the middle of a paced load.

The image vanishing or being replaced ends the daemon with a non-zero status
(systemd notices); any other per-cycle failure is logged and the next cycle
tries again, up to ``ERROR_THRESHOLD`` in a row.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

from vmdisktouch import configfile, sdnotify, settings
from vmdisktouch.errors import ConfigError, ImageGoneError, LockLimitError, VmdtError
from vmdisktouch.image import open_image
from vmdisktouch.libvirt_disks import DEFAULT_URI
from vmdisktouch.sizes import format_size

log = logging.getLogger("vmdisktouch")

# After this many consecutive failed cycles the daemon gives up (exit 1).
ERROR_THRESHOLD = 10


class _JournalFormatter(logging.Formatter):
    """Under systemd: no timestamps, syslog priority prefixes (sd-daemon(3))."""

    PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4,
                logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record):
        return f"<{self.PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def setup_logging(debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("vmdisktouch")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="disk image: raw/qcow2 file or block device")
    settings.add_arguments(parser)
    configfile.add_arguments(parser)
    parser.add_argument("--uri", default=DEFAULT_URI,
                        help=f"libvirt URI asked about the disk's cache mode and domain "
                             f"(default: {DEFAULT_URI}; '' to not ask libvirt)")
    parser.add_argument("--force", action="store_true",
                        help="hold a disk even though libvirt opens it with O_DIRECT "
                             "(cache=none/directsync or io=native)")


class _Watchdog:
    """Pings systemd's watchdog at most once a second, when it is enabled."""

    def __init__(self):
        self.period = sdnotify.watchdog_interval()
        self.last = 0.0

    @property
    def slice(self) -> float:
        """Longest wait between pings."""
        return self.period / 2 if self.period else 3600.0

    def ping(self) -> None:
        now = time.monotonic()
        if self.period and now - self.last >= min(1.0, self.period / 4):
            sdnotify.watchdog_ping()
            self.last = now


def status_line(report, budget: int) -> str:
    return (f"held {format_size(report.held_bytes)}/{format_size(budget)}, "
            f"rewritten {report.rewritten_blocks} blocks, cycle {report.cycle}")


def main(args) -> int:
    setup_logging(getattr(args, "debug", False))
    cli_values = {s.key: getattr(args, s.key) for s in settings.SETTINGS}
    config, warnings, config_path = configfile.load_for_run(cli_values, args.config)
    for w in warnings:
        log.warning("%s", w)
    if config_path:
        log.info("settings from %s", config_path)
    if args.uri:
        from vmdisktouch import lifecycle
        lifecycle.require_eligible(args.path, args.uri, args.force)
    from vmdisktouch.daemon import DiskWatcher  # numpy/scipy only once arguments are good

    stop = threading.Event()      # SIGTERM/SIGINT
    wake = threading.Event()      # end the wait between cycles early
    reload_asked = threading.Event()
    dog = _Watchdog()

    def on_stop(signum, _frame):
        log.info("received %s; releasing holds and exiting", signal.Signals(signum).name)
        stop.set()
        wake.set()

    def on_hup(_signum, _frame):
        reload_asked.set()
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_stop)
    signal.signal(signal.SIGHUP, on_hup)

    def pace(seconds: float) -> bool:     # the holder's sleep between paced loads
        dog.ping()
        return stop.wait(min(seconds, dog.slice))

    with open_image(args.path) as image:
        if image.format == "qcow2":
            log.warning("%s is qcow2: blocks are host-file offsets, not guest offsets",
                        image.path)
        watcher = DiskWatcher(image, config, sleep=pace)
        domain = None
        if args.uri:
            from vmdisktouch import lifecycle
            domain = lifecycle.start_watcher(args.path, args.uri, wake)

        def reload() -> None:
            sdnotify.reloading()
            try:
                new, warns, path = configfile.load_for_run(cli_values, args.config)
            except ConfigError as exc:
                log.error("reload rejected, keeping the current settings: %s", exc)
            else:
                for w in warns:
                    log.warning("%s", w)
                released = watcher.reconfigure(new)
                log.info("reloaded settings%s: budget %s, floor %s; released %s",
                         f" from {path}" if path else "", format_size(new.max_hold),
                         format_size(new.min_free), format_size(released))
            sdnotify.ready()

        try:
            return _loop(watcher, domain, stop, wake, reload_asked, reload, dog)
        finally:
            sdnotify.stopping()
            if domain is not None:
                domain.close()
            watcher.close()
            log.info("released all holds")


def _loop(watcher, domain, stop, wake, reload_asked, reload, dog) -> int:
    failures = 0
    ready = False
    while not stop.is_set():
        wake.clear()
        if reload_asked.is_set():
            reload_asked.clear()
            reload()
        started = watcher.clock()
        active = domain.domain_active() if domain is not None else None
        if active is False and watcher.hold_enabled:
            log.info("%s: its libvirt domain is not running; releasing the holds",
                     watcher.image.path)
        elif active is not False and not watcher.hold_enabled:
            log.info("%s: its libvirt domain is running; holding again", watcher.image.path)
        watcher.domain_active = active
        watcher.hold_enabled = active is not False
        try:
            report = watcher.tick()
            failures = 0
        except (ImageGoneError, LockLimitError):
            raise
        except VmdtError as exc:
            failures += 1
            log.error("cycle failed (%d/%d): %s", failures, ERROR_THRESHOLD, exc)
            if failures >= ERROR_THRESHOLD:
                raise
        else:
            line = status_line(report, watcher.config.max_hold)
            if not ready:
                sdnotify.ready(line)
                ready = True
            else:
                sdnotify.status(line)
        dog.ping()
        deadline = started + watcher.config.interval
        while not stop.is_set() and not wake.is_set():
            remaining = deadline - watcher.clock()
            if remaining <= 0:
                break
            wake.wait(min(remaining, dog.slice))
            dog.ping()
    return 0
