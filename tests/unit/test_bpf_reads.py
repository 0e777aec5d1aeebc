"""system.trace.bpf_reads: the counting program's instructions, as the kernel will read
them (the kernel's verifier loads it in tests/system/test_trace_counted.py)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from vmdisktouch.system.trace import bpf_reads

OFFSETS = {"i_ino": 8, "s_dev": 16, "index": 24, "last_index": 32}


def decode(code: bytes):
    """(opcode, dst, src, off, imm) per 8-byte slot."""
    out = []
    for i in range(0, len(code), 8):
        op, regs, off, imm = struct.unpack("<BBhi", code[i:i + 8])
        out.append((op, regs & 0xF, regs >> 4, off, imm))
    return out


def program(**kw):
    args = dict(map_fd=7, ino=0x1_0000_0005, sdev=(259 << 20) | 3, exclude_tid=4242,
                pages_per_block=512, nblocks=1000)
    args.update(kw)
    return decode(bpf_reads.program(OFFSETS, **args))


def starts(insns):
    """The slots an instruction starts at (the second half of a 64-bit load is not one)."""
    out, i = [], 0
    while i < len(insns):
        out.append(i)
        i += 2 if insns[i][0] == 0x18 else 1
    return out


@pytest.mark.parametrize("kw", [{}, {"sdev": None, "exclude_tid": None}])
def test_every_jump_lands_on_an_instruction_and_the_program_ends_in_exit(kw):
    insns = program(**kw)
    ok = set(starts(insns))
    jumps = [(i, ins) for i in ok for ins in [insns[i]]
             if ins[0] & 0x07 == 0x05 and ins[0] not in (0x85, 0x95)]
    assert len(jumps) > 10
    for i, (_, _, _, off, _) in jumps:
        assert i + 1 + off in ok, (i, off)
        assert off >= 0                      # forward only: no loop for the verifier
    assert insns[-1][0] == 0x95 and insns[-2][:2] == (0xb7, 0)       # r0 = 0; exit


def test_the_64_bit_constants_and_the_map_are_loaded_whole():
    insns = program()
    loads = [(insns[i], insns[i + 1]) for i in starts(insns) if insns[i][0] == 0x18]
    values = {(lo[2], (hi[4] & 0xFFFFFFFF) << 32 | (lo[4] & 0xFFFFFFFF)) for lo, hi in loads}
    assert (0, 0x1_0000_0005) in values                     # the inode, all 64 bits
    assert (0, (259 << 20) | 3) in values                   # s_dev of an NVMe partition
    assert (1, 7) in values                                 # BPF_PSEUDO_MAP_FD: the map
    divs = [ins for ins in insns if ins[0] == 0x37]
    assert [d[4] for d in divs] == [512, 512]               # first and last page -> block


@pytest.mark.parametrize("ppb, span", [(512, 8), (256, 8), (16, 33), (1, 256)])
def test_a_range_counts_for_at_most_span_blocks(ppb, span):
    assert bpf_reads.span_blocks(ppb) == span
    insns = program(pages_per_block=ppb)
    adds = [ins for ins in insns if ins[0] == 0xdb]         # lock *(u64 *)(r0) += r1
    # the probe's slot, the slot beyond the map, span blocks of one range, and the chunks
    # of its first and last block
    assert len(adds) == 2 + span + 2
    insns = program()
    assert ((0x15, 7, 0, None, 4242) in
            {(op, d, s, None, imm) for op, d, s, _, imm in insns})     # the loader left out


def test_too_many_blocks_are_refused_before_anything_is_made():
    with pytest.raises(bpf_reads.BpfUnavailable, match="counters"):
        bpf_reads.ReadCounter.create(1, OFFSETS, ino=1, sdev=1, exclude_tid=None,
                                     pages_per_block=1, nblocks=bpf_reads.MAX_SLOTS)


def counter_over_anonymous_maps(nblocks: int, preset: dict[int, int] | None = None):
    """A ReadCounter over anonymous memory laid out as the program's maps: the test writes
    what the program would (``preset``: slot -> its count when the counter is made)."""
    import mmap
    words = nblocks + bpf_reads.FIRST_BLOCK + bpf_reads.chunks_of(nblocks)
    counters = mmap.mmap(-1, -(-8 * words // mmap.PAGESIZE) * mmap.PAGESIZE)
    samples = mmap.mmap(-1, -(-8 * (bpf_reads.S_PEND + 4 * bpf_reads.PEND_SLOTS)
                              // mmap.PAGESIZE) * mmap.PAGESIZE)
    slots = np.frombuffer(counters, dtype=np.uint64, count=words)
    for slot, value in (preset or {}).items():              # counted before the counter
        slots[slot] = np.uint64(value)
    return bpf_reads.ReadCounter([], counters, samples, nblocks), slots


def read_range(slots, nblocks, first, last):
    """What the program does for one read of blocks first..last: each block, then the
    chunks of the first and the last."""
    slots[bpf_reads.FIRST_BLOCK + first:bpf_reads.FIRST_BLOCK + last + 1] += np.uint64(1)
    base = bpf_reads.FIRST_BLOCK + nblocks
    for chunk in {first >> bpf_reads.CHUNK_SHIFT, last >> bpf_reads.CHUNK_SHIFT}:
        slots[base + chunk] += np.uint64(1)


def test_a_take_reads_the_blocks_of_the_chunks_that_moved_and_loses_none():
    nblocks = 65536 + 100                                    # a last chunk left short
    c, slots = counter_over_anonymous_maps(nblocks)
    assert not c.pending() and c.take()[0].size == 0
    read_range(slots, nblocks, 10, 12)
    read_range(slots, nblocks, 250, 260)                     # across two chunks
    read_range(slots, nblocks, nblocks - 1, nblocks - 1)
    read_range(slots, nblocks, 11, 11)
    assert c.pending()
    blocks, counts, probe, beyond = c.take()
    want = {10: 1, 11: 2, 12: 1, nblocks - 1: 1, **{b: 1 for b in range(250, 261)}}
    assert dict(zip(blocks.tolist(), counts.tolist())) == want
    assert (probe, beyond) == (0, 0) and not c.pending()
    # A block counted before its chunk (a take between the program's two adds): the take
    # does not see it, the next one that finds the chunk moved does, with nothing lost.
    slots[bpf_reads.FIRST_BLOCK + 3000] += np.uint64(5)
    assert c.take()[0].size == 0
    read_range(slots, nblocks, 3001, 3001)
    blocks, counts, _, _ = c.take()
    assert dict(zip(blocks.tolist(), counts.tolist())) == {3000: 5, 3001: 1}
    slots[bpf_reads.BEYOND] += np.uint64(2)
    assert c.pending() and c.take()[3] == 2 and not c.pending()


def test_counts_are_exact_across_the_32_bit_wrap_of_the_kept_base():
    """The counter keeps each slot's last count modulo 2**32 (half the map's width): a
    count that passes 2**32 between two takes still gives its exact growth."""
    nblocks, near = 1000, (1 << 32) - 3                      # as if read that often before
    c, slots = counter_over_anonymous_maps(nblocks, {bpf_reads.FIRST_BLOCK + 7: near,
                                                     bpf_reads.BEYOND: near})
    assert c._base.dtype == np.uint32 and c._base.nbytes < slots.nbytes // 2 + 64
    for _ in range(5):
        read_range(slots, nblocks, 7, 7)
    slots[bpf_reads.BEYOND] += np.uint64(4)
    assert c.pending()
    blocks, counts, _, beyond = c.take()
    assert dict(zip(blocks.tolist(), counts.tolist())) == {7: 5} and beyond == 4
    assert int(slots[bpf_reads.FIRST_BLOCK + 7]) > 1 << 32 and not c.pending()


def test_a_verification_a_signal_interrupted_is_tried_again(monkeypatch):
    """The verifier returns EAGAIN when a signal is pending; a busy host met it and the
    disk's reads stayed events for its life. Any other refusal is not tried again."""
    import errno

    from vmdisktouch.errors import SyscallError
    from vmdisktouch.system import libc
    calls = []

    def bpf(cmd, attr, what, errs=[errno.EAGAIN, errno.EINTR]):
        calls.append(cmd)
        if errs:
            raise SyscallError("bpf", errs.pop(0), what)
        return 42
    monkeypatch.setattr(libc, "bpf", bpf)
    assert libc.bpf_prog_load(5, b"\0" * 16, b"t") == 42 and len(calls) == 3

    calls.clear()
    monkeypatch.setattr(libc, "bpf", lambda cmd, attr, what: (calls.append(cmd), (
        _ for _ in ()).throw(SyscallError("bpf", errno.EACCES, what)))[1])
    with pytest.raises(SyscallError) as refused:
        libc.bpf_prog_load(5, b"\0" * 16, b"t")
    assert refused.value.errno == errno.EACCES and len(calls) == 2    # and the log's load

    calls.clear()
    monkeypatch.setattr(libc, "bpf", lambda cmd, attr, what: (calls.append(cmd), (
        _ for _ in ()).throw(SyscallError("bpf", errno.EAGAIN, what)))[1])
    with pytest.raises(SyscallError):
        libc.bpf_prog_load(5, b"\0" * 16, b"t")
    assert len(calls) == libc.BPF_LOAD_TRIES + 1
