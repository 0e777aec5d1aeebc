"""The runtime directory, and the status file a daemon writes there without ``--status``.

``vmdisktouch status`` reads the status files of ``RUNTIME_DIR``
(``/run/vmdisktouch``, the units' ``RuntimeDirectory=``); the environment
variable ``VMDISKTOUCH_RUNTIME_DIR`` names another (the tests point it at
their own directory, never the host's).

A ``run`` given no ``--status`` (flag or config file) still writes one there,
so ``status`` sees every daemon, named as the units name theirs: one image
``ESCAPED.json``, its path escaped as ``vmdisktouch unit-name`` and the
template unit's ``%i`` escape it (``unitname.escape_path``), so a manual
``run IMG`` and the unit of IMG write the same file (the image lock never lets
both run); several images the first one's name (the lock keeps two daemons
from sharing any image, so two running daemons never share a first image);
``--libvirt`` ``host.json``, the host service's. The file is the same as with
``--status``: replaced every cycle, kept with ``stopped`` at a clean stop.

Where it cannot be written (a user that cannot write the directory, a
read-only ``/run``, a file there another live daemon writes), the daemon
starts all the same and says once, in an INFO line, why ``status`` cannot
see it (``default_status``).
"""

from __future__ import annotations

import json
import os

from vmdisktouch.adapters import outputs
from vmdisktouch.errors import ConfigError
from vmdisktouch.unitname import escape_path

RUNTIME_DIR = "/run/vmdisktouch"
ENV = "VMDISKTOUCH_RUNTIME_DIR"
HOST_STATUS = "host.json"           # the host service's (``--libvirt``)


def runtime_dir() -> str:
    """``RUNTIME_DIR``, or ``$VMDISKTOUCH_RUNTIME_DIR`` when set."""
    return os.environ.get(ENV) or RUNTIME_DIR


def status_name(paths: list[str], libvirt: bool) -> str:
    """The status file's name in the runtime directory (the module docstring);
    ``ConfigError`` when the path cannot be escaped (a ``..`` in it, too long)."""
    if libvirt or not paths:
        return HOST_STATUS
    name = escape_path(paths[0]) + ".json"
    if len(name.encode()) > 255:
        raise ConfigError("its escaped name is longer than a file name may be")
    return name


def default_status(paths: list[str], libvirt: bool,
                   protected: list[outputs.Protected]) -> tuple[str | None, str | None]:
    """(the status file a daemon without ``--status`` writes, None) or (None, why it
    cannot). The directory is made (0755, as the units make it) when it is missing."""
    directory = runtime_dir()
    try:
        path = os.path.join(directory, status_name(paths, libvirt))
    except ConfigError as exc:
        return None, f"no status file can be named after {paths[0]}: {exc}"
    try:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    except OSError as exc:
        return None, f"{directory} cannot be made: {exc.strerror or exc}"
    problem = outputs.path_problem(path, "status", protected)
    if problem is None:
        other = _writer(path)
        if other is not None:
            problem = f"another live daemon (pid {other}) writes it"
    return (path, None) if problem is None else (None, f"{path}: {problem}")


def _writer(path: str) -> int | None:
    """The pid of the live daemon other than this one that wrote the status ``path``,
    None when none does (no file, a daemon gone, one that stopped, this one)."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read(outputs.MAX_STATUS_BYTES))
        head = doc.get("host", doc)
        pid = head.get("pid")
        if head.get("stopped") or not isinstance(pid, int) or isinstance(pid, bool) \
                or pid <= 0 or pid == os.getpid():
            return None
        os.kill(pid, 0)
    except (OSError, ValueError, AttributeError, OverflowError):
        return None         # PermissionError included: not a daemon of this user's
    return pid
