"""image_lock on real files, real loop devices and real processes: one daemon per image,
whatever the spelling; a killed holder leaves no stale lock."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from tests.support.images import make_image
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image

MiB = 1 << 20


@pytest.fixture
def locks(tmp_path):
    return str(tmp_path / "locks")


def test_every_spelling_of_a_file_meets_one_lock(tmp_path, locks, monkeypatch):
    path = make_image(tmp_path / "part.img", 4 * MiB)
    os.symlink(path, tmp_path / "link.img")
    os.link(path, tmp_path / "hard.img")
    monkeypatch.chdir(tmp_path)
    with open_image(str(path)) as img, image_lock.acquire(img, locks) as lock:
        assert open(lock.path).read() == f"pid {os.getpid()} {path}\n"
        for other in ("./part.img", "part.img", str(tmp_path / "link.img"), "hard.img",
                      f"{tmp_path}/../{tmp_path.name}/part.img"):
            with open_image(other) as again, pytest.raises(image_lock.ImageBusyError) as err:
                image_lock.acquire(again, locks)
            msg = str(err.value)
            assert "\n" not in msg and f"pid {os.getpid()}" in msg and other in msg
            assert err.value.exit_code == 78
    with open_image("./part.img") as img, image_lock.acquire(img, locks):
        pass                                             # released: free again


def test_another_file_is_another_lock(tmp_path, locks):
    a = make_image(tmp_path / "a.img", MiB)
    b = make_image(tmp_path / "b.img", MiB)
    with open_image(str(a)) as ia, open_image(str(b)) as ib, \
            image_lock.acquire(ia, locks), image_lock.acquire(ib, locks):
        assert len(os.listdir(locks)) == 2


@pytest.mark.root
def test_every_node_of_a_block_device_meets_one_lock(tmp_path, locks, loop_device_of):
    dev = loop_device_of(8 * MiB)
    os.symlink(dev, tmp_path / "lv")                      # /dev/vg/lv -> ../dm-3
    rdev = os.stat(dev).st_rdev
    os.mknod(tmp_path / "node", stat.S_IFBLK | 0o600, rdev)   # /dev/mapper/vg-lv
    with open_image(dev) as img, image_lock.acquire(img, locks) as lock:
        assert os.path.basename(lock.path) == f"blk-{os.major(rdev)}:{os.minor(rdev)}.lock"
        for other in (str(tmp_path / "lv"), str(tmp_path / "node")):
            with open_image(other) as again, pytest.raises(image_lock.ImageBusyError):
                image_lock.acquire(again, locks)


HOLD = """
import sys, time
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image
img = open_image(sys.argv[1])
image_lock.acquire(img, sys.argv[2])
print("locked", flush=True)
time.sleep(60)
"""


def test_a_killed_holder_leaves_no_stale_lock(tmp_path, locks):
    path = make_image(tmp_path / "disk.img", MiB)
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(path), locks], stdout=subprocess.PIPE,
                         text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__)))))
    try:
        assert p.stdout.readline().strip() == "locked"
        with open_image(str(path)) as img, pytest.raises(image_lock.ImageBusyError) as err:
            image_lock.acquire(img, locks)
        assert f"pid {p.pid}" in str(err.value)
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
        with open_image(str(path)) as img, image_lock.acquire(img, locks) as lock:
            assert open(lock.path).read().startswith(f"pid {os.getpid()} ")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_an_unwritable_lock_directory_is_one_clear_line(tmp_path):
    path = make_image(tmp_path / "disk.img", MiB)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with open_image(str(path)) as img, pytest.raises(image_lock.ConfigError) as err:
        image_lock.acquire(img, str(blocker / "locks"))
    assert "VMDISKTOUCH_LOCK_DIR" in str(err.value) and "\n" not in str(err.value)


def test_the_directory_follows_the_user_and_the_environment(monkeypatch):
    monkeypatch.setenv(image_lock.ENV, "/somewhere")
    assert image_lock.lock_dir() == "/somewhere"
    monkeypatch.delenv(image_lock.ENV)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert image_lock.lock_dir() == "/run/vmdisktouch/locks"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert image_lock.lock_dir() == "/run/user/1000/vmdisktouch/locks"



# -- issue 31: what a local user or a stray file can plant -----------------------------------

def lock_path(directory, image) -> str:
    return os.path.join(str(directory), image_lock.lock_name(os.stat(image)))


@pytest.mark.parametrize("plant,why", [
    (os.mkfifo, "it is a FIFO, not a regular file"),
    (lambda p: os.symlink("/etc/passwd", p), "it is a symbolic link"),
    (lambda p: os.link(p + ".victim", p), "it has 2 hard links"),
])
def test_a_planted_lock_file_is_refused_not_truncated(tmp_path, locks, plant, why):
    path = make_image(tmp_path / "disk.img", MiB)
    os.makedirs(locks, mode=0o700)
    lock = lock_path(locks, path)
    with open(lock + ".victim", "w") as f:
        f.write("keep")
    plant(lock)
    with open_image(str(path)) as img, pytest.raises(image_lock.ConfigError, match=why) as err:
        image_lock.acquire(img, locks)
    assert err.value.exit_code == 78 and "\n" not in str(err.value)
    assert open(lock + ".victim").read() == "keep"


@pytest.mark.parametrize("make,why", [
    (lambda d: (os.mkdir(d), os.chmod(d, 0o777)), "can be written by other users"),
    (lambda d: (os.mkdir(d), os.chown(d, 65534, 65534)), "owned by uid 65534"),
    (lambda d: (os.mkdir(d + ".real"), os.symlink(d + ".real", d)), "is a symbolic link"),
])
def test_a_lock_directory_others_control_is_refused(tmp_path, locks, make, why):
    path = make_image(tmp_path / "disk.img", MiB)
    make(locks)
    with open_image(str(path)) as img, pytest.raises(image_lock.ConfigError, match=why):
        image_lock.acquire(img, locks)


def test_lock_files_are_private_and_the_holder_is_shown_printable(tmp_path, locks):
    path = make_image(tmp_path / "disk.img", MiB)
    os.makedirs(locks, mode=0o700)
    lock = lock_path(locks, path)
    with open(lock, "w") as f:
        f.write("\x1b[2J\x1b]0;title\x07pid 7 /x" + "\u202e" * 3 + "y" * 5000)
    os.chmod(lock, 0o644)
    with open(lock) as held:
        fcntl_flock(held)
        with open_image(str(path)) as img, pytest.raises(image_lock.ImageBusyError) as err:
            image_lock.acquire(img, locks)
    msg = str(err.value)
    assert msg.isprintable() and "?[2J?]0;title?pid 7 /x???yyy" in msg
    assert msg.count("y") < image_lock.HOLDER_CHARS + 10
    with open_image(str(path)) as img, image_lock.acquire(img, locks):
        assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600


def fcntl_flock(f) -> None:
    import fcntl
    fcntl.flock(f, fcntl.LOCK_EX)
