"""A real ``vmdisktouch run`` speaking the systemd protocols it is started with.

systemd is not PID 1 on these machines, so the test plays its part: it binds
the NOTIFY_SOCKET datagram socket and sets WATCHDOG_USEC / JOURNAL_STREAM as
a ``Type=notify`` unit with ``WatchdogSec=`` would, and reads what the daemon
sends: READY=1 only after the first cycle, a STATUS= line per cycle,
WATCHDOG=1 pings well within the period, STOPPING=1 on SIGTERM; logs with
syslog priority prefixes and no timestamps.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.pagecache import data_image

MiB = 1 << 20


@pytest.mark.timeout(120)
def test_notify_ready_status_watchdog_stopping_and_journal_logs(tmp_path):
    img = data_image(tmp_path / "disk.img", 64 * MiB)
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.2)
    status = tmp_path / "status.json"
    env = dict(os.environ, NOTIFY_SOCKET=sock_path, WATCHDOG_USEC="2000000",
               JOURNAL_STREAM="8:12345")
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmdisktouch", "run", str(img), "--max-hold", "16M",
         "--interval", "5", "--uri", "", "--status", str(status)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    messages: list[tuple[float, str, bool]] = []   # (time, message, status file existed)
    try:
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            try:
                data = sock.recv(4096).decode()
            except socket.timeout:
                continue
            messages.append((time.monotonic(), data, status.exists()))
        proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                messages.append((time.monotonic(), sock.recv(4096).decode(), True))
            except socket.timeout:
                if proc.poll() is not None:
                    break
        _out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
    assert proc.returncode == 0, err

    texts = [m for _, m, _ in messages]
    ready = [i for i, m in enumerate(texts) if "READY=1" in m.splitlines()]
    assert len(ready) == 1, texts
    _, ready_msg, had_status = messages[ready[0]]
    assert had_status, "READY=1 came before the first cycle wrote its status"
    assert re.search(r"^STATUS=held \S+/16M, rewritten \d+ blocks, cycle 1$", ready_msg, re.M)
    statuses = [m for m in texts if m.startswith("STATUS=held")]
    assert len(statuses) >= 2                               # one per cycle (5 s interval, 12 s)
    pings = [t for t, m, _ in messages if m == "WATCHDOG=1"]
    assert len(pings) >= 6, texts                           # half of 2 s, over 12 s
    assert max(b - a for a, b in zip(pings, pings[1:])) < 2.0   # never a missed period
    assert texts[-1] == "STOPPING=1" or "STOPPING=1" in texts

    lines = [line for line in err.splitlines() if line]
    assert lines and all(re.match(r"^<[0-7]>", line) for line in lines), lines
    assert not any(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", line) for line in lines)
    assert any(line.startswith("<6>cycle 1:") for line in lines), lines


@pytest.mark.parametrize("debug", [None, "before", "after"])
def test_debug_shows_tracebacks_and_only_then(tmp_path, debug):
    """``--debug`` before the subcommand or after it."""
    cfg = tmp_path / "bad.toml"
    cfg.write_text('max_hold = "1G"\ndecay = "fast"\n')
    img = tmp_path / "disk.img"
    img.write_bytes(b"\0" * 4096)
    argv = [sys.executable, "-m", "vmdisktouch", *(["--debug"] if debug == "before" else []),
            "run", str(img), "--config", str(cfg), "--uri", "",
            *(["--debug"] if debug == "after" else [])]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert ("Traceback" in r.stderr) == bool(debug), r.stderr
    assert "key decay" in r.stderr


def test_under_journald_a_fatal_line_is_priority_3(tmp_path):
    """The repro of the operator's view: `journalctl -p warning` must show why it died."""
    env = dict(os.environ, JOURNAL_STREAM="8:1")
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "run", str(tmp_path / "nope.img"),
                        "--max-hold", "1G", "--uri", ""], env=env, capture_output=True,
                       text=True, timeout=60)
    lines = r.stderr.splitlines()
    assert r.returncode == 66 and lines, r.stderr
    assert all(re.match(r"^<[0-7]>", line) for line in lines), lines
    assert lines[-1].startswith("<3>vmdisktouch: ") and "no such file" in lines[-1]
    assert len(lines) == 1, lines                    # a refusal is one line


@pytest.mark.parametrize("debug", [False, True])
def test_quiet_cycles_are_debug_lines(tmp_path, debug):
    """An idle image: the first cycle at INFO (<6>) with why nothing is held; the same
    again at DEBUG (<7>), shown only with --debug."""
    img = data_image(tmp_path / "idle.img", 16 * MiB)
    env = dict(os.environ, JOURNAL_STREAM="8:1")
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", str(img),
                             "--max-hold", "8M", "--interval", "0.2", "--uri", "",
                             *(["--debug"] if debug else [])],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    cycles = [line for line in err.splitlines() if re.match(r"^<\d>cycle \d+:", line)]
    assert cycles[0].startswith("<6>cycle 1:") and "no evidence of use yet" in cycles[0]
    later = cycles[1:]
    if debug:
        assert len(later) >= 5 and all(c.startswith("<7>") for c in later), cycles
    else:
        assert later == [], cycles
