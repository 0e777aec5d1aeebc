"""PostgreSQL on a raw image through QEMU's block layer, without a guest kernel.

    prepare(image, work, scale=20)                  # ext4, initdb, pgbench -i; all stopped
    with pg_disk(image, work, cache="none", qsd_cgroup=cg1, pg_cgroup=cg2) as pg:
        run = pg.pgbench(20, builtin="select-only") # its -P lines parsed live
        pg.disk_stat()                              # the "guest's disk": its I/O completed
        run.stop().progress                         # SIGTERM; (s, tps, lat ms) so far

``qemu-storage-daemon`` opens the image as a VM's QEMU would (``cache="none"``:
``cache.direct=on,aio=native``; ``"writethrough"``: ``cache.direct=off,aio=threads``
and the export's ``writethrough=on``, a flush after every write) and exports
the raw node as a regular file through FUSE; ``losetup --direct-io=on`` over
that file is the guest's disk, with ext4 on it and PostgreSQL (run as
``postgres``, unix socket only) on that. ``pg_cgroup`` keeps the ext4 page
cache above the loop device, the guest's RAM, small, so reads reach the image.

Two hazards, both silent corruption. Debian's QEMU 7.2 FUSE export corrupts
data with two writes in flight: before ``losetup`` the FUSE connection (the
fusectl directory named by the mount's device minor, fusectl mounted
privately for the moment) gets ``max_background`` and ``congestion_threshold``
1, one request in flight. And the node ignores the loop device's zeroing
requests unless ``discard=unmap`` is set on both blockdevs, as it is here.

Only processes started here are signalled, by PID; a failure midway still
stops, unmounts and detaches what was set up, in reverse order.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass

from tests.support.blockdev import loop_device
from tests.support.common import WorkloadError, require_tool, stop_process

PG_BIN = "/usr/lib/postgresql/15/bin"
PORT = 5432           # unix socket only, in the work directory: no clash with another server
MODES = {"none": ("on", "native", False), "writethrough": ("off", "threads", True)}
PG_SETTINGS = {"shared_buffers": "16MB", "fsync": "on", "synchronous_commit": "on",
               "full_page_writes": "on", "listen_addresses": "", "max_connections": "20",
               "max_wal_size": "256MB",   # the WAL of a small disk stays small
               "track_wal_io_timing": "on"}   # pg_stat_wal's write and sync times


def _pg(tool: str) -> str:
    return os.path.join(PG_BIN, tool)


def _as_postgres(argv: list[str]) -> list[str]:
    """argv run as ``postgres`` by exec (``setpriv``: the PID stays the program's)."""
    return [require_tool("setpriv"), "--reuid=postgres", "--regid=postgres", "--init-groups",
            "--reset-env", "--", *argv]


def _run(argv: list[str], log: str, **kw) -> None:
    with open(log, "ab") as out:
        rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, **kw).returncode
    if rc:
        raise WorkloadError(f"{os.path.basename(argv[0])} failed ({rc}): see {log}")


def _postgres_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    os.chown(path, *_postgres_ids())
    os.chmod(path, 0o700)
    return path


def _socket_dir(work: str) -> str:
    """``work/sock``, postgres's; ``work`` made traversable so that postgres reaches it."""
    os.chmod(work, os.stat(work).st_mode | 0o011)
    return _postgres_dir(os.path.join(work, "sock"))


def _postgres_ids() -> tuple[int, int]:
    pw = pwd.getpwnam("postgres")
    return pw.pw_uid, pw.pw_gid


def qsd_argv(image: str, mountfile: str, cache: str) -> list[str]:
    """The ``qemu-storage-daemon`` command exporting ``image`` as the file ``mountfile``."""
    direct, aio, writethrough = MODES[cache]
    return [require_tool("qemu-storage-daemon"),
            "--blockdev", f"driver=file,node-name=file0,filename={os.path.abspath(image)},"
                          f"cache.direct={direct},aio={aio},discard=unmap",
            "--blockdev", "driver=raw,node-name=disk0,file=file0,discard=unmap",
            "--export", f"type=fuse,id=exp0,node-name=disk0,mountpoint={mountfile},writable=on"
                        + (",writethrough=on" if writethrough else "")]


def limit_fuse_connection(mountfile: str) -> None:
    """One request in flight on the FUSE connection of ``mountfile`` (the 7.2 export's hazard)."""
    conn = str(os.minor(os.stat(mountfile).st_dev))
    ctl = tempfile.mkdtemp(prefix="vmdt-fusectl-")
    try:
        subprocess.run([require_tool("mount"), "-t", "fusectl", "none", ctl], check=True)
        try:
            for knob in ("max_background", "congestion_threshold"):
                path = os.path.join(ctl, conn, knob)
                with open(path, "w") as f:
                    f.write("1")
                with open(path) as f:
                    if f.read().strip() != "1":
                        raise WorkloadError(f"{path} did not take 1")
        finally:
            subprocess.run([require_tool("umount"), ctl], check=True)
    finally:
        os.rmdir(ctl)


@contextlib.contextmanager
def qsd_loop(image: str, work: str, *, cache: str, cgroup=None):
    """qemu-storage-daemon over ``image`` (in ``cgroup``), its FUSE connection limited, a
    direct-I/O loop device over the export; yields ``(loop device, qsd Popen)``."""
    if cache not in MODES:
        raise WorkloadError(f"cache must be one of {sorted(MODES)}, not {cache!r}")
    work = os.path.abspath(work)
    mountfile = os.path.join(work, "export.raw")
    open(mountfile, "w").close()
    argv = qsd_argv(image, mountfile, cache)
    if cgroup is not None:
        argv = cgroup.wrap(argv)
    with fuse_loop(argv, mountfile, work, image) as out:
        yield out


@contextlib.contextmanager
def fuse_loop(argv: list, mountfile: str, work: str, what: str):
    """Run ``argv`` (a qemu-storage-daemon whose FUSE export is ``mountfile``, an empty
    file in ``work``) until it exports ``what``, its FUSE connection limited, a direct-I/O
    loop device over the export; yields ``(loop device, qsd Popen)``."""
    log = open(os.path.join(work, "qsd.log"), "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while os.stat(mountfile).st_dev == os.stat(work).st_dev:    # not mounted yet
            if proc.poll() is not None or time.monotonic() > deadline:
                raise WorkloadError(f"qemu-storage-daemon did not export {what}: see {log.name}")
            time.sleep(0.05)
        limit_fuse_connection(mountfile)
        with loop_device(mountfile, direct_io=True) as loop:
            with open(f"/sys/block/{os.path.basename(loop)}/loop/dio") as f:
                if f.read().strip() != "1":
                    raise WorkloadError(f"{loop}: direct I/O refused by the FUSE export")
            yield loop, proc
    finally:
        stop_process(proc, signal.SIGTERM, 30)
        log.close()
        if os.stat(mountfile).st_dev != os.stat(work).st_dev:     # qsd died without unmounting
            subprocess.run([require_tool("umount"), "-l", mountfile])
        os.unlink(mountfile)


@contextlib.contextmanager
def _mounted(dev: str, mountpoint: str):
    os.makedirs(mountpoint, exist_ok=True)
    if subprocess.run([require_tool("mount"), dev, mountpoint]).returncode:
        os.rmdir(mountpoint)
        raise WorkloadError(f"cannot mount {dev} (no file system: prepare() first?)")
    try:
        yield mountpoint
    finally:
        for _ in range(50):      # EBUSY while the last postgres children exit
            if subprocess.run([require_tool("umount"), mountpoint]).returncode == 0:
                break
            time.sleep(0.2)
        else:
            raise WorkloadError(f"cannot unmount {mountpoint}")
        os.rmdir(mountpoint)


@contextlib.contextmanager
def _postgres(data: str, sockdir: str, log: str, cgroup=None):
    """The postmaster on ``data`` (in ``cgroup``), ready; fast shutdown (SIGINT) at the end."""
    settings = {**PG_SETTINGS, "unix_socket_directories": sockdir}
    argv = _as_postgres([_pg("postgres"), "-D", data, "-p", str(PORT),
                         *(a for k, v in settings.items() for a in ("-c", f"{k}={v}"))])
    if cgroup is not None:
        argv = cgroup.wrap(argv)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=data)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([_pg("pg_isready"), "-q", "-h", sockdir, "-p", str(PORT)]).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise WorkloadError(f"postgres did not start: see {log}")
            time.sleep(0.1)
        yield proc
    finally:
        stop_process(proc, signal.SIGINT, 120)


def prepare(image: str, work: str, *, scale: int = 20) -> None:
    """ext4 on the raw ``image`` (through the export, cache "writethrough"), a cluster
    initdb'd on it and ``pgbench -i -s scale``; all stopped, unmounted, detached at the end.
    ``image``: an existing non-sparse raw file; ``work``: a scratch directory."""
    work = os.path.abspath(work)
    log = os.path.join(work, "prepare.log")
    with qsd_loop(image, work, cache="writethrough") as (loop, _):
        _run([require_tool("mkfs.ext4"), "-F", "-q",
              "-E", "lazy_itable_init=0,lazy_journal_init=0", loop], log)   # no lazy init later
        with _mounted(loop, os.path.join(work, "mnt")) as mnt:
            sockdir = _socket_dir(work)          # and ``work`` traversable, for initdb
            data = _postgres_dir(os.path.join(mnt, "pgdata"))
            _run(_as_postgres([_pg("initdb"), "-D", data, "-U", "postgres", "--auth=trust",
                               "-E", "UTF8", "--locale=C", "--no-instructions"]), log, cwd=data)
            with _postgres(data, sockdir, os.path.join(work, "postgres.log")):
                conn = ["-h", sockdir, "-p", str(PORT), "-U", "postgres"]
                _run([_pg("pgbench"), *conn, "-i", "-s", str(scale), "-q", "postgres"], log)
                _run([_pg("psql"), *conn, "-c", "CHECKPOINT", "postgres"], log)


@dataclass
class PgbenchResult:
    progress: list[tuple[float, float, float]]     # pgbench's -P lines: (s, tps, lat ms)


class PgbenchRun:
    """A running pgbench; its ``-P`` lines parsed live into ``progress``."""

    PROGRESS = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms")

    def __init__(self, argv: list[str], cgroup=None):
        self.progress: list[tuple[float, float, float]] = []
        self.proc = subprocess.Popen(cgroup.wrap(argv) if cgroup is not None else argv,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            m = self.PROGRESS.match(line)
            if m:
                self.progress.append(tuple(map(float, m.groups())))

    def stop(self) -> PgbenchResult:
        """SIGTERM by PID; the progress so far."""
        stop_process(self.proc, signal.SIGTERM, 10)
        self._thread.join(5)
        return PgbenchResult(list(self.progress))


@dataclass(frozen=True)
class DiskStat:
    """``/sys/block/DEV/stat``: reads and writes completed, and the ms they took, summed."""
    reads: int
    read_ms: int
    writes: int
    write_ms: int


@dataclass
class PgDisk:
    loop: str            # /dev/loopN: the guest's disk; /sys/block/loopN/stat counts its I/O
    qsd_pid: int
    pg_pid: int
    socket_dir: str
    port: int
    mountpoint: str

    def conn_args(self) -> list[str]:
        return ["-h", self.socket_dir, "-p", str(self.port), "-U", "postgres"]

    def disk_stat(self) -> DiskStat:
        """The loop device's I/O completed: counters since the device was made, not since
        attached; take differences."""
        with open(f"/sys/block/{os.path.basename(self.loop)}/stat") as f:
            fields = [int(x) for x in f.read().split()]
        return DiskStat(fields[0], fields[3], fields[4], fields[7])

    def writes(self) -> dict[str, float]:
        """PostgreSQL's own count of its writes, cumulative (take differences): data pages
        written by the backends (a client waits for those), by the background writer and
        the checkpointer (none waits), and the WAL's writes and flushes (a commit waits
        for its flush) with the ms they took."""
        cols = ("backend_pages", "background_pages", "wal_writes", "wal_syncs",
                "wal_write_ms", "wal_sync_ms")
        row = self.sql("SELECT buffers_backend, buffers_clean + buffers_checkpoint, wal_write, "
                       "wal_sync, wal_write_time, wal_sync_time FROM pg_stat_bgwriter, "
                       "pg_stat_wal")
        return dict(zip(cols, map(float, row.split("|"))))

    def sql(self, query: str) -> str:
        """``psql -At -c query``'s output."""
        return subprocess.run([_pg("psql"), *self.conn_args(), "-At", "-c", query, "postgres"],
                              check=True, capture_output=True, text=True).stdout.strip()

    def pgbench(self, seconds: float, *, clients: int = 1, cgroup=None, progress: int = 1,
                builtin: str = "tpcb-like") -> PgbenchRun:
        """``pgbench -b builtin -c clients -j clients -T seconds -P progress -n`` started."""
        return PgbenchRun([_pg("pgbench"), *self.conn_args(), "-b", builtin, "-c", str(clients),
                           "-j", str(clients), "-T", str(max(1, round(seconds))),
                           "-P", str(progress), "-n", "postgres"], cgroup)


@contextlib.contextmanager
def pg_disk(image: str, work: str, *, cache: str, qsd_cgroup=None, pg_cgroup=None):
    """qemu-storage-daemon over ``image`` in mode ``cache`` (in ``qsd_cgroup``), the loop
    device, ext4 mounted, PostgreSQL started (in ``pg_cgroup``); yields a ``PgDisk``; all
    stopped, unmounted and detached at the end, in reverse order."""
    work = os.path.abspath(work)
    with qsd_loop(image, work, cache=cache, cgroup=qsd_cgroup) as (loop, qsd), \
            _mounted(loop, os.path.join(work, "mnt")) as mnt:
        data = os.path.join(mnt, "pgdata")
        if not os.path.isdir(data):
            raise WorkloadError(f"no cluster on {image}: prepare() first")
        with _postgres(data, _socket_dir(work), os.path.join(work, "postgres.log"),
                       pg_cgroup) as pg:
            yield PgDisk(loop, qsd.pid, pg.pid, os.path.join(work, "sock"), PORT, mnt)
