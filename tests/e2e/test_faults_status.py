"""Fault table, part 3: status files that are malformed, not files, or hold bad values.

Each row fills a temporary status directory with one valid, live status file
(its ``pid`` is this test's) and one bad one, runs the real ``vmdisktouch
status --dir DIR`` (and ``--json``) and checks that the bad file is one
sanitised line (or entry) of its own, that every valid entry is still shown,
and that the command exits 0, without a traceback, within the timeout. See
``tests/support/faultkit.py`` and ``docs/faults.md``.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.support.faultkit import MiB, Untouched, assert_clean, fault, rows_of, vmdt
from tests.support.pagecache import data_image

SHOWN = ("`vmdisktouch status` exits 0 and shows every valid entry; the bad file is one "
         "line of its own, never exit 70")


def disk(path, **over) -> dict:
    """One disk's status as a live daemon writes it (the keys the command shows)."""
    d = {"path": str(path), "pid": os.getpid(), "version": "0-test", "interval_seconds": 1.0,
         "cycle": 3, "cycle_seconds": 0.0123, "size_bytes": 32 * MiB, "block_size": MiB,
         "budget_bytes": 8 * MiB, "held_bytes": 4 * MiB, "resident_bytes": 4 * MiB,
         "regions": [[0, 4 * MiB]], "rewritten_blocks": 0, "access_source": "mincore",
         "events_lost": 0, "not_held_reason": None, "time": time.time()}
    d.update(over)
    return d


def host(disks: list[dict], **over) -> dict:
    """A host daemon's status serving ``disks``."""
    head = {"pid": os.getpid(), "version": "0-test", "interval_seconds": 1.0,
            "time": time.time(), "budget_bytes": 8 * MiB, "held_bytes": 4 * MiB, "cycle": 3,
            "cycle_seconds": 0.02, "failed": [],
            "disks": [{"path": d["path"], "held_bytes": 4 * MiB, "heat": 1.0,
                       "cap_bytes": None, "weight": 1.0} for d in disks]}
    head.update(over)
    return {"host": head, "disks": disks}


def status(directory, *argv):
    r = vmdt("status", "--dir", directory, *argv, timeout=20)
    assert_clean(r.stderr)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    return r


def strict_json(text: str):
    """The text as JSON, refusing NaN and Infinity (not JSON, and what jq refuses)."""
    def refuse(c):
        raise AssertionError(f"--json printed {c}, which is not JSON")
    return json.loads(text, parse_constant=refuse)


def with_one_bad(tmp_path, image, bad, name: str = "bad.json"):
    """A status directory: ``good.json`` (a live disk, ``image``) and ``name`` (``bad``:
    text, bytes, or a callable making it). Returns the directory and the bad path."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "good.json").write_text(json.dumps(disk(image)))
    path = run / name
    if callable(bad):
        bad(path)
    else:
        (path.write_bytes if isinstance(bad, bytes) else path.write_text)(bad)
    return run, path


def shown_apart(tmp_path, image, bad, needle: str, name: str = "bad.json") -> list[str]:
    """The bad file is one line ``FILE: NEEDLE...`` and the valid entry is shown, live;
    ``--json`` is strict JSON with both, the bad one stale. Returns the lines."""
    run, path = with_one_bad(tmp_path, image, bad, name)
    lines = status(run).stdout.splitlines()
    assert len(lines) == 2, lines
    assert "\x1b" not in "".join(lines), lines
    good = [x for x in lines if x.startswith(f"{image}: held 4M/8M in 1 region,")]
    assert len(good) == 1 and "STALE" not in good[0], lines
    [other] = [x for x in lines if x not in good]
    assert other.startswith(f"{run}/") and f": {needle}" in other, other
    entries = strict_json(status(run, "--json").stdout)
    assert len(entries) == 2, entries
    [ok] = [e for e in entries if e.get("path") == image]
    assert ok["stale"] is False and ok["pid"] == os.getpid() and ok["held_bytes"] == 4 * MiB
    [bad_entry] = [e for e in entries if e is not ok]
    assert bad_entry["file"] == str(path) and bad_entry["stale"] is True, bad_entry
    assert bad_entry["error"].startswith(needle) and "path" not in bad_entry, bad_entry
    return lines


# -- broke 4: a malformed file crashed the command and hid every valid entry ---------------

OTHER = "/var/lib/libvirt/images/other.img"
MALFORMED = [
    ("host-not-object", '`{"host": 5}`', '{"host": 5}', "host"),
    ("time-string", "`time` a string", json.dumps(disk(OTHER, time="yesterday")), "time"),
    ("held-string", "a host's disk with `held_bytes` a string",
     json.dumps(host([disk(OTHER, held_bytes="4M")])), "held_bytes"),
    ("cycle-seconds-string", "`cycle_seconds` a string",
     json.dumps(disk(OTHER, cycle_seconds="0.1")), "cycle_seconds"),
    ("disks-not-objects", "a host status with `disks: [5]`", json.dumps(host([]) | {"disks": [5]}),
     "disks"),
    ("regions-number", "`regions: 5`", json.dumps(disk(OTHER, regions=5)), "regions"),
    ("pid-huge", "`pid` 2^70 (too large for a C long)", json.dumps(disk(OTHER, pid=2 ** 70)),
     "pid"),
    ("deep-nesting", "JSON nested 100,000 deep", "[" * 100_000 + "]" * 100_000, "JSON"),
]
for _id, _what, _text, _key in MALFORMED:
    fault(f"status-{_id}", f"a status file with {_what}, beside a valid one", SHOWN,
          f"exit 0; the valid entry shown; `FILE: malformed: ...` naming `{_key}`; "
          "`--json`: an entry with `file`, `error`, `stale: true`", "31 broke 4")(
        lambda tmp_path, image, text=_text, key=_key: _malformed(tmp_path, image, text, key))


def _malformed(tmp_path, image, text: str, key: str) -> None:
    lines = shown_apart(tmp_path, image, text, "malformed")
    [line] = [x for x in lines if not x.startswith(image)]
    assert key in line, line


@fault("status-number-not-finite", "a status file with `resident_bytes: NaN` (Python's JSON "
       "extension), beside a valid one", SHOWN + "; `--json` stays JSON",
       "exit 0; `FILE: malformed: ... not a finite number`; `--json` parses without NaN",
       "31 weak 7")
def _(tmp_path, image):
    lines = shown_apart(tmp_path, image, json.dumps(disk(OTHER, resident_bytes=float("nan"))),
                        "malformed")
    assert any("not a finite number" in x for x in lines), lines


@fault("status-path-nul", "`status PATH` beside a status whose `path` holds a NUL "
       "(`\"\\u0000\"`, valid JSON)", "PATH still finds its entry; never exit 70",
       "exit 0; the one entry serving PATH shown", "31 broke 4")
def _(tmp_path, image):
    run, _ = with_one_bad(tmp_path, image, json.dumps(disk("/img/a\0b")))
    lines = status(run, image).stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{image}: held 4M/8M"), lines
    assert any(x.startswith("/img/a\\x00b: held") for x in status(run).stdout.splitlines())


# -- broke 5: a FIFO named *.json hung the command -----------------------------------------

@fault("status-fifo", "a FIFO named `x.json` in the status directory (no writer)",
       SHOWN + "; no hang", "exit 0 within the timeout; `FILE: unreadable: a FIFO`",
       "31 broke 5")
def _(tmp_path, image):
    lines = shown_apart(tmp_path, image, os.mkfifo, "unreadable", name="x.json")
    assert any(x.endswith("x.json: unreadable: a FIFO, not a regular file") for x in lines)


@fault("status-symlink-dev-zero", "`z.json`, a symlink to `/dev/zero`, in the status directory",
       SHOWN + "; the link is not followed (no unbounded read)",
       "exit 0; `FILE: unreadable: a symbolic link`", "31 broke 5")
def _(tmp_path, image):
    lines = shown_apart(tmp_path, image, lambda p: p.symlink_to("/dev/zero"), "unreadable",
                        name="z.json")
    assert any("z.json: unreadable: a symbolic link" in x for x in lines), lines


# -- weak 7: bad values shown as they are ---------------------------------------------------

for _id, _text in (("nan", '"time": NaN'), ("1e400", '"time": 1e400')):
    fault(f"status-time-{_id}", f"a live daemon's status with `{_text}`", "never shown as "
          "fresh (`0 s ago`, not STALE)", "exit 0; `FILE: malformed: time ...`; `--json`: "
          "`stale: true`", "31 weak 7")(
        lambda tmp_path, image, text=_text: shown_apart(
            tmp_path, image, json.dumps(disk(OTHER, time=0.5)).replace('"time": 0.5', text),
            "malformed: time"))


@fault("status-time-future", "a live daemon's status with `time` 1e300 (far in the future)",
       "never shown as fresh", "exit 0; the entry `written in the future ... STALE`",
       "31 weak 7")
def _(tmp_path, image):
    run, _ = with_one_bad(tmp_path, image, json.dumps(disk(OTHER, time=1e300)))
    lines = status(run).stdout.splitlines()
    [line] = [x for x in lines if x.startswith(OTHER)]
    assert "written in the future" in line and line.endswith("STALE"), line
    [e] = [e for e in strict_json(status(run, "--json").stdout) if e.get("path") == OTHER]
    assert e["stale"] is True


@fault("status-control-chars", "a status whose `path`, `version` and `not_held_reason` hold "
       "ESC and newlines", "one line per entry, no control character printed",
       "exit 0; two lines; `\\x1b` and `\\n` shown escaped", "31 weak 7")
def _(tmp_path, image):
    evil = "/img/a\x1b[2J\nb.img"
    doc = disk(evil, version="1\x1b]0;x\x07", not_held_reason="no\nevidence\x1b[31m")
    run, _ = with_one_bad(tmp_path, image, json.dumps(doc))
    out = status(run).stdout
    lines = out.splitlines()
    assert len(lines) == 2 and "\x1b" not in out and "\x07" not in out, lines
    [line] = [x for x in lines if not x.startswith(image)]
    assert line.startswith("/img/a\\x1b[2J\\nb.img: held 4M/8M"), line
    assert "(no\\nevidence\\x1b[31m)" in line and "v1\\x1b]0;x\\x07" in line, line
    [e] = [e for e in strict_json(status(run, "--json").stdout) if e.get("path") == evil]
    assert e["stale"] is False             # --json keeps the value (JSON escapes it)


@fault("status-file-name-control-chars", "a malformed status file whose name holds ESC and a "
       "newline", "its line is one line, the name escaped",
       "exit 0; two lines; `bad\\x1b[2J\\n.json: malformed: ...`", "31 weak 7")
def _(tmp_path, image):
    lines = shown_apart(tmp_path, image, "{", "malformed", name="bad\x1b[2J\n.json")
    assert any("/bad\\x1b[2J\\n.json: malformed" in x for x in lines), lines


@fault("status-path-lone-surrogate", "a status whose `path` is a lone surrogate "
       "(`\"\\udc80\"`, valid JSON, no valid UTF-8)", "one line, the path escaped",
       "exit 0; `\\udc80` shown escaped", "31 weak 7")
def _(tmp_path, image):
    run, _ = with_one_bad(tmp_path, image, json.dumps(disk("/img/\udc80.img")))
    lines = status(run).stdout.splitlines()
    assert len(lines) == 2 and any(x.startswith("/img/\\udc80.img: held") for x in lines), lines


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_status_fault(row, tmp_path):
    image = data_image(tmp_path / "disk.img", 1 * MiB)      # status never opens it
    kept = Untouched(image)
    row.check(tmp_path, image)
    kept.check()
