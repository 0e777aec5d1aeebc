"""BlockChecksums on real files written with os.pwrite (the path QEMU's writes take)."""

import os

import numpy as np
import pytest

from vmdisktouch.system.checksums import BlockChecksums
from vmdisktouch.system.image import open_image

MiB = 1 << 20
BS = MiB


@pytest.fixture
def image(tmp_path):
    """A 32 MiB file of distinct random blocks; yields (path, read fd, write fd)."""
    path = tmp_path / "disk.raw"
    with open(path, "wb") as f:
        for _ in range(32):
            f.write(os.urandom(MiB))
    rfd = os.open(path, os.O_RDONLY)
    wfd = os.open(path, os.O_WRONLY)
    yield str(path), rfd, wfd
    os.close(rfd)
    os.close(wfd)


def sums_of(path, **kw) -> BlockChecksums:
    """Checksums of the image at ``path`` (they read on a descriptor of their own)."""
    with open_image(str(path)) as img:
        return BlockChecksums(img, BS, **kw)


class FakeClock:
    """The checksums' wall clock (ns), moved by the test instead of sleeping.

    ``written()`` sets it to the file's last change (mtime or ctime: utime
    cannot set ctime, so the clock follows the file): a write happens "now".
    """

    def __init__(self, path):
        self.path = path
        self.written()

    def __call__(self) -> int:
        return self.now

    def written(self) -> None:
        st = os.stat(self.path)
        self.now = max(st.st_mtime_ns, st.st_ctime_ns)

    def advance(self, seconds: float) -> None:
        self.now += int(seconds * 1e9)


def flip(rfd, wfd, offset, length):
    """Write the complement of what is there: a write that surely changes every byte."""
    old = os.pread(rfd, length, offset)
    os.pwrite(wfd, bytes(b ^ 0xFF for b in old), offset)


def changed_set(sums, blocks, size):
    blocks = np.asarray(blocks)
    return set(blocks[sums.update(blocks, size) > 0].tolist())


@pytest.mark.parametrize("read_bytes", [8 * MiB, 3 * MiB, 1])
def test_changes_detected_exactly_for_the_blocks_written(image, read_bytes):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    sums = sums_of(path, read_bytes=read_bytes)
    every = np.arange(32)
    assert changed_set(sums, every, size) == set()          # first sight is not a change
    assert changed_set(sums, every, size) == set()          # nothing written

    flip(rfd, wfd, 3 * BS + 8192, 4096)                     # inside block 3
    flip(rfd, wfd, 7 * BS, 1)                               # one byte at the start of block 7
    flip(rfd, wfd, 11 * BS - 4096, 8192)                    # straddles blocks 10 and 11
    flip(rfd, wfd, 32 * BS - 1, 1)                          # the last byte of the file
    assert changed_set(sums, every, size) == {3, 7, 10, 11, 31}
    assert changed_set(sums, every, size) == set()


def test_the_fraction_of_a_block_rewritten_is_measured_in_sixteenths(image):
    """A hot zone's many writes and one stray write per block must not look alike."""
    path, rfd, wfd = image
    size = os.path.getsize(path)
    sums = sums_of(path)
    blocks = np.arange(4, 8)
    sums.update(blocks, size)
    part = BS // 16
    os.pwrite(wfd, b"\x5a" * 100, 4 * BS + 3 * part + 7)     # one stray write: 1 part of 16
    for k in range(0, 16, 2):                                  # every second part of block 5
        os.pwrite(wfd, b"\xa5" * 4096, 5 * BS + k * part)
    os.pwrite(wfd, os.urandom(BS), 6 * BS)                    # block 6 written all over
    out = sums.update(blocks, size)
    assert out.dtype == np.float32
    assert out.tolist() == [1 / 16, 0.5, 1.0, 0.0]
    assert not sums.update(blocks, size).any()


def test_result_is_aligned_with_the_given_order(image):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    sums = sums_of(path)
    blocks = np.array([9, 2, 5, 2, 40, -1])                 # unsorted, duplicate, beyond, negative
    assert not sums.update(blocks, size).any()
    flip(rfd, wfd, 2 * BS + 100, 1)
    assert (sums.update(blocks, size) > 0).tolist() == [False, True, False, True, False, False]


def test_a_block_not_seen_last_cycle_starts_fresh(image):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    sums = sums_of(path)
    sums.update(np.arange(0, 5), size)
    os.pwrite(wfd, b"new", 6 * BS)      # block 6 is seen for the first time below
    os.pwrite(wfd, b"new", 2 * BS)      # block 2 was seen last cycle
    assert changed_set(sums, np.arange(0, 9), size) == {2}

    # Block 0 is left out for one cycle (released), written, then seen again.
    sums.update(np.arange(1, 9), size)
    os.pwrite(wfd, b"again", 0)
    assert changed_set(sums, np.arange(0, 9), size) == set()
    assert set(sums.known().tolist()) == set(range(9))

    sums.forget([4])
    os.pwrite(wfd, b"forgotten", 4 * BS)
    assert changed_set(sums, np.arange(0, 9), size) == set()


def test_truncation_between_size_check_and_read(image):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    sums = sums_of(path)
    every = np.arange(32)
    sums.update(every, size)

    new_size = 20 * BS + 12345
    os.truncate(path, new_size)
    # The caller still believes the old size: reads come back short, nothing crashes.
    changed = sums.update(every, size)
    assert not changed[:20].any() and not changed[21:].any()
    known = sums.known()
    assert known.max() <= 20 and set(range(20)) <= set(known.tolist())

    # With the new size the partial block 20 starts fresh, then behaves normally.
    assert changed_set(sums, every, new_size) == set()
    os.pwrite(wfd, b"tail", 20 * BS + 100)
    os.pwrite(wfd, b"head", 5 * BS)
    assert changed_set(sums, every, new_size) == {5, 20}
    assert sums.known().max() == 20

    # Truncated to nothing at all.
    os.truncate(path, 0)
    assert not sums.update(every, new_size).any()
    assert not sums.update(every, 0).any()
    assert sums.known().size == 0


def test_growth_and_resize(image):
    path, rfd, wfd = image
    sums = sums_of(path)
    os.truncate(path, 10 * BS + 5)
    sums.update(np.arange(11), 10 * BS + 5)
    os.truncate(path, 12 * BS)                    # block 10 grows to full: not a rewrite
    assert changed_set(sums, np.arange(12), 12 * BS) == set()
    sums.resize(4)
    assert sums.known().tolist() == [0, 1, 2, 3]
    sums.resize(12)
    assert changed_set(sums, np.arange(12), 12 * BS) == set()
    flip(rfd, wfd, 11 * BS, 1)
    assert changed_set(sums, np.arange(12), 12 * BS) == {11}


def test_baseline_makes_a_write_right_after_the_load_a_change(image):
    """Blocks 4-5 are taken into hold after this cycle's update; the guest writes at once."""
    path, rfd, wfd = image
    size = os.path.getsize(path)
    sums = sums_of(path)
    assert changed_set(sums, [1, 2], size) == set()
    sums.baseline([4, 5], size)                           # the load of this cycle
    os.pwrite(wfd, b"\x77" * 4096, 5 * BS + 4096)         # written before the next cycle
    flip(rfd, wfd, 2 * BS, 1)                    # and one of the older holds
    assert changed_set(sums, [1, 2, 4, 5], size) == {2, 5}
    # Without the baseline the same write would be the block's first hash, not a change.
    fresh = sums_of(path)
    assert changed_set(fresh, [1, 2], size) == set()
    os.pwrite(wfd, b"\x78" * 4096, 5 * BS + 4096)
    assert changed_set(fresh, [1, 2, 4, 5], size) == set()


def test_a_pass_is_skipped_only_while_the_file_is_provably_unwritten(image):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    clock = FakeClock(path)
    sums = sums_of(path, clock=clock)
    every = np.arange(32)
    sums.update(every, size, skip_unwritten=True)
    assert not sums.skipped                                # nothing to compare with yet
    sums.update(every, size, skip_unwritten=True)
    assert not sums.skipped                                # the file was written < 1 s ago
    clock.advance(1.2)
    sums.update(every, size, skip_unwritten=True)          # stamp taken > 1 s after the write
    assert not sums.skipped
    assert not sums.update(every, size, skip_unwritten=True).any()
    assert sums.skipped                                    # unchanged and settled: skipped
    flip(rfd, wfd, 9 * BS + 5, 1)
    clock.written()
    changed = sums.update(every, size, skip_unwritten=True)
    assert not sums.skipped and set(every[changed > 0].tolist()) == {9}
    assert not sums.update(every, size, skip_unwritten=True).any()
    assert not sums.skipped                                # the write is recent: not settled


def test_a_skip_keeps_the_hashes_so_a_later_write_is_still_a_change(image):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    clock = FakeClock(path)
    sums = sums_of(path, clock=clock)
    clock.advance(1.2)
    sums.update([3, 4], size, skip_unwritten=True)
    sums.update([3, 4], size, skip_unwritten=True)
    assert sums.skipped
    os.pwrite(wfd, b"\x42" * 10, 4 * BS)
    assert (sums.update([3, 4], size, skip_unwritten=True) > 0).tolist() == [False, True]


def test_a_lease_renewed_on_an_unwritten_file_is_not_read_again(image, monkeypatch):
    """Blocks released and held again: their stored hashes serve while nothing was written."""
    path, rfd, wfd = image
    size = os.path.getsize(path)
    clock = FakeClock(path)
    sums = sums_of(path, clock=clock)
    clock.advance(1.2)
    sums.update([3, 4, 5], size, skip_unwritten=True)      # a pass: the stamp is settled
    sums.update([3], size, skip_unwritten=True)            # 4 and 5 released; pass skipped
    assert sums.skipped
    read = []
    real = sums._hash_blocks
    monkeypatch.setattr(sums, "_hash_blocks",
                        lambda blocks, size: (read.extend(blocks.tolist()), real(blocks, size))[1])
    sums.baseline([4, 5, 6], size)                         # 4 and 5 taken again, 6 is new
    assert read == [6]
    os.pwrite(wfd, b"\x42" * 10, 5 * BS)                  # the guest writes one of them
    clock.written()
    assert (sums.update([3, 4, 5, 6], size, skip_unwritten=True) > 0).tolist() == \
        [False, False, True, False]
    read.clear()
    sums.update([3], size, skip_unwritten=True)            # written < 1 s ago: a real pass
    sums.baseline([4, 5], size)                            # so a renewal is read again
    assert read == [3, 4, 5]


def test_hashing_caches_nothing_beyond_the_blocks_hashed(image):
    """Readahead of the checksum reads would look like the guest's use next cycle."""
    from tests.pagecache import evict
    from vmdisktouch.system import residency
    path, rfd, wfd = image
    size = os.path.getsize(path)
    evict(path)
    sums = sums_of(path)
    sums.update([5, 6], size)
    sums.baseline([20], size)
    counts = residency.scan(rfd, size, BS).counts
    assert counts[[5, 6, 20]].tolist() == [256] * 3
    assert int(counts.sum()) == 3 * 256, np.flatnonzero(counts).tolist()
    sums.close()
    sums.close()
