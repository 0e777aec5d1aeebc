"""io_watch.scan_openers on real processes: who has an image open, and which way.

A process that holds the image's lock (``image_lock``: the daemon serving it)
is left out and named, whatever its descriptors; a process with an
``O_DIRECT`` descriptor and no lock is a guest's ``cache=none``; one with a
lock file of another image is not the daemon of this one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.images import make_image
from vmdisktouch.system import image_lock
from vmdisktouch.system.image import open_image
from vmdisktouch.system.observe.io_watch import scan_openers

MiB = 1 << 20

HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    image, lock, direct = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    fd = os.open(image, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    if lock:
        lfd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lfd, fcntl.LOCK_EX)
    print("ready", flush=True)
    sys.stdin.read()
""")


def holder(image: str, lock: str = "", direct: bool = True) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, image, lock, "1" if direct else "0"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    return p


def done(*procs) -> None:
    for p in procs:
        p.stdin.close()
        p.wait(10)


def test_the_lock_holder_is_named_and_left_out_a_guest_is_not(tmp_path):
    image = make_image(tmp_path / "disk.raw", 4 * MiB, sparse=False)
    other = make_image(tmp_path / "other.raw", 4 * MiB, sparse=False)
    locks = tmp_path / "locks"
    locks.mkdir()
    own = str(locks / image_lock.lock_name(os.stat(image)))
    daemon = holder(image, own)                            # O_DIRECT, like its miss probe
    guest = holder(image, direct=False)                    # buffered: writethrough
    stranger = holder(image, str(locks / image_lock.lock_name(os.stat(other))))
    try:
        seen = scan_openers(image)
        assert seen.daemon == daemon.pid
        assert seen.pids == {guest.pid: False, stranger.pid: True}
    finally:
        done(daemon, guest, stranger)


@pytest.mark.root
def test_a_real_image_lock_names_this_process_s_daemon(tmp_path):
    """The lock ``image_lock.acquire`` takes, seen from another process's scan."""
    image = make_image(tmp_path / "disk.raw", 4 * MiB, sparse=False)
    img = open_image(image)
    try:
        with image_lock.acquire(img, str(tmp_path / "locks")):
            code = ("import sys; from vmdisktouch.system.observe.io_watch import scan_openers;"
                    " s = scan_openers(sys.argv[1]); print(s.daemon, s.pids)")
            out = subprocess.run([sys.executable, "-c", code, image], capture_output=True,
                                 text=True, check=True).stdout
        assert out == f"{os.getpid()} {{}}\n", out
    finally:
        img.close()


def test_another_vmdisktouch_process_is_left_out_unnamed(tmp_path):
    """A vmdisktouch process without the lock (``advise``'s miss probe, O_DIRECT) is not a
    guest's cache=none: left out, and not taken for the serving daemon either."""
    image = make_image(tmp_path / "disk.raw", 4 * MiB, sparse=False)
    script = tmp_path / "vmdisktouch"                      # as /usr/bin/vmdisktouch runs
    script.write_text(HOLDER)
    advise = subprocess.Popen([sys.executable, str(script), image, "", "1"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert advise.stdout.readline() == "ready\n"
    guest = holder(image, direct=True)                     # cache=none
    try:
        seen = scan_openers(image)
        assert seen.daemon is None
        assert seen.pids == {guest.pid: True}
    finally:
        done(advise, guest)
