"""The file system calls that go through Python's ``os`` module, each with one home.

``lseek`` (``SEEK_DATA``/``SEEK_HOLE``), ``posix_fadvise`` (``WILLNEED`` in
pieces, ``DONTNEED``, ``RANDOM``, ``NORMAL``), ``pread``/``preadv``,
``fstat`` and the ``O_NOATIME`` open of the OS layer are called here and
nowhere else (the adapters stat their own output files); the calls through
ctypes are in ``libc``. An image is opened once by path (``image.open_image``
through ``open_noatime``); every other descriptor on it, the ``O_DIRECT`` one
of the miss probe and the direct-I/O tracer's included, is ``reopen`` of the
verified one (``tests/unit/test_image_opens.py`` holds the rule). A failure becomes a
project exception (``errors.syscall_error``) here, once; advice is advice
only, and its failure is ignored.

``open_dir`` is the one way to a directory the daemon writes in (the lock,
state and output directories): walked from ``/`` one component at a time,
never through a symlink someone else could have planted or changed (a link
is followed only when it is root's or the daemon's own, in a directory only
they can change or a sticky one), the last component never a symlink, the
checks made again at every write. ``private``: the directory is root's or
the daemon's user's, every directory above it too, and none of them can be
written by group or others (an ancestor may be sticky, as ``/tmp``): no
other user can plant a file there, or swap one. ``UnsafePath`` says why not.
``inode_generation`` is ``FS_IOC_GETVERSION``: what tells a reused inode
number from the file that had it before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct

from vmdisktouch.errors import SyscallError, file_kind, syscall_error

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


def reopen(fd: int, flags: int) -> int:
    """The file open on ``fd`` (an image ``open_image`` verified), on a new descriptor
    opened with ``flags`` (``O_NOATIME`` added where permitted): through
    ``/proc/self/fd/N``, so the same inode whatever its path names now (renamed over,
    a symlink planted, deleted). Its (device, inode) is checked against ``fd``'s all
    the same: a mismatch is refused (``SyscallError``, ESTALE), never read."""
    path = f"/proc/self/fd/{fd}"
    try:
        new = open_noatime(path, flags)
    except OSError as exc:
        raise _raise("open", exc, path) from None
    try:
        was, now = fstat(fd), fstat(new)
        if (now.st_dev, now.st_ino) != (was.st_dev, was.st_ino):
            raise syscall_error("open", errno.ESTALE,
                                f"{path} names inode {now.st_ino}, not the image's "
                                f"{was.st_ino}")
    except BaseException:
        os.close(new)
        raise
    return new


def reopen_random(fd: int) -> int:
    """The same open file, read-only, on a new descriptor with readahead off (``reopen``).

    ``O_NOATIME`` where permitted: reads after a guest's write would
    otherwise update the image's atime (relatime), a metadata write.
    """
    new = reopen(fd, os.O_RDONLY | os.O_CLOEXEC)
    advise(new, 0, 0, os.POSIX_FADV_RANDOM)
    return new


# -- directories the daemon writes in ---------------------------------------------------

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_SYMLINKS = 40                  # as the kernel's path walk
FS_IOC_GETVERSION = 0x80087601     # _IOR('v', 1, long)


class UnsafePath(OSError):
    """A directory others could swap or write into (``strerror``: why, in words)."""


def _trusted(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid())


def _closed(st: os.stat_result) -> bool:
    """Only its owner can add, remove or rename entries (or, sticky, only theirs)."""
    return not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or bool(st.st_mode & stat.S_ISVTX)


def _private_problem(st: os.stat_result, shown: str, last: bool) -> str | None:
    if not _trusted(st):
        return f"{shown} is owned by uid {st.st_uid}, not root or this daemon's user"
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and (last or not st.st_mode & stat.S_ISVTX):
        return (f"{shown} can be written by other users (mode "
                f"{stat.S_IMODE(st.st_mode):04o}): make it 0755 or 0700")
    return None


def open_dir(path: str, *, private: bool = False, create: int | None = None) -> int:
    """A descriptor (``O_DIRECTORY``) of the directory ``path``, walked as the docstring
    says; ``create``: the mode of the last component when it is missing (the ones above
    it: 0755). Raises ``UnsafePath``, ``NotADirectoryError``, ``FileNotFoundError`` or the
    ``OSError`` of a step."""
    parts = [p for p in reversed(os.path.abspath(path).split("/")) if p]
    fds = [os.open("/", DIR_FLAGS)]
    shown, links = "/", 0
    try:
        if private and (problem := _private_problem(os.fstat(fds[0]), "/", not parts)):
            raise UnsafePath(errno.EPERM, problem)
        while parts:
            name = parts.pop()
            if name == ".":
                continue
            if name == "..":
                if len(fds) > 1:
                    os.close(fds.pop())
                shown = os.path.dirname(shown)
                continue
            parent, last = fds[-1], not parts
            st = _lstat_or_make(name, parent, create if last else 0o755,
                                create is not None)
            here = os.path.join(shown, name)
            if stat.S_ISLNK(st.st_mode):
                if last:
                    raise UnsafePath(errno.ELOOP, f"{here} is a symbolic link")
                if not (_trusted(st) and _trusted(os.fstat(parent))
                        and _closed(os.fstat(parent))):
                    raise UnsafePath(errno.EPERM, f"{here} is a symbolic link another user "
                                                  f"could change (uid {st.st_uid})")
                links += 1
                if links > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, f"{path}: too many symbolic links")
                target = os.readlink(name, dir_fd=parent)
                parts.extend(p for p in reversed(target.split("/")) if p)
                if target.startswith("/"):
                    while len(fds) > 1:
                        os.close(fds.pop())
                    shown = "/"
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, f"{here} is {file_kind(st.st_mode)}, "
                                                        "not a directory")
            fds.append(os.open(name, DIR_FLAGS, dir_fd=parent))
            shown = here
            if private and (problem := _private_problem(os.fstat(fds[-1]), here, last)):
                raise UnsafePath(errno.EPERM, problem)
        return fds.pop()
    finally:
        for fd in fds:
            os.close(fd)


def _lstat_or_make(name: str, parent: int, mode: int, create: bool) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(name, mode, dir_fd=parent)
    except FileExistsError:
        pass                                   # made by another process meanwhile
    return os.stat(name, dir_fd=parent, follow_symlinks=False)


def inode_generation(fd: int) -> int | None:
    """The inode's generation number (ext4, XFS, btrfs...), None where the file system
    has none: a new file that got a freed inode's number has another generation."""
    try:
        raw = fcntl.ioctl(fd, FS_IOC_GETVERSION, bytes(8))
    except OSError:
        return None
    return struct.unpack("=I", raw[:4])[0]
