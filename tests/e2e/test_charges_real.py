"""Cgroup-aware holding against real cgroup v1 memory groups, with a real daemon.

A reader in a memory group (the guest's QEMU) keeps a hot zone of a data
image cached, so its pages are charged to that group; the daemon runs
outside it and holds the zone. Checked: with a limit, the bytes the daemon
keeps locked while charged to the group stay within the cap (the status and
the group's own ``unevictable`` agree) and the rest is recharged to the
daemon's group, still held; without a limit the group is left alone; a
group removed while its pages are held changes nothing for the daemon.
"""

from __future__ import annotations

import time

import pytest

from tests.support.pagecache import data_image
from tests.support.cgroup import MemoryCgroup
from tests.support.daemon_proc import DaemonProc
from tests.support.holders import zone_reader_argv

MiB = 1 << 20
ZONE = (16 * MiB, 64 * MiB)
ARGS = ("--max-hold", "96M", "--uri", "", "--min-free", "0", "--interval", "0.5",
        "--decay", "1")


def group_entry(status: dict, cg: MemoryCgroup) -> dict | None:
    for g in status["charges"]["groups"]:
        if g["group"].rstrip("/").endswith(cg.name):
            return g
    return None


def start_reader(cg: MemoryCgroup, image: str):
    return cg.popen(zone_reader_argv(image, *ZONE, pause=0.2))


@pytest.fixture
def image(tmp_path):
    return data_image(tmp_path / "disk.img", 256 * MiB)


@pytest.mark.root
@pytest.mark.timeout(180)
def test_a_limited_group_keeps_at_most_its_cap_pinned_and_the_rest_is_recharged(tmp_path,
                                                                                image):
    with MemoryCgroup("charges", 256 * MiB) as cg:
        start_reader(cg, image)
        time.sleep(2)                                   # the zone is the group's cache now
        d = DaemonProc(tmp_path, image, *ARGS)
        try:
            st = d.wait_status(lambda s: s["held_bytes"] >= ZONE[1] // 2
                               and s["charges"]["recharged_bytes"] > 0,
                               "the zone held and recharged", timeout=60)
            assert st["charges"]["available"] is True
            cap = int(0.1 * 256 * MiB)
            worst = most = 0
            for _ in range(10):                          # 5 s of samples
                time.sleep(0.5)
                worst = max(worst, cg.unevictable_bytes())
                st = d.read_status()
                most = max(most, st["held_bytes"])
                g = group_entry(st, cg)
                if g is not None:
                    assert g["cap_bytes"] <= cap and g["held_bytes"] <= cap + MiB, g
                    assert g["limit_bytes"] == 256 * MiB
            assert worst <= cap + 2 * MiB, f"{worst / MiB:.1f} MiB unevictable in the group"
            assert most >= ZONE[1] // 2 + cap           # held beyond the cap: our own charge
            assert "recharging" in d.output()
        finally:
            assert d.stop() == 0, d.output()[-2000:]
        assert cg.oom_kills() == 0


@pytest.mark.root
@pytest.mark.timeout(180)
def test_an_unlimited_group_is_left_alone(tmp_path, image):
    with MemoryCgroup("charges-free", 1 << 62) as cg:
        start_reader(cg, image)
        time.sleep(2)
        d = DaemonProc(tmp_path, image, *ARGS)
        try:
            st = d.wait_status(lambda s: s["held_bytes"] >= ZONE[1], "the zone held",
                               timeout=60)
            for _ in range(4):
                time.sleep(0.5)
                st = d.read_status()
            g = group_entry(st, cg)
            assert g is not None and g["limit_bytes"] is None and g["cap_bytes"] is None
            assert g["held_bytes"] >= ZONE[1] // 2          # the guest's pages, held as they are
            assert st["charges"]["recharged_bytes"] == 0
            assert cg.unevictable_bytes() >= ZONE[1] // 2
        finally:
            assert d.stop() == 0, d.output()[-2000:]


@pytest.mark.root
@pytest.mark.timeout(180)
def test_a_group_removed_while_its_pages_are_held(tmp_path, image):
    cg = MemoryCgroup("charges-gone", 1 << 62).create()
    try:
        start_reader(cg, image)
        time.sleep(2)
        d = DaemonProc(tmp_path, image, *ARGS)
        try:
            d.wait_status(lambda s: s["held_bytes"] >= ZONE[1] and group_entry(s, cg),
                          "the zone held, charged to the group", timeout=60)
            cg.cleanup()                                 # reader killed, group removed
            st = d.wait_status(lambda s: group_entry(s, cg) is None, "the group gone",
                               timeout=90)
            c = st["cycle"]
            st = d.wait_status(lambda s: s["cycle"] >= c + 3, "three more cycles")
            assert st["held_bytes"] > 0
            assert "Traceback" not in d.output()
        finally:
            assert d.stop() == 0, d.output()[-2000:]
    finally:
        cg.cleanup()


@pytest.mark.root
@pytest.mark.timeout(180)
def test_a_zone_the_guest_rereads_without_pause_is_still_recharged_and_held(tmp_path, image):
    """A guest that rereads its zone back to back (a hot set under an LRU that
    thrashes): pages dropped to be reloaded under the daemon's charge are faulted
    back by the guest first unless the drop and the reload are close together.
    The zone must still be held, within the cap."""
    with MemoryCgroup("charges-hot", 256 * MiB) as cg:
        cg.popen(zone_reader_argv(image, *ZONE, pause=0))
        time.sleep(2)
        d = DaemonProc(tmp_path, image, *ARGS)
        try:
            cap = int(0.1 * 256 * MiB)
            d.wait_status(lambda s: s["cycle"] >= 20, "20 cycles", timeout=60)
            held = []
            for _ in range(10):                          # 5 s of samples
                time.sleep(0.5)
                st = d.read_status()
                held.append(sum(max(0, min(ZONE[0] + ZONE[1], o + n) - max(ZONE[0], o))
                                for o, n in st["regions"]))
                assert cg.unevictable_bytes() <= cap + 2 * MiB
            assert min(held) >= 0.9 * ZONE[1], [h // MiB for h in held]
        finally:
            assert d.stop() == 0, d.output()[-2000:]
        assert cg.oom_kills() == 0
