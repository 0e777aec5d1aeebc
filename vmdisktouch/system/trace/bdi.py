"""The name of the backing device (bdi) the kernel's writeback tracepoints give a file.

Theory of operation. ``writeback:writeback_dirty_folio`` names the page cache's
file by ``ino`` and by ``bdi_dev_name(inode_to_bdi(inode))``: for a block device
(its inode on the kernel's bdev file system) the bdi of its whole disk; for a
regular file the bdi of its superblock, which a file system on a block device
takes from that device's whole disk. A disk's bdi is named ``MAJ:MIN`` after the
disk and listed in ``/sys/class/bdi``; a partition's disk is the parent of its
``/sys/dev/block/MAJ:MIN`` (which has a ``partition`` file). So ``name_of`` is
the whole disk of ``st_dev`` (``st_rdev`` for a block device) when that is a bdi.

Two exceptions are known. fuseblk (ntfs-3g and the like) sits on a block device
but gives its superblock a bdi of its own, ``MAJ:MIN-fuseblk`` after the partition
itself: that name is taken when it exists. A file system with a bdi named after
its type (``btrfs-1``, ``cifs-N``, ``ceph-N``, ``9p-N``: ``super_setup_bdi``) or
none (tmpfs: "(unknown)") has no name to find here: ``name_of`` says None. NFS
and FUSE name theirs ``MAJ:MIN`` after their anonymous ``st_dev``, which
``/sys/class/bdi`` lists, so they are found.

The other tracepoints name a device by the kernel's own dev_t, ``major << 20 |
minor`` (``kernel_dev``), not by the user-space ``st_dev``.
"""

from __future__ import annotations

import os
import stat

SYSFS = "/sys"

__all__ = ["kernel_dev", "name_of"]


def kernel_dev(dev: int) -> int:
    """The kernel's dev_t (``major << 20 | minor``) of a user-space ``st_dev``/``st_rdev``."""
    return os.major(dev) << 20 | os.minor(dev)


def _whole_disk(dev: str, sysfs: str) -> str:
    """``MAJ:MIN`` of the whole disk of block device ``dev`` (itself when not a partition)."""
    node = f"{sysfs}/dev/block/{dev}"
    if not os.path.exists(f"{node}/partition"):
        return dev
    try:
        with open(f"{node}/../dev") as f:          # ".." of the symlink's target: the disk
            return f.read().strip()
    except OSError:
        return dev


def name_of(st: os.stat_result, sysfs: str = SYSFS) -> str | None:
    """The bdi name the writeback tracepoints report for the file of ``st``, or None when
    sysfs does not tell it (module docstring)."""
    block = stat.S_ISBLK(st.st_mode)
    dev = st.st_rdev if block else st.st_dev
    own = f"{os.major(dev)}:{os.minor(dev)}"
    names = ([] if block else [f"{own}-fuseblk"]) + [_whole_disk(own, sysfs)]
    return next((n for n in names if os.path.isdir(f"{sysfs}/class/bdi/{n}")), None)
