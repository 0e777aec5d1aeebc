"""system.opens: every open of a watched image, by any process, wakes the loop (issue 54,
break 2: QEMU's open of an image comes before it activates the disk)."""

import os
import subprocess
import threading
import time

from vmdisktouch.system.opens import OpenWatch


def test_an_open_by_another_process_wakes_and_nothing_else_does(tmp_path):
    img = tmp_path / "a.raw"
    img.write_bytes(b"\0" * 65536)
    link = tmp_path / "by-link"
    link.symlink_to(img)
    other = tmp_path / "b.raw"
    other.write_bytes(b"\0" * 4096)
    wake = threading.Event()
    w = OpenWatch(wake)
    try:
        assert w.add(str(link))                         # the link's target is watched
        assert not w.add(str(tmp_path / "missing"))     # said at DEBUG, not raised
        os.stat(img)                                    # no open: no wake
        with open(other, "rb"):                         # another file: no wake
            pass
        assert not wake.wait(0.3)
        subprocess.run(["cat", str(img)], stdout=subprocess.DEVNULL, check=True)
        assert wake.wait(2.0), "an open of the image did not wake"
        wake.clear()
        assert not wake.wait(0.3)                     # one open, one wake
        t0 = time.monotonic()
        fd = os.open(img, os.O_RDONLY)                  # by this process too (no pid in it)
        os.close(fd)
        assert wake.wait(2.0) and time.monotonic() - t0 < 1.0
    finally:
        w.close()
    thread = w._thread
    assert thread is not None and not thread.is_alive()     # close() ends its thread


def test_close_without_a_watch_is_clean():
    w = OpenWatch(threading.Event())
    w.close()
    assert w._thread is None


def test_a_disarmed_image_does_not_wake_and_a_burst_wakes_at_most_once_a_gap(tmp_path):
    """Opens wake only while armed (held, no domain using it), at most one wake each
    ``GAP``: a process opening the image in a loop costs at most 10 cycles a second, and
    the open in a gap still wakes, at its end."""
    from vmdisktouch.system import opens
    img = tmp_path / "a.raw"
    img.write_bytes(b"\0" * 4096)

    class Counter:
        def __init__(self):
            self.n, self.event = 0, threading.Event()

        def set(self):
            self.n += 1
            self.event.set()

    wake = Counter()
    w = OpenWatch(wake)
    try:
        assert w.add(str(img))
        w.arm(str(img), False)
        os.close(os.open(img, os.O_RDONLY))
        assert not wake.event.wait(0.3) and wake.n == 0
        w.arm(str(img), True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:             # about 1000 opens in a second
            os.close(os.open(img, os.O_RDONLY))
            time.sleep(0.001)
        time.sleep(2 * opens.GAP)                      # the last one's wake, at its gap's end
        n = wake.n
        assert 2 <= n <= 1.0 / opens.GAP + 2, n
        wake.event.clear()
        last = time.monotonic()
        os.close(os.open(img, os.O_RDONLY))            # after the burst: one wake within a gap
        assert wake.event.wait(1.0) and time.monotonic() - last < opens.GAP + 0.5
        assert wake.n == n + 1
    finally:
        w.close()


def test_with_the_verified_descriptor_the_file_is_watched_not_what_its_path_names(tmp_path):
    """``add(path, fd)`` watches the file the daemon opened: a file planted at its path
    since does not wake, the image renamed away still does."""
    img = tmp_path / "a.raw"
    img.write_bytes(b"\0" * 4096)
    fd = os.open(img, os.O_RDONLY)
    wake = threading.Event()
    w = OpenWatch(wake)
    try:
        assert w.add(str(img), fd)
        moved = tmp_path / "moved.raw"
        os.rename(img, moved)
        img.write_bytes(b"\1" * 4096)                   # another file at the path
        os.close(os.open(img, os.O_RDONLY))
        assert not wake.wait(0.3), "an open of the file planted at the path woke"
        os.close(os.open(moved, os.O_RDONLY))
        assert wake.wait(2.0), "an open of the verified file did not wake"
    finally:
        w.close()
        os.close(fd)
