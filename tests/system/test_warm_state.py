"""warm_state on real files: what is saved comes back; what is not this image's is ignored
with one line."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from tests.support.images import make_image
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
    monkeypatch.setattr(warm_state, "VERSION", warm_state.VERSION + 1)
    assert "version" in ignored(caplog, d, image)
    monkeypatch.undo()
    os.truncate(image, 2 * N * MiB)
    assert "bytes" in ignored(caplog, d, image)


# -- issue 31: what a local user or a stray file can plant -----------------------------------

def plant(tmp_path, image, make):
    d = tmp_path / "state"
    d.mkdir(mode=0o700, exist_ok=True)
    with open_image(image) as img:
        make(warm_state.state_path(str(d), img))
    return str(d)


@pytest.mark.parametrize("make,why", [
    (os.mkfifo, "it is a FIFO, not a regular file"),
    (lambda p: os.symlink("/dev/zero", p), "it is a symbolic link"),
    (lambda p: os.truncate(open(p, "wb").name, 1 << 30), "bytes, more than the"),
])
def test_a_planted_state_is_ignored_without_blocking_or_reading_it(tmp_path, image, caplog,
                                                                   make, why):
    assert why in ignored(caplog, plant(tmp_path, image, make), image)


def repacked(path, compression, **members):
    """The state at ``path`` with ``members`` replaced (raw .npy bytes), packed anew."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        old = {i.filename: z.read(i) for i in z.infolist()}
    old.update({f"{k}.npy": v for k, v in members.items()})
    with zipfile.ZipFile(path, "w", compression) as z:
        for name, data in old.items():
            z.writestr(name, data)


def npy(array) -> bytes:
    import io
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array)
    return buf.getvalue()


def test_what_is_unpacked_is_bounded_by_the_image(tmp_path, image, caplog):
    import io
    import zipfile
    d = str(tmp_path / "state")
    with open_image(image) as img:
        path = warm_state.save(d, img, MiB, heat(1), heat(2), [], 1000.0)
    limit = warm_state.limits(N)["heat_resident"]
    repacked(path, zipfile.ZIP_DEFLATED, heat_resident=npy(np.zeros(limit, np.float32)))
    assert os.path.getsize(path) < warm_state.file_limit(N)        # small: the bomb's part
    assert f"its heat_resident unpacks to {limit * 4 + 128} bytes" in ignored(caplog, d, image)
    with open_image(image) as img:
        path = warm_state.save(d, img, MiB, heat(1), heat(2), [], 1000.0)
    repacked(path, zipfile.ZIP_BZIP2)                               # unbounded by read(n)
    assert "packed in a way vmdisktouch never writes" in ignored(caplog, d, image)
    with open_image(image) as img:
        path = warm_state.save(d, img, MiB, heat(1), heat(2), [], 1000.0)
    liar = io.BytesIO()                                             # the header lies
    np.lib.format.write_array_header_1_0(liar, {"descr": "<f4", "fortran_order": False,
                                                "shape": (10 ** 10,)})
    repacked(path, zipfile.ZIP_DEFLATED, heat_resident=liar.getvalue() + bytes(4 * N))
    assert "not the array its header says" in ignored(caplog, d, image)


def test_a_reused_inode_number_is_another_image(tmp_path, image, caplog):
    d = str(tmp_path / "state")
    with open_image(image) as img:
        ident = warm_state.identity(img)
        assert "generation" in ident                # ext4 under the tests
        path = warm_state.save(d, img, MiB, heat(1), heat(2), [], 1000.0)
    import json
    import zipfile
    with zipfile.ZipFile(path) as z:
        meta = json.loads(bytes(np.lib.format.read_array(z.open("meta.npy"))).decode())
    meta["identity"]["generation"] += 1             # the inode's former file
    repacked(path, zipfile.ZIP_DEFLATED,
             meta=npy(np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)))
    assert "another image" in ignored(caplog, d, image)


def test_without_a_generation_the_first_4k_tell_images_apart(caplog):
    import tempfile
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:       # tmpfs: no generation
        os.chmod(shm, 0o700)
        image = make_image(os.path.join(shm, "disk.img"), N * MiB, sparse=False)
        d = os.path.join(shm, "state")
        with open_image(image) as img:
            assert "generation" not in warm_state.identity(img)
            warm_state.save(d, img, MiB, heat(1), heat(2), [], 1000.0)
            assert warm_state.load(d, img, MiB, 1010.0) is not None
        with open(image, "r+b") as f:
            f.write(os.urandom(4096))                                # another image's head
        assert "another image" in ignored(caplog, d, image)


def test_a_state_directory_others_can_write_is_refused(tmp_path):
    from vmdisktouch.errors import ConfigError
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    os.symlink(tmp_path / "real", tmp_path / "link")
    (tmp_path / "real").mkdir()
    for d, why in ((shared, "can be written by other users"), (tmp_path / "link",
                                                               "is a symbolic link")):
        with pytest.raises(ConfigError, match=why):
            warm_state.check_directory(str(d))
    warm_state.check_directory(str(tmp_path / "new"))               # made, 0700
    assert os.stat(tmp_path / "new").st_mode & 0o777 == 0o700
