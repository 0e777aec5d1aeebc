"""``vmdisktouch status`` against real daemons: one per disk and one serving several, live
and then killed (stale); and against a status directory holding every kind of bad file
(issue 31; one row each in ``test_faults_status.py``)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

import pytest

from tests.pagecache import data_image
from tools.daemon_proc import ROOT, DaemonProc, env_without_systemd

MiB = 1 << 20


def status_cmd(*argv):
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "status", *argv],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_status_lists_live_daemons_and_says_stale_once_one_is_gone(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    one, a, b = (data_image(tmp_path / f"{n}.raw", 16 * MiB) for n in ("one", "a", "b"))
    env = env_without_systemd()
    single = DaemonProc(run, one, "--uri", "", max_hold="8M", interval=1.0,
                        status="one.json", log="../one.log", env=env)
    host = DaemonProc(run, [a, b], "--uri", "", max_hold="8M", interval=1.0,
                      status="host.json", log="../host.log", env=env)
    try:
        single.wait_status(lambda s: s["cycle"] >= 1, "the single daemon's first cycle")
        host.wait_status(lambda s: s["host"]["cycle"] >= 1, "the host daemon's first cycle")
        r = status_cmd("--dir", str(run))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert len(lines) == 3 and not any("STALE" in x for x in lines), r.stdout
        by_path = {x.split(":")[0]: x for x in lines}
        assert set(by_path) == {one, a, b}
        assert f"pid {single.pid}" in by_path[one] and f"pid {host.pid}" in by_path[a]
        assert "held 0/8M" in by_path[one] and "no evidence of use yet" in by_path[one]

        # one disk, named another way; --json
        r = status_cmd("--dir", str(run), "--json",
                       os.path.join(os.path.dirname(a), ".", os.path.basename(a)))
        [entry] = json.loads(r.stdout)
        assert entry["path"] == a and entry["pid"] == host.pid and entry["stale"] is False
        assert entry["budget_bytes"] == 8 * MiB and entry["file"] == str(run / "host.json")

        single.kill()                                   # SIGKILL: its status file stays
        r = status_cmd("--dir", str(run), one)
        assert r.returncode == 0 and r.stdout.rstrip().endswith("STALE"), r.stdout
        r = status_cmd("--dir", str(run), str(tmp_path / "nothing.raw"))
        assert r.returncode == 66 and "no status file" in r.stderr
        assert len(r.stderr.splitlines()) == 1
    finally:
        single.stop()
        assert host.stop() == 0


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
        f.truncate(65 * MiB)                            # sparse: past the 64 MiB cap
    (run / "text.json").write_text("not json")
    (run / "utf8.json").write_bytes(b'{"path": "\xff"}')
    (run / "deep.json").write_text("{\"a\": " * 50_000)
    (run / "list.json").write_text("[1, 2]")
    (run / "value.json").write_text(json.dumps(disk(one, held_bytes=-1)))
    bad = {"fifo": "unreadable: a FIFO", "dir": "unreadable: a directory",
           "link": "unreadable: a symbolic link", "big": "unreadable: larger than 64M",
           "text": "malformed: not JSON", "utf8": "malformed: not JSON",
           "deep": "malformed: JSON nested too deep",
           "list": "malformed: the document is not a JSON object",
           "value": "malformed: held_bytes is not a byte count"}

    r = status_cmd("--dir", str(run))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 5 + len(bad), r.stdout
    for name, why in bad.items():
        assert f"{run}/{name}.json: {why}" in r.stdout, (name, r.stdout)
    for path in (one, a, b):
        assert sum(x.startswith(f"{path}: held 1M/8M in 1 regions") for x in lines) == 1
    assert "/img/a\\x00b: held" in r.stdout and "\x1b" not in r.stdout
    assert "/gone.img: FAILED: deleted\\x1b[1m (pid" in r.stdout
    assert not any("STALE" in x for x in lines if "unreadable" not in x and "malformed" not in x)

    entries = json.loads(status_cmd("--dir", str(run), "--json").stdout,
                         parse_constant=lambda c: pytest.fail(f"--json printed {c}"))
    assert len(entries) == 5 + len(bad)
    assert all(e["stale"] and set(e) == {"file", "error", "stale"}
               for e in entries if "path" not in e)

    r = status_cmd("--dir", str(run), a)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1 and "pid" in r.stdout, r
    r = status_cmd("--dir", str(run), str(tmp_path / "nothing.raw"))
    assert r.returncode == 66 and f"({len(bad)} unreadable or malformed" in r.stderr
    r = status_cmd("--dir", str(tmp_path / "no\x1b[2Jdir"))
    assert r.returncode == 0 and r.stdout == f"no status files in {tmp_path}/no\\x1b[2Jdir\n"


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
    keys = key_paths(st) | {k for k in key_paths(hs) if not k.startswith("disks")}
    missing = sorted(k for k in keys
                     if f"`{k}`" not in doc and f"`{k}[]." not in doc)
    assert st["charges"]["available"] and st["regions"]
    assert not missing, f"docs/status.md does not describe: {missing}"
