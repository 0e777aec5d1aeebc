"""Fault table, round 4: limits of what the host service reads (issue 54).

* A ``[scope]`` list of 60,000 globs: before, it passed ``config --check`` and the host
  service recompiled every glob each cycle (``fnmatch`` caches 32,768): 2 cycles in 15 s
  at ``interval = 1``, 13.3 s of CPU. Now a list longer than
  ``overrides.MAX_SCOPE_PATTERNS`` is refused by ``config --check``, at start and at a
  reload (one line, the current settings kept), and a list at the cap costs little: the
  globs are compiled once at load and matches are memoised per name.
* Heat in the warm-restart state file far above what reads make (``3e38``): before, it
  held its blocks for about 15 minutes at the default decay, with no word. Now a loaded
  heat is capped by the one rule of both loaders (``heat.cap_loaded``), said in one line.
* 2.7 MB of foreign metadata (another application's element) in each domain's XML:
  before, the host service read every domain's XML each cycle, 7-8 ms of CPU per such
  domain per cycle. Now a domain's XML is read when it arrives and on libvirt's events
  (lifecycle, devices, metadata change), and a label change is still followed.

The libvirt rows run on a libvirtd of their own (``tests.support.private_libvirt``), so
no other test's domains add to the cost measured. See ``tests/support/faultkit.py``.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

from tests.support.daemon_proc import DaemonProc
from tests.support.faultkit import (EX_CONFIG, MiB, assert_clean, assert_refused, fault,
                                    rows_of, vmdt)
from tests.support.faultkit import image  # noqa: F401 - the rows' fixture
from tests.support.images import evict
from tests.support.libvirt_env import disk_xml, libvirt_daemons  # noqa: F401
from tests.support.pagecache import data_image
from tests.support.private_libvirt import own_libvirtd  # noqa: F401
from tests.support.procfs import cpu_seconds
from vmdisktouch.adapters import warm_state
from vmdisktouch.config import overrides
from vmdisktouch.system.image import open_image

LABEL_NS = overrides.LABEL_NS
CAP = overrides.MAX_SCOPE_PATTERNS


def host(tmp_path, uri: str, *args, name: str = "host") -> DaemonProc:
    """A host service at 1 s cycles on ``uri``, its status in ``tmp_path/name/host.json``."""
    work = tmp_path / name
    work.mkdir()
    return DaemonProc(work, [], "--libvirt", "--uri", uri, "--min-free", "0", "--interval", "1",
                      "--state-dir", str(tmp_path / f"{name}-state"), *args, max_hold="64M",
                      status="host.json")


def served(st: dict | None) -> set[str]:
    return {d["path"] for d in (st or {}).get("disks", [])}


def cycle(st: dict | None) -> int:
    return (st or {}).get("host", {}).get("cycle", 0)


def cpu_per_cycle(d: DaemonProc, cycles: int, timeout: float = 90.0) -> float:
    """The daemon's CPU seconds per cycle over ``cycles`` cycles (utime + stime, all threads)."""
    c0 = cycle(d.read_status())
    t0 = cpu_seconds(d.pid)
    d.wait_status(lambda s: cycle(s) >= c0 + cycles, f"{cycles} more cycles", timeout=timeout)
    return (cpu_seconds(d.pid) - t0) / cycles


def scope_toml(path, **lists) -> None:
    """A config file with a budget and a ``[scope]`` table."""
    body = "".join(f"{k} = [{', '.join(repr(g).replace(chr(39), chr(34)) for g in v)}]\n"
                   for k, v in lists.items())
    path.write_text('max_hold = "64M"\nmin_free = "0"\n[scope]\n' + body)


def set_metadata(uri: str, dom: str, xml: str, ns: str, key: str) -> None:
    """Live metadata through the python binding (virsh's argv cannot carry MiB)."""
    import libvirt
    conn = libvirt.open(uri)
    try:
        conn.lookupByName(dom).setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, xml, key, ns,
                                           libvirt.VIR_DOMAIN_AFFECT_LIVE)
    finally:
        conn.close()


# -- 54 break 3: a [scope] of 60,000 globs ---------------------------------------------------

@fault("scope-60000-globs",
       "`[scope] include` with 60,000 globs (589 KB), in `config --check`, at start, and at a "
       "reload of a running host service; then every list at the cap "
       f"({CAP} globs each, {4 * CAP} in all)",
       "a list over the cap is refused in one line naming the key and the cap (exit 78; at "
       "a reload the current settings stay); a scope at the cap costs little CPU: the globs "
       "are compiled once, the verdicts memoised",
       "`config --check` and the start exit 78 naming `include`, 60000 and the cap (it "
       "passed, and the service then ran 2 cycles in 15 s); one `reload rejected` line and "
       "the domain still served; at the cap, < 20 % of a core per 1 s cycle over 8 cycles",
       "54 broke 3")
def check_scope_60000(tmp_path, lv):
    big = tmp_path / "big.toml"
    scope_toml(big, include=[f"web-{i:05d}-*" for i in range(60_000)])
    assert os.path.getsize(big) > 500_000
    r = vmdt("config", "--check", big, timeout=60)
    last = assert_refused(r, EX_CONFIG, "include")
    assert "60000" in last and f"{CAP}" in last, last

    r = vmdt("run", "--libvirt", "--uri", lv.uri, "--config", big, "--min-free", "0",
             timeout=60)
    last = assert_refused(r, EX_CONFIG, "include")
    assert "60000" in last and f"{CAP}" in last, last

    img = data_image(tmp_path / "web.raw", 16 * MiB)
    dom = lv.define([disk_xml("vda", img)], tag="web")
    cfg = tmp_path / "host.toml"
    scope_toml(cfg, include=["vdt-private-web-*"])
    d = host(tmp_path, lv.uri, "--config", cfg)
    try:
        d.wait_status(lambda s: img in served(s), "the domain served", timeout=60)
        os.replace(big, cfg)
        d.signal(signal.SIGHUP)
        d.wait_output("reload rejected", "the reload rejected", timeout=30)
        c0 = cycle(d.read_status())
        st = d.wait_status(lambda s: cycle(s) >= c0 + 2, "two more cycles", timeout=30)
        assert img in served(st), st
        said = [x for x in d.output().splitlines() if "reload rejected" in x]
        assert len(said) == 1 and "include" in said[0] and f"{CAP}" in said[0], said

        # every list at the cap; the domain matches only the last include glob
        others = [f"x{i:04d}-*[0-9]?" for i in range(CAP - 1)]
        scope_toml(cfg, include=others + [f"{dom[:-2]}*"], exclude=others + ["nothing"],
                   include_labels=others + ["l"], exclude_labels=others + ["m"])
        d.signal(signal.SIGHUP)
        d.wait_output("reloaded settings", "the reload at the cap", timeout=30)
        st = d.wait_status(lambda s: img in served(s), "the domain still served", timeout=30)
        per = cpu_per_cycle(d, 8)
        print(f"scope at the cap: {per * 1e3:.1f} ms of CPU per cycle")
        assert per < 0.20, f"{per:.3f} s of CPU per 1 s cycle at the cap"
        assert_clean(d.output())
    finally:
        rc = d.stop()
    assert rc == 0, d.output()[-2000:]


# -- 54 weak: the state file's heat ----------------------------------------------------------

def state_with_heat(sd, image, zone: slice, value: float) -> None:
    """A state file for ``image`` (1 MiB blocks), written as the daemon writes it, with
    ``value`` as the resident heat of the blocks of ``zone``."""
    with open_image(str(image)) as img:
        n = img.block_count(MiB)
        hr = np.zeros(n, dtype=np.float32)
        hr[zone] = value
        warm_state.save(str(sd), img, MiB, hr, np.zeros(n, dtype=np.float32), [], time.time())


@fault("state-heat-3e38",
       "the warm-restart state file (`run IMG --state-dir SD`) has `heat_resident[4:12] = "
       "3e38` (finite float32) for an image nobody reads; `--decay 0.5`",
       "a loaded heat is at most what reads can make (the rule the carried metadata "
       "follows too): the zone is held at start and let go as a real hot zone is; said once",
       "one WARNING `... capped` line; the 8 MiB zone held at start, released within 20 s "
       "unread (it stayed held: 3e38 at 0.5/s takes 3 min, 15 min at the default decay)",
       "54 weak state-heat")
def check_state_heat(tmp_path, image):  # noqa: F811
    sd = tmp_path / "state"
    os.makedirs(sd, mode=0o700)
    state_with_heat(sd, image, slice(4, 12), 3e38)
    evict(image)
    d = DaemonProc(tmp_path, image, "--uri", "", "--min-free", "0", "--interval", "0.5",
                   "--decay", "0.5", "--state-dir", str(sd), max_hold="16M")
    try:
        st = d.wait_status(lambda s: s["held_bytes"] >= 8 * MiB, "the zone held at start",
                           timeout=30)
        t0 = time.monotonic()
        d.wait_status(lambda s: s["held_bytes"] == 0, "the zone released unread", timeout=25)
        took = time.monotonic() - t0
        assert took <= 20, took                 # ln(2 / 0.05) / 0.5 = 7.4 s, plus cycles
        said = [x for x in d.output().splitlines() if "capped" in x]
        assert len(said) == 1 and "WARNING" in said[0] and "8 blocks" in said[0], said
        assert st["cycle"] >= 1
    finally:
        rc = d.stop()
    assert rc == 0, d.output()[-2000:]
    assert_clean(d.output())


# -- 54 weak: foreign metadata read every cycle ----------------------------------------------

FOREIGN = 2_700_000
DOMAINS = 4


@fault("foreign-metadata-2.7mb",
       f"{DOMAINS} running domains each carry {FOREIGN / 1e6:.1f} MB of another application's "
       "metadata (its own namespace); a host service at 1 s cycles; then a label changed, "
       "foreign metadata changed, and a domain started",
       "a domain's XML is read when it arrives and on libvirt's events, not each cycle: the "
       "foreign metadata costs no CPU per cycle; a label change is still followed at once",
       f"the service's CPU per cycle with the {DOMAINS} domains < 12 ms more than without "
       "their metadata (it was 7-8 ms per domain: about 30 ms); an `exclude_labels` label "
       "set live releases its domain within 5 s; a domain started later is served within 5 s",
       "54 weak metadata")
def check_foreign_metadata(tmp_path, lv):
    imgs = [data_image(tmp_path / f"m{i}.raw", 16 * MiB) for i in range(DOMAINS + 1)]
    doms = [lv.define([disk_xml("vda", img)], tag=f"meta{i}") for i, img in
            enumerate(imgs[:DOMAINS])]
    cfg = tmp_path / "host.toml"
    scope_toml(cfg, exclude_labels=["off"])
    d = host(tmp_path, lv.uri, "--config", cfg)
    try:
        d.wait_status(lambda s: set(imgs[:DOMAINS]) <= served(s), "the domains served",
                      timeout=60)
        d.wait_status(lambda s: cycle(s) >= 4, "a few cycles", timeout=30)
        bare = cpu_per_cycle(d, 10)
        big = f'<blob a="{"x" * FOREIGN}"/>'
        for dom in doms:
            set_metadata(lv.uri, dom, big, "http://example.org/other-app", "other")
        c0 = cycle(d.read_status())
        d.wait_status(lambda s: cycle(s) >= c0 + 3, "a few cycles", timeout=30)
        heavy = cpu_per_cycle(d, 10)
        print(f"CPU per cycle: {bare * 1e3:.1f} ms bare, {heavy * 1e3:.1f} ms with "
              f"{DOMAINS} x {FOREIGN} bytes of foreign metadata")
        assert heavy - bare < 0.012, \
            f"{heavy * 1e3:.1f} ms per cycle with the metadata, {bare * 1e3:.1f} without"

        set_metadata(lv.uri, doms[0], "<label>off</label>", LABEL_NS, "vmdt")
        t0 = time.monotonic()
        d.wait_status(lambda s: imgs[0] not in served(s), "the labelled domain released",
                      timeout=30)
        assert time.monotonic() - t0 <= 5
        set_metadata(lv.uri, doms[1], '<blob a="changed"/>', "http://example.org/other-app",
                     "other")
        late = lv.define([disk_xml("vda", imgs[DOMAINS])], tag="late")
        t0 = time.monotonic()
        st = d.wait_status(lambda s: imgs[DOMAINS] in served(s), "the late domain served",
                           timeout=30)
        assert time.monotonic() - t0 <= 5 and set(imgs[1:DOMAINS]) <= served(st), (late, st)
        assert_clean(d.output())
    finally:
        rc = d.stop()
    assert rc == 0, d.output()[-2000:]


# -- the table's own tests ---------------------------------------------------------------------

ROWS = rows_of(__name__)
LIBVIRT_ROWS = [r for r in ROWS if r.id != "state-heat-3e38"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("row", LIBVIRT_ROWS, ids=[f.id for f in LIBVIRT_ROWS])
def test_libvirt_limit(row, tmp_path, own_libvirtd):  # noqa: F811
    row.check(tmp_path, own_libvirtd)


@pytest.mark.timeout(120)
def test_state_heat(tmp_path, image):  # noqa: F811
    check_state_heat(tmp_path, image)
