"""A real ``vmdisktouch run`` speaking the systemd protocols it is started with.

systemd is not PID 1 on these machines, so the test plays its part: it binds
the NOTIFY_SOCKET datagram socket and sets WATCHDOG_USEC / JOURNAL_STREAM as
a ``Type=notify`` unit with ``WatchdogSec=`` would, and reads what the daemon
sends: READY=1 only after the first cycle, a STATUS= line per cycle,
WATCHDOG=1 pings well within the period, STOPPING=1 on SIGTERM. The log:
where stderr is the stream JOURNAL_STREAM names and python3-systemd is not
installed, syslog priority prefixes and no timestamps; where JOURNAL_STREAM
names another stream (inherited, stderr redirected), a terminal's timestamped
lines. Here stderr is a file whose device and inode JOURNAL_STREAM gives (all
the daemon compares); tests/e2e/test_journal.py runs a real journald.
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

from tests.support.pagecache import data_image

MiB = 1 << 20
PREFIXED = re.compile(r"^<[0-7]>")
TIMESTAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")


def journal_stream(tmp_path, env: dict | None = None):
    """(stderr, env): a file standing for journald's stream, named by JOURNAL_STREAM (its
    ``st_dev:st_ino``, as systemd sets it), with python3-systemd made unimportable (a
    ``systemd`` package on PYTHONPATH whose import fails): the stream with prefixes."""
    hide = tmp_path / "no-systemd" / "systemd"
    hide.mkdir(parents=True, exist_ok=True)
    (hide / "__init__.py").write_text('raise ImportError("python3-systemd hidden")\n')
    err = open(tmp_path / "stream.log", "w+")
    st = os.fstat(err.fileno())
    env = dict(os.environ if env is None else env, JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hide.parent),
                                                      env.get("PYTHONPATH")]))
    return err, env


def read_back(err) -> str:
    err.flush()
    err.seek(0)
    return err.read()


@pytest.mark.timeout(120)
def test_notify_ready_status_watchdog_stopping_and_journal_logs(tmp_path):
    img = data_image(tmp_path / "disk.img", 64 * MiB)
    sock_path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(0.2)
    status = tmp_path / "status.json"
    stream, env = journal_stream(tmp_path, dict(os.environ, NOTIFY_SOCKET=sock_path,
                                                WATCHDOG_USEC="2000000"))
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmdisktouch", "run", str(img), "--max-hold", "16M",
         "--interval", "5", "--uri", "", "--status", str(status)],
        env=env, stdout=subprocess.DEVNULL, stderr=stream, text=True)
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
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
        err = read_back(stream)
        stream.close()
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
    assert lines and all(PREFIXED.match(line) for line in lines), lines
    assert not any(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", line) for line in lines)
    assert any(line.startswith("<6>cycle 1:") for line in lines), lines


@pytest.mark.parametrize("value", ["8:12345", "x"])
def test_a_journal_stream_that_is_not_stderr_gives_timestamped_lines(tmp_path, value):
    """JOURNAL_STREAM inherited by a process whose stderr went to a pipe (or malformed):
    stderr is not the journal, so the lines are a terminal's, python3-systemd or not."""
    img = data_image(tmp_path / "disk.img", 16 * MiB)
    env = dict(os.environ, JOURNAL_STREAM=value)
    env.pop("NOTIFY_SOCKET", None)
    proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", str(img),
                             "--max-hold", "8M", "--interval", "0.2", "--uri", ""],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = err.splitlines()
    assert lines and all(TIMESTAMPED.match(line) for line in lines), lines
    assert any(" INFO cycle 1:" in line for line in lines), lines


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
    """The repro of the operator's view: `journalctl -p warning` must show why it died;
    the same run with JOURNAL_STREAM naming another stream: no prefix."""
    stream, env = journal_stream(tmp_path)
    argv = [sys.executable, "-m", "vmdisktouch", "run", str(tmp_path / "nope.img"),
            "--max-hold", "1G", "--uri", ""]
    with stream:
        r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=stream, text=True,
                           timeout=60)
        lines = read_back(stream).splitlines()
    assert r.returncode == 66 and lines, lines
    assert all(PREFIXED.match(line) for line in lines), lines
    assert lines[-1].startswith("<3>vmdisktouch: ") and "no such file" in lines[-1]
    assert len(lines) == 1, lines                    # a refusal is one line
    r = subprocess.run(argv, env=dict(env, JOURNAL_STREAM="8:1"), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 66 and r.stderr.startswith("vmdisktouch: "), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr


@pytest.mark.parametrize("debug", [False, True])
def test_quiet_cycles_are_debug_lines(tmp_path, debug):
    """An idle image: the first cycle at INFO (<6>) with why nothing is held; the same
    again at DEBUG (<7>), shown only with --debug."""
    img = data_image(tmp_path / "idle.img", 16 * MiB)
    stream, env = journal_stream(tmp_path)
    env.pop("NOTIFY_SOCKET", None)
    with stream:
        proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", str(img),
                                 "--max-hold", "8M", "--interval", "0.2", "--uri", "",
                                 *(["--debug"] if debug else [])],
                                env=env, stdout=subprocess.DEVNULL, stderr=stream, text=True)
        # Until six cycles are logged (with --debug) or 3 s have passed since the first:
        # a fixed sleep counted the interpreter's start-up on a loaded machine.
        deadline, first = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            text = (tmp_path / "stream.log").read_text()   # its own offset, not the daemon's
            if "cycle 1:" in text:
                first = first or time.monotonic()
                if len(re.findall(r"(?m)^<\d>cycle \d+:", text)) >= 6 or \
                        time.monotonic() - first >= 3:
                    break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        err = read_back(stream)
    assert proc.returncode == 0, err
    cycles = [line for line in err.splitlines() if re.match(r"^<\d>cycle \d+:", line)]
    assert cycles[0].startswith("<6>cycle 1:") and "no evidence of use yet" in cycles[0]
    later = cycles[1:]
    if debug:
        assert len(later) >= 5 and all(c.startswith("<7>") for c in later), cycles
    else:
        assert later == [], cycles
