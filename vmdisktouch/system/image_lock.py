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
stale lock behind (the file stays, unlocked, and is reused).

The lock files live in ``LOCK_DIR`` (/run/vmdisktouch/locks, made on first
use; the units' ``RuntimeDirectory=vmdisktouch``), or for a user other than
root in ``$XDG_RUNTIME_DIR/vmdisktouch/locks`` (that user's daemons only:
root's and a user's cannot hold the same image's pages against each other
beyond the user's own mlock limit); ``VMDISKTOUCH_LOCK_DIR`` overrides both.
A file image and a loop device over it are different images here.
"""

from __future__ import annotations

import fcntl
import os
import stat

from vmdisktouch.errors import ConfigError

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
        if self.fd >= 0:
            os.close(self.fd)            # the flock goes with the open file
            self.fd = -1

    def __enter__(self) -> "ImageLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(image, directory: str | None = None) -> ImageLock:
    """Lock ``image`` (an open ``Image``) for this process, or raise ImageBusyError."""
    directory = directory or lock_dir()
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
        path = os.path.join(directory, lock_name(os.fstat(image.fd)))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise ConfigError(f"cannot make the lock of {image.path} in {directory}: "
                          f"{exc.strerror} (set {ENV} to a writable directory)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise ImageBusyError(
            f"{image.path} is already served by another vmdisktouch ({holder}; lock {path}): "
            "one daemon per image, or each would take the other's holds for the guest's "
            "use") from None
    except OSError as exc:
        os.close(fd)
        raise ConfigError(f"cannot lock {path}: {exc.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} {image.path}\n".encode(errors="surrogateescape"), 0)
    return ImageLock(fd, path)


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "pid unknown"
