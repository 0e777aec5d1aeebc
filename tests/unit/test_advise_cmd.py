"""commands.advise: the watch goes on when one disk's fails; the cache mode a PATH showed."""

from __future__ import annotations

from vmdisktouch.commands import advise
from vmdisktouch.errors import VmdtError


class Watch:
    def __init__(self, fail: bool):
        self.fail, self.drains, self.closed = fail, 0, False

    def drain(self) -> None:
        self.drains += 1
        if self.fail:
            raise VmdtError("its trace instance is gone")

    def close(self) -> None:
        self.closed = True


def test_a_failed_drain_drops_that_disk_alone_and_says_why():
    good, bad = Watch(False), Watch(True)
    watches = [({"name": "a"}, good), ({"name": "b"}, bad)]
    failed: dict = {}
    advise.drain_all(watches, failed)
    advise.drain_all(watches, failed)
    assert watches == [({"name": "a"}, good)] and good.drains == 2
    assert bad.closed and bad.drains == 1
    assert failed == {"b": "the watch failed: its trace instance is gone"}


def test_the_cache_mode_comes_from_the_openers_else_from_the_reads():
    assert advise.cache_seen("direct", True, 10) == "none"
    assert advise.cache_seen("paged", False, 0) == "writethrough"
    assert advise.cache_seen(None, True, 10) == "writethrough"
    assert advise.cache_seen(None, False, 10) == "none"
    assert advise.cache_seen(None, False, 0) == "-"


def test_a_duration_of_no_time_is_refused_in_the_one_place_that_reads_it():
    import pytest
    from vmdisktouch.errors import ConfigError
    assert advise.watch_duration("2m") == 120.0
    assert advise.watch_duration("500ms") == 0.5
    for text in ("0", "0s", "0ms", "0.0", "-1", "x"):
        with pytest.raises(ConfigError, match=f"bad value '{text}' for --duration"):
            advise.watch_duration(text)


def test_a_duration_under_the_minimum_window_is_warned_there_too():
    said = []
    assert advise.watch_duration("5", said.append) == 5.0
    assert said and "--duration 5 is less than the 10 s an advice needs" in said[0]
    assert "not a size" in said[0]
    said.clear()
    assert advise.watch_duration("10s", said.append) == 10.0 and not said


def test_the_picture_says_the_seconds_watched_and_of_how_many_when_interrupted():
    from vmdisktouch.adapters.pictures.advise_render import header
    report = {"disks": [{}], "duration_seconds": 60.0, "watched_seconds": 14.71,
              "interrupted": True, "when": 0.0, "kernel": "6.18"}
    assert header(report)[0] == "advise: 1 disk watched 14.7 s of 60 s (interrupted)"
    report.update(interrupted=False, watched_seconds=60.02, disks=[{}, {}])
    assert header(report)[0] == "advise: 2 disks watched 60.0 s"
