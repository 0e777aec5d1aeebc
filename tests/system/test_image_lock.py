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


# -- issue 45: lock files come and go with their locks -----------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def holder(image, locks) -> subprocess.Popen:
    """A child holding ``image``'s lock until killed."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(image), locks], stdout=subprocess.PIPE,
                         text=True, cwd=REPO)
    assert p.stdout.readline().strip() == "locked"
    return p


def test_a_released_lock_leaves_no_file(tmp_path, locks):
    path = make_image(tmp_path / "disk.img", MiB)
    with open_image(str(path)) as img:
        lock = image_lock.acquire(img, locks)
        assert os.listdir(locks) == [os.path.basename(lock.path)]
        lock.release()
        assert os.listdir(locks) == []
        with image_lock.acquire(img, locks):                 # and it is taken again
            pass
    assert os.listdir(locks) == []


def test_stale_lock_files_are_swept_and_held_ones_kept(tmp_path, locks):
    """A killed daemon's file goes at the next lock taken in the directory; a live one's
    stays, as do files that are not this project's locks."""
    a, b, c = (make_image(tmp_path / f"{n}.img", MiB) for n in "abc")
    live, killed = holder(a, locks), holder(b, locks)
    try:
        killed.kill()
        killed.wait(10)
        with open(os.path.join(locks, "blk-7:99.lock"), "w") as f:   # an older daemon's
            f.write("pid 1 /dev/loop99\n")
        with open(os.path.join(locks, "notes.txt"), "w") as f:
            f.write("keep")
        with open_image(str(c)) as img, image_lock.acquire(img, locks) as lock:
            assert sorted(os.listdir(locks)) == sorted(
                [lock_path("", a), os.path.basename(lock.path), "notes.txt"])
    finally:
        live.kill()
        live.wait()


RACE = """
import os, sys, time
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image
image, locks, marks, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
img = open_image(image)
mark = os.path.join(marks, os.path.basename(image) + ".held")
taken = busy = overlap = errors = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        lock = image_lock.acquire(img, locks)
    except image_lock.ImageBusyError:
        busy += 1
        continue
    except image_lock.ConfigError as exc:
        errors += 1                      # the lock file vanished under it, say
        print(exc, file=sys.stderr)
        continue
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        overlap += 1                     # another process holds the same image's lock
    else:
        os.unlink(mark)
    lock.release()
    taken += 1
print(taken, busy, overlap, errors, flush=True)
"""


def race(tmp_path, locks, images, per_image: int, seconds: float = 4.0) -> list:
    """``per_image`` processes looping on each image's lock for ``seconds``: their
    (taken, busy, overlap, errors) counts."""
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    procs = [subprocess.Popen([sys.executable, "-c", RACE, str(image), locks, str(marks),
                               str(seconds)], stdout=subprocess.PIPE, text=True, cwd=REPO)
             for image in images for _ in range(per_image)]
    try:
        return [tuple(map(int, p.communicate(timeout=seconds + 60)[0].split()))
                for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_one_holder_at_a_time_while_lock_files_come_and_go(tmp_path, locks):
    """Four processes take and release one image's lock as fast as they can: a release
    unlinks the file while another has it open, and that one must not hold the old inode
    while a third makes a new one."""
    path = make_image(tmp_path / "disk.img", MiB)
    counts = race(tmp_path, locks, [path], per_image=4)
    assert sum(c[0] for c in counts) > 100, counts
    assert [c[2:] for c in counts] == [(0, 0)] * 4, f"two holders at once, or errors: {counts}"
    assert os.listdir(locks) == []


def test_a_sweep_never_makes_another_image_look_busy(tmp_path, locks):
    """Daemons of different images sweep each other's directory as they lock: none of
    them is ever refused its own image."""
    images = [make_image(tmp_path / f"{n}.img", MiB) for n in "ab"]
    counts = race(tmp_path, locks, images, per_image=1)
    assert all(c[0] > 50 for c in counts), counts
    assert [c[1:] for c in counts] == [(0, 0, 0)] * 2, f"refused as busy: {counts}"
    assert os.listdir(locks) == []
