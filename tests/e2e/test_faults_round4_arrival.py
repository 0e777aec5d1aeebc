"""Fault table, round 4: a domain arrives on an image ``run IMG --uri`` holds (issue 54, 2).

``run IMG --uri URI`` holds an image no domain uses (it is not under libvirt) and
follows the domain that takes it. A domain arrives by a restore or an incoming live
migration: QEMU starts with ``-incoming`` and, when the incoming completes (a restore)
or at ``cont`` (a migration: late block activation), drops the image's page cache and
here checks the drop (``tests.support.arrival_env.CheckedQemu``: ``x-check-cache-
dropped``; a page left makes QEMU log "page cache still in use!" and refuse ``cont``). A
restore sends libvirt no event before it completes, and a 64 MiB paused guest's restore
lasts about 0.3 s, so a daemon at its 5 s cycle (the default) that only listens to
libvirt's events never sees the domain arrive: it keeps its pages locked through the
drop.

Each row runs a real libvirtd of its own (``PrivateLibvirtd``; two for the migration,
one page cache), a real QEMU, and a real ``vmdisktouch run IMG --uri`` holding the
image hot (the test reads it, as ``test_faults_run`` does), then:
the arrival completes with QEMU finding no page left, the daemon locked nothing at least
0.1 s before the domain ran (libvirt's "started" event of an incoming migration comes
some 0.03 s before the ``cont`` that activates the disk: a daemon woken only by it
releases by a hair, or too late), its log names the domain that took the image and says
it released for it, and it holds the image again once the domain runs. The interval is
30 s so that no scheduled cycle falls in the arrival by chance. The daemons run this
checkout's code, or the tree in ``VDT_ARRIVAL_TREE`` (a ``git worktree`` of the code
before the fix, which each row fails on).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
import uuid

import pytest

from tests.support.arrival_env import STILL_IN_USE, CheckedQemu, QemuLog, checked_domain_xml, vsh
from tests.support.common import ROOT, free_port
from tests.support.daemon_proc import DaemonProc
from tests.support.faultkit import MiB, assert_clean, fault, rows_of
from tests.support.faultkit import image  # noqa: F401 - the rows' fixture
from tests.support.libvirt_env import PREFIX, disk_xml, libvirt_daemons  # noqa: F401
from tests.support.pagecache import data_image, read_range
from tests.support.private_libvirt import PrivateLibvirtd

CASE = "54 broke 2"
BUDGET = "32M"
ZONE = (8 * MiB, 24 * MiB)         # read as the guest would, until 16 MiB of it is held
MARGIN = 0.1                       # s: released at least this long before the domain ran
INTERVAL = 30                      # s: no scheduled cycle falls in the arrival by chance
TREE = os.environ.get("VDT_ARRIVAL_TREE", ROOT)


def running_given(tmp_path, img: str, uri: str) -> DaemonProc:
    """``vmdisktouch run IMG --uri URI --max-hold 32M`` (``INTERVAL``), the image
    made hot (read until 16 MiB of it is locked)."""
    work = tmp_path / "run"
    work.mkdir()
    d = DaemonProc(work, img, "--uri", uri, "--min-free", "0", max_hold=BUDGET,
                   interval=INTERVAL, cwd=TREE)
    try:
        d.wait_output("cycle 1:", "the first cycle", timeout=60)
        held_again(d, img, 16 * MiB, timeout=60)
    except BaseException:
        d.stop()
        raise
    return d


def held_again(d: DaemonProc, img: str, at_least: int, timeout: float = 30.0) -> None:
    """Read the zone as a guest would until ``d`` locks ``at_least`` bytes."""
    deadline = time.monotonic() + timeout
    while d.vmlck() < at_least:
        assert d.alive(), d.output()[-3000:]
        assert time.monotonic() < deadline, \
            f"VmLck {d.vmlck()} after {timeout:g} s\n{d.log_tail(20)}"
        read_range(img, *ZONE)
        time.sleep(0.2)


class Clock:
    """A thread that notes, every 5 ms, when ``d`` first locks nothing and when ``dom``
    first runs at ``uri`` (a read-only connection of its own); ``stop()`` ends it."""

    def __init__(self, d: DaemonProc, uri: str, dom: str):
        import libvirt
        self.d, self.dom = d, dom
        self.conn = libvirt.openReadOnly(uri)
        self.released = self.running = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self._look()

    def _look(self) -> None:
        import libvirt
        now = time.monotonic()
        if self.released is None and self.d.vmlck() == 0:
            self.released = now
        try:
            states = {x.name(): x.state()[0] for x in self.conn.listAllDomains()}
        except libvirt.libvirtError:
            return
        if self.running is None and states.get(self.dom) == libvirt.VIR_DOMAIN_RUNNING:
            self.running = now

    def stop(self) -> str:
        """End the thread, then look once more: virsh can return within a poll of the
        domain running (a busy machine starves the thread), and the time noted then is
        later than the true one by that poll at most."""
        self._stop.set()
        self.thread.join(5)
        self._look()
        self.conn.close()
        if self.released is None or self.running is None:
            return f"released at {self.released}, running at {self.running}"
        return f"released {self.running - self.released:.3f} s before the domain ran"


def arrived_and_released(d: DaemonProc, dom: str, img: str, log: QemuLog, r, what: str,
                         clock: Clock):
    """The arrival completed (``r``: virsh's result), QEMU found no page still cached, the
    daemon named the domain that took its image and released for it, at least
    ``MARGIN`` before the domain ran (not by a hair: QEMU activates the disk before
    libvirt reports it running), and holds again."""
    when = clock.stop()
    out = log.new()
    assert r.returncode == 0 and STILL_IN_USE not in out, \
        f"{what}: exit {r.returncode}: {r.stderr.strip()}; VmLck now {d.vmlck()}; {when}\n" \
        f"QEMU:\n{out[-1500:]}\ndaemon:\n{d.log_tail(20)}"
    assert clock.released is not None and clock.running is not None \
        and clock.running - clock.released >= MARGIN, f"{what}: {when}\n{d.log_tail(20)}"
    said = d.output()
    assert f"libvirt domain {dom} takes it" in said, said[-3000:]
    assert f"libvirt domain {dom} is arriving" in said and "releasing" in said, said[-3000:]
    held_again(d, img, 8 * MiB)          # serving on: the zone held again once it runs
    assert d.alive(), said[-3000:]
    assert_clean(d.output())


@fault("arrive-restore-on-a-given-image",
       "`run IMG --uri URI` holds a hot image no domain uses; a transient domain saved "
       "earlier is restored onto it (`virsh restore --running`; no libvirt event until "
       "the restore completes, ~0.3 s)",
       "nothing is locked when QEMU drops the image's page cache; the daemon names the "
       "domain and holds again once it runs",
       "the restore completes and QEMU logs no \"page cache still in use\"; VmLck 0 at least "
       "0.1 s before the domain runs; the log says \"libvirt domain D takes it\" and \"is "
       "arriving ... releasing\"; VmLck back to 8 MiB",
       CASE)
def _(tmp_path, image):
    cq = CheckedQemu()
    lv = PrivateLibvirtd(tmp_path, name="own")
    d = None
    try:
        img = data_image(tmp_path / "a.raw", 64 * MiB)
        dom = f"{PREFIX}given-{uuid.uuid4().hex[:8]}"
        xml = tmp_path / f"{dom}.xml"
        xml.write_text(checked_domain_xml(dom, [disk_xml("vda", img)], cq.path))
        vsh(lv.uri, "create", str(xml), "--paused")
        saved = tmp_path / "s.save"
        vsh(lv.uri, "save", dom, str(saved))          # it leaves libvirt (transient)
        assert not vsh(lv.uri, "list", "--all", "--name").strip()
        d = running_given(tmp_path, img, lv.uri)
        log = QemuLog(dom, lv.qemu_log(dom))
        clock = Clock(d, lv.uri, dom)
        r = subprocess.run(["virsh", "-c", lv.uri, "restore", str(saved), "--running"],
                           capture_output=True, text=True, timeout=120)
        arrived_and_released(d, dom, img, log, r, "virsh restore", clock)
    finally:
        if d is not None:
            d.stop()
        lv.close()
        cq.remove()


@fault("arrive-migration-on-a-given-image",
       "`run IMG --uri DST` holds a hot image no domain of DST uses; a running domain on "
       "that image migrates live into DST (`virsh migrate --live --unsafe`, 64 MiB of RAM, "
       "no speed limit)",
       "nothing is locked when QEMU activates the disk at `cont` and drops its page cache; "
       "the daemon names the domain and holds again once it runs",
       "the migration completes and QEMU there logs no \"page cache still in use\"; VmLck 0 "
       "at least 0.1 s before the domain runs there; the log says \"libvirt domain D takes "
       "it\" and \"is arriving ... releasing\"; VmLck back to 8 MiB",
       CASE)
def _(tmp_path, image):
    cq = CheckedQemu()
    src = PrivateLibvirtd(tmp_path, name="src")
    dst = d = None
    try:
        dst = PrivateLibvirtd(tmp_path, name="dst")
        img = data_image(tmp_path / "a.raw", 64 * MiB)
        dom = f"{PREFIX}given-mig-{uuid.uuid4().hex[:8]}"
        xml = tmp_path / f"{dom}.xml"
        xml.write_text(checked_domain_xml(dom, [disk_xml("vda", img)], cq.path))
        vsh(src.uri, "create", str(xml))
        d = running_given(tmp_path, img, dst.uri)
        clock = Clock(d, dst.uri, dom)
        r = subprocess.run(["virsh", "-c", src.uri, "migrate", "--live", "--unsafe", dom,
                            dst.uri, "--migrateuri", f"tcp://127.0.0.1:{free_port()}"],
                           capture_output=True, text=True, timeout=300)
        log = QemuLog(dom, dst.qemu_log(dom))
        log.start = 0
        arrived_and_released(d, dom, img, log, r, "virsh migrate", clock)
    finally:
        if d is not None:
            d.stop()
        if dst is not None:
            dst.close()
        src.close()
        cq.remove()


# -- the table's own test -----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_arrival_fault(row, tmp_path, image, libvirt_daemons):
    row.check(tmp_path, image)


@pytest.mark.timeout(120)
def test_a_reader_that_opens_the_image_often_adds_no_cycles(tmp_path, libvirt_daemons):
    """Not a row (main had no open wake-ups): every open of a given image that no domain
    uses wakes the daemon, which asks libvirt and runs a cycle only when the answer
    changes what is held. A reader opening the image 50 times a second for 6 s (no
    domain takes it) leaves the cycle at its interval and the zone held."""
    from tests.support.libvirt_env import URI
    img = data_image(tmp_path / "a.raw", 64 * MiB)
    work = tmp_path / "run"
    work.mkdir()
    d = DaemonProc(work, img, "--uri", URI, "--min-free", "0", "--debug", max_hold=BUDGET,
                   interval=2)
    try:
        held_again(d, img, 16 * MiB, timeout=60)
        start = d.read_status()["cycle"]
        t0 = time.monotonic()
        while time.monotonic() - t0 < 6:
            read_range(img, *ZONE)                      # an open, and reads, each time
            time.sleep(0.02)
        cycles = d.read_status()["cycle"] - start
        assert cycles <= 6 / 2 + 2, f"{cycles} cycles in 6 s at a 2 s interval\n" \
                                    f"{d.log_tail(20)}"
        assert d.vmlck() >= 8 * MiB and "opened: " in d.output(), d.log_tail(20)
    finally:
        d.stop()
    assert_clean(d.output())
