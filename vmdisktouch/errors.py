"""The project's exceptions.

Every error a user can cause or meet is one of these. Its ``str()`` is a
complete one-line message, fit to print after ``vmdisktouch: ``; the CLI
prints it and exits with the class's ``exit_code``, without a traceback
unless ``--debug`` is given.

Exit codes (sysexits.h), one table for every subcommand (docs/exit-codes.md
says where each comes from, per subcommand), chosen so that systemd can tell
what a restart can fix (``RestartPreventExitStatus=`` in the unit lists 2, 66
and 78):

==  ===========  ============================================================
 1  EX_ERROR     a failure at run time: too many failed cycles in a row, a
                 scan that failed, libvirt unreachable, output cut (a pipe)
 2  EX_USAGE     the shape of the command line: an unknown option, a missing
                 or extra argument, options that exclude each other (argparse,
                 one line; ``UsageError``)
 3  (inactive)   ``status``: no daemon is live (``systemctl is-active``);
                 ``advise``: no disk was read in the window
66  EX_NOINPUT   an input cannot be used: the image missing, unreadable, not
                 an image, or its residency hidden from this process; the
                 status directory, or no status file serving a PATH
70  EX_SOFTWARE  internal error: a bug; no input may lead here
75  EX_TEMPFAIL  not now: the image was deleted or replaced while served (a
                 restart serves whatever the path names then; a deleted one
                 ends in 66), or ``adopt`` met a paused, arriving or busy domain
77  EX_NOPERM    ``advise`` as a user who may not read the kernel's
                 tracepoints (not root)
78  EX_CONFIG    refused setup: a setting's value, wherever it is given (a
                 flag of any subcommand, the config file, the unit), settings
                 together or against the host, the config file itself, an
                 output path, the lock limit, the image lock or libvirt's
                 cache mode
==  ===========  ============================================================

The rule for a bad value: every setting is checked by one parser
(``settings.parse_value``), so a bad value is 78 wherever it is given; 2 is
only for what argparse checks about the line's shape.
"""

from __future__ import annotations

import errno as _errno
import os
import stat as _stat


EX_ERROR = 1
EX_USAGE = 2
EX_NOINPUT = 66
EX_SOFTWARE = 70
EX_NOPERM = 77
EX_TEMPFAIL = 75
EX_CONFIG = 78


class VmdtError(Exception):
    """Base class: a failure with a one-line, user-facing message."""

    exit_code = EX_ERROR


class UsageError(VmdtError):
    """A command line argparse accepts but that makes no sense (exit 2, as argparse's):
    ``run`` with no PATH or --libvirt, ``snapshot --png`` with several PATHs, a
    ``unit-name`` PATH that has no unit name."""

    exit_code = EX_USAGE


class ImageError(VmdtError):
    """The path is not a usable disk image (missing, wrong kind, unreadable...)."""

    exit_code = EX_NOINPUT


class NotPermitted(VmdtError):
    """This user may not do it: ``advise`` needs root for the kernel's tracepoints."""

    exit_code = EX_NOPERM


class ImageGoneError(ImageError):
    """The image was deleted or replaced while we were watching it."""

    exit_code = EX_TEMPFAIL


class ConfigError(VmdtError):
    """A setting has a bad value, or the config file cannot be read."""

    exit_code = EX_CONFIG


class SyscallError(VmdtError):
    """A system call failed; carries the errno and the call's name."""

    def __init__(self, call: str, err: int, detail: str = ""):
        self.call = call
        self.errno = err
        where = f" ({detail})" if detail else ""
        super().__init__(f"{call}{where}: {os.strerror(err)}")


class LockLimitError(SyscallError):
    """mlock failed because of RLIMIT_MEMLOCK or missing CAP_IPC_LOCK."""

    exit_code = EX_CONFIG

    def __init__(self, call: str, err: int, detail: str = ""):
        super().__init__(call, err, detail)
        self.args = (
            f"{call}{' (' + detail + ')' if detail else ''}: {os.strerror(err)}; "
            "raise RLIMIT_MEMLOCK (systemd: LimitMEMLOCK=infinity) or grant CAP_IPC_LOCK",
        )


class ClosedError(VmdtError):
    """A part was used after its ``close()``: a bug in the caller."""

    exit_code = EX_SOFTWARE


def syscall_error(call: str, err: int, detail: str = "") -> SyscallError:
    """Translate an errno from ``call`` into the matching project exception."""
    if call.startswith("mlock") and err in (_errno.ENOMEM, _errno.EPERM, _errno.EAGAIN):
        return LockLimitError(call, err, detail)
    return SyscallError(call, err, detail)


_KINDS = ((_stat.S_ISLNK, "a symbolic link"), (_stat.S_ISDIR, "a directory"),
          (_stat.S_ISFIFO, "a FIFO"), (_stat.S_ISSOCK, "a socket"),
          (_stat.S_ISCHR, "a character device"), (_stat.S_ISBLK, "a block device"),
          (_stat.S_ISREG, "a regular file"))


def file_kind(mode: int) -> str:
    """What a file of ``st_mode`` is, for a message: "a FIFO", "a directory", ..."""
    return next((name for test, name in _KINDS if test(mode)), "an unknown kind of file")
