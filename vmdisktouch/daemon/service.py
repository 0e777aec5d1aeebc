"""The one runtime: ``vmdisktouch run`` for one disk image or many, or libvirt's disks.

Theory of operation
-------------------
Whatever it serves, the daemon is a host (``daemon.host``) whose disks come
from one membership (``daemon.membership``): the paths given, their owning
domains followed, or libvirt's running domains. A single disk is a host of
one. Everything below is written once and applies in every mode.

Start-up: the settings (``load_settings``: defaults < config file < flags,
checked against the host: a floor above the host's memory, a budget below
one block or above the lock limit without CAP_IPC_LOCK); the disks opened
(``served``: locked, refused with O_DIRECT unless ``--force``, their outputs
checked against every image served and the config file before anything is
held, warmed from ``--state-dir``). A path that cannot be served is left
out in one line; when none can, the daemon does not start.

The loop: ``while not stopping: cycle; wait``. A cycle resyncs the
membership (a disk that appears is opened, one that goes is released; a
domain shut off releases its disks' holds until it starts again) and runs
``Host.tick``; then the one report of the cycle (``report.HostReport``):
the status file, in one shape for 1..N disks (docs/status.md), the metrics, the host PNG, the warm state and the heat each domain carries
in its metadata (``daemon.carry``). Signal handlers only store a
flag and wake the loop through a pipe (``signals``), so a cycle is never cut
in half: SIGTERM/SIGINT stop (every hold released on the way out), SIGHUP
reloads between cycles keeping the holds (``reload``: the same checks as at
start, a bad file or output path rejected and the old settings kept). A
libvirt event wakes the loop at once; between cycles trace events are
drained once a second, and a drain whose reads left what is held starts the
next cycle now (``core.shift``). While a disk's domain is arriving the next
cycle comes after ``ARRIVAL_POLL`` seconds, not the interval: QEMU's resume
can come a few milliseconds after the incoming started, before that
cycle's listing could see it and after its event woke the loop, and the
guest waits for what the carried heat would hold. An open of an image given
by path that no domain uses wakes the loop too (``membership.GivenPaths``:
a domain may be taking it); libvirt is asked at once, and the cycle runs
now only when the answer changes what is held, else at its time.

Under systemd (``Type=notify``): ``READY=1`` after the first cycle, a
``STATUS=`` line every cycle, ``WATCHDOG=1`` at least every half watchdog
period, even in the middle of a paced load.
"""

from __future__ import annotations

import logging
import re
import time

from vmdisktouch.adapters.systemd import journal, sdnotify
from vmdisktouch.adapters import outputs, qemu_socket, runtime_dir
from vmdisktouch.config import file as configfile
from vmdisktouch.config import overrides, settings
from vmdisktouch.daemon import adoption, arrival, carry
from vmdisktouch.daemon import served as served_mod
from vmdisktouch.daemon.budgetlog import BudgetLog
from vmdisktouch.daemon.emit import status_bytes
from vmdisktouch.daemon.host import Host
from vmdisktouch.daemon.membership import GivenPaths, Member, RunningDomains
from vmdisktouch.daemon.record import Recorder
from vmdisktouch.errors import ConfigError, ImageError, VmdtError
from vmdisktouch.sizes import counted, format_size
from vmdisktouch.system import meminfo

log = logging.getLogger("vmdisktouch")

PUMP_SECONDS = 1.0     # between cycles, trace events are drained this often
ARRIVAL_POLL = 0.5     # the next cycle, while a disk's domain is arriving (see above)


class Watchdog:
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


def load_settings(cli_values, config_arg):
    """(config, warnings, config path): the settings from flags and file, checked against
    the host."""
    config, warnings, config_path = configfile.load_for_run(cli_values, config_arg)
    return config, list(warnings) + check_host(config), config_path


def membership(args, wake):
    """The paths given, or libvirt's running domains (``--libvirt``); libvirt's events set
    ``wake``."""
    watch = None
    if args.uri:
        from vmdisktouch.adapters.libvirt.libvirt_watch import LibvirtWatch
        watch = LibvirtWatch(args.uri, wake=wake)
    if args.libvirt:
        if watch is None:
            raise ConfigError("--libvirt needs a libvirt URI (--uri), not ''")
        from vmdisktouch.adapters.libvirt import libvirt_disks
        try:        # unlike an unreachable libvirtd, a module missing does not come back
            libvirt_disks.import_libvirt()
        except libvirt_disks.LibvirtError as exc:
            raise ConfigError(f"--libvirt: {exc}") from None
        return RunningDomains(watch)
    return GivenPaths(args.paths, watch, args.force)


class Service:
    """The daemon's state between cycles: its settings, disks, host and outputs."""

    def __init__(self, args, config, config_path, cli_values, sig):
        self.args, self.cli_values, self.sig = args, cli_values, sig
        self.config, self.config_path = config, config_path
        self.members = membership(args, sig)
        self.single = isinstance(self.members, GivenPaths) and len(args.paths) == 1
        served_mod.check_placeholders(config, not self.single)
        self.dog = Watchdog()
        self.served = served_mod.Served(config, config_path, self.pace, self.members.check)
        self.follower = arrival.Follower(self._warm, self.single)
        self.host = Host([], config.max_hold, config.block_size, close=self._close_disk,
                         may_be_empty=self.members.retry, spill_factor=config.spill,
                         recorder=Recorder.from_env())
        self.out = outputs.Outputs(self.served.protected)
        self.rules = configfile.load_rules(config_path)
        self.skipped: dict = {}
        self.refused: dict[str, str] = {}     # path -> why it cannot be served (said once)
        self._first_error: VmdtError | None = None
        self.metrics = None
        self.last_report = None               # the last cycle's ``report.HostReport``
        self.colour_book = None               # the host PNG's disk colours, frame to frame
        self.budget_log = BudgetLog()
        watch = getattr(self.members, "watch", None)
        self.carrier = None if watch is None else carry.Carrier(watch, config.carry_interval)
        self.started = False
        self.default_status: str | None = None    # ``runtime_dir``: written without --status
        self.adopted: dict[str, str] = {}     # path -> DOMAIN/TARGET or SOCKET DRIVE: served,
        #                                       adopted (``adoption``: judged, released at stop)
        self.adopter = adoption.Adopter(args.uri)    # and [adopt]'s own adoptions (--libvirt)

    def pace(self, seconds: float) -> bool:
        """The holder's sleep between paced loads: the watchdog is fed, a stop ends it."""
        self.dog.ping()
        return self.sig.sleep(min(seconds, self.dog.slice))

    # -- start and stop ----------------------------------------------------

    def start(self) -> None:
        """Open what the membership serves now; refuse to start when a path given cannot
        be served at all (one path: its own error). The outputs are checked against the
        paths given before any is opened: a path that names one refuses the start."""
        if isinstance(self.members, GivenPaths):
            given = [outputs.Protected.of_path(p, f"the disk image {p}") for p in self.args.paths]
            self._default_status(self.served.protected + [g for g in given if g])
            served_mod.check_outputs(self.config, self.args.paths,
                                     self.served.protected + [g for g in given if g])
            want = self.members.want()          # each one's domain, arriving or not
            for path in self.args.paths:        # in the order given, a path named twice too
                self._open(path, want.serve.get(path, Member(path)))
        else:
            self._default_status(self.served.protected)
        self.sync()
        if isinstance(self.members, GivenPaths) and not self.host.watchers:
            if self.single:
                raise self._first_error
            raise ImageError("no image can be served: " + ", ".join(self.args.paths))
        served_mod.check_outputs(self.config, [w.image.path for w in self.host.watchers],
                                 self.served.protected)
        try:
            meminfo.keep_open()    # read by pread from now on: no client can starve it
        except VmdtError:
            pass                   # FailSafe says so at the first cycle
        from vmdisktouch.adapters.metrics.metrics import start as start_metrics
        self.metrics = start_metrics(self.config, self.out)  # or a socket systemd passed
        log.info("%s", settings.in_force(self.config, self.config_path or ""))
        self.started = True
        if not self.single:
            log.info("serving %s under one budget of %s",
                     "libvirt's running domains" if self.members.retry
                     else counted(len(self.host.watchers), "image"),
                     format_size(self.config.max_hold))

    def _default_status(self, protected) -> None:
        """No ``--status``: one in the runtime directory, so ``status`` sees this daemon
        (``adapters.runtime_dir``); where it cannot be written, said once, and none."""
        if self.config.status:
            return
        path, why = runtime_dir.default_status(list(self.args.paths), bool(self.args.libvirt),
                                               protected)
        if path is None:
            log.info("`vmdisktouch status` cannot see this daemon: %s (give --status FILE)",
                     why)
            return
        self.default_status = path
        self.config = with_status(self.config, path)

    def _close_disk(self, w) -> None:
        self.follower.closed(w)
        self.served.close(w)

    def close(self) -> None:
        sdnotify.stopping()
        try:
            if self.metrics is not None:
                self.metrics.close()
            self.host.close()
        finally:
            self.members.close()
        self.adopter.close()
        stopping = set(self.adopted.values()) | self.adopter.adopted
        if stopping:                # holds gone: the disks go back to O_DIRECT with them
            for line in adoption.release_when_stopping(self.args.uri, sorted(stopping)):
                log.info("%s", line)
        if self.started:
            log.info("released all holds")
            if self.config.status and self.last_report is not None:
                # The last cycle's file would say what is held: it says it stopped.
                self.out.write("status", self.config.status,
                               status_bytes(self.last_report.stopped_at(time.time()).to_json()))

    # -- the membership ----------------------------------------------------

    def sync(self) -> None:
        """Serve what the membership wants now; follow each disk's domain."""
        want = self.members.want()
        if want is None:                       # libvirt unreachable: keep what is served
            return
        left: dict[str, str] = {}              # path -> why it is out of scope now
        for path, m in list(want.serve.items()):
            out = self.rules.out_of_scope(m.domain, m.target, m.labels) if m.domain else None
            if out is not None:
                del want.serve[path]
                want.skipped[(m.domain, m.target)] = out
                left[path] = out[1]
            else:
                ov = (self.rules.for_disk(m.domain, m.target) if m.domain
                      else overrides.Override())
                self.host.set_override(path, ov.weight, ov.cap)
        for key, (kind, why) in list(want.skipped.items()):
            slower = self.adopter.released.get("/".join(key))
            if slower:
                want.skipped[key] = ("adopt_slower", why := "released from adoption by "
                                                           f"itself: {slower}")
            if self.skipped.get(key, (None, None))[1] != why:
                log.info("libvirt: %s %s skipped: %s", key[0], key[1], why,
                         extra=journal.fields(domain=key[0], target=key[1]))
        self.skipped = dict(want.skipped)
        qmp_adopted = {m.qmp for m in want.serve.values() if m.qmp}
        for key, slower in dict(self.adopter.released).items():   # a QMP drive, slower
            if adoption.is_qmp(key) and key not in qmp_adopted:
                self.skipped[qemu_socket.parse_key(key)] = (
                    "adopt_slower", f"released from adoption by itself: {slower}")
        served = {w.image.path: w for w in self.host.watchers}
        for path in sorted(set(served) - set(want.serve)):
            self.host.remove(path, left.get(path, (
                "released from adoption: QEMU opens it with O_DIRECT again"
                if path in self.adopted else "no running domain uses it any more")))
        for path, m in sorted(want.serve.items()):
            w = served.get(path)
            if w is None:
                w = self._open(path, m)
            if w is not None:
                self.follower.follow(w, m)
        served = {w.image.path for w in self.host.watchers}
        self.adopted = {p: m.qmp or f"{m.domain}/{m.target}" for p, m in want.serve.items()
                        if m.adopted and p in served}
        for w in self.host.watchers:
            key = self.adopted.get(w.image.path)
            w.adopted_gain = self.adopter.figures(key) if key else (None, None)
        self.adopter.watch(self.adopted.values())
        if isinstance(self.members, RunningDomains):
            self.adopter.want(
                sorted(f"{d}/{t}" for (d, t), labels in want.adoptable.items()
                       if (d, t) in want.skipped and (self.rules.adopts(d, t, labels) or (
                           (d, t) in want.readopt
                           and self.rules.out_of_scope(d, t, labels) is None))),
                carried={f"{d}/{t}" for d, t in want.readopt})

    def carries(self, domain: str | None, target: str | None) -> bool:
        """Whether a disk's heat travels in its domain's metadata (``carry_heat``, the
        domain's or the daemon's; auto: with ``--libvirt``)."""
        if not domain:
            return False
        ov = self.rules.for_disk(domain, target or "")
        if ov.carry_heat is not None:
            return ov.carry_heat
        c = self.config.carry_heat
        return c == "on" or (c == "auto" and bool(self.args.libvirt))

    def _open(self, path: str, m):
        if not self.members.retry and (path in self.refused or path in self.host.failed):
            return None                        # a path given is tried once
        with journal.disk_context(path, m.domain, m.target):     # its lines carry its fields
            try:
                w = self.served.open(path, carried=m.carried is not None
                                     and self.carries(m.domain, m.target))
            except VmdtError as exc:
                self._first_error = self._first_error or exc
                said = re.sub(r"\d+", "N", str(exc))     # counts that move are the same why
                if self.refused.get(path) != said and not self.single:   # one: its exit line
                    where = f"libvirt: {m.domain} {m.target} not served" if self.members.retry \
                        else "left out"
                    log.error("%s: %s", where, exc)
                self.refused[path] = said
                return None
            self.refused.pop(path, None)
            self.host.add(w)
            self.members.opened(path, w.image.fd)   # its opens wake the loop (given paths)
            if self.members.retry:
                log.info("libvirt: serving %s %s (%s)%s", m.domain, m.target, path,
                         ", adopted: through the page cache, libvirt says cache=none"
                         if m.adopted else "")
            self.follower.opened(w, m)
            return w

    def settle_open(self) -> bool:
        """After a wake-up: True when it came from an open of an image given by path
        (``GivenPaths.opened``) and libvirt's answer, asked now (``sync``), changes nothing
        held: the next cycle keeps its time. A domain that took the image (its disk holds
        nothing from now) makes it False: the cycle that releases runs at once."""
        if not self.members.take_opened():
            return False
        before = {id(w): w.hold_enabled for w in self.host.watchers}
        self.sync()
        return {id(w): w.hold_enabled for w in self.host.watchers} == before

    def _warm(self, w, m) -> None:
        """Start a disk's heat from the local state or its domain's summary (``Served.warm``)."""
        carried = m.carried if self.carries(m.domain, m.target) else None
        self.served.warm(w, carried, f"{m.domain}/{m.target} {w.image.path}" if m.domain
                         else w.image.path)

    # -- a cycle -----------------------------------------------------------

    def cycle(self) -> list:
        self.sync()
        reports = self.host.tick()
        c = self.config
        skipped = ([{"domain": d, "target": t, "code": code, "reason": why}
                    for (d, t), (code, why) in sorted(self.skipped.items())]
                   if self.members.retry or self.skipped else None)
        self.last_report = self.host.report(c.interval, c.min_free, skipped)
        if c.status:
            self.out.write("status", c.status, status_bytes(self.last_report.to_json()))
        if self.metrics is not None:
            self.metrics.publish(self.last_report)
        above_floor = self.host.memory(c.min_free)[1]
        self.budget_log.note(self.host.watchers, self.host.budget, above_floor)
        if c.host_png:
            self.out.write("host_png", c.host_png, self._overview())
        self.host.each(self.served.maybe_save)
        self.host.each(self.served.maybe_check_direct)
        if self.carrier is not None:
            self.carrier.maybe_write(self.host.watchers, lambda w: self.carries(w.domain,
                                                                                  w.target))
        return reports

    def status_line(self) -> str:
        """systemd's STATUS= line, from the last report: one disk's rewrites, or the count;
        the share of reads from memory as status says it (``HostReport.from_memory``)."""
        r = self.last_report
        if r is None:
            return f"held 0/{format_size(self.host.budget)}, cycle 0"
        held = f"held {format_size(r.held_bytes)}/{format_size(r.budget_bytes)}"
        fm = r.from_memory
        if fm is not None:
            held += f", reads {100 * fm['now']:.0f} % from memory"
        if len(r.lines) == 1 and r.disks:
            rewritten = counted(r.disks[0].rewritten_blocks, "block")
            return f"{held}, rewritten {rewritten}, cycle {r.cycle}"
        return f"{held} over {counted(len(r.lines), 'disk')}, cycle {r.cycle}"

    def _overview(self) -> bytes:
        from vmdisktouch.adapters.pictures import host_render, render
        if self.colour_book is None:
            self.colour_book = host_render.ColourBook()
        bands = []
        for w in self.host.watchers:
            resident, held = w.last_maps()
            a, d = w.allotment, w.last_disk
            bands.append(host_render.DiskBand(
                w.image.path, w.holder.held_bytes(), resident, held,
                domain=w.domain, target=w.target, size_bytes=w.image.size,
                share_bytes=None if a is None else a.share,
                wanted_bytes=None if a is None else a.wanted,
                limited_by=None if d is None else d.limited_by,
                curve=d.curve if d is not None and (d.mrc or {}).get("reads") else None,
                from_memory=None if d is None else d.from_memory,
                adopted=w.adopted is not None, adopted_gain=w.adopted_gain[0]))
        return render.png_bytes(host_render.host_overview_image(
            bands, self.host.budget, when=time.time(),
            above_floor=self.host.memory(self.config.min_free)[1],
            unserved=self._unserved(), book=self.colour_book))

    def _unserved(self) -> list:
        """The disks libvirt has that are not served, with why (the report's ``skipped``);
        those the last ``advise`` says would gain, with what (``advice_file``)."""
        from vmdisktouch.adapters import advice_file
        from vmdisktouch.adapters.pictures.host_render import unserved_rows
        skipped = self.last_report.skipped if self.last_report is not None else None
        if not skipped:
            return []
        return unserved_rows(skipped, advice_file.load_advice(advice_file.advice_path()))

    # -- reload --------------------------------------------------------------

    def reload(self) -> None:
        """SIGHUP: the settings read again and checked as at start, for every disk; a bad
        file or output path is rejected and the current settings stay."""
        sdnotify.reloading()
        try:
            new, warns, path = load_settings(self.cli_values, self.args.config)
            served_mod.check_placeholders(new, not self.single)
            served_mod.check_outputs(new, [w.image.path for w in self.host.watchers],
                                     served_mod.config_protected(path) + self.served.images())
            rules = configfile.load_rules(path)
        except ConfigError as exc:
            log.error("reload rejected, keeping the current settings: %s", exc)
            sdnotify.ready()
            return
        for line in warns:
            log.warning("%s", line)
        if not new.status and self.default_status:
            new = with_status(new, self.default_status)
        log.info("%s", settings.in_force(new, path or ""))
        self.served.set_config(new, path)
        released = sum(self.host.each(lambda w: w.reconfigure(
            served_mod.disk_config(new, w.image.path))))
        self.rules = rules
        self.adopter.forget_refusals()
        if self.carrier is not None:
            self.carrier.interval = new.carry_interval
        released += self.host.set_budget(new.max_hold)
        self.host.spill_factor = new.spill
        self.config, self.config_path = new, path
        log.info("reloaded settings%s: budget %s, floor %s; released %s",
                 f" from {path}" if path else "", format_size(new.max_hold),
                 format_size(new.min_free), format_size(released))
        sdnotify.ready()


def with_status(config, path: str):
    """``config`` with the status file ``path`` (where its settings came from kept)."""
    new = type(config)(config, status=path)
    new.origins, new.file_name = {**config.origins, "status": "default"}, config.file_name
    return new


def serve(args, config, config_path, cli_values, sig) -> int:
    """Serve until a stop signal (see the module docstring); the exit status."""
    svc = Service(args, config, config_path, cli_values, sig)
    try:
        svc.start()
        return _loop(svc)
    finally:
        svc.close()


def _loop(svc: Service) -> int:
    sig, ready = svc.sig, False
    while not sig.stopping:
        started = time.monotonic()
        reports = svc.cycle()                 # NoDiskLeft ends the daemon
        if reports or not svc.host.watchers:  # a cycle that served something, or nothing
            (sdnotify.status if ready else sdnotify.ready)(svc.status_line())
            ready = True
        svc.dog.ping()
        arriving = svc.follower.waiting or svc.follower.arriving
        _wait_for_next_cycle(svc, started + (min(svc.config.interval, ARRIVAL_POLL) if arriving
                                             else svc.config.interval))
    log.info("received %s; releasing holds and exiting", sig.stop_name())
    return 0


def _wait_for_next_cycle(svc: Service, deadline: float) -> None:
    """Sleep until ``deadline``; reload on SIGHUP meanwhile; return early on stop or wake-up,
    or when a disk's reads left what it holds (``core.shift``)."""
    sig, dog = svc.sig, svc.dog
    while not sig.stopping:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        if sig.wait(min(remaining, dog.slice, PUMP_SECONDS)):
            if not sig.take_reload():
                if not sig.stopping and svc.settle_open():
                    continue               # an open that changed nothing held
                return                     # a stop, or libvirt woke us: act now
            svc.reload()
        if any(svc.host.each(lambda w: w.pump())):    # every disk drains
            return
        dog.ping()
