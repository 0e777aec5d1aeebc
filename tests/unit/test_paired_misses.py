"""The misses paired from the ring buffer's events (``trace_reader.paired_misses``): the
rule ``bpf_reads.added_program`` applies in the kernel, on made-up event streams."""

from __future__ import annotations

import numpy as np

from vmdisktouch.system.trace.ringbuf import Events
from vmdisktouch.system.trace.trace_reader import ADD, READ, WRITE, paired_misses


def stream(*rows):
    """Rows of (kind, ts, first, last, thread) -> (Events, pid), sorted by time."""
    rows = sorted(rows, key=lambda r: r[1])
    col = (lambda i, t: np.array([r[i] for r in rows], dtype=t))
    return (Events(col(0, np.uint8), col(1, np.int64), col(2, np.int64), col(3, np.int64), 0),
            col(4, np.int64))


def test_a_read_of_the_page_its_thread_added_waited_from_the_first_add():
    ev, pid = stream((ADD, 100, 7, 7, 1), (ADD, 120, 8, 11, 1), (READ, 400, 7, 7, 1))
    assert paired_misses(ev, pid)[:2] == (300, 1)


def test_threads_interleaved_pair_each_with_its_own():
    ev, pid = stream((ADD, 100, 7, 7, 1), (ADD, 110, 50, 50, 2), (READ, 300, 50, 50, 2),
                     (READ, 500, 7, 7, 1), (READ, 600, 9, 9, 1))       # the last: a hit
    assert paired_misses(ev, pid)[:2] == ((300 - 110) + (500 - 100), 2)


def test_a_page_added_by_a_write_or_ahead_is_no_miss_of_a_read_elsewhere():
    ev, pid = stream((ADD, 100, 30, 30, 1), (WRITE, 101, 30, 30, 1), (READ, 900, 5, 5, 1),
                     (READ, 1000, 8, 8, 3), (ADD, 1010, 40, 71, 3), (READ, 1100, 9, 9, 3))
    assert paired_misses(ev, pid)[:2] == (0, 0)


def test_a_read_closes_its_thread_s_adds_and_a_large_folio_covers_its_pages():
    ev, pid = stream((ADD, 100, 64, 127, 1), (READ, 200, 70, 70, 1), (READ, 300, 64, 64, 1))
    assert paired_misses(ev, pid)[:2] == (100, 1)
    assert paired_misses(*stream((READ, 1, 0, 0, 1)))[:2] == (0, 0)


def test_a_wait_that_spans_two_drains_is_paired_in_the_second():
    """A long wait (a throttle's slice) starts in one drain and ends in the next: the
    thread's open ADD is carried, and only while no read of the thread closed it."""
    ns, n, left = paired_misses(*stream((READ, 50, 3, 3, 1), (ADD, 100, 7, 7, 1),
                                        (ADD, 150, 9, 9, 2), (READ, 160, 1, 1, 2)))
    assert (ns, n) == (0, 0) and left.pid.tolist() == [1] and left.ts.tolist() == [100]
    ns, n, left = paired_misses(*stream((READ, 5_000, 7, 7, 1)), left)
    assert (ns, n) == (4_900, 1) and left.ts.size == 0
