"""One daemon per image: an advisory lock keyed by what the image is, not how it is named.

Two daemons serving one image each see the other's holds as the guest's use
and would hold it twice over. ``acquire(image)`` takes an exclusive
``flock(2)`` on a lock file named after the image's identity, so that every
spelling of one image meets the same lock: ``./disk.img``, an absolute path,
a symlink, a hard link (a regular file: its device and inode), and for a
block device every node of it (``/dev/vg/lv``, ``/dev/mapper/vg-lv``,
``/dev/dm-3``: its device number, ``st_rdev``). The lock file holds the pid
and path of the daemon that has it, for the refusal's message; the lock
itself goes with the daemon's open file, so a SIGKILLed daemon leaves no
stale lock behind.

A lock file lives as long as its lock, or a directory fills with one per
image ever served (224 seen on a host): ``release`` unlinks it while still
holding the lock, and ``acquire`` checks, once it has the lock, that the
name still names the file it locked (a holder may have unlinked it between
the open and the lock), else starts again. A killed daemon's file is
removed by the next ``acquire`` in the directory (``sweep``: the files
nobody holds), which takes the directory's own ``flock`` for its sweep and
its lock, so that one daemon's sweep never locks a file another has just
made and refuses it its image.

The lock files live in ``LOCK_DIR`` (/run/vmdisktouch/locks, made on first
use; the units' ``RuntimeDirectory=vmdisktouch``), or for a user other than
root in ``$XDG_RUNTIME_DIR/vmdisktouch/locks`` (that user's daemons only:
root's and a user's cannot hold the same image's pages against each other
beyond the user's own mlock limit); ``VMDISKTOUCH_LOCK_DIR`` overrides both.
A file image and a loop device over it are different images here.

What a local user or a stray file can plant is refused in one line (exit
78), never followed, never truncated, never a hang: the lock
directory must be root's or the daemon's user's, as every directory above
it, none of them writable by group or others (``files.open_dir(private=True)``:
a 0777 directory let any user pre-lock an image, and name a fake holder),
and is never reached through a symlink it ends in; a lock file that is not
a regular file (a FIFO made ``ftruncate`` fail: exit 70), that has other
hard links (it was truncated and overwritten: someone else's file), or that
is another user's is refused, not recreated (deleting a file two starting
daemons both saw would let each lock an inode of its own; only root can
put one there, so it is a setup error). Lock files are created 0600 (a
file others can open, others can ``flock``), and the holder's text is shown
printable and bounded (escape sequences reached the terminal raw).
"""

from __future__ import annotations

import fcntl
import os
import re
import stat

from vmdisktouch.errors import ConfigError, file_kind
from vmdisktouch.system import files
from vmdisktouch.system.image import EMFILE, too_many_files

LOCK_DIR = "/run/vmdisktouch/locks"
ENV = "VMDISKTOUCH_LOCK_DIR"


class ImageBusyError(ConfigError):
    """Another daemon serves this image (exit 78: two units for one image is a setup error)."""


def lock_dir() -> str:
    if os.environ.get(ENV):
        return os.environ[ENV]
    if os.geteuid() == 0:
        return LOCK_DIR
    base = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/vmdisktouch-{os.geteuid()}"
    return os.path.join(base, "vmdisktouch", "locks")


def lock_name(st: os.stat_result) -> str:
    """The lock file's name for an image with this ``fstat``."""
    if stat.S_ISBLK(st.st_mode):
        return f"blk-{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}.lock"
    return f"file-{os.major(st.st_dev)}:{os.minor(st.st_dev)}-{st.st_ino}.lock"


class ImageLock:
    """Held from ``acquire`` until ``release`` (or the process's end)."""

    def __init__(self, fd: int, path: str):
        self.fd = fd
        self.path = path

    def release(self) -> None:
        """Unlink the file while still holding its lock, then drop the lock: whoever opened
        the file meanwhile sees it gone once it locks it, and starts again (``acquire``)."""
        if self.fd >= 0:
            try:
                if _names(self.path, self.fd):
                    os.unlink(self.path)
            except OSError:
                pass                     # left for the next sweep
            os.close(self.fd)            # the flock goes with the open file
            self.fd = -1

    def __enter__(self) -> "ImageLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(image, directory: str | None = None) -> ImageLock:
    """Lock ``image`` (an open ``Image``) for this process, or raise ImageBusyError."""
    directory = directory or lock_dir()
    name = lock_name(os.fstat(image.fd))
    path = os.path.join(directory, name)
    try:
        dfd = files.open_dir(directory, private=True, create=0o700)
    except files.UnsafePath as exc:
        raise ConfigError(f"refusing the lock directory {directory}: {exc.strerror}") from None
    except OSError as exc:
        hint = too_many_files() if exc.errno in EMFILE else \
            f"{exc.strerror} (set {ENV} to a writable directory)"
        raise ConfigError(f"cannot make the lock of {image.path} in {directory}: "
                          f"{hint}") from None
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)          # no other daemon sweeps or locks meanwhile
        sweep(dfd, directory)
        fd = _lock(name, dfd, path, image.path)
    finally:
        os.close(dfd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} {image.path}\n".encode(errors="surrogateescape"), 0)
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"cannot write the lock file {path}: {exc.strerror}") from None
    return ImageLock(fd, path)


def _lock(name: str, dfd: int, path: str, image: str) -> int:
    """The locked descriptor of the file ``name`` names once it is locked: a file unlinked
    by its last holder between the open and the lock is not the lock any more."""
    while True:
        fd = _open_lock(name, dfd, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ImageBusyError(
                f"{image} is already served by another vmdisktouch ({holder}; lock {path}): "
                "one daemon per image, or each would take the other's holds for the guest's "
                "use") from None
        except OSError as exc:
            os.close(fd)
            raise ConfigError(f"cannot lock {path}: {exc.strerror}") from None
        if _names(name, fd, dfd):
            return fd
        os.close(fd)


def _names(name: str, fd: int, dfd: int | None = None) -> bool:
    """Whether ``name`` (in ``dfd``) still names the file open as ``fd``."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


LOCK_FILE = re.compile(r"(file-\d+:\d+-\d+|blk-\d+:\d+)\.lock")


def sweep(dfd: int, directory: str) -> list[str]:
    """Remove the lock files nobody holds (their daemons were killed), under the directory's
    own lock (``acquire``): a sweep that locked a file a starting daemon had just made
    would refuse that daemon its image. Files that are not locks this project made, or that
    ``_open_lock`` would refuse, are left alone."""
    gone = []
    for name in os.listdir(dfd):
        if not LOCK_FILE.fullmatch(name):
            continue
        try:
            if _lock_file_problem(os.stat(name, dir_fd=dfd, follow_symlinks=False)):
                continue
            fd = os.open(name, LOCK_FLAGS, dir_fd=dfd)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if _names(name, fd, dfd) and not _lock_file_problem(os.fstat(fd)):
                os.unlink(name, dir_fd=dfd)
                gone.append(os.path.join(directory, name))
        except OSError:
            pass                                 # held: a live daemon's
        finally:
            os.close(fd)
    return gone


LOCK_FLAGS = os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


def _open_lock(name: str, dfd: int, path: str) -> int:
    """The lock file, made or reused: a regular file of one link, root's or this user's."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    try:
        if st is not None and (problem := _lock_file_problem(st)):
            raise ConfigError(f"refusing the lock file {path}: {problem}; remove it")
        fd = os.open(name, LOCK_FLAGS | os.O_CREAT, 0o600, dir_fd=dfd)
    except OSError as exc:
        why = too_many_files() if exc.errno in EMFILE else exc.strerror
        raise ConfigError(f"cannot open the lock file {path}: {why}") from None
    st = os.fstat(fd)
    problem = _lock_file_problem(st)                 # swapped after the check
    try:
        if problem:
            raise ConfigError(f"refusing the lock file {path}: {problem}; remove it")
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)                     # made 0644 by an older version
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"cannot make the lock file {path} private: {exc.strerror}") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_file_problem(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return f"it is {file_kind(st.st_mode)}, not a regular file"
    if st.st_nlink > 1:
        return f"it has {st.st_nlink} hard links: another file's, not a lock vmdisktouch made"
    if st.st_uid not in (0, os.geteuid()):
        return f"it is owned by uid {st.st_uid}"
    return None


HOLDER_CHARS = 160      # of the holder's text shown


def _holder(fd: int) -> str:
    """The holder's ``pid N PATH``, printable and bounded: it is shown on a terminal."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    text = "".join(c if c.isprintable() else "?" for c in text)
    if len(text) > HOLDER_CHARS:
        text = text[:HOLDER_CHARS] + "…"
    return text or "pid unknown"
