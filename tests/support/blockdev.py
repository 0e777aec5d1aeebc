"""Loop devices and read throttles, for tests and benchmarks that need a block device
whose reads cost a known amount: a loop device over a cached file answers from memory,
and the blkio group's throttle makes its reads wait like a loaded array's."""
from __future__ import annotations

import contextlib
import os
import subprocess

from tests.support.common import require_tool

# The throttle of the blkio group this process runs in: cgroup v1, as on these machines.
BLKIO_ROOT = "/sys/fs/cgroup/blkio"


@contextlib.contextmanager
def loop_device(path: str, direct_io: bool = False):
    """A loop device over ``path``, detached at the end; ``direct_io`` makes the loop
    driver read its backing file past the page cache."""
    losetup = require_tool("losetup")
    dev = subprocess.run([losetup, "--find", "--show", f"--direct-io={'on' if direct_io else 'off'}",
                          path], check=True, capture_output=True, text=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run([losetup, "-d", dev], check=True)


def own_blkio_group() -> str:
    """The blkio group directory of this process (cgroup v1)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, rel = line.rstrip("\n").split(":", 2)
            if "blkio" in controllers.split(","):
                return os.path.join(BLKIO_ROOT, rel.lstrip("/"))
    raise RuntimeError("no cgroup v1 blkio controller: a read throttle needs one")


@contextlib.contextmanager
def read_throttle(dev: str, riops: int):
    """Caps the reads this process's blkio group sends to ``dev`` at ``riops`` a second;
    the cap removed at the end."""
    rdev = os.stat(dev).st_rdev
    rule = f"{os.major(rdev)}:{os.minor(rdev)}"
    knob = os.path.join(own_blkio_group(), "blkio.throttle.read_iops_device")
    with open(knob, "w") as f:
        f.write(f"{rule} {riops}")
    try:
        yield
    finally:
        with open(knob, "w") as f:
            f.write(f"{rule} 0")
