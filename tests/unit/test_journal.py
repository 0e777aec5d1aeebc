"""adapters.journal: where the log goes (JOURNAL_STREAM checked against stderr's own
device and inode, python3-systemd importable or not), the disk context's fields on every
record, and what the native handler sends."""

from __future__ import annotations

import logging
import os
import sys
import threading
import types

import pytest

from vmdisktouch.adapters.systemd import journal


def dev_ino(fd: int) -> str:
    st = os.fstat(fd)
    return f"{st.st_dev}:{st.st_ino}"


@pytest.fixture
def stream(tmp_path):
    """A file open on a descriptor: what journald's stream is to a unit's stderr."""
    fd = os.open(tmp_path / "stream", os.O_WRONLY | os.O_CREAT, 0o600)
    yield fd
    os.close(fd)


@pytest.fixture
def sent(monkeypatch):
    """python3-systemd importable, its ``send`` recording each entry: (message, fields)."""
    entries: list[tuple[str, dict]] = []
    fake = types.ModuleType("systemd.journal")
    fake.send = lambda message, **fields: entries.append((message, fields))
    package = types.ModuleType("systemd")
    package.journal = fake
    monkeypatch.setitem(sys.modules, "systemd", package)
    monkeypatch.setitem(sys.modules, "systemd.journal", fake)
    return entries


@pytest.fixture
def hidden(monkeypatch):
    """python3-systemd not installed: its import fails."""
    monkeypatch.setitem(sys.modules, "systemd", None)
    monkeypatch.setitem(sys.modules, "systemd.journal", None)


# -- the decision --------------------------------------------------------------------

def test_the_stream_counts_only_when_it_is_the_descriptor_itself(stream, tmp_path):
    assert journal.stderr_is_journal({"JOURNAL_STREAM": dev_ino(stream)}, stream)
    other = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT, 0o600)
    try:      # a JOURNAL_STREAM inherited by a child whose stderr went elsewhere
        assert not journal.stderr_is_journal({"JOURNAL_STREAM": dev_ino(stream)}, other)
    finally:
        os.close(other)
    st = os.fstat(stream)
    assert not journal.stderr_is_journal({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"},
                                         stream)
    assert not journal.stderr_is_journal({}, stream)


@pytest.mark.parametrize("value", ["", "x", "8", "8:", ":12345", "8:12a", "-1:5", "8:1:2",
                                   " 8:1", "0x8:1"])
def test_a_malformed_journal_stream_is_not_the_journal(stream, value):
    assert not journal.stderr_is_journal({"JOURNAL_STREAM": value}, stream)


def test_a_closed_descriptor_is_not_the_journal(tmp_path):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    value = dev_ino(fd)
    os.close(fd)
    assert not journal.stderr_is_journal({"JOURNAL_STREAM": value}, fd)


def test_native_only_where_stderr_is_the_journal_and_python3_systemd_imports(stream, sent):
    env = {"JOURNAL_STREAM": dev_ino(stream)}
    choice = journal.choose(env, stream)
    assert choice.mode == journal.NATIVE and choice.send is sys.modules["systemd.journal"].send
    assert journal.choose({"JOURNAL_STREAM": "8:12345"}, stream) == (journal.PLAIN, None)
    assert journal.choose({}, stream) == (journal.PLAIN, None)


def test_the_stream_with_prefixes_when_python3_systemd_is_missing(stream, hidden):
    assert journal.choose({"JOURNAL_STREAM": dev_ino(stream)}, stream) == (journal.STREAM,
                                                                            None)
    assert journal.choose({"JOURNAL_STREAM": "x"}, stream) == (journal.PLAIN, None)


def test_priorities_are_syslogs():
    assert [journal.priority(x) for x in (logging.DEBUG, logging.INFO, journal.NOTICE,
                                          logging.WARNING, logging.ERROR, logging.CRITICAL)] \
        == [7, 6, 5, 4, 3, 2]
    assert journal.priority(logging.INFO + 1) == 5 and journal.priority(60) == 1
    assert logging.getLevelName(journal.NOTICE) == "NOTICE"


def test_the_three_message_ids_are_distinct_128_bit_ids():
    ids = [journal.BUDGET_FULL, journal.FLOOR_SHED, journal.DISK_DROPPED]
    assert len(set(ids)) == 3
    for i in ids:
        assert len(i) == 32 and int(i, 16) >= 0 and i == i.lower()


# -- the disk context ----------------------------------------------------------------

def record(msg="m", level=logging.INFO, **extra) -> logging.LogRecord:
    r = logging.LogRecord("vmdisktouch", level, __file__, 1, msg, (), None, "f")
    r.__dict__.update(extra)
    return r


def filtered(r: logging.LogRecord) -> dict:
    assert journal.DiskFields().filter(r) is True
    return {k: getattr(r, k) for k in journal.FIELDS if hasattr(r, k)}


def test_a_record_inside_a_disk_context_carries_its_fields():
    assert filtered(record()) == {}
    with journal.disk_context("/img/a.raw", "web", "vda"):
        assert filtered(record()) == {"DISK": "/img/a.raw", "DOMAIN": "web", "TARGET": "vda"}
        with journal.disk_context("/img/b.raw"):               # no libvirt: DISK alone
            assert filtered(record()) == {"DISK": "/img/b.raw"}
        assert filtered(record())["DISK"] == "/img/a.raw"      # the outer one again
    assert filtered(record()) == {}


def test_fields_given_by_the_call_win_and_a_message_id_is_kept():
    with journal.disk_context("/img/a.raw", "web", "vda"):
        got = filtered(record(**journal.fields(domain="db", target="vdb",
                                               message_id=journal.DISK_DROPPED)))
    assert got == {"DISK": "/img/a.raw", "DOMAIN": "db", "TARGET": "vdb",
                   "MESSAGE_ID": journal.DISK_DROPPED}
    assert journal.fields(None, "", None) == {}


def test_a_context_survives_an_exception_and_another_thread_starts_without_one():
    with pytest.raises(RuntimeError):
        with journal.disk_context("/img/a.raw"):
            raise RuntimeError
    assert filtered(record()) == {}
    seen = []
    with journal.disk_context("/img/a.raw"):
        t = threading.Thread(target=lambda: seen.append(filtered(record())))
        t.start()
        t.join()
    assert seen == [{}]       # the metrics server's thread: its lines are about no disk


# -- the handlers --------------------------------------------------------------------

def test_the_native_handler_sends_the_fields(sent):
    h = journal.handler(journal.Choice(journal.NATIVE, sys.modules["systemd.journal"].send))
    with journal.disk_context("/img/a.raw", "web", "vda"):
        h.handle(record("cycle %d", logging.DEBUG))
        h.handle(record("full", journal.NOTICE, MESSAGE_ID=journal.BUDGET_FULL))
    h.handle(record("released all holds"))
    (m1, f1), (m2, f2), (m3, f3) = sent
    assert m1 == "cycle %d" and f1["PRIORITY"] == "7" and f1["SYSLOG_IDENTIFIER"] == "vmdisktouch"
    assert (f1["DISK"], f1["DOMAIN"], f1["TARGET"]) == ("/img/a.raw", "web", "vda")
    assert f1["CODE_FILE"] == __file__ and f1["CODE_LINE"] == 1 and f1["CODE_FUNC"] == "f"
    assert f2["MESSAGE_ID"] == journal.BUDGET_FULL and f2["PRIORITY"] == "5"
    assert "MESSAGE_ID" not in f1
    assert m3 == "released all holds" and not set(f3) & {"DISK", "DOMAIN", "TARGET"}


def test_an_entry_that_cannot_be_sent_goes_to_the_stream_prefixed(capsys):
    def refuse(message, **fields):
        raise ConnectionRefusedError(111, "Connection refused")

    h = journal.handler(journal.Choice(journal.NATIVE, refuse))
    h.handle(record("dropped", logging.WARNING))
    assert capsys.readouterr().err == "<4>dropped\n"


def test_the_stream_and_plain_formats(capsys):
    for mode in (journal.STREAM, journal.PLAIN):
        h = journal.handler(journal.Choice(mode))
        h.handle(record("budget full", journal.NOTICE))
    stream, plain = capsys.readouterr().err.splitlines()
    assert stream == "<5>budget full"
    assert plain.endswith(" NOTICE budget full") and plain[:4].isdigit()


@pytest.fixture
def logger():
    """The ``vmdisktouch`` logger as it was, put back after the test."""
    lg = logging.getLogger("vmdisktouch")
    saved = lg.handlers[:], lg.level, lg.propagate
    yield lg
    lg.handlers[:], lg.level, lg.propagate = saved


def test_setup_and_fatal_take_the_same_decision(capfd, sent, logger, monkeypatch):
    """stderr (fd 2) named by JOURNAL_STREAM: native, the fatal line too, nothing on
    stderr; stderr not named: timestamps, and a fatal line with no prefix."""
    monkeypatch.setenv("JOURNAL_STREAM", dev_ino(2))
    assert journal.setup(debug=False) == journal.NATIVE
    logger.info("a line")
    journal.fatal("/img/a.raw: no such file\n(second line)")
    assert capfd.readouterr().err == ""
    assert [(m, f["PRIORITY"]) for m, f in sent] == [
        ("a line", "6"), ("vmdisktouch: /img/a.raw: no such file (second line)", "3")]
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    assert journal.setup(debug=True) == journal.PLAIN and logger.level == logging.DEBUG
    logger.debug("a debug line")
    journal.fatal("gone")
    err = capfd.readouterr().err.splitlines()
    assert err[0].endswith(" DEBUG a debug line") and err[1] == "vmdisktouch: gone"
    assert len(sent) == 2


def test_fatal_on_the_stream_without_python3_systemd_is_priority_3(capfd, hidden,
                                                                   monkeypatch):
    monkeypatch.setenv("JOURNAL_STREAM", dev_ino(2))
    journal.fatal("gone")
    assert capfd.readouterr().err == "<3>vmdisktouch: gone\n"
