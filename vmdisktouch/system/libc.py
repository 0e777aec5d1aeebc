"""Thin ctypes bindings: the one module of the project that calls libc through ctypes.

mmap, munmap, mincore, mlock, munlock, madvise, fstatfs, cachestat(2), mount(2) and
inotify(7) (the watch on opens of an image).
Each wrapper returns raw data and turns a failure into a project exception
exactly once (``errors.syscall_error``). The calls that Python's ``os``
module makes itself (lseek, posix_fadvise, pread, fstat) have their home in
``files``. Policy (what to map, when to lock) lives above this layer.

References: mmap(2), mincore(2), mlock(2), madvise(2), statfs(2) and
cachestat(2) (Linux >= 6.5, syscall 451 on x86_64 and arm64).
"""

from __future__ import annotations

import ctypes
import errno
import ctypes.util
import mmap as _mmap
import os
import platform
import struct

import numpy as np

from vmdisktouch.errors import SyscallError, syscall_error

# The host's page size, read once here and nowhere else: 4 KiB on x86_64, often 64 KiB
# on arm64 and ppc64le. Every other module (and, as a parameter, the core) takes it
# from here; the kernel's page indices (mincore, trace events) are in this unit.
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")

PROT_READ = _mmap.PROT_READ
MAP_SHARED = _mmap.MAP_SHARED
MADV_DONTNEED = 4
MADV_RANDOM = 1
MADV_SEQUENTIAL = 2

# cachestat(2) syscall numbers. The generic table (arm64, riscv) uses 451 too.
_CACHESTAT_NR = {"x86_64": 451, "aarch64": 451, "riscv64": 451}

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _bind(name: str, *argtypes, restype=ctypes.c_int):
    fn = getattr(_libc, name)
    fn.argtypes, fn.restype = list(argtypes), restype
    return fn


_void_p, _size_t, _int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_mmap_fn = _bind("mmap", _void_p, _size_t, _int, _int, _int, ctypes.c_long, restype=_void_p)
_munmap_fn = _bind("munmap", _void_p, _size_t)
_mincore_fn = _bind("mincore", _void_p, _size_t, _void_p)
_mlock_fn = _bind("mlock", _void_p, _size_t)
_munlock_fn = _bind("munlock", _void_p, _size_t)
_madvise_fn = _bind("madvise", _void_p, _size_t, _int)
_fstatfs_fn = _bind("fstatfs", _int, _void_p)
_statfs_fn = _bind("statfs", ctypes.c_char_p, _void_p)
_syscall_fn = _libc.syscall
_syscall_fn.restype = ctypes.c_long

MAP_FAILED = ctypes.c_void_p(-1).value


def _fail(call: str, detail: str = ""):
    raise syscall_error(call, ctypes.get_errno(), detail)


def mmap_file(fd: int, offset: int, length: int, prot: int = PROT_READ,
              flags: int = MAP_SHARED) -> int:
    """Map ``length`` bytes of ``fd`` at page-aligned ``offset``; return the address."""
    addr = _mmap_fn(None, length, prot, flags, fd, offset)
    if addr == MAP_FAILED or addr is None:
        _fail("mmap", f"offset {offset}, length {length}")
    return addr


def munmap(addr: int, length: int) -> None:
    if _munmap_fn(addr, length) != 0:
        _fail("munmap")


def mincore(addr: int, length: int, vec: np.ndarray) -> np.ndarray:
    """Fill ``vec`` (uint8, at least one byte per page) with mincore(2) output.

    Returns the view of ``vec`` covering the pages of ``length``; bit 0 of each
    byte is set when the page is resident.
    """
    pages = (length + PAGE_SIZE - 1) // PAGE_SIZE
    if vec.dtype != np.uint8 or vec.size < pages or not vec.flags.c_contiguous:
        raise ValueError("mincore vector too small or not contiguous uint8")
    if _mincore_fn(addr, length, vec.ctypes.data) != 0:
        _fail("mincore")
    return vec[:pages]


def mlock(addr: int, length: int) -> None:
    if _mlock_fn(addr, length) != 0:
        _fail("mlock", f"{length} bytes")


def munlock(addr: int, length: int) -> None:
    if _munlock_fn(addr, length) != 0:
        _fail("munlock")


def madvise(addr: int, length: int, advice: int) -> None:
    if _madvise_fn(addr, length, advice) != 0:
        _fail("madvise")


def fs_type(fd: int) -> int | None:
    """``f_type`` of the filesystem ``fd`` is on (statfs(2)); None when fstatfs fails."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on x86_64
    if _fstatfs_fn(fd, buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value


def fs_type_at(path: str) -> int | None:
    """``f_type`` of the filesystem ``path`` is on (statfs(2): the file is not opened);
    None when statfs fails."""
    buf = ctypes.create_string_buffer(256)
    if _statfs_fn(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value


class CacheStatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class CacheStat(ctypes.Structure):
    _fields_ = [
        ("nr_cache", ctypes.c_uint64),
        ("nr_dirty", ctypes.c_uint64),
        ("nr_writeback", ctypes.c_uint64),
        ("nr_evicted", ctypes.c_uint64),
        ("nr_recently_evicted", ctypes.c_uint64),
    ]


class CacheStatCaller:
    """Calls cachestat(2) on one fd with preallocated argument structures.

    The scanner issues tens of thousands of calls per scan, so the structures
    are built once. ``available`` is False when the kernel lacks the syscall
    (ENOSYS) or refuses it for this file (EPERM: the caller may not write it).
    A failed call raises ``SyscallError`` ("cachestat"), never a bare OSError.
    """

    def __init__(self, fd: int):
        self.fd = fd
        self._range = CacheStatRange()
        self._stat = CacheStat()
        self._range_ref = ctypes.byref(self._range)
        self._stat_ref = ctypes.byref(self._stat)
        self._nr = _CACHESTAT_NR.get(platform.machine())
        self.available = self._nr is not None
        # Why not, when not: the errno of the probe (ENOSYS, EPERM), or the machine.
        self.unavailable = "" if self.available else f"no syscall number on {platform.machine()}"
        if self.available:
            try:
                self.nr_cache(0, PAGE_SIZE)
            except SyscallError as exc:
                self.available = False
                self.unavailable = errno.errorcode.get(exc.errno or 0, str(exc.errno))

    def nr_cache(self, offset: int, length: int) -> int:
        """Number of pages of [offset, offset+length) present in the page cache."""
        rng = self._range
        rng.off = offset
        rng.len = length
        if _syscall_fn(self._nr, self.fd, self._range_ref, self._stat_ref, 0) != 0:
            _fail("cachestat", f"offset {offset}, length {length}")
        return self._stat.nr_cache

    def uncached_bytes(self, offset: int, length: int) -> int:
        """Bytes of the range not in the page cache: all of them when cachestat cannot tell."""
        if not self.available:
            return length
        try:
            cached = self.nr_cache(offset, length) * PAGE_SIZE
        except SyscallError:
            return length
        return max(length - cached, 0)

    def record(self, offset: int, length: int) -> tuple[int, int, int, int, int]:
        """(cached, dirty, writeback, evicted, recently evicted) pages of the range."""
        self.nr_cache(offset, length)
        st = self._stat
        return (st.nr_cache, st.nr_dirty, st.nr_writeback, st.nr_evicted,
                st.nr_recently_evicted)


_mount_fn = _bind("mount", ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                  _void_p)


def mount(source: str, target: str, fstype: str, flags: int = 0) -> None:
    """mount(2) without file system data (e.g. ``mount("nodev", "/sys/kernel/tracing",
    "tracefs")``); a failure raises ``SyscallError`` ("mount")."""
    if _mount_fn(source.encode(), target.encode(), fstype.encode(), flags, None) != 0:
        _fail("mount", f"{fstype} on {target}")


# bpf(2) and perf_event_open(2) numbers, by machine (the generic table: aarch64, riscv64).
_BPF_NR = {"x86_64": 321, "aarch64": 280, "riscv64": 280, "ppc64le": 361, "s390x": 351}
_PERF_OPEN_NR = {"x86_64": 298, "aarch64": 241, "riscv64": 241, "ppc64le": 319,
                 "s390x": 331}
_BPF_PROG_LOAD = 5
_ioctl_fn = _bind("ioctl", _int, ctypes.c_ulong, ctypes.c_ulong)


def _syscall_nr(table: dict[str, int], call: str) -> int:
    nr = table.get(platform.machine())
    if nr is None:
        raise SyscallError(call, 38, f"no system call number known for {platform.machine()}")
    return nr


def bpf(cmd: int, attr: bytes, what: str) -> int:
    """bpf(2) with ``attr`` (a ``union bpf_attr``, zero-padded to 128 bytes): the
    descriptor it returns; a failure raises ``SyscallError`` (``what``)."""
    buf = ctypes.create_string_buffer(attr, max(len(attr), 128))
    fd = _syscall_fn(_syscall_nr(_BPF_NR, "bpf"), cmd, buf, len(buf))
    if fd < 0:
        _fail("bpf", what)
    return int(fd)


BPF_LOAD_TRIES = 5     # a verification a signal interrupted is tried again, this many times


def bpf_prog_load(prog_type: int, code: bytes, name: bytes) -> int:
    """BPF_PROG_LOAD of the instructions ``code`` (GPL): its descriptor. Refused, it is
    loaded again with the verifier's log, whose last line the ``SyscallError`` tells.
    The verifier gives up with EAGAIN when a signal is pending (``do_check``): on a busy
    host a long verification met one and the disk's reads stayed events for its life,
    so that is tried again, up to ``BPF_LOAD_TRIES`` times."""
    insns = ctypes.create_string_buffer(code, len(code))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(1 << 20)

    def attr(level: int) -> bytes:
        return struct.pack("<IIQQIIQII16s", prog_type, len(code) // 8, ctypes.addressof(insns),
                           ctypes.addressof(lic), level, len(log) if level else 0,
                           ctypes.addressof(log) if level else 0, 0, 0, name)
    for tries_left in range(BPF_LOAD_TRIES - 1, -1, -1):
        try:
            return bpf(_BPF_PROG_LOAD, attr(0), "BPF_PROG_LOAD")
        except SyscallError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EINTR) or not tries_left:
                refused = exc
                break
    try:
        os.close(bpf(_BPF_PROG_LOAD, attr(1), "BPF_PROG_LOAD"))
    except SyscallError:
        pass
    lines = log.value.decode(errors="replace").strip().splitlines()
    detail = "BPF_PROG_LOAD" + (f": the verifier: {lines[-2] if len(lines) > 1 else lines[-1]}"
                                if lines else "")
    raise SyscallError("bpf", refused.errno, detail) from None


def perf_event_open(attr: bytes, pid: int, cpu: int, group_fd: int, flags: int) -> int:
    """perf_event_open(2) with ``attr`` (a ``struct perf_event_attr`` of its own size)."""
    buf = ctypes.create_string_buffer(attr, len(attr))
    fd = _syscall_fn(_syscall_nr(_PERF_OPEN_NR, "perf_event_open"), buf, pid, cpu, group_fd,
                     flags)
    if fd < 0:
        _fail("perf_event_open")
    return int(fd)


def ioctl(fd: int, request: int, arg: int, what: str) -> None:
    """ioctl(2) with an integer argument; a failure raises ``SyscallError`` (``what``)."""
    if _ioctl_fn(fd, request, arg) != 0:
        _fail("ioctl", what)


# inotify(7): only the watch on opens of an image (``system.opens``)
IN_OPEN = 0x00000020
IN_CLOEXEC, IN_NONBLOCK = os.O_CLOEXEC, os.O_NONBLOCK
_inotify_init1_fn = _bind("inotify_init1", _int)
_inotify_add_watch_fn = _bind("inotify_add_watch", _int, ctypes.c_char_p, ctypes.c_uint32)


def inotify_init1(flags: int = IN_CLOEXEC | IN_NONBLOCK) -> int:
    """A new inotify descriptor; a failure raises ``SyscallError``."""
    fd = _inotify_init1_fn(flags)
    if fd < 0:
        _fail("inotify_init1")
    return int(fd)


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    """Watch ``path`` (a symbolic link followed) for ``mask``; the watch descriptor."""
    wd = _inotify_add_watch_fn(fd, os.fsencode(path), mask)
    if wd < 0:
        _fail("inotify_add_watch", path)
    return int(wd)
