"""Run a command under an emulation of systemd/vmdisktouch@.service's sandbox.

systemd is not PID 1 on the test machines, so the unit cannot be started;
this launcher applies the same kernel mechanisms systemd would, reading the
settings from the unit file, then execs the command::

    python tests/support/sandbox_exec.py [--private-network] [--address-families] [--mdwe]
                                 [--mdwe-seccomp] [--seccomp] [--caps]
                                 [--devices-cgroup NAME] [--listen-fd FD:NAME]
                                 [--report FILE] -- CMD...

--private-network PrivateNetwork=yes as systemd applies it: a new network
                  namespace (unshare(CLONE_NEWNET)) whose loopback device is
                  brought up (systemd's loopback_setup()), so 127.0.0.1
                  there is the namespace's own, unreachable from the host.
--address-families
                  RestrictAddressFamilies= (an allow-list) as systemd 252
                  applies it (src/shared/seccomp-util.c,
                  seccomp_restrict_address_families): socket(2) with a family
                  not listed fails with EAFNOSUPPORT; socketpair(2) and the
                  use of sockets already open (accept(2) on a passed one) are
                  not filtered. Verified: socket(AF_INET) then fails,
                  socket(AF_UNIX) works.

--mdwe            MemoryDenyWriteExecute= as systemd >= 254 applies it:
                  prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN). Verified here:
                  PR_GET_MDWE reads it back and mprotect(PROT_EXEC) on an
                  anonymous writable page fails with EACCES.
--mdwe-seccomp    MemoryDenyWriteExecute= as systemd 252 (Debian 12) applies it,
                  a seccomp filter (src/shared/seccomp-util.c,
                  seccomp_memory_deny_write_execute): EPERM for mmap with
                  PROT_WRITE|PROT_EXEC, for mprotect/pkey_mprotect with
                  PROT_EXEC, for shmat with SHM_EXEC. Verified the same way
                  (mprotect then fails with EPERM).
--seccomp         SystemCallFilter= (a deny-list of @groups, expanded with
                  `systemd-analyze syscall-filter`), SystemCallErrorNumber= and
                  SystemCallArchitectures=native: one filter that allows every
                  native system call except the listed ones, which fail with
                  the unit's errno; other ABIs (i386, x32) kill. Loading it sets
                  no_new_privs (NoNewPrivileges=yes).
--seccomp-action kill
                  The same filter with systemd's default action when
                  SystemCallErrorNumber= is not set: kill the process (SIGSYS).
--caps            CapabilityBoundingSet=: drop every other capability from the
                  bounding set, so the exec'd root process has only those.
--devices-cgroup NAME
                  Join /sys/fs/cgroup/devices/NAME (cgroup v1), which the
                  caller has set up with ``device_rules()``.
--listen-fd FD:NAME
                  Socket activation as systemd does it for a socket unit
                  (repeatable): the inherited descriptor FD (the caller's
                  pass_fds) becomes 3, 4, ... and LISTEN_FDS, LISTEN_FDNAMES
                  and LISTEN_PID (this process, which the exec keeps) are set
                  right before the exec, after everything else.
--report FILE     Write what was applied and verified, as JSON.

Any verification that fails exits 1 with a message; nothing is exec'd.
The functions are also imported by tests/e2e/test_sandbox.py and
tests/e2e/test_metrics_socket.py.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import mmap
import os
import pathlib
import re
import shutil
import socket
import stat
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(ROOT, "systemd", "vmdisktouch@.service")
UNIT_PATH = pathlib.Path(UNIT)
DEVICES_CGROUP = "/sys/fs/cgroup/devices"

PR_CAPBSET_DROP = 24
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
SD_LISTEN_FDS_START = 3
PR_SET_MDWE = 65
PR_GET_MDWE = 66
PR_MDWE_REFUSE_EXEC_GAIN = 1
SHM_EXEC = 0o100000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.unshare.argtypes = [ctypes.c_int]


class SandboxError(Exception):
    pass


# -- the unit file --------------------------------------------------------------------

def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (a key may repeat); comments and blank lines dropped."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert section is not None, line
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def unit_settings(text: str) -> dict[str, list[str]]:
    """[Service] key -> values in order (a key may repeat); comments dropped."""
    return parse_unit(text).get("Service", {})


def read_unit(path: str = UNIT) -> dict[str, list[str]]:
    with open(path) as f:
        return unit_settings(f.read())


# -- SystemCallFilter= ----------------------------------------------------------------

def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        raise SandboxError("systemd-analyze not found: install the Debian package systemd "
                           "(scripts/install-deps.sh does)")
    return exe


def syscall_groups() -> dict[str, list[str]]:
    """Every group `systemd-analyze syscall-filter` knows: name -> entries (may be @groups)."""
    out = subprocess.run([systemd_analyze(), "syscall-filter", "--no-pager"],
                         capture_output=True, text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.splitlines():
        if line.startswith("@"):
            current = groups.setdefault(line.strip(), [])
        elif not line.strip():
            current = None
        elif current is not None and not line.strip().startswith("#"):
            current.append(line.strip())
    if not groups:
        raise SandboxError(f"no groups in `systemd-analyze syscall-filter` output:\n{out}")
    return groups


def expand(names, groups: dict[str, list[str]]) -> set[str]:
    """System call names of ``names`` (syscalls and @groups, nested groups expanded)."""
    result: set[str] = set()
    todo = list(names)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.startswith("@"):
            if name not in groups:
                raise SandboxError(f"unknown system call group {name}")
            todo.extend(groups[name])
        else:
            result.add(name)
    return result


def denied_syscalls(settings: dict[str, list[str]], groups=None) -> set[str]:
    """The unit's SystemCallFilter= deny-list, expanded to system call names.

    systemd's rule: the first line decides; with a '~' deny-list, later '~'
    lines add to the list and lines without '~' take entries out of it.
    """
    lines = settings.get("SystemCallFilter", [])
    if not lines or not lines[0].startswith("~"):
        raise SandboxError(f"SystemCallFilter= is not a deny-list: {lines}")
    groups = groups if groups is not None else syscall_groups()
    denied: set[str] = set()
    for line in lines:
        if line.startswith("~"):
            denied |= expand(line[1:].split(), groups)
        else:
            denied -= expand(line.split(), groups)
    return denied


def error_number(settings: dict[str, list[str]]) -> int | None:
    """SystemCallErrorNumber= as an errno value; None when unset (systemd then kills)."""
    values = settings.get("SystemCallErrorNumber")
    if not values:
        return None
    name = values[-1]
    if not hasattr(errno, name):
        raise SandboxError(f"SystemCallErrorNumber={name} is not an errno name")
    return getattr(errno, name)


# -- DevicePolicy= / DeviceAllow= ---------------------------------------------------------

def _proc_devices() -> dict[str, list[tuple[int, str]]]:
    """/proc/devices: {'c': [(major, name)...], 'b': [...]}."""
    out: dict[str, list[tuple[int, str]]] = {"c": [], "b": []}
    kind = None
    with open("/proc/devices") as f:
        for line in f:
            line = line.strip()
            if line == "Character devices:":
                kind = "c"
            elif line == "Block devices:":
                kind = "b"
            elif not line:
                kind = None
            elif kind:
                major, _, name = line.partition(" ")
                out[kind].append((int(major), name.strip()))
    return out


def _node_rule(node: str, acc: str) -> str:
    m = re.fullmatch(r"/run/systemd/inaccessible/(chr|blk)", node)
    if m:       # systemd parses these as 0:0 without stat()ing them
        return f"{'c' if m.group(1) == 'chr' else 'b'} 0:0 {acc}"
    st = os.stat(node)
    kind = "c" if stat.S_ISCHR(st.st_mode) else "b"
    return f"{kind} {os.major(st.st_rdev)}:{os.minor(st.st_rdev)} {acc}"


def _major_rules(kind: str, pattern: str, acc: str) -> list[str]:
    import fnmatch
    if pattern == "*":
        return [f"{kind} *:* {acc}"]
    if pattern.isdigit():
        return [f"{kind} {int(pattern)}:* {acc}"]
    return [f"{kind} {major}:* {acc}" for major, name in _proc_devices()[kind]
            if major > 0 and fnmatch.fnmatchcase(name, pattern)]


# systemd 252, src/core/bpf-devices.c, bpf_devices_allow_list_static()
_CLOSED_STATIC = (("/dev/null", "rwm"), ("/dev/zero", "rwm"), ("/dev/full", "rwm"),
                  ("/dev/random", "rwm"), ("/dev/urandom", "rwm"), ("/dev/tty", "rwm"),
                  ("/dev/ptmx", "rwm"), ("/run/systemd/inaccessible/chr", "rwm"),
                  ("/run/systemd/inaccessible/blk", "rwm"))


def device_rules(settings: dict[str, list[str]]) -> list[str]:
    """The cgroup v1 devices.allow lines systemd 252 writes for the unit (after `a` is denied).

    DevicePolicy=closed: the static pseudo devices and `char-pts rw`; each
    DeviceAllow= entry (a /dev path, or block-/char- and a /proc/devices name
    glob); ProtectClock=yes adds `char-rtc r` (src/core/unit.c,
    unit_patch_contexts) once any device list is in force. A glob that
    matches nothing adds nothing, as in systemd.
    """
    policy = settings.get("DevicePolicy", ["auto"])[-1]
    allows = [v.split() for v in settings.get("DeviceAllow", []) if v]
    if settings.get("ProtectClock", ["no"])[-1] in ("yes", "true", "1", "on") and \
            (policy != "auto" or allows):
        allows.append(["char-rtc", "r"])
    if policy not in ("closed", "strict"):
        raise SandboxError(f"DevicePolicy={policy}: this emulation handles closed and strict")
    rules: list[str] = []
    if policy == "closed":
        for node, acc in _CLOSED_STATIC:
            rules.append(_node_rule(node, acc))
        rules += _major_rules("c", "pts", "rw")
    for entry in allows:
        spec, acc = entry[0], (entry[1] if len(entry) > 1 else "rwm")
        if spec.startswith("/dev/"):
            rules.append(_node_rule(spec, acc))
        elif spec.startswith("block-"):
            rules += _major_rules("b", spec[len("block-"):], acc)
        elif spec.startswith("char-"):
            rules += _major_rules("c", spec[len("char-"):], acc)
        else:
            raise SandboxError(f"DeviceAllow={spec}: not a /dev path, block- or char- name")
    return rules


def make_devices_cgroup(name: str, rules: list[str]) -> str:
    """mkdir /sys/fs/cgroup/devices/NAME, deny all, allow ``rules``; return its path."""
    path = os.path.join(DEVICES_CGROUP, name)
    os.mkdir(path)
    with open(os.path.join(path, "devices.deny"), "w") as f:
        f.write("a")
    for rule in rules:
        with open(os.path.join(path, "devices.allow"), "w") as f:
            f.write(rule)
    return path


def join_cgroup(name: str) -> str:
    path = os.path.join(DEVICES_CGROUP, name)
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    with open("/proc/self/cgroup") as f:
        mine = [line.strip().split(":", 2)[2] for line in f
                if line.split(":")[1:2] == ["devices"]]
    if mine != ["/" + name]:
        raise SandboxError(f"not in the devices cgroup {name}: {mine}")
    return mine[0]


# -- CapabilityBoundingSet= ---------------------------------------------------------------

CAP_NAMES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
             "CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
             "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
             "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
             "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
             "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
             "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
             "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
             "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
             "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
             "CAP_CHECKPOINT_RESTORE"]


def capability_mask(settings: dict[str, list[str]]) -> int:
    names = " ".join(settings.get("CapabilityBoundingSet", [])).split()
    unknown = [n for n in names if n not in CAP_NAMES]
    if unknown or not names or any(n.startswith("~") for n in names):
        raise SandboxError(f"CapabilityBoundingSet=: cannot emulate {names}")
    return sum(1 << CAP_NAMES.index(n) for n in names)


def drop_bounding_set(keep: int) -> None:
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if not keep >> cap & 1 and _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise SandboxError(f"PR_CAPBSET_DROP {cap}: {os.strerror(ctypes.get_errno())}")


# -- MemoryDenyWriteExecute= ----------------------------------------------------------

def mprotect_exec_errno() -> int:
    """0 when a writable anonymous page can be made executable, else the errno."""
    length = mmap.PAGESIZE
    addr = _libc.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE,
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        raise SandboxError(f"mmap: {os.strerror(ctypes.get_errno())}")
    try:
        if _libc.mprotect(addr, length, mmap.PROT_READ | mmap.PROT_EXEC) == 0:
            return 0
        return ctypes.get_errno()
    finally:
        _libc.munmap(addr, length)


def mdwe_prctl() -> int:
    """PR_SET_MDWE(PR_MDWE_REFUSE_EXEC_GAIN); returns what PR_GET_MDWE reads back."""
    if _libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise SandboxError(f"prctl(PR_SET_MDWE): {os.strerror(ctypes.get_errno())} "
                           "(needs Linux >= 6.3)")
    return _libc.prctl(PR_GET_MDWE, 0, 0, 0, 0)


def mdwe_seccomp_filter():
    """systemd 252's seccomp_memory_deny_write_execute() for x86-64/arm64."""
    import seccomp
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    eperm = seccomp.ERRNO(errno.EPERM)
    wx = mmap.PROT_WRITE | mmap.PROT_EXEC
    f.add_rule_exactly(eperm, "mmap", seccomp.Arg(2, seccomp.MASKED_EQ, wx, wx))
    for call in ("mprotect", "pkey_mprotect"):
        f.add_rule_exactly(eperm, call,
                           seccomp.Arg(2, seccomp.MASKED_EQ, mmap.PROT_EXEC, mmap.PROT_EXEC))
    f.add_rule_exactly(eperm, "shmat", seccomp.Arg(2, seccomp.MASKED_EQ, SHM_EXEC, SHM_EXEC))
    return f


# -- SystemCallFilter= as a seccomp filter -------------------------------------------------

def syscall_filter(denied: set[str], err: int | None):
    """Allow all native system calls but ``denied``: fail them with ``err``, or kill.

    The filter holds the native architecture only, so a call through another
    ABI (int 0x80, x32) takes the bad-architecture action, kill: this is
    SystemCallArchitectures=native. Names unknown on this architecture (the
    32-bit setuid32, ...) are left out, as systemd leaves them out.
    Returns (filter, the names installed).
    """
    import seccomp
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    action = seccomp.ERRNO(err) if err is not None else seccomp.KILL_PROCESS
    installed = []
    for name in sorted(denied):
        try:
            nr = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        except (ValueError, RuntimeError):
            continue
        if nr < 0:          # a pseudo number: not a system call on this architecture
            continue
        f.add_rule_exactly(action, name)
        installed.append(name)
    return f, installed


def seccomp_mode() -> tuple[int, int]:
    """(Seccomp:, Seccomp_filters:) of this process."""
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Seccomp", "Seccomp_filters"):
                vals[key] = int(value)
    return vals.get("Seccomp", 0), vals.get("Seccomp_filters", 0)


# -- PrivateNetwork= ----------------------------------------------------------------------

def private_network(settings: dict[str, list[str]]) -> dict:
    """A new network namespace with its loopback device up, as PrivateNetwork=yes gives;
    returns the old and new namespace (``/proc/self/ns/net``) and the loopback's flags."""
    if settings.get("PrivateNetwork", ["no"])[-1] not in ("yes", "true", "1", "on"):
        raise SandboxError(f"PrivateNetwork={settings.get('PrivateNetwork')}: the unit has "
                           "no private network to emulate")
    before = os.readlink("/proc/self/ns/net")
    if _libc.unshare(CLONE_NEWNET) != 0:
        raise SandboxError(f"unshare(CLONE_NEWNET): {os.strerror(ctypes.get_errno())}")
    after = os.readlink("/proc/self/ns/net")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:     # before any filter
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, req))[1]
    if after == before or not flags & IFF_UP:
        raise SandboxError(f"no private network: namespace {before} -> {after}, "
                           f"lo flags {flags:#x}")
    return {"host_netns": before, "netns": after, "lo_up": True}


# -- RestrictAddressFamilies= --------------------------------------------------------------

def allowed_families(settings: dict[str, list[str]]) -> list[int]:
    """RestrictAddressFamilies= (an allow-list) as address family numbers."""
    names = " ".join(settings.get("RestrictAddressFamilies", [])).split()
    if not names or any(n.startswith("~") or n == "none" for n in names):
        raise SandboxError(f"RestrictAddressFamilies={names}: this emulation handles an "
                           "allow-list")
    unknown = [n for n in names if not isinstance(getattr(socket, n, None), int)]
    if unknown:
        raise SandboxError(f"RestrictAddressFamilies=: unknown families {unknown}")
    return sorted({int(getattr(socket, n)) for n in names})


def address_family_filter(allowed: list[int]):
    """systemd 252's allow-list filter on socket(2): EAFNOSUPPORT below the first family
    allowed, above the last, and for each one between them that is not allowed."""
    import seccomp
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    refuse = seccomp.ERRNO(errno.EAFNOSUPPORT)
    first, last = allowed[0], allowed[-1]
    f.add_rule_exactly(refuse, "socket", seccomp.Arg(0, seccomp.LT, first))
    f.add_rule_exactly(refuse, "socket", seccomp.Arg(0, seccomp.GT, last))
    for af in range(first + 1, last):
        if af not in allowed:
            f.add_rule_exactly(refuse, "socket", seccomp.Arg(0, seccomp.EQ, af))
    return f


def socket_errno(family: int) -> int:
    """0 when a socket of ``family`` can be made, else the errno."""
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
        return 0
    except OSError as exc:
        return exc.errno


# -- socket activation ---------------------------------------------------------------------

def pass_listen_fds(specs: list[str]) -> dict:
    """Move each inherited ``FD:NAME`` to 3, 4, ... and set LISTEN_* for this process (the
    exec keeps its pid), as systemd does for the sockets of a service; call last."""
    pairs = []
    for spec in specs:
        fd, _, name = spec.partition(":")
        if not fd.isdigit() or not name or ":" in name:
            raise SandboxError(f"--listen-fd {spec}: expected FD:NAME")
        pairs.append((int(fd), name))
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd, _ in pairs]   # out of 3..'s way
    for i, fd in enumerate(high):
        os.dup2(fd, SD_LISTEN_FDS_START + i)                          # inheritable
        os.close(fd)
    for fd, _ in pairs:
        if fd >= SD_LISTEN_FDS_START + len(pairs):
            os.close(fd)
    os.environ.update(LISTEN_FDS=str(len(pairs)),
                      LISTEN_FDNAMES=":".join(name for _, name in pairs),
                      LISTEN_PID=str(os.getpid()))
    return {"fds": list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + len(pairs))),
            "names": [name for _, name in pairs], "pid": os.getpid()}


# -- main ---------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--unit", default=UNIT)
    ap.add_argument("--private-network", action="store_true")
    ap.add_argument("--address-families", action="store_true")
    ap.add_argument("--listen-fd", action="append", default=[], metavar="FD:NAME")
    ap.add_argument("--mdwe", action="store_true")
    ap.add_argument("--mdwe-seccomp", action="store_true")
    ap.add_argument("--seccomp", action="store_true")
    ap.add_argument("--seccomp-action", choices=["unit", "kill"], default="unit")
    ap.add_argument("--caps", action="store_true")
    ap.add_argument("--devices-cgroup", metavar="NAME")
    ap.add_argument("--report", metavar="FILE")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command after --")
    settings = read_unit(args.unit)
    report: dict = {"pid": os.getpid()}
    try:
        if args.private_network:           # first, as systemd: the namespaces, then the rest
            report["private_network"] = private_network(settings)
        if args.devices_cgroup:
            report["cgroup"] = join_cgroup(args.devices_cgroup)
        if args.caps:
            keep = capability_mask(settings)
            drop_bounding_set(keep)
            report["capability_bounding_set"] = keep
        if args.mdwe:
            got = mdwe_prctl()
            err = mprotect_exec_errno()
            if got != PR_MDWE_REFUSE_EXEC_GAIN or err != errno.EACCES:
                raise SandboxError(f"PR_SET_MDWE not in force: PR_GET_MDWE={got}, "
                                   f"mprotect(PROT_EXEC) errno {err}")
            report["mdwe_prctl"] = {"PR_GET_MDWE": got, "mprotect_exec": errno.errorcode[err]}
        if args.mdwe_seccomp:
            mdwe_seccomp_filter().load()
            err = mprotect_exec_errno()
            if err != errno.EPERM:      # seccomp runs before the call, and the prctl
                raise SandboxError(f"MDWE seccomp filter not in force: mprotect(PROT_EXEC) "
                                   f"errno {err}")
            report["mdwe_seccomp"] = {"mprotect_exec": errno.errorcode[err]}
        if args.seccomp:
            denied = denied_syscalls(settings)
            err = None if args.seccomp_action == "kill" else error_number(settings)
            f, installed = syscall_filter(denied, err)
            f.load()
            report["seccomp"] = {"errno": err, "denied": sorted(denied),
                                 "installed": installed}
        if args.address_families:
            allowed = allowed_families(settings)
            address_family_filter(allowed).load()
            got = {socket.AddressFamily(af).name: socket_errno(af)
                   for af in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)}
            if any((got[socket.AddressFamily(af).name] == 0) != (af in allowed)
                   for af in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)) or \
                    any(e not in (0, errno.EAFNOSUPPORT) for e in got.values()):
                raise SandboxError(f"RestrictAddressFamilies= not in force: {got}")
            report["address_families"] = {"allowed": allowed, "socket_errno": got}
        report["seccomp_status"] = seccomp_mode()
        if args.listen_fd:
            report["listen_fds"] = pass_listen_fds(args.listen_fd)
    except SandboxError as exc:
        print(f"sandbox_exec: {exc}", file=sys.stderr)
        return 1
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
