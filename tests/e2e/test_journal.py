"""The log in a real systemd-journald: fields a domain's lines are selected by, priorities,
the events' MESSAGE_IDs, nothing on the stream in native mode.

systemd is not PID 1 here, so the test plays its part without touching the machine's
journal: a real ``systemd-journald`` runs in a private mount namespace (``unshare
--mount --propagation private``, tmpfs over /run/systemd/journal, /run/log/journal and
/var/log/journal), and the daemon is started in that namespace (``nsenter``) with its
stderr connected to journald's stream socket and JOURNAL_STREAM naming that socket's
device and inode, exactly as systemd does for ``StandardError=journal``
(``sd_journal_stream_fd``). ``journalctl`` reads the namespace's journal. The libvirt
domains are real (started paused, no guest OS; ``qemu_io`` reads as a guest would), so
DOMAIN= and TARGET= are libvirt's own. The floor, which needs MemAvailable to fall, is
checked in-process at the ``mem_available`` seam of ``build``, on a real image and holder.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.support.clocks import Stepped
from tests.support.libvirt_env import (URI, disk_xml, domains, libvirt_daemons,  # noqa: F401
                               qemu_io)
from tests.support.journal_records import journal_records
from tests.support.pagecache import data_image, held
from tests.support.common import ROOT
from tests.support.daemon_proc import DaemonProc, env_without_systemd
from vmdisktouch.adapters.systemd import journal
from vmdisktouch.config import settings
from vmdisktouch.daemon.build import build
from vmdisktouch.daemon.host import host_of
from vmdisktouch.system.image import open_image

MiB = 1 << 20
JOURNALD = "/lib/systemd/systemd-journald"
JOURNAL_DIRS = ("/run/systemd/journal", "/run/log/journal", "/var/log/journal")

# What systemd does for StandardError=journal, then exec: argv[1] a PYTHONPATH for the
# daemon ("" to keep it), argv[2:] the daemon's command.
LAUNCH = """\
import os, sys
from systemd import journal
stream = journal.stream("vmdisktouch", level_prefix=True)
st = os.fstat(stream.fileno())
os.dup2(stream.fileno(), 2)
os.environ["JOURNAL_STREAM"] = "%d:%d" % (st.st_dev, st.st_ino)
if sys.argv[1]:
    os.environ["PYTHONPATH"] = sys.argv[1]
os.execv(sys.argv[2], sys.argv[2:])
"""


def _tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not installed (util-linux / systemd)"
    return path


class PrivateJournal:
    """A real systemd-journald in its own mount namespace; its process anchors the
    namespace, so stopping it (by PID) removes both."""

    def __init__(self, workdir):
        assert os.geteuid() == 0, "a private mount namespace needs root"
        assert os.access(JOURNALD, os.X_OK), f"{JOURNALD} is missing (Debian: systemd)"
        mounts = "; ".join(f"if [ -d {d} ]; then mount -t tmpfs -o mode=0755 tmpfs {d}; fi"
                           for d in JOURNAL_DIRS)
        self.log = open(os.path.join(workdir, "journald.log"), "wb")
        self.proc = subprocess.Popen(
            [_tool("unshare"), "--mount", "--propagation", "private", "--", "sh", "-c",
             f"set -e; {mounts}; exec {JOURNALD}"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 30
        while not self._inside("test", "-S", "/run/systemd/journal/stdout", "-a", "-S",
                               "/run/systemd/journal/socket").returncode == 0:
            assert self.proc.poll() is None, f"journald exited: {self._log()}"
            assert time.monotonic() < deadline, f"journald has no sockets: {self._log()}"
            time.sleep(0.1)

    def _log(self) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()[-2000:]

    def _inside(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([_tool("nsenter"), "-t", str(self.proc.pid), "-m", "--", *argv],
                              capture_output=True, text=True, timeout=60)

    def prefix(self, hide_systemd: str = "") -> list[str]:
        """A ``DaemonProc`` prefix: in the namespace, stderr on journald's stream."""
        return [_tool("nsenter"), "-t", str(self.proc.pid), "-m", f"--wd={ROOT}", "--",
                sys.executable, "-c", LAUNCH, hide_systemd]

    def entries(self, *matches: str) -> list[dict]:
        """``journalctl -o json MATCH...`` in the namespace (the kernel's lines left out)."""
        r = self._inside(_tool("journalctl"), "--no-pager", "-o", "json", "--all",
                         *matches)
        assert r.returncode == 0, r.stderr
        return [e for e in map(json.loads, r.stdout.splitlines())
                if e.get("_TRANSPORT") != "kernel"]

    def wait(self, pred, what: str, *matches: str, timeout: float = 60.0,
             proc: DaemonProc | None = None) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            got = self.entries(*matches)
            if pred(got):
                return got
            if proc is not None:
                assert proc.alive(), f"the daemon exited before {what}: {messages(got)}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: " \
                                                f"{messages(self.entries())[-40:]}"
            time.sleep(0.3)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def messages(entries: list[dict]) -> list[str]:
    return [e.get("MESSAGE", "") for e in entries]


@pytest.fixture
def private_journal(tmp_path):
    j = PrivateJournal(tmp_path)
    yield j
    j.close()


@pytest.fixture
def no_python3_systemd(tmp_path) -> str:
    """A PYTHONPATH on which ``import systemd`` fails, as where python3-systemd is not
    installed."""
    d = tmp_path / "no-systemd"
    (d / "systemd").mkdir(parents=True)
    (d / "systemd" / "__init__.py").write_text(
        'raise ImportError("python3-systemd is not installed (hidden by the test)")\n')
    return str(d)


# -- two libvirt domains: one journalctl DOMAIN= each ----------------------------------

@pytest.mark.timeout(300)
def test_journalctl_domain_selects_that_domains_lines(domains, private_journal,  # noqa: F811
                                                      tmp_path):
    """Two running domains under a 4 MiB budget; both read 16 MiB. The budget is full
    (one notice with BUDGET_FULL); one domain's image is deleted under it (a warning with
    DISK_DROPPED). Each domain's lines are selected by its DOMAIN= and carry its DISK=
    and TARGET=; every entry is native (nothing on the stream)."""
    a = data_image(tmp_path / "a.raw", 32 * MiB)
    b = data_image(tmp_path / "b.raw", 32 * MiB)
    dom_a = domains.define([disk_xml("vda", a)], tag="jrnA")
    dom_b = domains.define([disk_xml("vdb", b)], tag="jrnB")
    j = private_journal
    d = DaemonProc(tmp_path, [], "--libvirt", "--uri", URI, "--min-free", "0",
                   "--interval", "1", max_hold="4M", status="host.json",
                   prefix=j.prefix(), env=env_without_systemd())
    try:
        d.wait_status(lambda s: {x["path"] for x in s["host"]["disks"]} == {a, b},
                      "both domains' disks", timeout=60)
        qemu_io(dom_a, "read 0 16M")
        qemu_io(dom_b, "read 0 16M", alias="virtio-disk1")     # named by its target
        j.wait(lambda es: es, "the budget full", f"MESSAGE_ID={journal.BUDGET_FULL}",
               proc=d, timeout=60)
        os.unlink(b)                                  # the image goes: B's disk dropped
        j.wait(lambda es: es, "B's disk dropped", f"MESSAGE_ID={journal.DISK_DROPPED}",
               proc=d, timeout=60)
        d.wait_status(lambda s: s["host"]["failed"], "the failure in the status")
    finally:
        rc = d.stop()
    assert rc == 0, messages(j.entries())[-40:]
    assert d.output() == ""                  # stdout: nothing; stderr was journald's stream

    mine = j.entries(f"_PID={d.pid}")
    assert any(m.startswith("released all holds") for m in messages(mine)), messages(mine)
    # native, every one: nothing went to the stream, nothing lost a field
    assert {(e["_TRANSPORT"], e.get("SYSLOG_IDENTIFIER")) for e in mine} == {
        ("journal", "vmdisktouch")}, [e for e in mine if e["_TRANSPORT"] != "journal"]
    # every line that names a disk's image carries that disk's fields
    for path, dom, target in ((a, dom_a, "vda"), (b, dom_b, "vdb")):
        about = [e for e in mine if path in e["MESSAGE"]]
        assert about, path
        for e in about:
            assert (e.get("DISK"), e.get("DOMAIN"), e.get("TARGET")) == (path, dom, target), e

    sel_a, sel_b = j.entries(f"DOMAIN={dom_a}"), j.entries(f"DOMAIN={dom_b}")
    # each disk's lines, and a domain's own (its carried heat) with no DISK=
    assert {e["DISK"] for e in sel_a if "DISK" in e} == {a}
    assert {e["DISK"] for e in sel_b if "DISK" in e} == {b}
    # none is about the other disk (a line may name it as where the budget went)
    assert not any(b in m or m.startswith(dom_b) for m in messages(sel_a)), messages(sel_a)
    assert not any(a in m or m.startswith(dom_a) for m in messages(sel_b)), messages(sel_b)
    assert any(": cycle 1:" in m for m in messages(sel_a)), messages(sel_a)
    serving = [e for e in sel_a if e["MESSAGE"].startswith("libvirt: serving")]
    assert [e["PRIORITY"] for e in serving] == ["6"]

    [dropped] = j.entries(f"MESSAGE_ID={journal.DISK_DROPPED}")
    assert dropped["PRIORITY"] == "4" and dropped["DOMAIN"] == dom_b
    assert (dropped["DISK"], dropped["TARGET"]) == (b, "vdb")
    assert "dropped, the other disks go on" in dropped["MESSAGE"]
    assert dropped in sel_b
    [full] = j.entries(f"MESSAGE_ID={journal.BUDGET_FULL}")      # said once: stays full
    assert full["PRIORITY"] == "5" and full["MESSAGE"].startswith("budget full: held 4M")
    assert "DOMAIN" not in full and "DISK" not in full           # the host's line
    # the priorities journalctl -p filters on
    warned = messages(j.entries(f"_PID={d.pid}", "-p", "warning"))
    assert dropped["MESSAGE"] in warned and full["MESSAGE"] not in warned
    assert full["MESSAGE"] in messages(j.entries(f"_PID={d.pid}", "-p", "notice"))


# -- one disk, no libvirt: the stream, and the last line of a failed start --------------

@pytest.mark.timeout(120)
def test_without_python3_systemd_the_stream_has_the_priorities(private_journal, tmp_path,
                                                               no_python3_systemd):
    """python3-systemd missing: `<N>` lines on journald's stream, which journald turns
    into PRIORITY=N; no fields (nor any prefix left in the text)."""
    j = private_journal
    img = data_image(tmp_path / "d.img", 16 * MiB)
    d = DaemonProc(tmp_path, img, "--uri", "", "--interval", "0.2", "--debug", max_hold="8M",
                   prefix=j.prefix(no_python3_systemd), env=env_without_systemd())
    try:
        got = j.wait(lambda es: sum(": held" in m for m in messages(es)) >= 3, "three cycles",
                     f"_PID={d.pid}", proc=d)
    finally:
        rc = d.stop()
    assert rc == 0, messages(j.entries())[-20:]
    assert {e["_TRANSPORT"] for e in got} == {"stdout"}
    cycles = [e for e in got if e["MESSAGE"].startswith("cycle ")]
    assert cycles[0]["MESSAGE"].startswith("cycle 1:") and cycles[0]["PRIORITY"] == "6"
    assert {e["PRIORITY"] for e in cycles[1:]} == {"7"}          # quiet: --debug only
    assert not any(m.startswith("<") for m in messages(got))
    assert not any("DISK" in e or "MESSAGE_ID" in e for e in got)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["native", "stream"])
def test_a_failed_start_says_why_at_priority_3(private_journal, tmp_path, mode,
                                               no_python3_systemd):
    j = private_journal
    d = DaemonProc(tmp_path, tmp_path / "nope.img", "--uri", "", max_hold="8M",
                   prefix=j.prefix(no_python3_systemd if mode == "stream" else ""),
                   env=env_without_systemd())
    try:
        rc = d.proc.wait(60)
    finally:
        d.stop()
    assert rc == 66, messages(j.entries())[-20:]
    got = j.wait(lambda es: es, "the fatal line", f"_PID={d.pid}")
    assert [(e["PRIORITY"], e["_TRANSPORT"]) for e in got] == [
        ("3", "journal" if mode == "native" else "stdout")], got
    assert got[0]["MESSAGE"].startswith("vmdisktouch: ") and "no such file" in got[0]["MESSAGE"]


# -- the floor and the budget, at the MemAvailable seam ---------------------------------

@pytest.fixture
def captured():
    """The daemon's records as the journal handler would see them: (level, message,
    fields)."""
    with journal_records() as got:
        yield got


def test_the_floor_and_a_full_budget_are_one_line_each_time_they_start(tmp_path, captured):
    """A real image, holder and host of one disk, MemAvailable read through the seam:
    full (16 MiB hot, 8 MiB budget), then MemAvailable falls 4 MiB under the floor and
    stays at it, then comes back, then falls again. Each start is one line with its
    MESSAGE_ID and the disk's fields; every line of the cycles carries DISK=."""
    img = data_image(tmp_path / "d.img", 64 * MiB)
    floor, room = 1 << 30, {"extra": 100 * MiB}
    cfg = settings.resolve({"max_hold": "8M", "interval": 5.0, "min_free": floor,
                            "access_source": "mincore", "load_rate": 0, "sigma_resident": 0})
    clock = Stepped()
    w = build(open_image(img), cfg, clock=clock, memcg=None,
              mem_available=lambda: floor + room["extra"] - w.holder.held_bytes())
    h = host_of(w)
    captured.clear()                # built outside a disk's context: the daemon opens it in one
    events: list[tuple[str, int]] = []

    def ticks(n, extra):
        room["extra"] = extra
        for _ in range(n):
            clock.t += 5.0
            h.tick()
        for level, msg, fields in captured:
            assert fields.get("DISK") == img, (msg, fields)
            if "MESSAGE_ID" in fields:
                events.append((fields["MESSAGE_ID"], level))
        captured.clear()

    try:
        with held(img, [(8 * MiB, 16 * MiB)]):
            ticks(4, 100 * MiB)
            assert w.holder.held_bytes() == 8 * MiB
            assert events == [(journal.BUDGET_FULL, journal.NOTICE)]
            ticks(4, 4 * MiB)            # 4M under the floor with 8M held: 4M shed, then
            assert w.holder.held_bytes() == 4 * MiB     # held back by the floor each cycle
            assert events[1:] == [(journal.FLOOR_SHED, logging.WARNING)]
            assert w.last_report.limited_by == "floor"
            ticks(3, 100 * MiB)          # room again: held to the budget, full again
            assert w.holder.held_bytes() == 8 * MiB
            ticks(3, 4 * MiB)            # and the floor again: a new episode
    finally:
        h.close()
    assert events == [(journal.BUDGET_FULL, journal.NOTICE),
                      (journal.FLOOR_SHED, logging.WARNING),
                      (journal.BUDGET_FULL, journal.NOTICE),
                      (journal.FLOOR_SHED, logging.WARNING)]
