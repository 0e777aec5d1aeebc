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
