"""The project's exceptions.

Every error a user can cause or meet is one of these. Its ``str()`` is a
complete one-line message, fit to print after ``vmdisktouch: ``; the CLI
prints it and exits non-zero, without a traceback unless ``--debug`` is given.
"""

from __future__ import annotations

import errno as _errno
import os


class VmdtError(Exception):
    """Base class: a failure with a one-line, user-facing message."""


class ImageError(VmdtError):
    """The path is not a usable disk image (missing, wrong kind, unreadable...)."""


class ImageGoneError(ImageError):
    """The image was deleted or replaced while we were watching it."""


class ConfigError(VmdtError):
    """A setting has a bad value, or the config file cannot be read."""


class SyscallError(VmdtError):
    """A system call failed; carries the errno and the call's name."""

    def __init__(self, call: str, err: int, detail: str = ""):
        self.call = call
        self.errno = err
        where = f" ({detail})" if detail else ""
        super().__init__(f"{call}{where}: {os.strerror(err)}")


class LockLimitError(SyscallError):
    """mlock failed because of RLIMIT_MEMLOCK or missing CAP_IPC_LOCK."""

    def __init__(self, call: str, err: int, detail: str = ""):
        super().__init__(call, err, detail)
        self.args = (
            f"{call}{' (' + detail + ')' if detail else ''}: {os.strerror(err)}; "
            "raise RLIMIT_MEMLOCK (systemd: LimitMEMLOCK=infinity) or grant CAP_IPC_LOCK",
        )


def syscall_error(call: str, err: int, detail: str = "") -> SyscallError:
    """Translate an errno from ``call`` into the matching project exception."""
    if call.startswith("mlock") and err in (_errno.ENOMEM, _errno.EPERM, _errno.EAGAIN):
        return LockLimitError(call, err, detail)
    return SyscallError(call, err, detail)
