"""``vmdisktouch status`` against real daemons: one per disk and one serving several, live
and then killed (stale); and against a status directory holding every kind of bad file
(issue 31; one row each in ``test_faults_status.py``)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from tests.support.pagecache import data_image
from tests.support.daemon_proc import ROOT, DaemonProc, env_without_systemd

MiB = 1 << 20
UNREAD = r"(?:no evidence of use yet|nothing is above the threshold \(.*\))"  # a disk not read


def status_cmd(*argv):
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "status", *argv],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_status_lists_live_daemons_and_says_stale_once_one_is_gone(tmp_path):
    """A one-disk daemon and a host daemon of two real images, one of them read: the host
    line, one line per disk held of its share (the read one's share leaves the other less
    than the budget), ``--json`` with the host's keys; exit 0 while a daemon is live, 3
    once its file is stale, 66 for a PATH no file serves."""
    run = tmp_path / "run"
    run.mkdir()
    one, a, b = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in ("one", "a", "b"))
    env = env_without_systemd()
    single = DaemonProc(run, one, "--uri", "", max_hold="8M", interval=1.0,
                        status="one.json", log="../one.log", env=env)
    host = DaemonProc(run, [a, b], "--uri", "", "--min-free", "0", max_hold="8M",
                      interval=1.0, status="host.json", log="../host.log", env=env)
    try:
        single.wait_status(lambda s: s["cycle"] >= 1, "the single daemon's first cycle")
        host.wait_status(lambda s: s["host"]["held_bytes"] > 0, "a hold of the host's disk a",
                         drive=lambda: open(a, "rb").read(4 * MiB))
        r = status_cmd("--dir", str(run))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == 4 and not any("STALE" in x for x in lines), r.stdout
        head, line_a, line_b, line_one = lines
        assert re.fullmatch(rf"host \(pid {host.pid}, v[^)]+\): held [1-9][^ ]* of 8M budget, "
                            r"[^ ]+ above the floor, 2 disks served, 0 failed, cycle \d+, "
                            r"\d+ s ago, LIVE(, reads \d+ % from memory(, \+1G -> \d+ % of "
                            r"reads: the next GiB would do most for .+ reads/s\))?)?",
                            head), head
        assert line_a.startswith(f"  {a}: held ") and not line_a.startswith(f"  {a}: held 0/")
        share_b = re.match(rf"  {re.escape(b)}: held 0/([^ ]+) ", line_b)
        assert share_b and share_b[1] != "8M", line_b       # a's hold is not b's to take
        assert re.search(rf" \({UNREAD}\)$", line_b), line_b     # its not_held_reason
        assert re.match(rf"{re.escape(one)}: held 0/8M in 0 regions \({UNREAD}\), ", line_one)
        assert f"pid {single.pid}" in line_one and line_one.endswith(" LIVE"), line_one

        # one disk, named another way; --json: the host's file, with its keys, cut to it
        r = status_cmd("--dir", str(run), "--json",
                       os.path.join(os.path.dirname(a), ".", os.path.basename(a)))
        [doc] = json.loads(r.stdout)
        assert r.returncode == 0 and doc["file"] == str(run / "host.json")
        assert doc["stale"] is False and doc["host"]["pid"] == host.pid
        assert doc["host"]["budget_bytes"] == 8 * MiB and doc["host"]["min_free_bytes"] == 0
        [line] = doc["host"]["disks"]
        [entry] = doc["disks"]
        assert line["path"] == entry["path"] == a and entry["host_budget_bytes"] == 8 * MiB
        assert 0 < entry["budget_bytes"] <= 8 * MiB and line["domain"] is None

        single.kill()                                   # SIGKILL: its status file stays
        r = status_cmd("--dir", str(run), one)
        assert r.returncode == 3 and r.stdout.rstrip().endswith("STALE"), r.stdout
        assert status_cmd("--dir", str(run)).returncode == 0      # the host is live
        r = status_cmd("--dir", str(run), str(tmp_path / "nothing.raw"))
        assert r.returncode == 66 and "no status file" in r.stderr
        assert len(r.stderr.splitlines()) == 1
    finally:
        single.stop()
        assert host.stop() == 0
    r = status_cmd("--dir", str(run))
    assert r.returncode == 3 and "LIVE" not in r.stdout, r.stdout


def test_every_valid_entry_is_shown_beside_every_kind_of_bad_file(tmp_path):
    """Valid files (one disk; a host of two with a failed disk) beside a FIFO, a directory,
    a symlink, a sparse file past the size cap, bad JSON, bad UTF-8, deep nesting, a list,
    a bad value: each bad file one line, exit 0, no hang; PATH still finds its entry (a
    NUL in another entry's path included); every string printed is escaped."""
    run = tmp_path / "run"
    run.mkdir()
    one, a, b = (str(tmp_path / f"{n}.raw") for n in ("one", "a", "b"))

    def disk(path, **over):
        return {"path": path, "pid": os.getpid(), "version": "0-test", "interval_seconds": 1.0,
                "time": time.time(), "cycle": 2, "cycle_seconds": 0.01, "budget_bytes": 8 * MiB,
                "held_bytes": MiB, "regions": [[0, MiB]], "access_source": "mincore", **over}

    head = {k: v for k, v in disk("").items() if k != "path" and k != "regions"}
    (run / "one.json").write_text(json.dumps(disk(one)))
    (run / "host.json").write_text(json.dumps({
        "host": {**head, "disks": [{"path": a}, {"path": b}],
                 "failed": [{"path": "/gone.img", "error": "deleted\x1b[1m"}]},
        "disks": [disk(a), disk(b)]}))
    (run / "nul.json").write_text(json.dumps(disk("/img/a\0b")))
    os.mkfifo(run / "fifo.json")
    (run / "dir.json").mkdir()
    (run / "link.json").symlink_to(run / "one.json")
    with open(run / "big.json", "wb") as f:
        f.truncate(65 * MiB)                            # sparse: past the 4 MiB cap
    (run / "text.json").write_text("not json")
    (run / "utf8.json").write_bytes(b'{"path": "\xff"}')
    (run / "deep.json").write_text("{\"a\": " * 50_000)
    (run / "list.json").write_text("[1, 2]")
    (run / "value.json").write_text(json.dumps(disk(one, held_bytes=-1)))
    bad = {"fifo": "unreadable: a FIFO", "dir": "unreadable: a directory",
           "link": "unreadable: a symbolic link", "big": "unreadable: larger than 4M",
           "text": "malformed: not JSON", "utf8": "malformed: not JSON",
           "deep": "malformed: JSON nested too deep",
           "list": "malformed: the document is not a JSON object",
           "value": "malformed: held_bytes is not a byte count"}

    r = status_cmd("--dir", str(run))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 6 + len(bad), r.stdout        # one, nul; host: its line, a, b, failed
    for name, why in bad.items():
        assert f"{run}/{name}.json: {why}" in r.stdout, (name, r.stdout)
    for path in (one, a, b):
        assert sum(x.lstrip().startswith(f"{path}: held 1M/8M in 1 region") for x in lines) == 1
    assert sum(x.startswith(f"host (pid {os.getpid()}, v0-test): held 1M of 8M budget, "
                            "2 disks served, 1 failed") for x in lines) == 1, r.stdout
    assert "/img/a\\x00b: held" in r.stdout and "\x1b" not in r.stdout
    assert "  /gone.img: FAILED: deleted\\x1b[1m" in lines
    assert not any("STALE" in x for x in lines if "unreadable" not in x and "malformed" not in x)

    entries = json.loads(status_cmd("--dir", str(run), "--json").stdout,
                         parse_constant=lambda c: pytest.fail(f"--json printed {c}"))
    assert len(entries) == 3 + len(bad)                # one per file
    assert all(e["stale"] and set(e) == {"file", "error", "stale"}
               for e in entries if "path" not in e and "host" not in e)
    [h] = [e for e in entries if "host" in e]
    assert h["host"]["failed"] == [{"path": "/gone.img", "error": "deleted\x1b[1m"}]

    r = status_cmd("--dir", str(run), a)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 2 and "pid" in r.stdout, r
    r = status_cmd("--dir", str(run), str(tmp_path / "nothing.raw"))
    assert r.returncode == 66 and f"({len(bad)} unreadable or malformed" in r.stderr
    r = status_cmd("--dir", str(tmp_path / "no\x1b[2Jdir"))
    assert r.returncode == 66 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr == f"vmdisktouch: {tmp_path}/no\\x1b[2Jdir: no such directory\n"


def key_paths(obj, prefix=""):
    """Every key of a status object, as docs/status.md names them (``a.b``, ``a[].b``)."""
    out = set()
    for k, v in obj.items():
        p = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= key_paths(v, p + ".")
        elif isinstance(v, list) and v and isinstance(v[0], dict):
            out |= key_paths(v[0], p + "[].")
        else:
            out.add(p)          # a value (an empty list of objects: its own name)
    return out


def test_every_key_of_the_status_is_documented(tmp_path):
    """docs/status.md names every key a live daemon writes (one disk, and a host)."""
    doc = (pathlib.Path(ROOT) / "docs" / "status.md").read_text()
    one, a, b = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in ("one", "a", "b"))
    env = env_without_systemd()
    single = DaemonProc(tmp_path, one, "--uri", "", "--min-free", "0", max_hold="8M",
                        interval=1.0, status="one.json", log="one.log", env=env)
    host = DaemonProc(tmp_path, [a, b], "--uri", "", "--min-free", "0", max_hold="8M",
                      interval=1.0, status="host.json", log="host.log", env=env)
    try:
        st = single.wait_status(lambda s: s["held_bytes"] > 0, "a hold", timeout=30,
                                drive=lambda: open(one, "rb").read(8 * MiB))
        hs = host.wait_status(lambda s: s["host"]["cycle"] >= 2, "two host cycles")
    finally:
        single.stop()
        host.stop()
    # one shape: a disk's keys (docs/status.md, "A disk") are those of each ``disks[]``
    keys = {k[len("disks[]."):] if k.startswith("disks[].") else k
            for k in key_paths(st) | key_paths(hs)}
    missing = sorted(k for k in keys
                     if f"`{k}`" not in doc and f"`{k}[]." not in doc)
    assert st["charges"]["available"] and st["regions"]
    assert not missing, f"docs/status.md does not describe: {missing}"
