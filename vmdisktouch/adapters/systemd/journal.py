"""Where the log goes, decided once: the journal's own protocol, journald's stream, or a terminal.

Theory of operation
-------------------
stderr is *connected to the journal* when ``JOURNAL_STREAM`` is ``DEV:INO``
and equals stderr's ``st_dev:st_ino`` (systemd.exec(5), sd-daemon(3)): a
variable inherited by a child whose stderr was redirected (a terminal, a file,
a pipe), or a malformed one, does not count. Then:

========== ================================ ===========================================
mode       when                             each line
========== ================================ ===========================================
``native`` connected, python3-systemd       one journal entry (``systemd.journal.send``)
           importable                       with fields, nothing on stderr
``stream`` connected, no python3-systemd    ``<N>message`` on stderr: journald reads the
                                            priority from the prefix (sd-daemon(3))
``plain``  not connected                    ``TIME LEVEL message`` on stderr
========== ================================ ===========================================

The native fields: ``MESSAGE``, ``PRIORITY`` (``priority``), ``SYSLOG_IDENTIFIER``
(``vmdisktouch``), ``CODE_FILE``/``CODE_LINE``/``CODE_FUNC``, and for a line about a
disk ``DISK`` (its image path), ``DOMAIN`` and ``TARGET`` (when libvirt knows them),
and ``MESSAGE_ID`` for the events an operator alerts on (``BUDGET_FULL``,
``FLOOR_SHED``, ``DISK_DROPPED``, ``BUDGET_ADVICE``; docs/logging.md). A disk's fields come from the
*disk context* (``disk_context``) the daemon sets around each disk's work, added to
every record by ``DiskFields``, so no call site repeats them; a line logged outside
one passes them with ``extra=fields(...)``, which wins. A native entry that cannot
be sent (journald restarting, its socket gone) is written to stderr as in
``stream`` mode: stderr is the journal's stream, so no line is lost.

``setup`` is the log of every command that logs (``run``); ``fatal`` the last line
of a failed command (``cli``): both take the same decision (``choose``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from contextvars import ContextVar
from typing import Callable, Iterator, Mapping, NamedTuple

IDENTIFIER = "vmdisktouch"
NATIVE, STREAM, PLAIN = "native", "stream", "plain"

# The events an operator alerts on: fixed ids (``journalctl --new-id128``), never
# changed once released; docs/logging.md says what each means.
BUDGET_FULL = "3b169ea0f92841a1b0455f7a8a8af973"    # notice: held max_hold, wants more
FLOOR_SHED = "f7eea93cc75f4838a77698c318f2f8a8"     # warning: released under min_free
DISK_DROPPED = "b83b9d51571946158fd145d64e6d803b"   # warning: a disk no longer served
BUDGET_ADVICE = "e84f6832d0084c559987b8d997755b46"  # notice: a budget's verdict changed

# syslog's notice (5), which Python's levels lack: news an operator acts on, not a fault
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")

FIELDS = ("DISK", "DOMAIN", "TARGET", "MESSAGE_ID")
_disk: ContextVar[Mapping[str, str]] = ContextVar("vmdisktouch_disk", default={})


class Choice(NamedTuple):
    mode: str                                   # NATIVE, STREAM or PLAIN
    send: Callable[..., object] | None = None   # ``systemd.journal.send`` in NATIVE


def stderr_is_journal(environ: Mapping[str, str] | None = None, fd: int = 2) -> bool:
    """Whether ``fd`` is the stream ``JOURNAL_STREAM`` names (its ``DEV:INO``, both
    decimal): a variable merely set proves nothing once stderr was redirected."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    dev, sep, ino = value.partition(":")
    if not (sep and dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def _journal_send() -> Callable[..., object] | None:
    try:
        from systemd import journal
    except ImportError:
        return None
    return journal.send


def choose(environ: Mapping[str, str] | None = None, fd: int = 2) -> Choice:
    """The mode of the log (see the table above): native only where stderr is the
    journal and python3-systemd is importable."""
    if not stderr_is_journal(environ, fd):
        return Choice(PLAIN)
    send = _journal_send()
    return Choice(STREAM) if send is None else Choice(NATIVE, send)


def priority(levelno: int) -> int:
    """syslog's priority of a logging level (sd-daemon(3)): 7 debug .. 2 critical."""
    for top, prio in ((logging.DEBUG, 7), (logging.INFO, 6), (NOTICE, 5),
                      (logging.WARNING, 4), (logging.ERROR, 3), (logging.CRITICAL, 2)):
        if levelno <= top:
            return prio
    return 1


def fields(disk: str | None = None, domain: str | None = None, target: str | None = None,
           message_id: str | None = None) -> dict[str, str]:
    """The journal fields of a line (``extra=``), the empty ones left out."""
    named = zip(FIELDS, (disk, domain, target, message_id))
    return {k: str(v) for k, v in named if v}


@contextlib.contextmanager
def disk_context(disk: str | None, domain: str | None = None,
                 target: str | None = None) -> Iterator[None]:
    """Every line logged inside is about this disk (``DiskFields``); nested: the inner."""
    token = _disk.set(fields(disk, domain, target))
    try:
        yield
    finally:
        _disk.reset(token)


class DiskFields(logging.Filter):
    """Adds the disk context's fields to each record, unless the call gave its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _disk.get().items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class _Prefixed(logging.Formatter):
    """``<N>message``: the priority journald's stream reads, no timestamp (it adds its own)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{priority(record.levelno)}>{super().format(record)}"


class NativeHandler(logging.Handler):
    """Each record one journal entry with its fields; stderr, prefixed, if it cannot be
    sent."""

    def __init__(self, send: Callable[..., object]):
        super().__init__()
        self.send = send
        self.setFormatter(logging.Formatter("%(message)s"))
        self.fallback = _Prefixed("%(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            given = {k: str(getattr(record, k)) for k in FIELDS if getattr(record, k, None)}
            try:
                self.send(message, PRIORITY=str(priority(record.levelno)),
                          SYSLOG_IDENTIFIER=IDENTIFIER, CODE_FILE=record.pathname,
                          CODE_LINE=record.lineno, CODE_FUNC=record.funcName, **given)
            except OSError:
                sys.stderr.write(self.fallback.format(record) + "\n")
                sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a log line never raises
            self.handleError(record)


def handler(choice: Choice) -> logging.Handler:
    """The handler of ``choice``'s mode, adding the disk context's fields."""
    if choice.mode == NATIVE:
        out: logging.Handler = NativeHandler(choice.send)
    else:
        out = logging.StreamHandler(sys.stderr)
        out.setFormatter(_Prefixed("%(message)s") if choice.mode == STREAM else
                         logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    out.addFilter(DiskFields())
    return out


def setup(debug: bool) -> str:
    """The ``vmdisktouch`` logger of a command that logs, in the mode ``choose`` gives;
    returns the mode."""
    choice = choose()
    root = logging.getLogger("vmdisktouch")
    root.handlers[:] = [handler(choice)]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False
    return choice.mode


def fatal(message: str) -> None:
    """The last line before a failed exit: one line, at priority 3 (err), where the
    rest of the log goes."""
    line = f"vmdisktouch: {' '.join(message.splitlines())}"
    choice = choose()
    if choice.mode == NATIVE:
        try:
            choice.send(line, PRIORITY="3", SYSLOG_IDENTIFIER=IDENTIFIER)
            return
        except OSError:
            pass
    prefix = "" if choice.mode == PLAIN else "<3>"
    print(f"{prefix}{line}", file=sys.stderr, flush=True)
