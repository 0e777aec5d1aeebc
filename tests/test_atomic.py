"""atomic: readers never see a partial file; failures leave the old file intact."""

import json
import os
import threading

import pytest
from PIL import Image

from vmdisktouch import atomic


def test_replace_changes_inode_and_leaves_no_temp(tmp_path):
    p = tmp_path / "s.json"
    atomic.write_json(str(p), {"a": 1})
    ino = p.stat().st_ino
    atomic.write_json(str(p), {"a": 2})
    assert json.loads(p.read_text()) == {"a": 2}
    assert p.stat().st_ino != ino
    assert sorted(os.listdir(tmp_path)) == ["s.json"]


def test_failed_write_keeps_the_old_file(tmp_path):
    p = tmp_path / "m.png"
    atomic.write_png(str(p), Image.new("RGB", (4, 4), (0, 255, 0)))
    before = p.read_bytes()

    class Broken:
        def save(self, *_a, **_k):
            raise OSError("disk full")

    with pytest.raises(OSError):
        atomic.write_png(str(p), Broken())
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["m.png"]


def test_concurrent_reader_always_decodes(tmp_path):
    p = tmp_path / "live.png"
    atomic.write_png(str(p), Image.new("RGB", (256, 256)))
    stop = threading.Event()
    errors = []

    def reader():
        while not stop.is_set():
            try:
                with Image.open(p) as im:
                    im.load()
            except Exception as exc:  # noqa: BLE001 - any decode failure is the bug
                errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(200):
            atomic.write_png(str(p), Image.new("RGB", (256, 256), (i, 0, 255 - i)))
    finally:
        stop.set()
        t.join()
    assert errors == []
