"""budgetlog: one line when the host's budget fills, frees or its split changes; none when
steady."""

import logging
from types import SimpleNamespace

from vmdisktouch.daemon.budgetlog import BudgetLog

MiB = 1 << 20


def disk(name, held):
    dom, tgt = name.split("/")
    return SimpleNamespace(domain=dom, target=tgt, image=SimpleNamespace(path=f"/img/{dom}"),
                           holder=SimpleNamespace(held_bytes=lambda: held))


def lines(caplog):
    out = [r.getMessage() for r in caplog.records if r.getMessage().startswith("budget:")]
    caplog.clear()
    return out


def test_a_line_when_it_fills_then_none_while_steady_then_one_when_the_split_changes(caplog):
    caplog.set_level(logging.INFO, logger="vmdisktouch")
    bl = BudgetLog()
    budget = 1000 * MiB
    bl.note([disk("vm1/vda", 0), disk("vm2/vda", 0)], budget, None)
    assert lines(caplog) == []                                     # nothing held yet
    bl.note([disk("vm1/vda", 600 * MiB), disk("vm2/vda", 300 * MiB)], budget, 20 << 30)
    assert lines(caplog) == ["budget: held 900M of 1000M (90%): vm1/vda 600M, vm2/vda 300M; "
                             "20G above the floor"]
    for held in (610, 590, 650):                                   # within a tenth: quiet
        bl.note([disk("vm1/vda", held * MiB), disk("vm2/vda", 300 * MiB)], budget, None)
    assert lines(caplog) == []
    # the same sum, split otherwise: a line
    bl.note([disk("vm1/vda", 450 * MiB), disk("vm2/vda", 450 * MiB)], budget, None)
    assert lines(caplog) == ["budget: held 900M of 1000M (90%): vm1/vda 450M, vm2/vda 450M"]
    # a disk that goes with a tenth of the budget: a line
    bl.note([disk("vm1/vda", 450 * MiB)], budget, None)
    assert lines(caplog) == []                           # one disk left: its own lines say it
    bl.note([disk("vm1/vda", 450 * MiB), disk("vm3/vdb", 0)], budget, None)
    assert lines(caplog) == ["budget: held 450M of 1000M (45%): vm1/vda 450M, vm3/vdb 0"]
