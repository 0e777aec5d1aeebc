"""The daemon's output files: checked before they are used, written without losing anything.

Theory of operation
-------------------
``run`` writes up to three files every cycle (``--status``, ``--map-png``,
``--heat-png``), each replaced atomically (``atomic``). A rename replaces
whatever the path names, so a wrong path loses data: ``--status victim.img``
once replaced the very disk image being served with a 529-byte JSON file.
So an output path is checked at start and on every reload
(``check_paths``; ``advise`` checks its ``--save`` report and ``--png``
with the same ``path_problem`` before it watches), and refused, with the
option named, when:

* it is the image, or any alias of it: a hard link (same device and inode),
  a symlink to it, or a device node of the same block device (same
  ``st_rdev``) - or the config file;
* it exists and is not a regular file (symlink, directory, device, FIFO,
  socket): an output is never written through a symlink;
* it exists and does not look like this kind of output (a status file is
  one JSON object with the daemon's fields, ``cycle``, ``version`` or
  ``host``, an advise report one with ``duration_seconds``: a first byte
  ``{`` alone let one random image in 256 through; a
  PNG starts with the PNG signature; an empty file is fine):
  the daemon replaces only what it could have written itself, so another
  VM's image named by mistake is refused too;
* two options name the same file;
* its directory does not exist, is not a directory, or a file cannot be
  created there (read-only or pseudo file system, no permission): a probe
  file is created and removed, so the error comes at start, before
  anything is held;
* its directory is a symlink, or is reached through one another user could
  change (``files.open_dir``), or, for the status file (what ``vmdisktouch
  status`` and the operator read), is not closed to other users: it and
  every directory above it must be root's or the daemon's user's, none
  writable by group or others (an ancestor may be sticky, as ``/tmp``).
  The PNGs and the metrics file may go to a shared directory (a tmpfs,
  node_exporter's): they are never written through a link there either.

At run time (``Outputs.write``) each write walks to the directory again
(a directory swapped for a symlink after start is refused, never followed)
and checks the target again, in the
writer's own ``lstat``, when it is not the file the daemon wrote last
(someone swapped it), and a failure of any kind (ENOSPC, EROFS, the directory removed, a
refused target) is logged once per streak of failures of that output, with
the count when it recovers, and counted in ``errors``: it never stops the
holding. A full ``/run`` thus costs pictures, not the held memory.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import stat
from dataclasses import dataclass

from vmdisktouch.adapters import atomic
from vmdisktouch.errors import ConfigError
from vmdisktouch.system import files

log = logging.getLogger("vmdisktouch")

# option key -> (flag, the first bytes its file starts with)
OUTPUT_KEYS = {"status": ("--status", b"{"),
               "map_png": ("--map-png", b"\x89PNG\r\n\x1a\n"),
               "heat_png": ("--heat-png", b"\x89PNG\r\n\x1a\n"),
               "host_png": ("--host-png", b"\x89PNG\r\n\x1a\n"),
               "metrics_file": ("--metrics-file", b"# HELP "),
               "advise": ("--save", b"{")}      # ``advise``'s report, not ``run``'s


@dataclass(frozen=True)
class Protected:
    """A file outputs must never replace: its identity and what to call it."""
    dev: int
    ino: int
    rdev: int          # a block device's device number, else 0
    what: str

    @classmethod
    def of_fd(cls, fd: int, what: str) -> "Protected":
        st = os.fstat(fd)
        return cls(st.st_dev, st.st_ino, st.st_rdev if stat.S_ISBLK(st.st_mode) else 0, what)

    @classmethod
    def of_path(cls, path: str, what: str) -> "Protected | None":
        try:
            st = os.stat(path)
        except OSError:
            return None
        return cls(st.st_dev, st.st_ino, st.st_rdev if stat.S_ISBLK(st.st_mode) else 0, what)

    def matches(self, st: os.stat_result) -> bool:
        if (st.st_dev, st.st_ino) == (self.dev, self.ino):
            return True
        return bool(self.rdev) and stat.S_ISBLK(st.st_mode) and st.st_rdev == self.rdev


def _flag(key: str) -> str:
    return OUTPUT_KEYS[key][0] if key in OUTPUT_KEYS else "--" + key.replace("_", "-")


def path_problem(path: str, key: str, protected: list[Protected], *,
                 probe_dir: bool = True) -> str | None:
    """Why ``path`` must not be the output ``key`` (None: it may be written).

    ``probe_dir``: also check that a file can be created in its directory.
    """
    try:
        lst = os.lstat(path)
    except FileNotFoundError:
        lst = None
    except OSError as exc:
        return f"cannot check it: {exc.strerror or exc}"
    if lst is not None:
        try:
            st = os.stat(path)          # what a symlink names, for the message
        except OSError:
            st = lst
        for p in protected:
            if p.matches(st) or p.matches(lst):
                return f"it is {p.what}"
        problem = atomic.target_problem(lst)
        if problem:
            return problem
        magic = OUTPUT_KEYS.get(key, ("", b""))[1]
        head = _head(path, len(magic))
        if head is None:
            return "it cannot be read to check what it is"
        if head and magic and not head.startswith(magic[:len(head)]):
            return (f"it exists and is not a file vmdisktouch writes (it does not start with "
                    f"{magic!r}); remove it or choose another path")
        if head and key in JSON_FIELDS and not _is_json_output(path, lst.st_size,
                                                               JSON_FIELDS[key][1]):
            return ("it exists and is not a file vmdisktouch writes (not a JSON object with "
                    f"{JSON_FIELDS[key][0]}'s fields); remove it or choose another path")
    return _directory_problem(path, key) if probe_dir else None


STATUS_FIELDS = ("cycle", "version", "host")   # one of them in every status file written
ADVISE_FIELDS = ("duration_seconds",)           # in every advise report (and no status)
JSON_FIELDS = {"status": ("a status", STATUS_FIELDS), "advise": ("an advise report",
                                                                 ADVISE_FIELDS)}
MAX_STATUS_BYTES = 64 << 20                     # a status file (or report) is far smaller


def _is_json_output(path: str, size: int, fields: tuple[str, ...]) -> bool:
    """Whether ``path`` holds one JSON object with one of ``fields``."""
    data = _head(path, MAX_STATUS_BYTES) if size <= MAX_STATUS_BYTES else None
    try:
        doc = json.loads(data) if data is not None else None
    except ValueError:                  # UnicodeDecodeError and JSONDecodeError included
        return False
    return isinstance(doc, dict) and any(k in doc for k in fields)


def _head(path: str, n: int) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, n) if n else b""
    except OSError:
        return None
    finally:
        os.close(fd)


def _directory_problem(path: str, key: str = "") -> str | None:
    directory = os.path.dirname(os.path.abspath(path))
    try:
        dfd = files.open_dir(directory)
    except FileNotFoundError:
        return f"its directory {directory} does not exist"
    except NotADirectoryError:
        return f"{directory} is not a directory"
    except files.UnsafePath as exc:
        return f"{exc.strerror}: an output is never written through a link"
    except OSError as exc:
        return f"its directory {directory} cannot be opened: {exc.strerror or exc}"
    probe = f".vmdisktouch-probe.{secrets.token_hex(6)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=dfd)
        os.close(fd)
        os.unlink(probe, dir_fd=dfd)
    except OSError as exc:
        return f"cannot create a file in {directory}: {exc.strerror or exc}"
    finally:
        os.close(dfd)
    return _private_problem(directory) if key in PRIVATE_KEYS else None


PRIVATE_KEYS = ("status",)          # written in a directory closed to other users


def _private_problem(directory: str) -> str | None:
    try:
        os.close(files.open_dir(directory, private=True))
    except OSError as exc:
        return (f"its directory is not closed to other users: {exc.strerror or exc} "
                "(another user could swap the file or plant one)")
    return None


def check_paths(config, protected: list[Protected]) -> None:
    """Refuse (``ConfigError``, naming the option) any output path that must not be written."""
    check_named([(_flag(key), key, config.get(key)) for key in OUTPUT_KEYS
                 if config.get(key)], protected)


def check_named(named: list[tuple[str, str, str]], protected: list[Protected]) -> None:
    """Refuse (``ConfigError``) the first of ``named`` (option, output key, path) that must
    not be written (``path_problem``), or that names the file an option before it names."""
    seen: dict[tuple, str] = {}
    for flag, key, path in named:
        problem = path_problem(path, key, protected)
        if problem:
            raise ConfigError(f"refusing {flag} {path}: {problem}")
        where = os.path.abspath(path)
        parent = os.stat(os.path.dirname(where))
        same = (parent.st_dev, parent.st_ino, os.path.basename(where))
        if same in seen:
            raise ConfigError(f"refusing {flag} {path}: {seen[same]} names the same file")
        seen[same] = flag


def remove(path: str, key: str, protected: list[Protected]) -> bool:
    """Remove ``path`` when it is an output ``key`` vmdisktouch writes: a regular file (not
    a link: never followed), starting with that output's first bytes, none of
    ``protected``; True if removed. Raises the ``OSError`` of a step.

    Every step works in the directory ``files.open_dir`` opened (never reached through
    a link another user could change), as ``atomic`` writes there: the name is checked
    (``lstat``) before the file is opened (a device node or a FIFO is never opened), the
    file opened must be the one checked, and the name must still be it just before the
    unlink. An unlink never writes a file: at worst it drops one name of it.
    """
    directory, name = os.path.split(os.path.abspath(path))
    try:
        dfd = files.open_dir(directory)
    except FileNotFoundError:
        return False                       # the file went with its directory
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        why = atomic.target_problem(st) or next(
            (f"it is {p.what}" for p in protected if p.matches(st)), None)
        if why is None:
            fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=dfd)
            try:
                magic = OUTPUT_KEYS[key][1]
                same = _same(os.fstat(fd), st)
                if not same or os.read(fd, len(magic)) != magic:
                    why = "it is not a file vmdisktouch writes"
            finally:
                os.close(fd)
        if why is None and _same(os.stat(name, dir_fd=dfd, follow_symlinks=False), st):
            os.unlink(name, dir_fd=dfd)
            return True
        log.warning("%s %s not removed: %s", _flag(key), path, why or "it was replaced")
        return False
    finally:
        os.close(dfd)


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class Outputs:
    """Writes the outputs of one daemon; a failure is logged once per streak and counted."""

    def __init__(self, protected: list[Protected]):
        self.protected = protected
        self.errors = 0                       # failed writes, all outputs, since start
        self._streak: dict[str, int] = {}     # key -> failures in a row
        self._written: dict[str, tuple[int, int]] = {}   # key -> (dev, ino) written last

    def write(self, key: str, path: str, data: bytes) -> bool:
        """Replace ``path`` with ``data``; False (logged, counted) when it failed."""
        try:
            self._written[key] = atomic.write_bytes(
                path, data, check=lambda st: self._problem(key, path, st),
                private=key in PRIVATE_KEYS)
        except OSError as exc:
            self.errors += 1
            n = self._streak.get(key, 0) + 1
            self._streak[key] = n
            if n == 1:
                log.warning("cannot write %s %s: %s; holding goes on (logged again when it "
                            "works)", _flag(key), path, exc.strerror or exc)
            return False
        n = self._streak.pop(key, 0)
        if n:
            log.info("%s %s written again after %d failed writes", _flag(key), path, n)
        return True

    def remove(self, key: str, path: str) -> None:
        """Remove the output ``key`` at ``path`` (``remove``) when what it pictures is gone;
        a failure is logged, never raised."""
        try:
            remove(path, key, self.protected)
        except OSError as exc:
            log.warning("cannot remove %s %s: %s", _flag(key), path, exc.strerror or exc)
        self._written.pop(key, None)

    def _problem(self, key: str, path: str, st: os.stat_result) -> str | None:
        """Why the existing regular file ``st`` at ``path`` must not be replaced now."""
        if (st.st_dev, st.st_ino) == self._written.get(key):
            return None                    # what this daemon wrote last: the common case
        return path_problem(path, key, self.protected, probe_dir=False)
