"""Who opens a served image with O_DIRECT (issue 54): said once per process, again for one
that appears later; looked for at most every ``DIRECT_MIN_SECONDS``, less often when a look
is slow or many disks look (``served.DirectOpeners``). The /proc walk is faked here; the
real one is the fault row of ``tests/e2e/test_faults_round4_status.py``."""

from __future__ import annotations

import logging

from vmdisktouch.daemon import served
from vmdisktouch.system.observe import io_watch


def test_each_o_direct_opener_is_said_once_and_a_later_one_too(monkeypatch, caplog):
    now, seen = [0.0], [{}]

    def openers(path):
        now[0] += 0.003                                     # a look takes 3 ms
        return dict(seen[0])
    monkeypatch.setattr(io_watch, "openers", openers)
    monkeypatch.setattr(io_watch, "process_name", lambda pid: f"p{pid}")
    caplog.set_level(logging.INFO, "vmdisktouch")
    seen[0] = {40: False}                          # a buffered reader: nothing said
    d = served.DirectOpeners("/img/a.raw", clock=lambda: now[0])
    assert [r for r in caplog.records if "O_DIRECT" in r.getMessage()] == []
    seen[0] = {40: False, 41: True}
    d.maybe_check()                                # too soon: not looked
    now[0] += served.DIRECT_MIN_SECONDS
    d.maybe_check()
    now[0] += served.DIRECT_MIN_SECONDS
    d.maybe_check()                                # still there: not said again
    said = [r.getMessage() for r in caplog.records if "O_DIRECT" in r.getMessage()]
    assert said == ["/img/a.raw: p41 (pid 41) opens it with O_DIRECT: nothing it reads comes "
                    "from the page cache; see `vmdisktouch advise`"], said
    assert all(r.levelno == logging.WARNING for r in caplog.records if "O_DIRECT" in
               r.getMessage())


def test_slow_looks_over_many_disks_are_spaced_to_a_thousandth_of_a_core(monkeypatch):
    now = [0.0]

    def openers(path):
        now[0] += 0.05                                      # a slow host: 50 ms a look
        return {}
    monkeypatch.setattr(io_watch, "openers", openers)
    d = served.DirectOpeners("/img/a.raw", clock=lambda: now[0])
    assert d.next - now[0] == max(served.DIRECT_MIN_SECONDS, 0.05 / served.DIRECT_COST)
    d.check(disks=20)
    assert abs((d.next - now[0]) - 0.05 * 20 / served.DIRECT_COST) < 1e-6     # 1000 s
