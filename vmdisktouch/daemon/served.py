"""The disks served: each opened, locked, checked, built and warmed; released and closed.

Every disk goes through ``Served.open`` whatever chose it (the command
line or libvirt): the image is opened and locked (``image_lock``: no other
daemon may serve it), named twice is refused, its outputs are checked
against every file no output may replace (``protected``: every image
served and the config file, one live list shared by every writer, so the
host's status file and each disk's PNGs are refused the same files), and
it is built into a ``DiskWatcher`` with its saved heat (``warm_state``).

``disk_config`` gives a disk its own PNG paths: with several disks the
``--map-png``/``--heat-png`` paths must contain ``{disk}``, replaced by the
image's escaped path (as in a unit instance name); one disk's may name a
plain path. The status file is the host's, one shape for 1..N disks,
written by the service from the cycle's report (docs/status.md).
"""

from __future__ import annotations

import logging
import os
import time

from vmdisktouch.adapters import outputs
from vmdisktouch.daemon import carry
from vmdisktouch.daemon.sources import restored_spill
from vmdisktouch.errors import ConfigError, ImageError
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image
from vmdisktouch.unitname import escape_path

log = logging.getLogger("vmdisktouch")

PLACEHOLDER = "{disk}"
PER_DISK_OUTPUTS = ("map_png", "heat_png")


DIRECT_MIN_SECONDS = 30.0    # between two looks for O_DIRECT openers of a disk, at least
DIRECT_COST = 1e-3           # and at most this share of a core spent looking (``DirectOpeners``)


class DirectOpeners:
    """The processes that open a disk's image with O_DIRECT (QEMU with cache=none,
    qemu-nbd --cache=none): what they read never comes from the page cache, so holding
    the image serves them nothing. Said in one warning when the disk is opened, and
    again for one that appears later: ``maybe_check`` looks again (a walk of
    ``/proc/*/fd``, ``io_watch.openers``: 3 ms here with 115 processes) after
    ``DIRECT_MIN_SECONDS``, or a thousand times the last look's time by the disks served
    when longer, so looking costs the daemon at most ``DIRECT_COST`` of a core whatever the
    host and however many disks it serves. vmdisktouch's own
    processes are left out (the daemon's miss probe opens the image O_DIRECT, and so
    may ``advise``'s)."""

    def __init__(self, path: str, clock=time.monotonic):
        self.path, self.clock = path, clock
        self.said: set[int] = set()
        self.next = 0.0
        self.check()

    def maybe_check(self, disks: int = 1) -> None:
        """Look again when it is time; ``disks``: how many disks look, each as often."""
        if self.clock() >= self.next:
            self.check(disks)

    def check(self, disks: int = 1) -> None:
        from vmdisktouch.system.observe import io_watch
        t0 = self.clock()
        direct = {pid for pid, d in io_watch.openers(self.path).items() if d}
        new = sorted(direct - self.said)
        self.said = direct               # one gone and back (a restart) is said again
        if new:
            who = " and ".join(f"{io_watch.process_name(pid)} (pid {pid})" for pid in new)
            log.warning("%s: %s open%s it with O_DIRECT: nothing %s reads comes from the "
                        "page cache; see `vmdisktouch advise`", self.path, who,
                        "s" if len(new) == 1 else "", "it" if len(new) == 1 else "they")
        took = self.clock() - t0
        self.next = self.clock() + max(DIRECT_MIN_SECONDS, took * disks / DIRECT_COST)


def disk_config(config, path: str):
    """The settings of one disk: its own PNG paths, and no status file (the host's, written
    by the service, is the only one)."""
    over = {"status": None}
    for key in PER_DISK_OUTPUTS:
        value = config.get(key)
        if value:
            over[key] = value.replace(PLACEHOLDER, escape_path(path))
    return type(config)(config, **over)


def check_placeholders(config, several: bool) -> None:
    for key in PER_DISK_OUTPUTS:
        value = config.get(key)
        if value and several and PLACEHOLDER not in value:
            raise ConfigError(f"--{key.replace('_', '-')} {value}: with several images it must "
                              f"contain {PLACEHOLDER} (each disk's PNG is its own file)")


def check_outputs(config, paths: list[str], protected: list[outputs.Protected]) -> None:
    """Refuse (``ConfigError``) an output path that names a protected file, at start and on
    every reload: the host's outputs, and each served disk's own PNG paths."""
    host_only = type(config)(config, map_png=None, heat_png=None)
    outputs.check_paths(host_only, protected)
    for path in paths:
        outputs.check_paths(type(config)(disk_config(config, path), status=config.status),
                            protected)


def config_protected(config_path: str | None) -> list[outputs.Protected]:
    p = outputs.Protected.of_path(config_path, f"the config file {config_path}") \
        if config_path else None
    return [p] if p is not None else []


class Served:
    """Opens, locks and builds the disks served; closes them (saving their warm state)."""

    def __init__(self, config, config_path, pace, check):
        self.config = config
        self.pace = pace                  # the holder's sleep between paced loads
        self.check = check                # membership's check of a path (O_DIRECT)
        self.protected = config_protected(config_path)   # the live list every writer shares
        self.locks: dict[int, image_lock.ImageLock] = {}     # id(watcher) ->
        self.keepers: dict[int, object] = {}
        self.saved: dict[int, object] = {}                   # id(watcher) -> its state read
        self.direct: dict[int, DirectOpeners] = {}           # id(watcher) -> its O_DIRECT users
        self.keys: dict[str, str] = {}                       # lock name -> path served
        self._images: dict[int, outputs.Protected] = {}

    def images(self) -> list[outputs.Protected]:
        """The images served now, as files no output may replace."""
        return list(self._images.values())

    def set_config(self, config, config_path: str | None) -> None:
        """A reload: the new settings, and the config file they came from."""
        self.config = config
        self.protected[:] = config_protected(config_path) + self.images()

    def open(self, path: str, carried: bool = False):
        """A watcher serving ``path``, its heat not started (``warm``); VmdtError (one
        line) when it cannot be served. Its warm state is read now, and with it or heat
        its domain carries (``carried``) the trace buffer is made for the restored
        selection's spill (``sources.restored_spill``), not grown while it records."""
        from vmdisktouch.daemon.build import build
        self.check(path)
        img = open_image(path)
        lock = None
        try:
            key = image_lock.lock_name(os.fstat(img.fd))
            if key in self.keys:
                raise ImageError(f"{path}: the same image as {self.keys[key]}, named twice")
            lock = image_lock.acquire(img)
            mine = outputs.Protected.of_fd(img.fd, f"the disk image {img.path}")
            check_outputs(self.config, [img.path], self.protected + [mine])
            saved = None
            if self.config.state_dir:          # closed to other users
                from vmdisktouch.adapters import warm_state
                warm_state.check_directory(self.config.state_dir)
                saved = warm_state.load(self.config.state_dir, img, self.config.block_size,
                                        time.time())
            cfg = disk_config(self.config, img.path)
            foreseen = restored_spill(cfg, img.size) if saved is not None or carried else 0
            w = build(img, cfg, sleep=self.pace, out=outputs.Outputs(self.protected),
                      foreseen_bytes=foreseen)
        except BaseException:
            if lock is not None:
                lock.release()
            img.close()
            raise
        if img.format == "qcow2":
            log.warning("%s is qcow2: blocks are host-file offsets, not guest offsets", img.path)
        self.direct[id(w)] = DirectOpeners(img.path)
        self.keys[key] = path
        self.saved[id(w)] = saved
        self.locks[id(w)] = lock
        self._images[id(w)] = mine
        self.protected.append(mine)
        return w

    def warm(self, w, carried=None, label: str = "") -> None:
        """Start ``w``'s heat from the local warm state or the heat its domain carries
        (``carried``, ``daemon.carry``), whichever is newer; from then on its state is
        saved (not before: an arriving disk's empty heat must not replace it)."""
        local = None
        if self.config.state_dir:
            from vmdisktouch.adapters import warm_state
            k = warm_state.Keeper(self.config.state_dir, self.config.state_save_interval,
                                  w.clock, time.time)
            local = k.restore(w, self.saved.pop(id(w), None))
            self.keepers[id(w)] = k
            w.warmed_from = None if local is None else "state"
        if carry.arrive(w, carried, local, time.time(), label or w.image.path):
            w.warmed_from = "metadata"

    def maybe_check_direct(self, w) -> None:
        """Say a process that opens ``w``'s image with O_DIRECT now (``DirectOpeners``)."""
        d = self.direct.get(id(w))
        if d is not None:
            d.maybe_check(len(self.direct))

    def maybe_save(self, w) -> None:
        """Save ``w``'s warm state when it is due (``warm_state.Keeper``)."""
        k = self.keepers.get(id(w))
        if k is not None:
            k.maybe_save(w)

    def close(self, w) -> None:
        """Save, release and close one disk (``Host``'s ``close``), and remove its PNGs: they
        picture holds that are gone, whether the disk was unplugged, its domain went or the
        daemon stops (docs/reference.md)."""
        k = self.keepers.pop(id(w), None)
        self.saved.pop(id(w), None)
        self.direct.pop(id(w), None)
        try:
            try:
                if k is not None:
                    k.save(w)
            finally:
                w.close()                  # released even when the save failed
        finally:
            for key in PER_DISK_OUTPUTS:
                if w.config.get(key):
                    w.outputs.remove(key, w.config.get(key))
            w.image.close()
            lock = self.locks.pop(id(w), None)
            if lock is not None:
                lock.release()
            mine = self._images.pop(id(w), None)
            if mine in self.protected:
                self.protected.remove(mine)
            self.keys = {key: p for key, p in self.keys.items() if p != w.image.path}
