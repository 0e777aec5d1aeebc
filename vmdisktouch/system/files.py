"""The file system calls that go through Python's ``os`` module, each with one home.

``lseek`` (``SEEK_DATA``/``SEEK_HOLE``), ``posix_fadvise`` (``WILLNEED`` in
pieces, ``DONTNEED``, ``RANDOM``, ``NORMAL``), ``pread``/``preadv``,
``fstat`` and the ``O_NOATIME`` open of the OS layer are called here and
nowhere else (the adapters stat their own output files); the calls through
ctypes are in ``libc``. A failure becomes a
project exception (``errors.syscall_error``) here, once; advice is advice
only, and its failure is ignored.
"""

from __future__ import annotations

import errno
import os

from vmdisktouch.errors import SyscallError, syscall_error

WILLNEED_BYTES = 128 << 10   # one POSIX_FADV_WILLNEED: never above the kernel's cap on it


def _raise(call: str, exc: OSError, detail: str = "") -> SyscallError:
    return syscall_error(call, exc.errno or errno.EIO, detail)


def fstat(fd: int) -> os.stat_result:
    try:
        return os.fstat(fd)
    except OSError as exc:
        raise _raise("fstat", exc) from None


def seek(fd: int, pos: int, whence: int) -> int | None:
    """``lseek(fd, pos, whence)``; None for ENXIO (no data, or no hole, from ``pos`` on)."""
    try:
        return os.lseek(fd, pos, whence)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return None
        raise _raise("lseek", exc, f"offset {pos}") from None


def advise(fd: int, offset: int, length: int, advice: int) -> bool:
    """``posix_fadvise``; advice only: False when the kernel refused it."""
    try:
        os.posix_fadvise(fd, offset, length, advice)
    except OSError:
        return False
    return True


def read_ahead(fd: int, offset: int, length: int) -> None:
    """Start reading exactly ``[offset, offset+length)``: ``WILLNEED`` in ``WILLNEED_BYTES``
    pieces (the kernel caps one WILLNEED at the device's readahead size)."""
    for off in range(offset, offset + length, WILLNEED_BYTES):
        if not advise(fd, off, min(WILLNEED_BYTES, offset + length - off),
                      os.POSIX_FADV_WILLNEED):
            return   # advice only: mlock still faults the pages in


def drop_cache(fd: int, offset: int, length: int) -> None:
    """``POSIX_FADV_DONTNEED``: the kernel drops the unmapped, clean pages of the range."""
    advise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def drop_and_read_back(fd: int, offset: int, length: int) -> None:
    """``DONTNEED`` then ``WILLNEED``, ``WILLNEED_BYTES`` at a time: each piece's pages are
    allocated again (and charged) in this process's context right after the drop, before
    a reader that keeps reading them faults them first. Dropping a whole range before
    reading it back left a window such a reader filled. Advice only: pages the kernel
    kept (mapped, dirty) stay charged where they were."""
    for off in range(offset, offset + length, WILLNEED_BYTES):
        n = min(WILLNEED_BYTES, offset + length - off)
        drop_cache(fd, off, n)
        advise(fd, off, n, os.POSIX_FADV_WILLNEED)


def pread(fd: int, length: int, offset: int) -> bytes:
    try:
        return os.pread(fd, length, offset)
    except OSError as exc:
        raise _raise("pread", exc, f"offset {offset}, length {length}") from None


def pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Read into ``buf`` until it is full or the file ends; returns the bytes read."""
    done = 0
    try:
        while done < len(buf):
            got = os.preadv(fd, [buf[done:]], offset + done)   # EINTR is retried (PEP 475)
            if got == 0:
                break
            done += got
    except OSError as exc:
        raise _raise("pread", exc, f"offset {offset}, length {len(buf)}") from None
    return done


def open_noatime(path: str, flags: int) -> int:
    """``os.open`` with ``O_NOATIME`` where permitted (the file's owner, or CAP_FOWNER).

    Raises the OSError of the open itself: the callers say what the path was.
    """
    try:
        return os.open(path, flags | os.O_NOATIME)
    except PermissionError as exc:
        if exc.errno != errno.EPERM:  # O_NOATIME needs ownership; EACCES is real
            raise
        return os.open(path, flags)


def reopen_random(fd: int) -> int:
    """The same open file, read-only, on a new descriptor with readahead off.

    ``O_NOATIME`` where permitted: reads after a guest's write would
    otherwise update the image's atime (relatime), a metadata write.
    """
    path = f"/proc/self/fd/{fd}"
    try:
        new = open_noatime(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _raise("open", exc, path) from None
    advise(new, 0, 0, os.POSIX_FADV_RANDOM)
    return new
