"""io_watch.switch_cost on real files: what a switch to cache=writethrough costs.

A wake-up is timed between two real processes (the child reaped); a write
through real qemu-nbd and qemu-img bench, each of an unnamed scratch file in
the image's directory that is gone at close: the image and its directory are
left as they were, and no qemu-nbd is left running. A block device gets no
write cost (nothing writes to it); a directory that takes no scratch file
gives none either, without an error.
"""

from __future__ import annotations

import os

from tests.support.blockdev import loop_device
from tests.support.images import make_image
from vmdisktouch.system.observe import io_watch

MiB = 1 << 20


def children() -> list[str]:
    """This process's children's command names."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                name, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        if int(rest.split()[1]) == os.getpid():
            out.append(name.split("(", 1)[1])
    return out


def test_a_file_image_gets_a_read_and_a_write_cost_and_its_directory_is_left_alone(tmp_path):
    image = make_image(tmp_path / "a.raw", 4 * MiB, sparse=False)
    before = (os.stat(image).st_mtime_ns, sorted(os.listdir(tmp_path)))
    fds = sorted(os.listdir("/proc/self/fd"))
    cost = io_watch.switch_cost([str(image)])[str(image)]
    assert cost.read is not None and 0 < cost.read < 1e-3, cost   # µs, not nothing
    # a write: the pool's hand-offs and a flush, more than a read's wake-up
    assert cost.write is not None and cost.write > cost.read, cost
    assert (os.stat(image).st_mtime_ns, sorted(os.listdir(tmp_path))) == before
    assert sorted(os.listdir("/proc/self/fd")) == fds     # the scratch descriptors closed
    assert not [c for c in children() if c in ("qemu-nbd", "python3", "python")]


def test_it_is_measured_once_per_directory(tmp_path):
    images = [str(make_image(tmp_path / f"{k}.raw", MiB, sparse=False)) for k in range(3)]
    costs = io_watch.switch_cost(images)
    assert len({costs[p] for p in images}) == 1, costs


def test_a_block_device_gets_no_write_cost_and_a_stop_measures_nothing(tmp_path):
    image = make_image(tmp_path / "b.raw", 8 * MiB, sparse=False)
    with loop_device(str(image)) as dev:
        cost = io_watch.switch_cost([dev])[dev]
        assert cost.read is not None and cost.read > 0 and cost.write is None, cost
    stopped = io_watch.switch_cost([str(image)], stop=lambda: True)[str(image)]
    assert stopped == io_watch.PathCost(None, None)


def test_a_directory_that_takes_no_scratch_file_gives_no_write_cost():
    assert io_watch._scratch("/proc") is None             # no O_TMPFILE there
    assert io_watch.switch_extras("qemu-nbd", "qemu-img", "/proc", lambda: False) == (None, None)
