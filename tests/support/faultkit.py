"""The fault-injection table: each row an input or a fault, the promise it tests, the result.

Rows are declared next to their checks in ``tests/e2e/test_faults_*.py``:
``test_faults_start.py`` (bad inputs refused before anything is held),
``test_faults_run.py`` (faults while the daemon serves), and one module per
area of a hardening round. ``python -m tests.support.faultkit`` prints the
table as Markdown; ``docs/faults.md`` is that output, and a test checks it is
current. Every row's ``observed`` text is what its check asserts.

The promises every row keeps (``P``): the daemon never writes to the image,
never holds more than its budget, never hangs, never reaches "internal
error" (exit 70), and says what happened in one line.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Callable

import pytest

from tests.support.images import evict
from tests.support.pagecache import data_image
from tests.support.common import ROOT

MiB = 1 << 20
EX_NOINPUT, EX_TEMPFAIL, EX_CONFIG = 66, 75, 78


@dataclass(frozen=True)
class Fault:
    id: str
    fault: str          # the input or the fault, in words
    promise: str        # what must hold
    observed: str       # what the check asserts
    check: Callable = field(compare=False, repr=False)
    issue_case: str = ""   # the numbered case of the hardening issue it covers, if any


TABLE: list[Fault] = []


def rows_of(module: str) -> list[Fault]:
    """The rows one test module registered (its ``__name__``)."""
    return [f for f in TABLE if f.check.__module__ == module]


@pytest.fixture
def image(tmp_path):
    """The image every row runs on: 32 MiB of data, out of the page cache."""
    return data_image(tmp_path / "disk.img", 32 * MiB)


def fault(id: str, fault: str, promise: str, observed: str, case: str = ""):
    """Decorator: register ``check(tmp_path, image)`` as a row of the table."""
    def register(check):
        TABLE.append(Fault(id, fault, promise, observed, check, case))
        return check
    return register


# -- running the CLI --------------------------------------------------------------

def vmdt(*argv, timeout: float = 30.0, env=None, prefix=()) -> subprocess.CompletedProcess:
    """``python -m vmdisktouch ARGV``; a hang is a failure (the timeout)."""
    return subprocess.run([*prefix, sys.executable, "-m", "vmdisktouch", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env=env, stdin=subprocess.DEVNULL)


def assert_refused(r: subprocess.CompletedProcess, code: int, needle: str) -> str:
    """Exit ``code``, its reason in one ``vmdisktouch:`` line at the end, no traceback."""
    err = r.stderr
    assert r.returncode == code, f"exit {r.returncode}, expected {code}: {err[-2000:]}"
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("vmdisktouch: "), err[-2000:]
    assert needle in last, f"{needle!r} not in {last!r}"
    assert "cycle 1:" not in err, "a cycle ran before the refusal"
    return last


def assert_clean(out: str) -> None:
    assert "Traceback" not in out and "internal error" not in out, out[-3000:]


def digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Untouched:
    """The image's bytes, size, mtime and atime: equal at the end (``check()``)."""

    def __init__(self, path):
        self.path = str(path)
        st = os.stat(self.path)
        self.before = (digest(self.path), st.st_size, st.st_mtime_ns)
        evict(self.path)       # hashing cached it all; the rows start from a cold image

    def check(self) -> None:
        st = os.stat(self.path)
        assert (digest(self.path), st.st_size, st.st_mtime_ns) == self.before, \
            f"{self.path} was modified"


def more_cycles(d, n: int = 3, timeout: float = 20.0) -> None:
    """Wait until the daemon ``d`` (a ``DaemonProc``) has run ``n`` more cycles; it must not exit."""
    import time
    target = d.cycles_done() + n
    deadline = time.monotonic() + timeout
    while d.cycles_done() < target:
        assert d.proc.poll() is None, f"daemon exited: {d.output()[-2000:]}"
        assert time.monotonic() < deadline, f"no {n} more cycles: {d.output()[-2000:]}"
        time.sleep(0.05)


# A daemon whose ``MODULE:ATTR`` sends it signal SIG at its NTH call:
# ``python -c LAUNCHER MODULE:ATTR NTH SIG run ...`` (the SIGTERM-in-every-phase rows).
LAUNCHER = textwrap.dedent("""
    import importlib, os, signal, sys, threading
    target, nth, sig = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    modname, attr = target.split(":")
    owner = importlib.import_module(modname)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    orig = getattr(owner, name)
    calls = [0]
    def wrapped(*a, **k):
        calls[0] += 1
        if calls[0] == nth:
            print("INJECT", target, flush=True)
            os.kill(os.getpid(), sig)
        return orig(*a, **k)
    setattr(owner, name, wrapped)
    from vmdisktouch.commands import cli
    sys.exit(cli.main(sys.argv[4:]))
""")


# -- the table as Markdown -----------------------------------------------------------

def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def row_modules() -> list[str]:
    """Every module that declares rows: ``tests/e2e/test_faults_*.py``, the start's first."""
    names = sorted(p.stem for p in (ROOT / "tests" / "e2e").glob("test_faults_*.py"))
    return [f"tests.e2e.{n}" for n in sorted(names, key=lambda n: n != "test_faults_start")]


def markdown() -> str:
    import importlib
    modules = row_modules()
    for m in modules:
        importlib.import_module(m)          # registers the rows
    rows = ["| # | input or fault | promise | observed (asserted) | issue case |",
            "|---|---|---|---|---|"]
    # Bad inputs first, then each module's faults, whatever order pytest imported them in.
    rows_in_order = sorted(TABLE, key=lambda f: modules.index(f.check.__module__))
    for n, f in enumerate(rows_in_order, 1):
        rows.append(f"| {n} | {_cell(f.fault)} | {_cell(f.promise)} | {_cell(f.observed)} "
                    f"| {f.issue_case} |")
    return ("# Fault injection: what the daemon does with bad input and faults\n\n"
            "Generated by `python -m tests.support.faultkit > docs/faults.md` from the rows of "
            "`tests/e2e/test_faults_*.py` (bad inputs refused at start first); each row is a "
            "test (`pytest tests/e2e/test_faults_*.py`), and a test checks this file is "
            "current.\n\n"
            "Every row also checks the promises that hold for all of them: the image is "
            "never written (its bytes, size and mtime compared), no traceback and no "
            "\"internal error\" (exit 70), the reason in one line.\n\n"
            "Exit codes: 66 the image cannot be opened, 75 the image was deleted or "
            "replaced while served, 78 the setup is refused (settings, config file, output "
            "paths, lock limit), 0 after SIGTERM.\n\n"
            f"{len(TABLE)} rows.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    from tests.support import faultkit   # the module the test modules register their rows in
    sys.stdout.write(faultkit.markdown())
