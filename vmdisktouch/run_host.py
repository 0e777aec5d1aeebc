"""``vmdisktouch run IMG IMG ...``: several disk images served by one process, one budget.

Each image is opened, locked (``image_lock``: no other daemon may serve it)
and built into its own ``DiskWatcher`` as a single image would be; a
``host.Host`` then runs their cycles under the one ``max_hold``. An image
that cannot be served at start (missing, unreadable, locked by another
daemon, refused by libvirt, named twice) is reported in one line and left
out; the others start. One that fails later is released and dropped while
the others go on (``host``).

Outputs: ``--status`` is one file for the host (a ``host`` object with the
budget, the sum held and each disk's share, and one entry per disk, each
as a single image's status); ``--map-png`` and ``--heat-png`` are per disk
and must contain ``{disk}``, replaced by the image's escaped path (as in a
unit instance name). ``--state-dir`` keeps one file per image. SIGHUP
re-reads the settings (the budget, the floor, ...) for every disk.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time

from vmdisktouch.adapters import outputs, sdnotify
from vmdisktouch.errors import ConfigError, ImageError, VmdtError
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


def check_outputs(config, npaths: int) -> None:
    for key in PER_DISK_OUTPUTS:
        value = config.get(key)
        if value and npaths > 1 and PLACEHOLDER not in value:
            raise ConfigError(f"--{key.replace('_', '-')} {value}: with several images it must "
                              f"contain {PLACEHOLDER} (each disk's PNG is its own file)")


def open_all(paths: list[str], args, stack: contextlib.ExitStack) -> list:
    """The images that can be served, opened and locked; one line for each left out."""
    images, seen = [], {}
    for p in paths:
        try:
            if args.uri:
                from vmdisktouch.adapters import lifecycle
                lifecycle.require_eligible(p, args.uri, args.force)
            img = stack.enter_context(open_image(p))
            key = image_lock.lock_name(os.fstat(img.fd))
            if key in seen:
                raise ImageError(f"{p}: the same image as {seen[key]}, named twice")
            stack.enter_context(image_lock.acquire(img))
        except VmdtError as exc:
            log.error("left out: %s", exc)
            continue
        seen[key] = p
        images.append(img)
    if not images:
        raise ImageError("no image can be served: " + ", ".join(paths))
    return images


def serve(args, config, config_path, cli_values, sig, load_settings) -> int:
    """Serve ``args.paths`` until a stop signal; ``load_settings`` is ``run``'s."""
    from vmdisktouch.build import build
    from vmdisktouch.host import Host
    from vmdisktouch.run import _Watchdog, protected_files

    check_outputs(config, len(args.paths))
    dog = _Watchdog()

    def pace(seconds: float) -> bool:
        dog.ping()
        return sig.sleep(min(seconds, dog.slice))

    with contextlib.ExitStack() as stack:
        images = open_all(args.paths, args, stack)
        watchers, keepers = [], []
        stack.callback(lambda: [w.close() for w in watchers])   # the ones still served
        for img in images:
            cfg = disk_config(config, img.path)
            protected = protected_files(img, config_path)
            outputs.check_paths(cfg, protected)
            w = build(img, cfg, sleep=pace, out=outputs.Outputs(protected))
            watchers.append(w)
            if config.state_dir:
                from vmdisktouch.adapters import warm_state
                k = warm_state.Keeper(config.state_dir, config.state_save_interval,
                                      w.clock, time.time)
                k.restore(w)
                keepers.append((w, k))
        host = Host(watchers, config.max_hold, config.block_size)
        watchers = host.watchers                 # a dropped disk is closed by the host
        status_out = outputs.Outputs([p for img in images
                                      for p in protected_files(img, config_path)])
        log.info("serving %d images under one budget of %s", len(watchers),
                 format_size(config.max_hold))

        def reload() -> None:
            sdnotify.reloading()
            try:
                new, warns, path, _ = load_settings(cli_values, args.config)
                check_outputs(new, len(args.paths))
            except ConfigError as exc:
                log.error("reload rejected, keeping the current settings: %s", exc)
            else:
                for w in warns:
                    log.warning("%s", w)
                for w in host.watchers:
                    w.reconfigure(disk_config(new, w.image.path))
                host.budget = new.max_hold
                nonlocal config
                config = new
                log.info("reloaded settings%s: one budget of %s, floor %s",
                         f" from {path}" if path else "", format_size(new.max_hold),
                         format_size(new.min_free))
            sdnotify.ready()

        def cycle():
            reports = host.tick()
            if config.status:
                st = host.status_obj([w.status_obj(w.last_report) for w in host.watchers
                                      if w.last_report is not None])
                status_out.write("status", config.status,
                                 (json.dumps(st, indent=2) + "\n").encode())
            for w, k in keepers:
                if w in host.watchers:
                    k.maybe_save(w)
            return reports

        try:
            return _loop(HostLoop(host, cycle), sig, reload, dog)
        finally:
            sdnotify.stopping()
            for w, k in keepers:
                if w in host.watchers:
                    k.save(w)
            log.info("released all holds")


def _loop(hl, sig, reload, dog) -> int:
    from vmdisktouch.host import NoDiskLeft
    from vmdisktouch.run import ERROR_THRESHOLD, _wait_for_next_cycle
    failures, ready = 0, False
    while not sig.stopping:
        started = hl.clock()
        try:
            hl.cycle()
            failures = 0
        except NoDiskLeft:
            raise
        except VmdtError as exc:
            failures += 1
            log.error("cycle failed (%d/%d): %s", failures, ERROR_THRESHOLD, exc)
            if failures >= ERROR_THRESHOLD:
                raise
        else:
            (sdnotify.status if ready else sdnotify.ready)(hl.status_line())
            ready = True
        dog.ping()
        _wait_for_next_cycle(hl, sig, reload, dog, started + hl.host.interval())
    log.info("received %s; releasing holds and exiting", sig.stop_name())
    return 0


class HostLoop:
    """What ``run``'s waiting between cycles needs of the host: a clock and a pump."""

    def __init__(self, host, cycle):
        self.host = host
        self.cycle = cycle

    def clock(self) -> float:
        return self.host.watchers[0].clock() if self.host.watchers else time.monotonic()

    def pump(self) -> None:
        for w in self.host.watchers:
            w.pump()

    def status_line(self) -> str:
        return (f"held {format_size(self.host.held_bytes())}/{format_size(self.host.budget)} "
                f"over {len(self.host.watchers)} disks, cycle {self.host.cycle}")


