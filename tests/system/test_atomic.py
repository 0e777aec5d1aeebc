"""atomic: readers never see a partial file; failures leave the old file intact."""

import json
import os
import stat
import threading

import pytest
from PIL import Image

from vmdisktouch.adapters import atomic


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


# -- an output directory that someone else can write --------------------------------------

def test_the_mode_is_set_on_the_descriptor_not_by_path(tmp_path, monkeypatch):
    """The temp file swapped for a symlink to a victim: the victim's mode never changes.

    The old code closed the temp file and then ran ``chmod(tmp_path, 0o644)``:
    an attacker who swapped the temp file for a symlink to ``/etc/shadow`` in
    that window had root make it world-readable. Here every chmod by path
    fails the test, and the swap happens after the data is written.
    """
    victim = tmp_path / "victim"
    victim.write_text("secret")
    victim.chmod(0o600)
    out = tmp_path / "out"
    out.mkdir()

    def no_chmod_by_path(*_a, **_k):
        raise AssertionError("chmod by path")

    real_fchmod = os.fchmod

    def swap_then_fchmod(fd, mode):
        name = next(p.name for p in out.iterdir() if p.name.endswith(".tmp"))
        os.unlink(out / name)
        os.symlink(victim, out / name)           # the attacker's swap, after the write
        return real_fchmod(fd, mode)

    monkeypatch.setattr(os, "chmod", no_chmod_by_path)
    monkeypatch.setattr(os, "fchmod", swap_then_fchmod)
    with pytest.raises(atomic.OutputRefused, match="temporary file"):
        atomic.write_bytes(str(out / "status.json"), b"{}")
    monkeypatch.undo()
    # The swap is seen before the rename (the temp name is no longer the file written).
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert victim.read_text() == "secret"
    assert not (out / "status.json").exists()


def test_the_temp_file_swapped_for_a_symlink_is_not_renamed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("secret")
    real_stat = os.stat
    swapped = []

    def stat_after_swap(name, *a, dir_fd=None, follow_symlinks=True):
        if str(name).endswith(".tmp") and not swapped:
            os.unlink(name, dir_fd=dir_fd)
            os.symlink(victim, name, dir_fd=dir_fd)
            swapped.append(name)
        return real_stat(name, *a, dir_fd=dir_fd, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(os, "stat", stat_after_swap)
    with pytest.raises(atomic.OutputRefused, match="temporary file"):
        atomic.write_bytes(str(tmp_path / "s.json"), b"{}")
    monkeypatch.undo()
    assert swapped and not (tmp_path / "s.json").exists()
    assert victim.read_text() == "secret"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim"]   # the temp name removed


def test_temp_files_are_created_exclusively_and_never_through_a_symlink(tmp_path, monkeypatch):
    opened = []
    real_open = os.open

    def spy(path, flags, *a, **kw):
        opened.append((path, flags))
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", spy)
    atomic.write_bytes(str(tmp_path / "s.json"), b"{}")
    monkeypatch.undo()
    tmp_flags = [f for p, f in opened if str(p).endswith(".tmp")]
    assert tmp_flags and all(f & os.O_EXCL and f & os.O_NOFOLLOW and f & os.O_CREAT
                             for f in tmp_flags)
    assert stat.S_IMODE((tmp_path / "s.json").stat().st_mode) == 0o644


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_a_target_that_is_not_a_regular_file_is_never_replaced(tmp_path, kind):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "s.json"
    {"symlink": lambda: target.symlink_to(victim), "directory": target.mkdir,
     "fifo": lambda: os.mkfifo(target)}[kind]()
    with pytest.raises(atomic.OutputRefused, match="not a regular file"):
        atomic.write_bytes(str(target), b"{}")
    assert victim.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "victim"]


def test_a_hard_link_target_is_replaced_by_rename_and_the_other_file_kept(tmp_path):
    other = tmp_path / "other"
    other.write_text("keep")
    os.link(other, tmp_path / "s.json")
    atomic.write_bytes(str(tmp_path / "s.json"), b"{}")
    assert other.read_text() == "keep" and (tmp_path / "s.json").read_bytes() == b"{}"


# -- issue 31: a directory swapped for a symlink, or one others can write ----------------------

def test_a_directory_swapped_for_a_symlink_is_never_written_through(tmp_path):
    out, target = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    target.mkdir()
    atomic.write_bytes(str(out / "s.json"), b"{}")
    out.rename(tmp_path / "out.real")
    out.symlink_to(target)
    with pytest.raises(OSError, match="is a symbolic link"):
        atomic.write_bytes(str(out / "s.json"), b"{}")
    assert list(target.iterdir()) == []


def test_a_symlink_above_it_is_followed_only_when_no_one_else_could_change_it(tmp_path):
    (tmp_path / "real" / "out").mkdir(parents=True)
    os.symlink(tmp_path / "real", tmp_path / "mine")                  # root's, in root's dir
    atomic.write_bytes(str(tmp_path / "mine" / "out" / "a.json"), b"{}")
    assert (tmp_path / "real" / "out" / "a.json").read_bytes() == b"{}"
    os.symlink(tmp_path / "real", tmp_path / "theirs")
    os.lchown(tmp_path / "theirs", 65534, 65534)                      # another user's link
    with pytest.raises(OSError, match="another user could change"):
        atomic.write_bytes(str(tmp_path / "theirs" / "out" / "b.json"), b"{}")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)                                           # anyone may swap it
    os.symlink(tmp_path / "real", shared / "link")
    with pytest.raises(OSError, match="another user could change"):
        atomic.write_bytes(str(shared / "link" / "out" / "c.json"), b"{}")
    assert sorted(p.name for p in (tmp_path / "real" / "out").iterdir()) == ["a.json"]


def test_private_directories_are_closed_to_other_users(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)                                          # sticky: not enough
    atomic.write_bytes(str(shared / "map.png"), b"x")                 # a PNG may go there
    with pytest.raises(OSError, match="can be written by other users"):
        atomic.write_bytes(str(shared / "s.json"), b"{}", private=True)
    (shared / "mine").mkdir(mode=0o755)                               # below a sticky one: fine
    atomic.write_bytes(str(shared / "mine" / "s.json"), b"{}", private=True)
    os.chown(shared / "mine", 65534, 65534)
    with pytest.raises(OSError, match="owned by uid 65534"):
        atomic.write_bytes(str(shared / "mine" / "s.json"), b"{}", private=True)
