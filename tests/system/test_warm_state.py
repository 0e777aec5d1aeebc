"""warm_state on real files: what is saved comes back; what is not this image's is ignored
with one line."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from tests.pagecache import make_image
from vmdisktouch.adapters import warm_state
from vmdisktouch.system.image import open_image

MiB = 1 << 20
N = 16


@pytest.fixture
def image(tmp_path):
    return str(make_image(tmp_path / "disk.img", N * MiB))


def heat(seed):
    return np.random.default_rng(seed).random(N).astype(np.float32)


def test_what_is_saved_comes_back(tmp_path, image):
    d = str(tmp_path / "state")
    with open_image(image) as img:
        path = warm_state.save(d, img, MiB, heat(1), heat(2), [(2, 5), (9, 10)], 1000.0)
        assert os.stat(path).st_mode & 0o777 == 0o600
        saved = warm_state.load(d, img, MiB, now_wall=1010.0)
    np.testing.assert_array_equal(saved.heat_resident, heat(1))
    np.testing.assert_array_equal(saved.heat_rewritten, heat(2))
    assert saved.held == [(2, 5), (9, 10)] and saved.saved_at == 1000.0
    assert os.listdir(d) == [os.path.basename(path)]          # no temporary left


def ignored(caplog, d, image, block_size=MiB, now=1010.0):
    caplog.clear()
    with caplog.at_level(logging.INFO, "vmdisktouch"), open_image(image) as img:
        assert warm_state.load(d, img, block_size, now_wall=now) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    return lines[0]


def test_a_missing_state_is_a_cold_start(tmp_path, image, caplog):
    assert "cold start" in ignored(caplog, str(tmp_path / "none"), image)


def test_a_replaced_image_is_never_restored(tmp_path, image, caplog):
    d = str(tmp_path / "state")
    with open_image(image) as img:
        path = warm_state.save(d, img, MiB, heat(1), heat(2), [(0, 4)], 1000.0)
    new = make_image(tmp_path / "new.img", N * MiB)
    os.replace(new, image)                                    # same path, another inode
    assert "cold start" in ignored(caplog, d, image)          # its own name: no file
    with open_image(image) as img:                            # the old file under the new name
        os.replace(path, warm_state.state_path(d, img))
    msg = ignored(caplog, d, image)
    assert "another image" in msg and "ignoring" in msg


@pytest.mark.parametrize("damage,why", [
    (lambda p: open(p, "wb").write(b"garbage"), "unreadable"),
    (lambda p: open(p, "r+b").truncate(40), "unreadable"),
])
def test_a_corrupt_state_is_ignored(tmp_path, image, caplog, damage, why):
    d = str(tmp_path / "state")
    with open_image(image) as img:
        damage(warm_state.save(d, img, MiB, heat(1), heat(2), [], 1000.0))
    assert why in ignored(caplog, d, image)


def test_another_version_size_block_size_or_a_future_save_is_ignored(tmp_path, image, caplog,
                                                                     monkeypatch):
    d = str(tmp_path / "state")
    with open_image(image) as img:
        warm_state.save(d, img, MiB, heat(1), heat(2), [], 1000.0)
    assert "block size" in ignored(caplog, d, image, block_size=2 * MiB)
    assert "future" in ignored(caplog, d, image, now=100.0)
    monkeypatch.setattr(warm_state, "VERSION", 2)
    assert "version" in ignored(caplog, d, image)
    monkeypatch.undo()
    os.truncate(image, 2 * N * MiB)
    assert "bytes" in ignored(caplog, d, image)
