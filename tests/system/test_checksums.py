"""BlockChecksums on real files written with os.pwrite (the path QEMU's writes take)."""

import math
import os

import numpy as np
import pytest

from vmdisktouch.system import files
from vmdisktouch.system.observe.checksums import BlockChecksums
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
    from tests.support.images import evict
    from vmdisktouch.system.observe import residency
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


# -- rotation: update(..., share=s) hashes ceil(s * n) of the n held blocks a call --------

HELD = np.array([*range(0, 6), *range(8, 21), 23, *range(26, 32)])   # 26 blocks, 4 runs


class Reads:
    """``files.pread_into`` wrapped: the real read, with what it returned recorded."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = files.pread_into

        def pread_into(fd, buf, offset):
            got = real(fd, buf, offset)
            self.calls.append((offset, got))
            return got
        monkeypatch.setattr(files, "pread_into", pread_into)

    def take(self) -> tuple[int, set]:
        """(bytes read, blocks read) since the last take."""
        calls, self.calls = self.calls, []
        blocks = set()
        for offset, n in calls:
            blocks.update(range(offset // BS, -(-(offset + n) // BS)))
        return sum(n for _, n in calls), blocks


@pytest.mark.parametrize("share", [1 / 64, 1 / 16, 1 / 5, 0.3, 1 / 3, 0.5, 1.0])
def test_rotation_hashes_every_held_block_within_ceil_one_over_share_calls(
        image, monkeypatch, share):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    sums = sums_of(path, read_bytes=3 * MiB)
    reads = Reads(monkeypatch)
    k = max(1, math.ceil(share * HELD.size))
    window = math.ceil(1 / share)
    seen = []
    for _ in range(2 * window + 3):
        sums.update(HELD, size, share=share)
        nbytes, blocks = reads.take()
        assert nbytes == k * BS                  # the bound: share of the held bytes, read once
        assert len(blocks) == k and blocks <= set(HELD.tolist())
        seen.append(blocks)
    for start in range(len(seen) - window + 1):  # any ceil(1/share) consecutive calls cover all
        assert set().union(*seen[start:start + window]) == set(HELD.tolist())


def test_share_one_is_every_block_every_call(image, monkeypatch):
    """share=1 (the default) hashes and reports every given block on every call."""
    path, rfd, wfd = image
    size = os.path.getsize(path)
    default, explicit = sums_of(path), sums_of(path)
    reads = Reads(monkeypatch)
    for step in range(4):
        flip(rfd, wfd, (7 * step + 2) * BS + 100, 10)
        flip(rfd, wfd, 31 * BS + step, 1)
        a = default.update(HELD, size)
        assert reads.take() == (HELD.size * BS, set(HELD.tolist()))
        b = explicit.update(HELD, size, share=1.0)
        assert reads.take() == (HELD.size * BS, set(HELD.tolist()))
        assert a.tolist() == b.tolist()
        expect = set() if step == 0 else {7 * step + 2, 31} & set(HELD.tolist())
        assert set(HELD[a > 0].tolist()) == expect


def test_share_must_be_in_zero_to_one(image):
    path, rfd, wfd = image
    sums = sums_of(path)
    for share in (0, -0.5, 1.01):
        with pytest.raises(ValueError):
            sums.update(HELD, os.path.getsize(path), share=share)


def test_a_write_is_reported_once_on_the_turn_of_its_block(image, monkeypatch):
    """Writes land at every point of the rotation: each is reported by the first call hashing
    its block afterwards (within ceil(1/share) calls), and never again."""
    path, rfd, wfd = image
    size = os.path.getsize(path)
    share, window = 1 / 4, 4
    held = np.arange(32)
    sums = sums_of(path)
    sums.baseline(held, size)                        # as the daemon does for newly held blocks
    reads = Reads(monkeypatch)
    written, hashed, reported = {}, [], {}
    for call in range(16):
        if call < 9:
            block = (call * 7 + 3) % 32              # distinct blocks, before or after their turn
            flip(rfd, wfd, block * BS + 4096 * call, 4096)
            written[block] = call
        out = sums.update(held, size, share=share)
        hashed.append(reads.take()[1])
        assert out[out > 0].tolist() == [1 / 16] * int((out > 0).sum())   # one part each
        for block in held[out > 0].tolist():
            assert block not in reported, f"block {block} reported twice"
            assert block in hashed[call]             # only blocks hashed now are reported
            reported[block] = call
    assert set(reported) == set(written)             # none lost
    for block, call in written.items():
        turn = next(c for c in range(call, len(hashed)) if block in hashed[c])
        assert reported[block] == turn and turn - call < window

    # A block written just after its turn waits a whole rotation.
    block = min(hashed[-1])
    flip(rfd, wfd, block * BS, 1)
    for call in range(window):
        out = sums.update(held, size, share=share)
        assert set(held[out > 0].tolist()) == ({block} if call == window - 1 else set())


def test_a_block_released_and_held_again_starts_fresh_under_rotation(image):
    path, rfd, wfd = image
    size = os.path.getsize(path)
    held = np.arange(32)
    sums = sums_of(path)
    sums.baseline(held, size)
    flip(rfd, wfd, 30 * BS, 1)           # written while held, before its turn came
    sums.update(held[held != 30], size, share=1 / 4)   # then released: forgotten
    assert 30 not in sums.known().tolist()
    flip(rfd, wfd, 30 * BS + 5, 1)       # and written while released
    for _ in range(8):                   # held again: two whole rotations, nothing to report
        assert not sums.update(held, size, share=1 / 4).any()
    assert sums.known().tolist() == held.tolist()


def test_a_write_before_the_file_settled_stops_no_pass_until_found(image, monkeypatch):
    """The stamps prove the file unwritten since it settled, not since each block's last hash:
    passes go on until every held block has been hashed after the write."""
    path, rfd, wfd = image
    size = os.path.getsize(path)
    clock = FakeClock(path)
    sums = sums_of(path, clock=clock)
    clock.advance(1.2)
    held, share = np.arange(32), 1 / 4
    sums.baseline(held, size)
    for _ in range(4):                       # one sweep after the stamp settled
        sums.update(held, size, skip_unwritten=True, share=share)
        assert not sums.skipped
    sums.update(held, size, skip_unwritten=True, share=share)
    assert sums.skipped                      # every block hashed since: idle, nothing read
    reads = Reads(monkeypatch)
    sums.update(held, size, skip_unwritten=True, share=share)
    assert sums.skipped and reads.take() == (0, set())

    flip(rfd, wfd, 30 * BS + 77, 1)          # far from the cursor's next blocks
    clock.written()
    clock.advance(1.2)                       # settled before the next pass: equal stamps follow
    found = []
    for _ in range(4):
        out = sums.update(held, size, skip_unwritten=True, share=share)
        assert not sums.skipped
        found += held[out > 0].tolist()
    assert found == [30]
    sums.update(held, size, skip_unwritten=True, share=share)
    assert sums.skipped


def test_a_stale_hash_kept_by_a_skip_is_not_reused_by_baseline(image, monkeypatch):
    """Block 30's hash predates a write (its turn had not come); a skipped update keeps it while
    30 is released; held again, 30 is hashed afresh and the old write is not reported."""
    path, rfd, wfd = image
    size = os.path.getsize(path)
    clock = FakeClock(path)
    sums = sums_of(path, clock=clock)
    clock.advance(1.2)
    rest = np.arange(7)
    held, share = np.append(rest, 30), 1 / 8           # one block a call: 0, 1, ..., 6, 30
    sums.baseline(held, size)
    for _ in range(8):
        sums.update(held, size, skip_unwritten=True, share=share)
    flip(rfd, wfd, 30 * BS, 1)
    clock.written()
    clock.advance(1.2)
    reads = Reads(monkeypatch)
    for _ in range(7):                                  # blocks 0..6 hashed again; 30 next
        assert not sums.update(held, size, skip_unwritten=True, share=share).any()
    assert reads.take()[1] == set(range(7))
    sums.update(rest[rest != 3], size, skip_unwritten=True, share=share)
    assert sums.skipped                                 # 3 and 30 released, their hashes kept
    assert {3, 30} <= set(sums.known().tolist())
    sums.baseline([3, 30], size)                        # both held again
    assert reads.take()[1] == {30}                      # 3's hash is current, 30's is not
    for _ in range(16):
        assert not sums.update(held, size, skip_unwritten=True, share=share).any()
