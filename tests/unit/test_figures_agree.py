"""A status line never holds two figures that contradict each other (docs/status.md, "Reads
from memory: one definition").

The share of reads from memory is said now and with one GiB more, on the host line
and on each disk's line, from the report (``report.reads_from_memory``). A line once
said "reads 91 % from memory ... +1G -> 69 % of reads": the first figure measured,
the second an LRU curve's height, which topped out at 83-85 % even at the whole
image. One GiB more never serves fewer reads from memory, and the host line's GiB is
the one its named disk's line says.

The recorded reports (tests/data/status-reports.jsonl.gz) are the status files a
daemon of the code before this rule wrote every 10 s while two guests read their
disks (tests/support/steady_host.py ``--reports``): read by today's ``status``.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import re
import time


from vmdisktouch.commands import cli
from vmdisktouch.report import HostReport

MiB = 1 << 20
REPORTS = pathlib.Path(__file__).resolve().parents[1] / "data" / "status-reports.jsonl.gz"
NOW = re.compile(r"reads (\d+) % from memory")
PLUS = re.compile(r"\+1G -> (\d+) % of reads")
MORE = re.compile(r"\+([\d,]+) reads/s")


def recorded() -> list[dict]:
    with gzip.open(REPORTS, "rt") as f:
        return [json.loads(line) for line in f]


def status_lines(tmp_path, capsys, doc: dict) -> list[str]:
    (tmp_path / "host.json").write_text(json.dumps(doc))
    cli.main(["status", "--dir", str(tmp_path)])
    return capsys.readouterr().out.splitlines()


def check(lines: list[str]) -> int:
    """Every line's figures agree: +1G never below now; the host line's +1G and reads a
    second are those of the disk it names. Returns how many lines had both figures."""
    both = 0
    for line in lines:
        now, plus = NOW.search(line), PLUS.search(line)
        if now and plus:
            both += 1
            assert int(plus.group(1)) >= int(now.group(1)), line
    head, disks = lines[0], lines[1:]
    named = re.search(r"the next GiB would do most for (.*) \(\+([\d,]+) reads/s\)", head)
    if named:
        [mine] = [x for x in disks if x.strip().startswith(named.group(1) + ":")]
        assert f"+{named.group(2)} reads/s" in mine, (head, mine)
    shares = [int(m.group(1)) for x in disks for m in [NOW.search(x)] if m]
    if shares and NOW.search(head):
        assert min(shares) <= int(NOW.search(head).group(1)) <= max(shares), lines
    return both


def disk(path: str, hit: float, held_curve: float, then: float, pages: float) -> dict:
    """A trace disk's status whose curve is ``held_curve`` high at what it holds and
    ``then`` one GiB further, its measured share ``hit``."""
    return {"path": path, "domain": None, "target": None, "pid": os.getpid(),
            "version": "0-test", "interval_seconds": 1.0, "cycle": 3, "cycle_seconds": 0.01,
            "size_bytes": 3 << 30, "block_size": 2 * MiB, "budget_bytes": 432 * MiB,
            "host_budget_bytes": 864 * MiB, "wanted_bytes": 432 * MiB,
            "held_bytes": 432 * MiB, "regions": [[0, 432 * MiB]], "rewritten_blocks": 0,
            "mem_available_bytes": 9 << 30, "min_free_bytes": 0, "not_held_reason": None,
            "limited_by": None, "access_source": "trace", "events_lost": 0,
            "time": time.time(), "curve": [[MiB, 0.1], [3 << 30, 0.84]],
            "mrc": {"reads": 900000, "re_reads": 800000, "window_seconds": 900.0,
                    "enough_reads": True, "wait_seconds": 0},
            "gain": {"pages_read_per_second": pages, "cache_hit_ratio": hit,
                     "held_read_share": 0.88, "held_reads_per_second": pages * 0.88,
                     "next_gib": {"bytes": (432 << 20) + (1 << 30), "hit_ratio": then,
                                  "more_reads_per_second": round((then - held_curve) * pages,
                                                                 1)},
                     "wants_bytes": 456 * MiB}}


def host_doc(disks: list[dict]) -> dict:
    lines = [{"path": d["path"], "domain": None, "target": None,
              "held_bytes": d["held_bytes"], "share_bytes": d["budget_bytes"],
              "wanted_bytes": d["wanted_bytes"], "limited_by": None, "not_held_reason": None,
              "heat": 1.0, "cap_bytes": None, "weight": 1.0} for d in disks]
    return {"host": {"pid": os.getpid(), "version": "0-test", "interval_seconds": 1.0,
                     "time": time.time(), "budget_bytes": 864 * MiB,
                     "held_bytes": sum(d["held_bytes"] for d in disks),
                     "mem_available_bytes": 9 << 30, "min_free_bytes": 0,
                     "above_floor_bytes": 9 << 30, "cycle": 9, "cycle_seconds": 0.01,
                     "disks": lines, "failed": []}, "disks": disks}


def test_the_line_of_the_issue_says_one_share_now_and_with_a_gib_more(tmp_path, capsys):
    """91 % measured; the curve 66 % high at 432M held and 69 % a GiB further: with a GiB
    more, 94 % (91 + 3), never "69 %"."""
    a = disk("/img/a.raw", 0.91, 0.66, 0.69, 17000.0)
    b = disk("/img/b.raw", 0.80, 0.40, 0.55, 4000.0)
    lines = status_lines(tmp_path, capsys, host_doc([a, b]))
    assert check(lines) == 3, lines
    assert "reads 91 % from memory" in lines[1] and "+1G -> 94 % of reads, +510 reads/s" \
        in lines[1], lines[1]
    # the host: (0.91 x 17000 + 0.80 x 4000) / 21000, and b's GiB (+600 reads/s) the most
    assert "reads 89 % from memory, +1G -> 92 % of reads: the next GiB would do most for " \
        "/img/b.raw (+600 reads/s)" in lines[0], lines[0]


def test_the_figures_of_one_report_are_the_same_everywhere(tmp_path, capsys):
    """Status, the metrics and the report's JSON take the one computation."""
    from vmdisktouch.adapters.metrics.metrics import Collector      # both venvs have it
    doc = host_doc([disk("/img/a.raw", 0.91, 0.66, 0.69, 17000.0)])
    r = HostReport.from_json(doc)
    c = Collector()
    c.update(r)
    got = {(s.name, s.labels.get("disk")): s.value for f in c.collect() for s in f.samples}
    fm = r.disks[0].from_memory
    assert got[("vmdisktouch_reads_from_memory_ratio", "/img/a.raw")] == fm["now"] == 0.91
    assert got[("vmdisktouch_reads_from_memory_next_gib_ratio", "/img/a.raw")] == \
        fm["plus_gib"] == 0.94
    assert r.to_json()["disks"][0]["from_memory"] == fm
    assert r.to_json()["host"]["from_memory"]["plus_gib"] == \
        got[("vmdisktouch_host_reads_from_memory_next_gib_ratio", None)]
    lines = status_lines(tmp_path, capsys, doc)
    assert "reads 91 % from memory" in lines[0] and "+1G -> 94 % of reads" in lines[0]


def test_every_line_of_the_recorded_reports_agrees(tmp_path, capsys):
    docs = recorded()
    assert len(docs) >= 10
    both = sum(check(status_lines(tmp_path, capsys, doc)) for doc in docs)
    assert both >= len(docs)          # the figures were there to check


def test_the_host_png_draws_each_curve_through_the_share_measured():
    """The curves panel's line passes through the measured share at what the disk holds
    (its dot), and one GiB further reads the report's +1G (to the panel's interpolation
    between the curve's points)."""
    import numpy as np
    from vmdisktouch.adapters.pictures.host_render import DiskBand, _hit_at, anchored
    from vmdisktouch.report import reads_from_memory
    sizes = [MiB << k for k in range(13)]                       # 1M .. 4G
    curve = [[s, min(0.84, 0.2 + 0.1 * np.log2(s / MiB) / 2)] for s in sizes]
    held = 256 * MiB
    at_held, then = _hit_at(curve, held), _hit_at(curve, held + (1 << 30))
    gain = {"pages_read_per_second": 1000.0, "cache_hit_ratio": 0.91,
            "next_gib": {"more_reads_per_second": round((then - at_held) * 1000, 1)}}
    fm = reads_from_memory(gain)
    d = DiskBand("/img/a.raw", held, np.zeros(4), np.zeros(4, bool), curve=curve,
                 from_memory=fm)
    drawn = anchored(d)
    assert abs(_hit_at(drawn, held) - 0.91) < 1e-9
    assert abs(_hit_at(drawn, held + (1 << 30)) - fm["plus_gib"]) < 0.01
    assert anchored(DiskBand("/img/b.raw", held, np.zeros(4), np.zeros(4, bool),
                             curve=curve)) == [tuple(p) for p in curve]
