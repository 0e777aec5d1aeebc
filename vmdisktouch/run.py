"""``vmdisktouch run``: the daemon for one disk image (several: ``run_host``).

Start-up: settings come from defaults < config file < flags
(``configfile.load_for_run``); a disk that libvirt opens with O_DIRECT is
refused unless ``--force`` (``lifecycle.require_eligible``); then the image is
opened and, when libvirt knows it, its domain is followed
(``lifecycle.LifecycleWatcher``): while the domain is shut off the holds are
released and no new ones are taken.

Before anything is held, the settings are checked against the host
(``settings.check_host``: a floor above the host's memory, a budget below
one block; a budget above the lock limit without CAP_IPC_LOCK) and every
output path against the image and the config file (``outputs``).

The loop ticks every ``interval`` seconds. Signal handlers only store a flag
and wake the loop through a pipe (``signals``: a handler that takes a lock
can deadlock the daemon), so a cycle is never cut in half: SIGTERM/SIGINT
stop (every hold is released on the way out; a paced load stops at once),
SIGHUP reloads the config file between cycles, keeping the holds (a smaller
budget releases down to it; a bad file or output path is rejected and the
old settings stay); any number of SIGHUPs before the loop looks is one
reload. A libvirt lifecycle change wakes the loop at once.

Under systemd (``Type=notify``): ``READY=1`` after the first cycle, a
``STATUS=`` line every cycle, ``WATCHDOG=1`` at least every half watchdog
period, even in the middle of a paced load.

The image vanishing or being replaced ends the daemon with exit 75 (systemd
restarts it on whatever the path names then); any other per-cycle failure is
logged and the next cycle tries again, up to ``ERROR_THRESHOLD`` in a row
(exit 1). A failed output write or an unreadable MemAvailable never ends it
(``outputs``, ``meminfo.FailSafe``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from vmdisktouch import configfile, settings
from vmdisktouch.system import image_lock, meminfo
from vmdisktouch.adapters import outputs, sdnotify
from vmdisktouch.errors import ConfigError, ImageGoneError, UsageError, VmdtError
from vmdisktouch.system.image import open_image
from vmdisktouch.system.signals import LoopSignals
from vmdisktouch.adapters.libvirt_disks import DEFAULT_URI
from vmdisktouch.sizes import format_size

log = logging.getLogger("vmdisktouch")

# After this many consecutive failed cycles the daemon gives up (exit 1).
ERROR_THRESHOLD = 10
PUMP_SECONDS = 1.0     # between cycles, trace events are drained this often


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
    parser.add_argument("paths", metavar="PATH", nargs="*",
                        help="disk image: raw/qcow2 file or block device; several share "
                             "one budget (max_hold), their regions ranked together")
    parser.add_argument("--libvirt", action="store_true",
                        help="serve every eligible disk of every running libvirt domain "
                             "(--uri), following them live, under one budget; no PATH")
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


def check_host(config) -> list[str]:
    """Refuse settings this host can never honour; return the warnings (see the docstring)."""
    try:
        total = meminfo.mem_total()
    except VmdtError as exc:
        return [f"{exc}: the budget and the floor are not checked against the host's memory"]
    warnings = settings.check_host(config, total)
    allowance = meminfo.memlock_allowance()
    if allowance is not None and config.max_hold > allowance:
        raise ConfigError(
            f"max_hold {format_size(config.max_hold)} is above this process's lock limit "
            f"(RLIMIT_MEMLOCK {format_size(allowance)}, no CAP_IPC_LOCK): raise the limit "
            "(systemd: LimitMEMLOCK=infinity), grant CAP_IPC_LOCK, or lower max_hold")
    return warnings


def protected_files(image, config_path: str | None) -> list[outputs.Protected]:
    """The files no output may replace: the image and the config file."""
    out = [outputs.Protected.of_fd(image.fd, f"the disk image {image.path}")]
    if config_path:
        p = outputs.Protected.of_path(config_path, f"the config file {config_path}")
        if p is not None:
            out.append(p)
    return out


def load_settings(cli_values, config_arg, image=None):
    """Settings from flags and file, checked against the host and (with an image) the outputs."""
    config, warnings, config_path = configfile.load_for_run(cli_values, config_arg)
    warnings = list(warnings) + check_host(config)
    protected = None
    if image is not None:
        protected = protected_files(image, config_path)
        outputs.check_paths(config, protected)
    return config, warnings, config_path, protected


def main(args) -> int:
    setup_logging(getattr(args, "debug", False))
    sig = LoopSignals().install()     # first: a SIGHUP or SIGTERM during start-up is kept
    try:
        return _start(args, sig)
    finally:
        sig.restore()


def _start(args, sig: LoopSignals) -> int:
    if bool(args.paths) == bool(args.libvirt):
        raise UsageError("run needs disk images (PATH ...) or --libvirt, not both"
                         if args.paths else "run needs a disk image (PATH) or --libvirt")
    cli_values = {s.key: getattr(args, s.key) for s in settings.SETTINGS}
    config, warnings, config_path, _ = load_settings(cli_values, args.config)
    for w in warnings:
        log.warning("%s", w)
    if len(args.paths) > 1 or args.libvirt:
        from vmdisktouch import run_host
        return run_host.serve(args, config, config_path, cli_values, sig, load_settings)
    args.path = args.paths[0]
    if args.uri:
        from vmdisktouch.adapters import lifecycle
        lifecycle.require_eligible(args.path, args.uri, args.force)

    with open_image(args.path) as image, image_lock.acquire(image):
        protected = protected_files(image, config_path)
        outputs.check_paths(config, protected)      # before anything is held
        if image.format == "qcow2":
            log.warning("%s is qcow2: blocks are host-file offsets, not guest offsets",
                        image.path)
        return _serve(args, image, config, protected, cli_values, sig, config_path)


def _serve(args, image, config, protected, cli_values, sig: LoopSignals,
           config_path: str | None = None) -> int:
    from vmdisktouch.build import build  # numpy only once the settings are good
    dog = _Watchdog()

    def pace(seconds: float) -> bool:     # the holder's sleep between paced loads
        dog.ping()
        return sig.sleep(min(seconds, dog.slice))

    watcher = build(image, config, sleep=pace, out=outputs.Outputs(protected))
    metrics = None
    keeper = None
    if config.state_dir:
        from vmdisktouch.adapters import warm_state
        keeper = warm_state.Keeper(config.state_dir, config.state_save_interval,
                                   watcher.clock, time.time)
        keeper.restore(watcher)
    domain = None
    try:
        if config.metrics_file or config.metrics_listen:
            from vmdisktouch.adapters.metrics import Metrics
            metrics = Metrics(config, watcher.outputs)
        if args.uri:
            from vmdisktouch.adapters import lifecycle
            domain = lifecycle.start_watcher(args.path, args.uri, sig)

        def reload() -> None:
            sdnotify.reloading()
            try:
                new, warns, path, prot = load_settings(cli_values, args.config, image)
            except ConfigError as exc:
                log.error("reload rejected, keeping the current settings: %s", exc)
            else:
                for w in warns:
                    log.warning("%s", w)
                log.info("%s", settings.in_force(new, path or ""))
                watcher.outputs.protected = prot
                released = watcher.reconfigure(new)
                log.info("reloaded settings%s: budget %s, floor %s; released %s",
                         f" from {path}" if path else "", format_size(new.max_hold),
                         format_size(new.min_free), format_size(released))
            sdnotify.ready()

        # once everything that may refuse has accepted: a refusal stays one line
        log.info("%s", settings.in_force(config, config_path or ""))
        return _loop(watcher, domain, sig, reload, dog, keeper, metrics)
    finally:
        sdnotify.stopping()
        if metrics is not None:
            metrics.close()
        if keeper is not None:
            keeper.save(watcher)
        if domain is not None:
            domain.close()
        watcher.close()
        log.info("released all holds")


def _loop(watcher, domain, sig: LoopSignals, reload, dog, keeper=None, metrics=None) -> int:
    streak = FailureStreak()
    ready = False
    while not sig.stopping:
        started = watcher.clock()
        active = domain.domain_active() if domain is not None else None
        if active is False and watcher.hold_enabled:
            log.info("%s: its libvirt domain is not running; releasing the holds",
                     watcher.image.path)
        elif active is not False and not watcher.hold_enabled:
            log.info("%s: its libvirt domain is running; holding again", watcher.image.path)
        watcher.domain_active = active
        watcher.hold_enabled = active is not False
        report = streak.run(watcher.tick)
        if report is not None and metrics is not None:
            metrics.publish([watcher.last_status])
        if report is not None:
            line = status_line(report, watcher.config.max_hold)
            if not ready:
                sdnotify.ready(line)
                ready = True
            else:
                sdnotify.status(line)
        if keeper is not None:
            keeper.maybe_save(watcher)
        dog.ping()
        _wait_for_next_cycle(watcher, sig, reload, dog, started + watcher.config.interval)
    log.info("received %s; releasing holds and exiting", sig.stop_name())
    return 0


class FailureStreak:
    """Failed cycles in a row: each logged, the ``ERROR_THRESHOLD``-th raised; an image
    gone (``ImageGoneError``) is raised at once."""

    def __init__(self):
        self.failures = 0

    def run(self, cycle):
        """``cycle()``'s result, or None when it failed and the loop goes on."""
        try:
            out = cycle()
        except ImageGoneError:
            raise
        except VmdtError as exc:
            self.failures += 1
            log.error("cycle failed (%d/%d): %s", self.failures, ERROR_THRESHOLD, exc)
            if self.failures >= ERROR_THRESHOLD:
                raise
            return None
        self.failures = 0
        return out


def _wait_for_next_cycle(watcher, sig: LoopSignals, reload, dog, deadline: float) -> None:
    """Sleep until ``deadline``; reload on SIGHUP meanwhile; return early on stop or wake-up,
    or when a disk's reads left what it holds (``core.shift``)."""
    while not sig.stopping:
        remaining = deadline - watcher.clock()
        if remaining <= 0:
            return
        if sig.wait(min(remaining, dog.slice, PUMP_SECONDS)):
            if not sig.take_reload():
                return                     # a stop, or libvirt woke us: act now
            reload()
        if watcher.pump():
            return
        dog.ping()
