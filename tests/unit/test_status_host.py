"""``vmdisktouch status`` on the status files of issue 32: the host line, each disk's share
and reason, ``--json`` keeping every key, the exit codes of ``systemctl is-active``, and
the checks of the new keys. Status files are made in a temporary directory, live (this
test's pid, a fresh ``time``) unless a test makes them stale; the command runs in-process."""

from __future__ import annotations

import json
import os
import time

import pytest

from vmdisktouch.commands import cli
from vmdisktouch.sizes import format_size

MiB = 1 << 20


def disk(path, **over) -> dict:
    """One disk's status as the daemon of #32 writes it (the keys the command reads)."""
    d = {"path": path, "domain": None, "target": None, "pid": os.getpid(),
         "version": "0-test", "interval_seconds": 1.0, "cycle": 3, "cycle_seconds": 0.01,
         "size_bytes": 64 * MiB, "block_size": MiB, "budget_bytes": 8 * MiB,
         "host_budget_bytes": 8 * MiB, "wanted_bytes": 0, "held_bytes": 0, "regions": [],
         "rewritten_blocks": 0, "mem_available_bytes": 900 * MiB,
         "min_free_bytes": 100 * MiB, "not_held_reason": "no evidence of use yet",
         "limited_by": "no_evidence", "access_source": "trace", "events_lost": 0,
         "time": time.time()}
    d.update(over)
    return d


def line_of(d: dict) -> dict:
    """``host.disks[]`` for the full status ``d``."""
    return {"path": d["path"], "domain": d["domain"], "target": d["target"],
            "held_bytes": d["held_bytes"], "share_bytes": d["budget_bytes"],
            "wanted_bytes": d["wanted_bytes"], "limited_by": d["limited_by"],
            "not_held_reason": d["not_held_reason"], "heat": 12.5, "cap_bytes": None,
            "weight": 1.0}


def host(disks: list[dict], **over) -> dict:
    head = {"pid": os.getpid(), "version": "0-test", "interval_seconds": 1.0,
            "time": time.time(), "budget_bytes": 8 * MiB,
            "held_bytes": sum(d["held_bytes"] for d in disks),
            "mem_available_bytes": 900 * MiB, "min_free_bytes": 100 * MiB,
            "above_floor_bytes": 800 * MiB, "cycle": 42, "cycle_seconds": 0.02,
            "disks": [line_of(d) for d in disks], "failed": [],
            "skipped": [{"domain": "vm3", "target": "hdc", "reason": "cache=none"}]}
    head.update(over)
    return {"host": head, "disks": disks}


A = disk("/img/a.img", domain="vm1", target="vda", budget_bytes=5 * MiB, held_bytes=5 * MiB,
         wanted_bytes=5 * MiB, regions=[[0, 5 * MiB]], not_held_reason=None, limited_by=None)
B = disk("/img/b.img", domain="vm\x1b[2J2", target="vdb", budget_bytes=3 * MiB,
         held_bytes=3 * MiB, wanted_bytes=6 * MiB, regions=[[0, MiB], [4 * MiB, 2 * MiB]],
         not_held_reason="the host budget went to hotter disks (most to vm1/vda)",
         limited_by="budget")


def write(directory, name: str, doc) -> None:
    (directory / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))


def status(capsys, directory, *argv) -> tuple[int, str, str]:
    rc = cli.main(["status", "--dir", str(directory), *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_a_host_file_is_a_host_line_then_one_line_per_disk_held_of_its_share(tmp_path, capsys):
    write(tmp_path, "host.json", host([A, B], failed=[{"path": "/img/gone.img",
                                                        "error": "deleted"}]))
    rc, out, err = status(capsys, tmp_path)
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert lines[0] == (f"host (pid {os.getpid()}, v0-test): held 8M of 8M budget, "
                        "800M above the floor, 2 disks served, 1 skipped, 1 failed, "
                        "cycle 42, 0 s ago, LIVE")
    assert lines[1:] == [
        "  vm1/vda (/img/a.img): held 5M/5M in 1 region",
        "  vm\\x1b[2J2/vdb (/img/b.img): held 3M/3M in 2 regions, wants 6M (the host budget "
        "went to hotter disks (most to vm1/vda))",
        "  /img/gone.img: FAILED: deleted",
        "  vm3/hdc: skipped: cache=none"]


def test_a_disk_line_shows_its_share_not_the_whole_budget(tmp_path, capsys):
    """The share comes from ``host.disks[].share_bytes`` (the full status's
    ``budget_bytes`` only when the line has none); ``host_budget_bytes`` is not it."""
    b = {**B, "budget_bytes": 2 * MiB, "held_bytes": MiB}
    doc = host([b])
    doc["host"]["disks"][0]["share_bytes"] = 3 * MiB
    write(tmp_path, "host.json", doc)
    write(tmp_path, "one.json", disk("/img/one.img", domain="vm4", target="sda",
                                     budget_bytes=3 * MiB, held_bytes=2 * MiB,
                                     wanted_bytes=2 * MiB, regions=[[0, 2 * MiB]],
                                     not_held_reason=None, limited_by=None))
    rc, out, _ = status(capsys, tmp_path)
    lines = out.splitlines()
    assert rc == 0 and lines[1].startswith("  vm\\x1b[2J2/vdb (/img/b.img): held 1M/3M in 2 "), out
    assert lines[2] == "  vm3/hdc: skipped: cache=none", lines
    assert lines[3].startswith("vm4/sda (/img/one.img): held 2M/3M in 1 region, source trace, "
                               f"cycle 3, pid {os.getpid()}, v0-test, "), lines
    assert lines[3].endswith(" LIVE") and len(lines) == 4, lines


def test_a_host_file_of_the_old_shape_is_still_shown(tmp_path, capsys):
    """No ``share_bytes`` nor ``above_floor_bytes`` (a daemon before #32): the share is the
    full status's ``budget_bytes``, and the floor is left out."""
    old = host([disk("/img/a.img", held_bytes=MiB, regions=[[0, MiB]]),
                disk("/img/b.img", held_bytes=0, regions=[])])
    for k in ("mem_available_bytes", "min_free_bytes", "above_floor_bytes", "skipped"):
        del old["host"][k]
    old["host"]["disks"] = [{"path": "/img/a.img", "held_bytes": MiB},
                            {"path": "/img/b.img", "held_bytes": 0}]
    write(tmp_path, "host.json", old)
    rc, out, _ = status(capsys, tmp_path)
    assert rc == 0 and out.splitlines() == [
        f"host (pid {os.getpid()}, v0-test): held 1M of 8M budget, 2 disks served, 0 failed, "
        "cycle 42, 0 s ago, LIVE",
        "  /img/a.img: held 1M/8M in 1 region (no evidence of use yet)",
        "  /img/b.img: held 0/8M in 0 regions (no evidence of use yet)"]


def test_a_host_of_one_disk_is_shown_as_that_disk_s_line(tmp_path, capsys):
    """One shape for 1..N disks; one disk, nothing skipped or failed, is one line."""
    one = host([disk("/img/a.img", held_bytes=MiB, regions=[[0, MiB]])])
    del one["host"]["skipped"]                       # not a host service following libvirt
    write(tmp_path, "one.json", one)
    rc, out, _ = status(capsys, tmp_path)
    assert rc == 0 and len(out.splitlines()) == 1, out
    assert out.startswith("/img/a.img: held 1M/8M in 1 region (no evidence of use yet), "
                          f"source trace, cycle 3, pid {os.getpid()}, v0-test, "), out


def test_json_keeps_every_key_of_every_file_the_host_s_included(tmp_path, capsys):
    doc = host([A, B])
    write(tmp_path, "host.json", doc)
    write(tmp_path, "one.json", disk("/img/one.img"))
    write(tmp_path, "bad.json", "{")
    rc, out, _ = status(capsys, tmp_path, "--json")
    bad, got, one = json.loads(out)
    assert rc == 0
    assert bad == {"file": str(tmp_path / "bad.json"), "stale": True,
                   "error": bad["error"]} and bad["error"].startswith("malformed")
    assert got.pop("file") == str(tmp_path / "host.json") and got.pop("stale") is False
    assert isinstance(got.pop("age_seconds"), float)
    assert got == json.loads(json.dumps(doc))              # every key, as read
    assert got["host"]["skipped"] and got["host"]["above_floor_bytes"] == 800 * MiB
    assert one["path"] == "/img/one.img" and one["limited_by"] == "no_evidence"

    # PATH: that file only, its lists of disks cut to PATH's; every other key kept
    rc, out, _ = status(capsys, tmp_path, "--json", "/img/./b.img")
    [got] = json.loads(out)
    assert [d["path"] for d in got["disks"]] == ["/img/b.img"] == \
        [d["path"] for d in got["host"]["disks"]]
    assert got["host"]["budget_bytes"] == 8 * MiB and got["host"]["skipped"]
    rc, out, _ = status(capsys, tmp_path, "/img/b.img")
    host_line, b_line = out.splitlines()
    assert rc == 0 and host_line.startswith("host (") and b_line.startswith("  vm\\x1b[2J2/vdb")


@pytest.mark.parametrize("files, code", [
    (lambda: {"host.json": host([A, B])}, 0),
    (lambda: {"host.json": host([A, B], time=time.time() - 3600),
              "one.json": disk("/img/one.img")}, 0),
    (lambda: {"host.json": host([A, B], time=time.time() - 3600)}, 3),
    (lambda: {"host.json": host([A], time=time.time() - 3600),
              "one.json": disk("/img/one.img", time=time.time() - 3600), "bad.json": "{"}, 3),
    (lambda: {"bad.json": "[]"}, 3),
    (lambda: {}, 3),
], ids=["live", "one-live-one-stale", "stale", "all-stale-or-bad", "only-bad", "none"])
def test_the_exit_status_is_that_of_systemctl_is_active(tmp_path, capsys, files, code):
    for name, doc in files().items():      # made now: a file made at collection is stale
        write(tmp_path, name, doc)
    assert status(capsys, tmp_path)[0] == code
    assert status(capsys, tmp_path, "--json")[0] == code


def test_with_path_only_the_files_serving_it_count_for_the_exit_status(tmp_path, capsys):
    write(tmp_path, "host.json", host([A, B]))
    write(tmp_path, "one.json", disk("/img/one.img", time=time.time() - 3600))
    assert status(capsys, tmp_path, "/img/a.img")[0] == 0
    rc, out, _ = status(capsys, tmp_path, "/img/one.img")
    assert rc == 3 and out.rstrip().endswith("STALE"), out


def test_a_missing_directory_is_one_line_and_exit_66(tmp_path, capsys):
    rc, out, err = status(capsys, tmp_path / "no\x1b[2Jdir")
    assert rc == 66 and out == ""
    assert err == f"vmdisktouch: {tmp_path}/no\\x1b[2Jdir: no such directory\n"


@pytest.mark.parametrize("where, over, key", [
    ("disk", {"limited_by": "bogus"}, "limited_by"),
    ("disk", {"domain": 5}, "domain"),
    ("disk", {"target": ["vda"]}, "target"),
    ("disk", {"wanted_bytes": -1}, "wanted_bytes"),
    ("disk", {"host_budget_bytes": None}, "host_budget_bytes"),
    ("host", {"above_floor_bytes": "310M"}, "host.above_floor_bytes"),
    ("host", {"mem_available_bytes": 1.5}, "host.mem_available_bytes"),
    ("host", {"min_free_bytes": None}, "host.min_free_bytes"),
    ("host", {"skipped": {"vm3": "cache=none"}}, "host.skipped"),
    ("host", {"skipped": [{"domain": 3, "target": "hdc", "reason": "x"}]},
     "host.skipped[0].domain"),
    ("line", {"share_bytes": "3M"}, "host.disks[0].share_bytes"),
    ("line", {"limited_by": "hot"}, "host.disks[0].limited_by"),
    ("line", {"weight": 0}, "host.disks[0].weight"),
    ("line", {"cap_bytes": -5}, "host.disks[0].cap_bytes"),
    ("line", {"domain": {"name": "vm1"}}, "host.disks[0].domain"),
])
def test_a_new_key_of_the_wrong_kind_is_a_malformed_file_of_its_own(tmp_path, capsys,
                                                                     where, over, key):
    if where == "disk":
        doc = disk("/img/x.img", **over)
    else:
        doc = host([A])
        (doc["host"] if where == "host" else doc["host"]["disks"][0]).update(over)
    write(tmp_path, "bad.json", doc)
    write(tmp_path, "good.json", disk("/img/one.img"))
    rc, out, err = status(capsys, tmp_path)
    lines = out.splitlines()
    assert rc == 0 and err == "" and len(lines) == 2, out
    assert lines[0].startswith(f"{tmp_path}/bad.json: malformed: {key} is not "), lines
    assert lines[1].startswith("/img/one.img: held 0/8M in 0 regions"), lines


def test_null_where_the_daemon_writes_null_is_accepted(tmp_path, capsys):
    """Before the first selection a disk's share and wants are null; a host with no disk
    has no MemAvailable."""
    d = disk("/img/a.img", wanted_bytes=None, not_held_reason=None, limited_by=None)
    doc = host([d], mem_available_bytes=None, above_floor_bytes=None)
    doc["host"]["disks"][0].update(share_bytes=None, wanted_bytes=None)
    write(tmp_path, "host.json", doc)
    rc, out, _ = status(capsys, tmp_path)
    assert rc == 0 and out.splitlines()[1] == "  /img/a.img: held 0/8M in 0 regions", out
    assert "above the floor" not in out


def test_no_default_directory_is_nothing_running(tmp_path, capsys, monkeypatch):
    """/run/vmdisktouch exists once a daemon ran since boot: before, nothing runs (3), as
    ``systemctl is-active`` says of a unit never started; a --dir given that is missing is
    an error (66)."""
    from vmdisktouch.commands import status as status_cmd
    missing = str(tmp_path / "run-vmdisktouch")
    monkeypatch.setattr(status_cmd, "STATUS_DIR", missing)
    monkeypatch.delenv("VMDISKTOUCH_RUNTIME_DIR", raising=False)    # (tests/conftest.py's)
    rc, out, err = status(capsys, missing)
    assert rc == 3 and "no daemon has run since boot" in out and err == ""
    rc, out, err = status(capsys, tmp_path / "elsewhere")
    assert rc == 66 and "no such directory" in err


def test_each_disk_says_what_memory_served_and_what_its_next_gib_would(tmp_path, capsys):
    """The gain of the trace source's disks (their ``gain``): the share of reads from
    memory, on held blocks, with the next GiB (the measured share plus the curve's
    increment: ``report.reads_from_memory``); the host line its share over every disk and
    names the disk whose next GiB adds the most reads a second, with the same figures; a
    young curve (``curve_seen`` false) says so instead of what it wants. A mincore disk
    (``gain`` null), or one whose curve has no read yet, says nothing of it; one with no
    measured share, no share."""
    def gain(hit, held, ratio, more, wants):
        return {"pages_read_per_second": 5000.0, "cache_hit_ratio": hit,
                "held_read_share": held, "held_reads_per_second": 900.0,
                "next_gib": {"bytes": 1024 * MiB, "hit_ratio": ratio,
                             "more_reads_per_second": more}, "wants_bytes": wants}
    curve = [[MiB, 0.1], [64 * MiB, 0.9]]
    read = {"reads": 12345}
    a = {**A, "curve": curve, "mrc": read, "gain": {**gain(0.84, 0.31, 0.5, 350.0, 400 * MiB),
                                                    "read_seconds_saved_per_second": 0.11},
         "miss_cost": {"seconds": 0.000122, "probes": 64}}
    b = {**B, "curve": curve, "mrc": read, "gain": gain(None, None, 0.5, 12.0, 0)}
    young = disk("/img/e.img", curve=curve, mrc=read,
                 gain={**gain(None, None, 0.5, 12.0, 0), "curve_seen": False})
    c = disk("/img/c.img", access_source="mincore", curve=None, gain=None)
    unread = disk("/img/d.img", curve=curve, mrc={"reads": 0}, gain=gain(None, None, 0, 0, 0))
    write(tmp_path, "host.json", host([a, b, c, unread, young]))
    rc, out, _ = status(capsys, tmp_path)
    lines = out.splitlines()
    assert lines[0].endswith(", reads 84 % from memory, +1G -> 91 % of reads: the next GiB "
                             "would do most for vm1/vda (/img/a.img) (+350 reads/s)")
    assert lines[1] == ("  vm1/vda (/img/a.img): held 5M/5M in 1 region; reads 84 % from "
                        "memory, 31 % on held blocks, a miss costs 122 µs, 0.11 s of reads "
                        "saved a second, +1G -> 91 % of reads, +350 reads/s, its curve "
                        "wants 400M")
    assert lines[2].endswith("(most to vm1/vda)); its curve wants 0")
    assert lines[3] == "  /img/c.img: held 0/8M in 0 regions (no evidence of use yet)"
    assert lines[4] == "  /img/d.img: held 0/8M in 0 regions (no evidence of use yet)"
    assert lines[5].endswith("; its curve is young: its heat decides how much")


def test_the_budget_advice_follows_the_host_line_and_the_disk_lines(tmp_path, capsys):
    """``budget_advice`` (core.advice): too small or too large is said after the host line
    and after a disk's line; right, a young curve (null) or a malformed value is not."""
    doc = host([A, B], budget_advice={"verdict": "too_small", "bytes": 3 * MiB})
    doc["host"]["disks"][0]["budget_advice"] = {"verdict": "right", "bytes": 0}
    doc["host"]["disks"][1]["budget_advice"] = {"verdict": "too_small", "bytes": 3 * MiB}
    write(tmp_path, "host.json", doc)
    rc, out, _ = status(capsys, tmp_path)
    lines = out.splitlines()
    assert rc == 0 and lines[0].endswith(", max_hold too small: 3M more would pay")
    assert "its share" not in lines[1]
    assert lines[2].endswith(", its share too small: 3M more would pay")
    doc = host([A, B], budget_advice={"verdict": "too_large", "bytes": "x"})
    doc["host"]["disks"][0]["budget_advice"] = "too_large"
    write(tmp_path, "host.json", doc)
    rc, out, _ = status(capsys, tmp_path)
    assert rc == 0 and "max_hold" not in out and "its share" not in out


# -- lost trace events: this cycle's, the total, and when (issue 45, part 3) -----------------

def test_lost_events_are_said_with_this_cycle_s_the_total_and_how_long_ago(tmp_path, capsys):
    """149130 events lost once, shown for ever with no time, read as a loss going on."""
    now = time.time()
    trace = {"lost": 0, "lost_at": now - 185, "lost_why": "the buffer overflowed"}
    old = disk("/img/a.img", held_bytes=MiB, regions=[[0, MiB]], events_lost=149130,
               trace=trace, time=now)
    new = disk("/img/b.img", held_bytes=MiB, regions=[[0, MiB]], events_lost=149142,
               trace={**trace, "lost": 12, "lost_at": now}, time=now)
    garbled = disk("/img/c.img", held_bytes=MiB, regions=[[0, MiB]], events_lost=7,
                   trace={"lost": "x", "lost_at": "yesterday"}, time=now)
    write(tmp_path, "host.json", host([old, new, garbled]))
    rc, out, _ = status(capsys, tmp_path)
    lines = out.splitlines()
    assert rc == 0
    assert lines[1].endswith(", 149130 events lost since start, the last 3 min ago"), lines
    assert lines[2].endswith(", 12 events lost in this cycle, 149142 since start"), lines
    assert lines[3].endswith(", 7 events lost since start"), lines


def test_each_skipped_disk_is_listed_with_its_reason(tmp_path, capsys):
    """Issue 45, part 3: not only "2 skipped": each one, with why (its code and reason)."""
    skipped = [{"domain": "vm3", "target": "hdc", "code": "read_only",
                "reason": "read-only cdrom: the host budget is for the disks guests work on"},
               {"domain": "test-1", "target": "vda", "code": "excluded",
                "reason": "excluded by [scope] exclude 'test-*'"}]
    write(tmp_path, "host.json", host([A], skipped=skipped))
    rc, out, err = status(capsys, tmp_path)
    assert rc == 0 and err == "", err
    lines = out.splitlines()
    assert ", 2 skipped, " in lines[0]
    assert lines[2:] == [
        "  test-1/vda: skipped (excluded): excluded by [scope] exclude 'test-*'",
        "  vm3/hdc: skipped (read_only): read-only cdrom: the host budget is for the disks "
        "guests work on"]


# -- a host of a hundred disks: the order, the limit, --top and --all -------------------------

def hundred(**over) -> list[dict]:
    """100 disks holding 1M..100M, written in a shuffled order (held i MiB: ``/img/dNNN``)."""
    order = list(range(1, 101))
    import random
    random.Random(7).shuffle(order)
    return [disk(f"/img/d{i:03}.img", held_bytes=i * MiB, wanted_bytes=i * MiB,
                 budget_bytes=i * MiB, regions=[[0, i * MiB]], not_held_reason=None,
                 limited_by=None, **over) for i in order]


def disk_lines(out: str) -> list[str]:
    return [x for x in out.splitlines()[1:] if x.startswith("  /img/")]


def held_of(lines: list[str]) -> list[int]:
    """The NNN of each ``/img/dNNN.img`` line (its held MiB)."""
    return [int(x.split("/img/d")[1][:3]) for x in lines]


def test_a_hundred_disks_show_the_twenty_holding_most_and_a_line_for_the_rest(tmp_path,
                                                                              capsys):
    write(tmp_path, "host.json", host(hundred(), budget_bytes=8192 * MiB))
    rc, out, err = status(capsys, tmp_path)
    lines = out.splitlines()
    assert rc == 0 and err == "", err
    assert lines[0].startswith("host (") and ", 100 disks served, 1 skipped, 0 failed" in lines[0]
    assert len(lines) == 1 + 20 + 1, lines
    assert held_of(lines[1:21]) == list(range(100, 80, -1))         # held, descending
    assert lines[1] == "  /img/d100.img: held 100M/100M in 1 region"
    # 1M + ... + 80M = 3240M (3.16 GiB) left out, and the one disk skipped (the skipped come last)
    assert lines[21] == "  ... and 80 more disks holding 3.2G, 1 more skipped; --all shows them"
    assert "skipped:" not in out


def test_top_n_shows_n_disk_lines_and_all_every_one(tmp_path, capsys):
    write(tmp_path, "host.json", host(hundred(), budget_bytes=8192 * MiB))
    rc, out, _ = status(capsys, tmp_path, "--top", "5")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 1 + 5 + 1, lines
    assert held_of(lines[1:6]) == [100, 99, 98, 97, 96]
    # 1M + ... + 95M = 4560M (4.45 GiB)
    assert lines[6] == "  ... and 95 more disks holding 4.5G, 1 more skipped; --all shows them"

    rc, out, _ = status(capsys, tmp_path, "--all")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 1 + 100 + 1, lines
    assert held_of(lines[1:101]) == list(range(100, 0, -1))
    assert lines[101] == "  vm3/hdc: skipped: cache=none" and "more" not in out

    # room for every disk served and some of the skipped: those that fit are shown
    rc, out, _ = status(capsys, tmp_path, "--top", "100")
    assert out.splitlines()[-1] == "  ... and 1 more skipped; --all shows them"
    rc, out, _ = status(capsys, tmp_path, "--top", "101")
    assert out.splitlines()[-1] == "  vm3/hdc: skipped: cache=none" and "more" not in out


def test_ties_of_held_go_by_what_is_wanted_then_by_name(tmp_path, capsys):
    same = dict(held_bytes=MiB, regions=[[0, MiB]], not_held_reason=None, limited_by=None)
    disks = [disk("/img/b.img", wanted_bytes=MiB, **same),
             disk("/img/z.img", wanted_bytes=4 * MiB, **same),
             disk("/img/a.img", wanted_bytes=MiB, **same),
             disk("/img/y.img", domain="vm0", target="vda", wanted_bytes=MiB, **same),
             disk("/img/big.img", held_bytes=2 * MiB, wanted_bytes=0, regions=[]),
             disk("/img/c.img", wanted_bytes=2 * MiB, **same)]
    write(tmp_path, "host.json", host(disks))
    rc, out, _ = status(capsys, tmp_path)
    names = [x.split(":")[0].strip() for x in out.splitlines()[1:7]]
    assert rc == 0 and names == ["/img/big.img", "/img/z.img", "/img/c.img", "/img/a.img",
                                 "/img/b.img", "vm0/vda (/img/y.img)"], out


def test_failed_disks_and_disks_with_an_error_are_never_left_out(tmp_path, capsys):
    """A failed disk (``host.failed``), and a disk whose holder met an error (a refused lock,
    a failed load), need the operator: shown whatever ``--top``, in their place in the
    order, and not counted among those left out."""
    disks = hundred()
    bad = [disk("/img/lock.img", limited_by="lock_limit", wanted_bytes=5 * MiB,
                not_held_reason="the kernel refused to lock more (ENOMEM)"),
           disk("/img/load.img", held_bytes=MiB, wanted_bytes=3 * MiB, regions=[[0, MiB]],
                limited_by="not_loaded",
                not_held_reason="2M targeted was not loaded (a lock or read error)")]
    failed = [{"path": f"/img/gone{i}.img", "error": "deleted"} for i in range(3)]
    write(tmp_path, "host.json", host(disks + bad, failed=failed, budget_bytes=8192 * MiB))
    for argv in ([], ["--top", "1"]):
        rc, out, _ = status(capsys, tmp_path, *argv)
        lines = out.splitlines()
        n = 20 if not argv else 1
        assert rc == 0 and len(lines) == 1 + n + 2 + 3 + 1, lines
        assert held_of(lines[1:1 + n]) == list(range(100, 100 - n, -1))
        assert lines[1 + n].startswith("  /img/load.img: held 1M/8M in 1 region, wants 3M (2M ")
        assert lines[2 + n].startswith("  /img/lock.img: held 0/8M in 0 regions, wants 5M (the "
                                       "kernel refused")
        assert lines[3 + n:6 + n] == [f"  /img/gone{i}.img: FAILED: deleted" for i in range(3)]
        left = 100 - n
        held = format_size(sum(range(1, left + 1)) * MiB)
        assert lines[-1] == (f"  ... and {left} more disks holding {held}, 1 more skipped; "
                             "--all shows them")


def test_json_and_path_are_not_cut_by_the_limit(tmp_path, capsys):
    write(tmp_path, "host.json", host(hundred(), budget_bytes=8192 * MiB))
    rc, out, _ = status(capsys, tmp_path, "--json", "--top", "5")
    [got] = json.loads(out)
    assert rc == 0 and len(got["disks"]) == 100 == len(got["host"]["disks"])
    rc, out, _ = status(capsys, tmp_path, "/img/d003.img")
    assert rc == 0 and out.splitlines()[1:] == ["  /img/d003.img: held 3M/3M in 1 region"], out


@pytest.mark.parametrize("argv, code, said", [
    (["--top", "0"], 78, "bad value '0' for --top: at least 1 disk line"),
    (["--top", "-3"], 78, "bad value '-3' for --top: at least 1 disk line"),
    (["--top", "x"], 78, "bad value 'x' for --top: not a whole number"),
    (["--top", "2.5"], 78, "bad value '2.5' for --top: not a whole number"),
    (["--top", ""], 78, "bad value '' for --top: not a whole number"),
    (["--top", "5", "--all"], 2, "argument --all: not allowed with argument --top"),
    (["--top"], 2, "argument --top: expected one argument"),
])
def test_a_bad_top_is_one_line_and_a_non_zero_exit(tmp_path, capsys, argv, code, said):
    write(tmp_path, "host.json", host(hundred()))
    try:
        rc, out, err = status(capsys, tmp_path, *argv)
    except SystemExit as exc:             # argparse's refusal (cli.Parser.error): exit 2
        rc, (out, err) = exc.code, capsys.readouterr()
    assert rc == code and out == "", out
    assert err.startswith("vmdisktouch: ") and said in err and err.count("\n") == 1, err
    assert "Traceback" not in err
