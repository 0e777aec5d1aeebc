"""Opening and validating disk images: regular files and block devices.

An ``Image`` is an open, read-only file descriptor on a raw or qcow2 image
(or an LVM volume / loop device). It alone keeps the image's facts: its
size (``size``, re-read by ``refresh_size``), its kind (``is_regular``), its
identity (``check_identity``), its allocation (``allocation``: ``st_blocks``)
and where its data lies (``data_runs``: ``SEEK_DATA``/``SEEK_HOLE``); the
holder, the checksums and the residency tracker are given the ``Image``
and ask it. Everything that can be wrong with a path a user gives is
turned into an ``ImageError`` with a one-line message here, before any
scanning starts.

Hazards handled (see FIELD-NOTES): block devices report ``st_size == 0`` so
their size comes from ``ioctl(BLKGETSIZE64)``; files on pseudo filesystems
(/proc, /sys) are refused; FIFOs are never opened (opening one blocks); the
image is opened ``O_RDONLY`` (plus ``O_NOATIME`` where allowed), so nothing,
not even atime, is written to it. It is opened by path once, here: a second
descriptor (the miss probe's and the direct-I/O tracer's ``O_DIRECT`` ones:
``reopen_direct``) is the verified one reopened, never the path again.
"""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import stat
import struct
from dataclasses import dataclass

from vmdisktouch.core.runs import Run, blocks_of
from vmdisktouch.errors import (ConfigError, ImageError, ImageGoneError, SyscallError, VmdtError,
                                syscall_error)
from vmdisktouch.system import files, libc

BLKGETSIZE64 = 0x80081272
QCOW2_MAGIC = b"QFI\xfb"

# statfs(2) f_type values of filesystems that hold no disk images.
_PSEUDO_FS = {
    0x9FA0: "proc", 0x62656572: "sysfs", 0x64626720: "debugfs", 0x74726163: "tracefs",
    0x73636673: "securityfs", 0x27E0EB: "cgroup", 0x63677270: "cgroup2",
    0x1CD1: "devpts", 0x62656570: "configfs", 0xCAFE4A11: "bpf",
    0x6165676C: "pstore", 0xDE5E81E4: "efivarfs",
}
MAX_DATA_RUNS = 64   # per probed run: beyond this many data runs, the rest counts as data


@dataclass(frozen=True)
class ImageIdentity:
    dev: int
    ino: int


class Image:
    """A disk image opened read-only. Use as a context manager or call close()."""

    def __init__(self, path: str, fd: int, kind: str, size: int, fmt: str,
                 identity: ImageIdentity):
        self.path = path
        self.fd = fd
        self.kind = kind          # "file" or "block"
        self.size = size
        self.format = fmt         # "raw" or "qcow2"
        self.identity = identity

    def __enter__(self) -> "Image":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    @property
    def is_regular(self) -> bool:
        """A regular file (holes, mtime, st_blocks apply), not a block device."""
        return self.kind == "file"

    def current_size(self) -> int:
        """Re-read the size (the image may have been truncated or grown); ``size`` is kept."""
        return size_of_fd(self.fd, self.kind)

    def refresh_size(self) -> int:
        """Re-read the size into ``size`` and return it."""
        self.size = self.current_size()
        return self.size

    def block_count(self, block_size: int) -> int:
        """Blocks of ``block_size`` bytes in the image at ``size`` (what ``refresh_size``
        last read): the last one may be short. The one place the count is made."""
        return blocks_of(self.size, block_size)

    def covers(self, end: int) -> bool:
        """Whether the image reaches byte ``end`` now (False when its size cannot be read)."""
        try:
            return self.current_size() >= end
        except SyscallError:
            return False

    def allocation(self) -> int | None:
        """``st_blocks`` of a regular file: it changes when a hole is filled or punched.

        None for a block device, or when ``fstat`` fails.
        """
        if not self.is_regular:
            return None
        try:
            return files.fstat(self.fd).st_blocks
        except SyscallError:
            return None

    def data_runs(self, run: Run, block_size: int) -> list[Run]:
        """The blocks of ``run`` that hold data (``SEEK_DATA``/``SEEK_HOLE``), in order.

        Up to ``size``; a block with any data counts whole. Beyond
        ``MAX_DATA_RUNS`` runs the rest of ``run`` counts as data; a failed
        ``lseek`` makes the rest count as data too (hold rather than guess).
        A block device has no holes to find: ask ``is_regular`` first.
        """
        bs = block_size
        a, b = run
        end = min(b * bs, self.size)
        out: list[Run] = []
        pos = a * bs
        while pos < end:
            if len(out) >= MAX_DATA_RUNS:
                out.append((pos // bs, b))            # too fragmented: the rest whole
                break
            try:
                data = files.seek(self.fd, pos, os.SEEK_DATA)
                hole = files.seek(self.fd, data, os.SEEK_HOLE) if data is not None else None
            except SyscallError:
                return out + [(pos // bs, b)]         # cannot tell: hold it all
            if data is None or hole is None:          # ENXIO: no data from pos to the end
                break
            if data >= end:
                break
            start, stop = data // bs, min(-(-hole // bs), b)
            out.append((start, stop))
            pos = stop * bs
        return out

    def reopen_direct(self) -> int:
        """A new ``O_DIRECT`` descriptor, read-only, on this very file: the verified one
        reopened (``files.reopen``, ``O_NOATIME`` where permitted), never the path again,
        which may name another file by now. Raises ``SyscallError`` (EINVAL where the
        file system has no ``O_DIRECT``)."""
        return files.reopen(self.fd, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)

    def check_identity(self) -> None:
        """Raise ImageGoneError if the path was deleted or now names another file."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            raise ImageGoneError(f"{self.path}: image was deleted") from None
        except OSError as exc:
            raise ImageGoneError(f"{self.path}: cannot stat image: {exc.strerror}") from None
        if (st.st_dev, st.st_ino) != (self.identity.dev, self.identity.ino):
            raise ImageGoneError(f"{self.path}: image was replaced by another file")
        if self.is_regular and files.fstat(self.fd).st_nlink == 0:
            raise ImageGoneError(f"{self.path}: image was deleted")


def size_of_fd(fd: int, kind: str) -> int:
    """Bytes of a regular file (``st_size``) or a block device (``BLKGETSIZE64``)."""
    if kind == "block":
        try:
            buf = fcntl.ioctl(fd, BLKGETSIZE64, b"\0" * 8)
        except OSError as exc:
            raise syscall_error("ioctl", exc.errno or errno.EIO, "BLKGETSIZE64") from None
        return struct.unpack("Q", buf)[0]
    return files.fstat(fd).st_size


def first_page_cached(fd: int, size: int) -> bool:
    """Whether page 0 of ``fd`` is in the page cache (mincore on a one-page mapping)."""
    import numpy as np

    length = min(size, libc.PAGE_SIZE)
    addr = libc.mmap_file(fd, 0, length)
    try:
        return bool(libc.mincore(addr, length, np.zeros(1, np.uint8))[0] & 1)
    finally:
        libc.munmap(addr, length)


def read_magic(fd: int, size: int) -> bytes:
    """The first 4 bytes, read without changing what the page cache holds.

    A plain read would cache page 0 and start readahead, and a snapshot would
    then count pages it brought in itself. So: no readahead on this open file
    (FADV_RANDOM applies to this file description only), and when page 0 was
    not cached before, it is dropped again after the read.
    """
    try:
        was_cached = first_page_cached(fd, size)
    except (OSError, VmdtError):
        was_cached = True              # cannot tell: leave the cache alone
    files.advise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    try:
        head = files.pread(fd, 4, 0)
        if not was_cached:
            # The whole page: the kernel keeps a partially covered last page.
            files.drop_cache(fd, 0, libc.PAGE_SIZE)
    finally:
        files.advise(fd, 0, 0, os.POSIX_FADV_NORMAL)
    return head


# Descriptors kept free whatever the images take: the daemon's own outputs (the status
# file, the PNGs, the metrics file and connections, the probe of each directory, a lazy
# import) must never fail for a descriptor a later image took. With 130 images at
# ``ulimit -n 1024`` the 114th image took the last one and the daemon exited 78 because it
# could not open its status file.
RESERVED_FDS = 64
# What one image takes once served: the image, its lock, pagemap, kpagecount, kpagecgroup,
# the tracefs instance's directory and ``tracing_on``, one ``trace_pipe_raw`` per CPU
# (counted: 9 each for 100 images on 2 CPUs), and one spare.
PER_IMAGE_FDS = 8 + (os.cpu_count() or 1)
EMFILE = (errno.EMFILE, errno.ENFILE)


def too_many_files() -> str:
    """The real cause of EMFILE/ENFILE, with the numbers: in use, and the soft limit."""
    used, limit = descriptors()
    shown = "unlimited" if limit == resource.RLIM_INFINITY else str(limit)
    return (f"too many open files: {used} descriptors in use, limit {shown} "
            "(LimitNOFILE; ulimit -n)")


def descriptors() -> tuple[int, int]:
    """(descriptors open now, this process's soft ``RLIMIT_NOFILE``); every one of them
    when there is none left to list them with."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    try:
        used = len(os.listdir("/proc/self/fd")) - 1       # less the listing's own
    except OSError as exc:
        used = limit if exc.errno in EMFILE else -1
    return used, limit


def require_descriptors(path: str) -> None:
    """Refuse to open ``path`` (ConfigError: the limit is the setup's) unless the image
    and ``RESERVED_FDS`` still fit under the descriptor limit: what is served keeps its
    outputs, and the disks past the limit are left out in one line each."""
    used, limit = descriptors()
    if limit != resource.RLIM_INFINITY and used >= 0 and \
            limit - used < RESERVED_FDS + PER_IMAGE_FDS:
        raise ConfigError(f"{path}: not opened: {too_many_files()}; {RESERVED_FDS} are kept "
                          f"for the daemon's own files and an image takes about "
                          f"{PER_IMAGE_FDS}: raise LimitNOFILE")


def open_image(path: str) -> Image:
    """Open ``path`` as a disk image, or raise ImageError saying what is wrong; refused
    while too few descriptors are left (``require_descriptors``)."""
    require_descriptors(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ImageError(f"{path}: no such file or directory") from None
    except PermissionError:
        raise ImageError(f"{path}: permission denied") from None
    except OSError as exc:
        raise ImageError(f"{path}: {exc.strerror}") from None

    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise ImageError(f"{path}: is a directory, not a disk image")
    if stat.S_ISFIFO(mode):
        raise ImageError(f"{path}: is a FIFO; only regular files and block devices are supported")
    if stat.S_ISCHR(mode):
        raise ImageError(f"{path}: is a character device; only regular files and block devices are supported")
    if stat.S_ISSOCK(mode):
        raise ImageError(f"{path}: is a socket; only regular files and block devices are supported")
    if not (stat.S_ISREG(mode) or stat.S_ISBLK(mode)):
        raise ImageError(f"{path}: unsupported file type")
    kind = "block" if stat.S_ISBLK(mode) else "file"

    try:
        fd = files.open_noatime(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except PermissionError:
        raise ImageError(f"{path}: permission denied (cannot open for reading)") from None
    except OSError as exc:
        if exc.errno in EMFILE:
            raise ConfigError(f"{path}: cannot open: {too_many_files()}") from None
        raise ImageError(f"{path}: cannot open: {exc.strerror}") from None

    try:
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)  # only needed for open()
        fs = libc.fs_type(fd)
        if fs in _PSEUDO_FS:
            raise ImageError(f"{path}: is on the {_PSEUDO_FS[fs]} pseudo filesystem, not a disk image")
        try:
            size = size_of_fd(fd, kind)
        except SyscallError as exc:
            raise ImageError(f"{path}: cannot read size: {os.strerror(exc.errno)}") from None
        if size == 0:
            raise ImageError(f"{path}: is empty (size 0)")
        try:
            head = read_magic(fd, size)
        except SyscallError as exc:
            raise ImageError(f"{path}: cannot read: {os.strerror(exc.errno)}") from None
        fmt = "qcow2" if head == QCOW2_MAGIC else "raw"
        fst = files.fstat(fd)
        return Image(path, fd, kind, size, fmt, ImageIdentity(fst.st_dev, fst.st_ino))
    except BaseException:
        os.close(fd)
        raise


__all__ = ["Image", "ImageIdentity", "open_image", "size_of_fd", "ImageGoneError"]
