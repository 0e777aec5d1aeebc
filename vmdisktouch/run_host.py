"""``vmdisktouch run IMG IMG ...`` and ``run --libvirt``: many disks, one process, one budget.

Each image is opened, locked (``image_lock``: no other daemon may serve it)
and built into its own ``DiskWatcher`` as a single image would be
(``Disks.open``); a ``host.Host`` runs their cycles under the one
``max_hold``. An image that cannot be served (missing, unreadable, locked by
another daemon, refused by libvirt, named twice) is reported in one line
and left out; one that fails later is released and dropped while the others
go on (``host``).

With ``--libvirt`` the set of disks is libvirt's (``follow``): before each
cycle the running domains' eligible disks are resynced; a disk that appears
(a domain started, a disk plugged) is opened and served, with its saved
heat when there is some (``warm_state``); one that goes (a domain stopped,
destroyed or migrated away, a disk unplugged) is released at once. Its
events wake the loop, so either is acted on within one cycle.

Outputs: ``--status`` is one file for the host (a ``host`` object with the
budget, the sum held and each disk's share, and one entry per disk, each
as a single image's status); ``--map-png`` and ``--heat-png`` are per disk
and must contain ``{disk}``, replaced by the image's escaped path (as in a
unit instance name). ``--state-dir`` keeps one file per image. SIGHUP
re-reads the settings (the budget, the floor, ...) for every disk.
"""

from __future__ import annotations

import logging
import os
import time

from vmdisktouch import configfile, overrides, settings
from vmdisktouch.adapters import outputs, sdnotify
from vmdisktouch.errors import ConfigError, ImageError, VmdtError
from vmdisktouch.report import status_bytes
from vmdisktouch.sizes import format_size
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image
from vmdisktouch.unitname import escape_path

log = logging.getLogger("vmdisktouch")

PLACEHOLDER = "{disk}"
PER_DISK_OUTPUTS = ("map_png", "heat_png")


def disk_config(config, path: str):
    """The settings of one disk: its own PNG paths, no status file of its own."""
    over = {"status": None}
    for key in PER_DISK_OUTPUTS:
        value = config.get(key)
        if value:
            over[key] = value.replace(PLACEHOLDER, escape_path(path))
    return type(config)(config, **over)


def check_outputs(config, several: bool) -> None:
    for key in PER_DISK_OUTPUTS:
        value = config.get(key)
        if value and several and PLACEHOLDER not in value:
            raise ConfigError(f"--{key.replace('_', '-')} {value}: with several images it must "
                              f"contain {PLACEHOLDER} (each disk's PNG is its own file)")


class Disks:
    """Opens, locks and builds the disks served; closes them (saving their warm state)."""

    def __init__(self, config, config_path, pace, *, uri: str = "", force: bool = False):
        self.config = config
        self.config_path = config_path
        self.pace = pace
        self.uri, self.force = uri, force
        self.locks: dict[int, image_lock.ImageLock] = {}     # id(watcher) ->
        self.keepers: dict[int, object] = {}
        self.keys: dict[str, str] = {}                       # lock name -> path served

    def open(self, path: str, check_libvirt: bool = True):
        """A watcher serving ``path``; VmdtError (one line) when it cannot be served."""
        from vmdisktouch.build import build
        from vmdisktouch.run import protected_files
        if check_libvirt and self.uri:
            from vmdisktouch.adapters import lifecycle
            lifecycle.require_eligible(path, self.uri, self.force)
        img = open_image(path)
        lock = None
        try:
            key = image_lock.lock_name(os.fstat(img.fd))
            if key in self.keys:
                raise ImageError(f"{path}: the same image as {self.keys[key]}, named twice")
            lock = image_lock.acquire(img)
            cfg = disk_config(self.config, img.path)
            protected = protected_files(img, self.config_path)
            outputs.check_paths(type(cfg)(cfg, status=self.config.status), protected)
            w = build(img, cfg, sleep=self.pace, out=outputs.Outputs(protected))
        except BaseException:
            if lock is not None:
                lock.release()
            img.close()
            raise
        self.keys[key] = path
        self.locks[id(w)] = lock
        w.emitter.cycles.label = f"{img.path}: "       # one log for many disks
        if self.config.state_dir:
            from vmdisktouch.adapters import warm_state
            k = warm_state.Keeper(self.config.state_dir, self.config.state_save_interval,
                                  w.clock, time.time)
            k.restore(w)
            self.keepers[id(w)] = k
        return w

    def maybe_save(self, watchers) -> None:
        for w in watchers:
            k = self.keepers.get(id(w))
            if k is not None:
                k.maybe_save(w)

    def close(self, w) -> None:
        """Save, release and close one disk (``Host``'s ``close``)."""
        k = self.keepers.pop(id(w), None)
        try:
            if k is not None:
                k.save(w)
            w.close()
        finally:
            w.image.close()
            lock = self.locks.pop(id(w), None)
            if lock is not None:
                lock.release()
            self.keys = {key: p for key, p in self.keys.items() if p != w.image.path}


def serve(args, config, config_path, cli_values, sig, load_settings) -> int:
    """Serve ``args.paths`` (or, with ``--libvirt``, libvirt's disks) until a stop signal;
    ``load_settings`` is ``run``'s."""
    from vmdisktouch.host import Host
    from vmdisktouch.run import _Watchdog

    follow = None
    if args.libvirt:
        from vmdisktouch.adapters.follow import LibvirtFollower
        if not args.uri:
            raise ConfigError("--libvirt needs a libvirt URI (--uri), not ''")
        follow = LibvirtFollower(args.uri, wake=sig)
    check_outputs(config, True if follow else len(args.paths) > 1)
    dog = _Watchdog()

    def pace(seconds: float) -> bool:
        dog.ping()
        return sig.sleep(min(seconds, dog.slice))

    disks = Disks(config, config_path, pace, uri=args.uri, force=args.force)
    host = Host([], config.max_hold, config.block_size, close=disks.close,
                may_be_empty=follow is not None, spill_factor=config.spill)
    metrics = None
    try:
        for p in ([] if follow else args.paths):
            try:
                host.add(disks.open(p))
            except VmdtError as exc:
                log.error("left out: %s", exc)
        if not follow and not host.watchers:
            raise ImageError("no image can be served: " + ", ".join(args.paths))
        status_out = outputs.Outputs([])
        if config.metrics_file or config.metrics_listen:
            from vmdisktouch.adapters.metrics import Metrics
            metrics = Metrics(config, status_out)
        log.info("%s", settings.in_force(config, config_path or ""))
        log.info("serving %s under one budget of %s",
                 "libvirt's running domains" if follow else f"{len(host.watchers)} images",
                 format_size(config.max_hold))
        syncer = _Sync(host, disks, follow, configfile.load_overrides(config_path)) \
            if follow else None

        def reload() -> None:
            nonlocal config
            sdnotify.reloading()
            try:
                new, warns, path, _ = load_settings(cli_values, args.config)
                check_outputs(new, True)
            except ConfigError as exc:
                log.error("reload rejected, keeping the current settings: %s", exc)
            else:
                for line in warns:
                    log.warning("%s", line)
                for w in host.watchers:
                    w.reconfigure(disk_config(new, w.image.path))
                if syncer is not None:
                    syncer.overrides = configfile.load_overrides(path)
                host.budget = new.max_hold
                host.spill_factor = new.spill
                disks.config = config = new
                log.info("reloaded settings%s: one budget of %s, floor %s",
                         f" from {path}" if path else "", format_size(new.max_hold),
                         format_size(new.min_free))
                log.info("%s", settings.in_force(new, path or ""))
            sdnotify.ready()

        def cycle():
            if syncer is not None:
                syncer.sync()
            reports = host.tick()
            if config.status or metrics is not None:
                st = host.status_obj([w.last_status for w in host.watchers
                                      if w.last_status is not None])
                if syncer is not None:
                    st["host"]["skipped"] = syncer.skipped_json()
                if config.status:
                    status_out.write("status", config.status, status_bytes(st))
                if metrics is not None:
                    metrics.publish(st["disks"], st["host"])
            if config.host_png:
                status_out.write("host_png", config.host_png, _overview(host))
            disks.maybe_save(host.watchers)
            return reports

        return _loop(HostLoop(host, cycle, config), sig, reload, dog)
    finally:
        sdnotify.stopping()
        if metrics is not None:
            metrics.close()
        host.close()
        if follow is not None:
            follow.close()
        log.info("released all holds")


def _overview(host) -> bytes:
    from vmdisktouch.adapters import host_render, render
    bands = []
    for w in host.watchers:
        resident, held = w.last_maps()
        bands.append(host_render.DiskBand(w.image.path, w.holder.held_bytes(), resident, held))
    return render.png_bytes(host_render.host_overview_image(bands, host.budget))


class _Sync:
    """Keeps the host's disks those libvirt's running domains use (``follow``)."""

    def __init__(self, host, disks: Disks, follow, overrides_=None):
        self.host, self.disks, self.follow = host, disks, follow
        self.overrides = overrides_ or {}
        self.skipped: dict = {}
        self.refused: dict[str, str] = {}     # path -> why it cannot be served (said once)

    def sync(self) -> None:
        want = self.follow.disks()
        if want is None:                       # libvirt unreachable: keep what is served
            return
        for path, disk in list(want.serve.items()):
            ov = overrides.for_disk(self.overrides, disk.domain, disk.target)
            if ov.exclude:
                del want.serve[path]
                want.skipped[(disk.domain, disk.target)] = "excluded by the config file"
            else:
                self.host.set_override(path, ov.weight, ov.cap)
        for key, why in want.skipped.items():
            if self.skipped.get(key) != why:
                log.info("libvirt: %s %s skipped: %s", key[0], key[1], why)
        self.skipped = dict(want.skipped)
        served = {w.image.path for w in self.host.watchers}
        for path in sorted(served - set(want.serve)):
            self.host.remove(path, "no running domain uses it any more")
        for path, disk in sorted(want.serve.items()):
            if path in served:
                continue
            try:
                w = self.disks.open(path, check_libvirt=False)
            except VmdtError as exc:
                if self.refused.get(path) != str(exc):
                    log.error("libvirt: %s %s not served: %s", disk.domain, disk.target, exc)
                    self.refused[path] = str(exc)
                continue
            self.refused.pop(path, None)
            self.host.add(w)
            log.info("libvirt: serving %s %s (%s)", disk.domain, disk.target, path)
        self.refused = {p: why for p, why in self.refused.items() if p in want.serve}

    def skipped_json(self) -> list[dict]:
        return [{"domain": d, "target": t, "reason": why}
                for (d, t), why in sorted(self.skipped.items())]


def _loop(hl, sig, reload, dog) -> int:
    from vmdisktouch.run import FailureStreak, _wait_for_next_cycle
    streak, ready = FailureStreak(), False     # NoDiskLeft is an ImageGoneError: raised
    while not sig.stopping:
        started = hl.clock()
        if streak.run(hl.cycle) is not None:
            (sdnotify.status if ready else sdnotify.ready)(hl.status_line())
            ready = True
        dog.ping()
        _wait_for_next_cycle(hl, sig, reload, dog, started + hl.interval())
    log.info("received %s; releasing holds and exiting", sig.stop_name())
    return 0


class HostLoop:
    """What ``run``'s waiting between cycles needs of the host: a clock and a pump."""

    def __init__(self, host, cycle, config):
        self.host = host
        self.cycle = cycle
        self.config = config

    def clock(self) -> float:
        return time.monotonic()

    def interval(self) -> float:
        return self.host.watchers[0].config.interval if self.host.watchers \
            else self.config.interval

    def pump(self) -> bool:
        woken = [w.pump() for w in self.host.watchers]    # every disk drains
        return any(woken)

    def status_line(self) -> str:
        return (f"held {format_size(self.host.held_bytes())}/{format_size(self.host.budget)} "
                f"over {len(self.host.watchers)} disks, cycle {self.host.cycle}")
