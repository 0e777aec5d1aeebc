"""The seams of a drive adopted through a QEMU's QMP socket: its counters and its record
(``adapters.qemu_socket``), the given path the service marks adopted
(``daemon.membership``), and the one judge over both backends (``daemon.adoption``)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading

import pytest

from vmdisktouch.adapters import qemu_socket
from vmdisktouch.core.never_slower import Counters, Window
from vmdisktouch.daemon import adoption
from vmdisktouch.daemon.membership import Member, adopted_through_qmp


class FakeQemu:
    """A QMP socket answering ``replies`` (command -> return), a client at a time."""

    def __init__(self, path: str, replies: dict):
        self.path, self.replies, self.asked = path, replies, []
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(path)
        self.sock.listen(4)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, conn.makefile("rw") as f:
                f.write(json.dumps({"QMP": {"version": {}}}) + "\n")
                f.flush()
                for line in f:
                    cmd = json.loads(line)["execute"]
                    self.asked.append(cmd)
                    f.write(json.dumps({"return": self.replies.get(cmd, {})}) + "\n")
                    f.flush()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("VMDISKTOUCH_RUNTIME_DIR", str(tmp_path / "run"))
    return tmp_path


def write_record(sock: str, drive: str, **doc) -> str:
    rec = qemu_socket._record_path(sock, drive)      # noqa: SLF001 - where adopt writes it
    os.makedirs(os.path.dirname(rec), exist_ok=True)
    with open(rec, "w") as f:
        json.dump({"socket": os.path.realpath(sock), "drive": drive, **doc}, f)
    return rec


def block(direct: bool) -> list:
    return [{"device": "drive-scsi0", "inserted": {"file": "/images/a.raw",
                                                    "cache": {"direct": direct}}}]


STATS = [{"device": "drive-scsi1", "stats": {"rd_operations": 1}},
         {"device": "drive-scsi0", "stats": {"rd_operations": 40, "rd_total_time_ns": 8000,
                                             "flush_operations": 3,
                                             "flush_total_time_ns": 90}}]


def test_an_adopted_drive_s_counters_come_from_query_blockstats(runtime):
    sock = str(runtime / "100.qmp")
    qemu = FakeQemu(sock, {"query-block": block(False), "query-blockstats": STATS})
    try:
        c = qemu_socket.counters(sock, "drive-scsi0")
        assert (c.ops, c.ns) == ((40, 0, 3), (8000, 0, 90))
        got = qemu_socket.measure(sock, ["drive-scsi0"], 3, sleep=lambda s: None)
        assert [w.ops for w in got["drive-scsi0"]] == [(0, 0, 0)] * 3
        assert qemu_socket.measure(sock, ["drive-scsi0"], 0) == {}
    finally:
        qemu.close()


def test_a_drive_qemu_opens_with_o_direct_again_is_not_adopted_and_its_record_goes(runtime):
    sock = str(runtime / "100.qmp")
    qemu = FakeQemu(sock, {"query-block": block(True), "query-blockstats": STATS})
    rec = write_record(sock, "drive-scsi0", pid=os.getpid(), path="/images/a.raw")
    try:
        with pytest.raises(qemu_socket.QmpError, match="O_DIRECT: not adopted"):
            qemu_socket.counters(sock, "drive-scsi0")
        assert not os.path.exists(rec) and "query-blockstats" not in qemu.asked
    finally:
        qemu.close()


def test_a_given_path_a_live_qmp_record_names_is_adopted_and_a_dead_qemu_s_record_goes(
        runtime):
    sock = runtime / "100.qmp"
    sock.write_text("")                                # a record needs its socket there
    img, other = runtime / "a.raw", runtime / "b.raw"
    img.write_text(""), other.write_text("")
    write_record(str(sock), "drive-scsi0", pid=os.getpid(), path=str(img), since=123.0)
    dead = write_record(str(sock), "drive-scsi1", pid=2 ** 22 + 1, path=str(other))
    link = runtime / "link.raw"
    link.symlink_to(img)                               # the same image by another name
    got = adopted_through_qmp({str(link): Member(str(link)), str(other): Member(str(other))})
    assert got[str(link)].qmp == f"{os.path.realpath(sock)} drive-scsi0"
    assert got[str(link)].adopted == 123.0 and got[str(link)].domain is None
    assert got[str(other)] == Member(str(other)) and not os.path.exists(dead)
    key = got[str(link)].qmp
    assert adoption.is_qmp(key) and not adoption.is_qmp("web/vda")
    assert qemu_socket.parse_key(key) == (os.path.realpath(sock), "drive-scsi0")
    assert qemu_socket.record_of(*qemu_socket.parse_key(key))["since"] == 123.0


class FakeBackend:
    """Counters that grow by ``per`` reads of ``us`` each a tick; a record with a baseline
    of reads of 100 us."""

    def __init__(self):
        self.n, self.us, self.released = 0, 100.0, []

    def counters(self, key):
        self.n += 1
        return Counters(float(self.n), (self.n * 1000, 0, 0),
                        (int(self.n * 1000 * self.us * 1000), 0, 0))

    def record(self, key):
        return {"baseline": [Window(10.0, (1000, 0, 0), (100_000_000, 0, 0)).to_json()] * 3,
                "advised_gain": 1.5}

    def release(self, key, why=None):
        self.released.append((key, why))
        return "/images/a.raw", True

    def reset(self):
        pass

    def again(self, key):
        return f"adopt {key} again"


def test_one_judge_serves_both_backends_and_releases_a_slower_qmp_drive(caplog):
    a = adoption.Adopter("qemu:///nowhere")
    lv, qmp = FakeBackend(), FakeBackend()
    a.backends = (lv, qmp)
    key = "/run/qemu-server/100.qmp drive-scsi0"
    a._watched = {key, "web/vda"}                    # noqa: SLF001 - the worker's own
    for _ in range(4):                               # the first reading, then settled
        for k in (key, "web/vda"):
            a._judge(k)                              # noqa: SLF001
    assert a.figures(key) == (pytest.approx(1.0), 1.5)
    qmp.us = 300.0                                   # the drive gets slower
    caplog.set_level(logging.WARNING, "vmdisktouch")
    for _ in range(3):
        if key in a._watched:                        # noqa: SLF001
            a._judge(key)                            # noqa: SLF001
        a._judge("web/vda")                          # noqa: SLF001
    assert [k for k, _ in qmp.released] == [key] and lv.released == []
    assert "slower: the guest's I/O took" in qmp.released[0][1]
    assert key in a.released and key not in a._watched      # noqa: SLF001
    assert f"{key}: released by itself: the guest's I/O took" in caplog.text
    assert f"until adopt {key} again" in caplog.text


def test_the_stopping_service_releases_qmp_drives_through_their_socket(monkeypatch):
    calls = []
    monkeypatch.setattr(qemu_socket, "release_drive",
                        lambda sock, drive: calls.append((sock, drive)) or ("/i/a.raw", True))
    lines = adoption.release_when_stopping("qemu:///nowhere", ["/run/100.qmp drive-scsi0"])
    assert calls == [("/run/100.qmp", "drive-scsi0")]
    assert lines == ["/run/100.qmp drive-scsi0: released: /i/a.raw with O_DIRECT again "
                     "(the service stopped)"]
