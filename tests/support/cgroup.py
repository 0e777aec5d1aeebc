"""A cgroup v1 memory group with a limit, where the workload and its noisy neighbour run.

Host memory pressure comes from a memory-limited cgroup v1 group
(``/sys/fs/cgroup/memory``, as libvirt's ``machine.slice`` confines a VM)
that holds the workload and a "noisy neighbour" streaming another file: the
page cache they fault in is charged to the group and reclaimed by LRU at its
limit, so without help the hot zone's pages keep getting evicted.

Hazard: pages are charged to the cgroup of the process that first faults them.
Hot-zone pages the workload faulted in are charged to the workload's group;
when the daemon (or vmtouch) mlocks them they stay charged there and become
*unevictable* inside the group. If the held bytes charged to the group
approach its limit, the group can no longer reclaim and the kernel OOM-kills
the workload. Pages the holder faults in itself are charged to the holder's
own group (here the root). So a scenario must keep
``budget + the workload's and neighbour's working memory < limit`` with a
margin; ``check_budget_vs_limit`` enforces it, and ``MemoryCgroup.oom_kills``
and ``MemoryCgroup.unevictable_bytes`` report what happened.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

from tests.support.common import MiB, PAGE, WorkloadError

CGROUP_MEMORY_ROOT = "/sys/fs/cgroup/memory"


class MemoryCgroup:
    """A cgroup v1 memory group with a limit, as a context manager.

    >>> with MemoryCgroup("demo", 768 * MiB) as cg:
    ...     p = cg.popen(["fio", ...])        # the child joins the group before exec
    ...     cg.usage(), cg.failcnt(), cg.oom_kills()

    On exit every process still in the group is killed (they are ours: only
    processes we started were put in it), and the group is removed with
    ``rmdir``; the page cache still charged to it moves to the parent.
    """

    def __init__(self, tag: str, limit_bytes: int, root: str = CGROUP_MEMORY_ROOT):
        self.root = root
        self.limit_bytes = int(limit_bytes)
        self.name = f"vmdt-{tag}-{os.getpid()}"
        self.path = os.path.join(root, self.name)
        self._created = False

    # -- life cycle --
    def create(self) -> "MemoryCgroup":
        if not os.path.exists(os.path.join(self.root, "memory.limit_in_bytes")):
            raise WorkloadError(
                f"no cgroup v1 memory controller at {self.root} (memory.limit_in_bytes missing); "
                "the pressure scenario needs it (mount -t cgroup -o memory memory " f"{self.root})")
        try:
            os.mkdir(self.path)
        except FileExistsError:
            pass
        except OSError as exc:
            raise WorkloadError(f"cannot create cgroup {self.path}: {exc.strerror} (run as root)") from None
        self._created = True
        self._write("memory.limit_in_bytes", str(self.limit_bytes))
        got = int(self._read("memory.limit_in_bytes"))
        if abs(got - self.limit_bytes) > PAGE:
            raise WorkloadError(f"cgroup {self.path}: limit {self.limit_bytes} not accepted (got {got})")
        return self

    def __enter__(self) -> "MemoryCgroup":
        return self.create()

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def cleanup(self, timeout: float = 10.0) -> None:
        """Kill what is still in the group (ours), then rmdir it. Idempotent."""
        if not self._created or not os.path.isdir(self.path):
            self._created = False
            return
        deadline = time.monotonic() + timeout
        sig = signal.SIGTERM
        while True:
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
            if time.monotonic() > deadline - timeout / 2:
                sig = signal.SIGKILL
            if time.monotonic() > deadline:
                break
        for _ in range(50):
            try:
                os.rmdir(self.path)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        else:
            print(f"warning: could not remove cgroup {self.path}", file=sys.stderr)
        self._created = False

    # -- processes --
    def wrap(self, argv: list[str]) -> list[str]:
        """argv that joins this group, then execs ``argv`` (so every page it faults is charged here)."""
        procs = os.path.join(self.path, "cgroup.procs")
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *argv]

    def popen(self, argv: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.wrap(argv), **kw)

    def add(self, pid: int) -> None:
        self._write("cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in self._read("cgroup.procs").split()]
        except FileNotFoundError:
            return []

    # -- counters --
    def usage(self) -> int:
        return int(self._read("memory.usage_in_bytes"))

    def max_usage(self) -> int:
        return int(self._read("memory.max_usage_in_bytes"))

    def failcnt(self) -> int:
        """How often usage hit the limit (normal under pressure: that is reclaim)."""
        return int(self._read("memory.failcnt"))

    def oom_kills(self) -> int:
        """Processes OOM-killed in this group (``oom_kill`` of memory.oom_control)."""
        for line in self._read("memory.oom_control").splitlines():
            k, _, v = line.partition(" ")
            if k == "oom_kill":
                return int(v)
        return 0

    def stat(self) -> dict[str, int]:
        out = {}
        for line in self._read("memory.stat").splitlines():
            k, _, v = line.partition(" ")
            try:
                out[k] = int(v)
            except ValueError:
                pass
        return out

    def unevictable_bytes(self) -> int:
        """Page cache charged to this group that someone mlocked (the hazard above)."""
        return self.stat().get("unevictable", 0)

    def counters(self) -> dict[str, int]:
        s = self.stat()
        return {"usage": self.usage(), "max_usage": self.max_usage(), "failcnt": self.failcnt(),
                "oom_kills": self.oom_kills(), "unevictable": s.get("unevictable", 0),
                "cache": s.get("cache", 0)}

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name)) as f:
            return f.read()

    def _write(self, name: str, value: str) -> None:
        try:
            with open(os.path.join(self.path, name), "w") as f:
                f.write(value)
        except OSError as exc:
            raise WorkloadError(f"cannot write {value} to {self.path}/{name}: {exc.strerror}") from None


def check_budget_vs_limit(budget: int, limit: int, margin: int = 192 * MiB) -> None:
    """Refuse scenarios where held pages charged to the group could OOM it.

    In the worst case every byte the daemon holds was first faulted by the
    workload and stays charged, unevictable, to the workload's group.
    """
    if budget + margin > limit:
        raise WorkloadError(
            f"budget {budget >> 20} MiB + margin {margin >> 20} MiB exceeds the cgroup limit "
            f"{limit >> 20} MiB: held pages charged to the group would OOM the workload")


def remove_group(path: str, evacuate, timeout: float = 30.0) -> None:
    """rmdir a cgroup directory once it is empty; ``evacuate(pids)`` empties it.

    The processes still listed in ``cgroup.procs`` (only ever the caller's
    own) are handed to ``evacuate`` (kill them, or move them out) before
    each try; a busy group (EBUSY: a process not yet gone) is retried until
    ``timeout``. A group already gone is fine.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return
        if pids:
            evacuate(pids)
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)
