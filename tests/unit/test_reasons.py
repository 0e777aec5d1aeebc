"""reasons: why a disk holds less than it wants, one code of a small set, the first that applies."""

import pytest

from vmdisktouch.config import settings
from vmdisktouch.daemon.emit import CycleReport
from vmdisktouch.daemon.reasons import CODES, Allotment, Facts, why_not_held

MiB = 1 << 20
CFG = settings.resolve({"max_hold": "64M", "min_free": "1G"})


def rep(held=0, skipped=0, avail=8 << 30):
    return CycleReport(cycle=1, cycle_seconds=0.01, held_bytes=held, resident_bytes=0,
                       regions=[], rewritten_blocks=0, rewritten_ranges=[],
                       mem_available_bytes=avail, loaded_bytes=0, released_bytes=0,
                       skipped_bytes=skipped, size_bytes=1 << 30)


def allot(wanted=32 * MiB, share=32 * MiB, limit=None, top=None, cap=None, weight=1.0,
          curve_wants=None):
    return Allotment(share, wanted, limit, top, 64 * MiB, cap, weight, curve_wants)


def facts(a=None, holding=True, heat=1.0, refused=None, ceded=0):
    return Facts(holding, a if a is not None else allot(), lambda: heat, 0.05, refused, ceded)


@pytest.mark.parametrize("r,f,code,needle", [
    (rep(), facts(holding=False), "domain_off", "libvirt domain is not running"),
    (rep(), facts(allot(wanted=0), heat=0.0), "no_evidence", "no evidence of use yet"),
    (rep(), facts(allot(wanted=0), heat=0.03), "below_threshold",
     "nothing is above the threshold 0.05 (the hottest block has 60 % of it)"),
    (rep(), facts(allot(wanted=0), heat=8.22e-15), "below_threshold",     # was "8.22e-15"
     "nothing is above the threshold 0.05 (the hottest block has under 1 % of it)"),
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="budget", top="vm2/vda")), "budget",
     "the host budget went to hotter disks (most to vm2/vda)"),
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="budget")), "budget",
     "the budget (64M) is full of regions at least as hot"),
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="cap", cap=8 * MiB)), "cap",
     "its cap (8M) is full"),
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="weight", top="vm2/vda",
                                    weight=0.5)), "weight", "weight 0.5; most to vm2/vda"),
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="curve", top="vm2/vda")), "curve",
     "memory saves more reads elsewhere (most to vm2/vda)"),
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="curve", top="vm2/vda",
                                    curve_wants=6 * MiB)), "curve",
     "its curve says more would not pay (it wants 6M)"),
    # within one slice of the 64M budget (1M) of what its curve wants: the split's grain
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="curve", curve_wants=9 * MiB)),
     "curve", "its curve says more would not pay (it wants 9M)"),
    (rep(held=8 * MiB), facts(allot(share=8 * MiB, limit="curve", curve_wants=10 * MiB)),
     "curve", "memory saves more reads elsewhere"),
    (rep(held=8 * MiB, skipped=MiB, avail=900 * MiB), facts(), "floor",
     "free-memory floor (min_free 1G)"),
    (rep(held=8 * MiB), facts(ceded=4 * MiB), "cgroup", "4M its memory cgroup keeps"),
    (rep(held=8 * MiB), facts(refused="RLIMIT_MEMLOCK 8M"), "lock_limit",
     "refused to lock more (RLIMIT_MEMLOCK 8M)"),
    (rep(held=8 * MiB, skipped=MiB), facts(), "not_loaded", "1M targeted was not loaded"),
])
def test_each_reason_of_the_set(r, f, code, needle):
    got, line = why_not_held(r, CFG, f)
    assert got == code and got in CODES
    assert needle in line


def test_nothing_to_say_when_all_it_wants_is_held():
    assert why_not_held(rep(held=32 * MiB), CFG, facts()) is None
    # less than the budget, but all it wants: no reason (the old rule said "no evidence")
    assert why_not_held(rep(held=MiB), CFG, facts(allot(wanted=MiB, share=64 * MiB))) is None


def test_the_domain_off_comes_before_everything_else():
    f = facts(allot(wanted=0), holding=False, heat=0.0, refused="x")
    assert why_not_held(rep(skipped=MiB, avail=0), CFG, f)[0] == "domain_off"
