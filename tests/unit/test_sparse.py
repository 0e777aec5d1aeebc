"""Sparse per-block values (rewrites, red blocks): pure, on synthetic data."""

import numpy as np

from vmdisktouch.core.sparse import Sparse


def sparse(blocks, values):
    return Sparse(np.asarray(blocks, dtype=np.intp), np.asarray(values, dtype=float))


def test_merged_keeps_both_sets_and_the_newer_value_where_both_have_one():
    old = sparse([2, 5, 9], [1.0, 1.0, 1.0])
    new = sparse([5, 7], [2.0, 2.0])
    m = old.merged(new)
    assert m.blocks.tolist() == [2, 5, 7, 9]
    assert m.values.tolist() == [1.0, 2.0, 2.0, 1.0]


def test_runs_are_the_maximal_runs_of_consecutive_blocks():
    assert sparse([3, 4, 5, 9, 11, 12], [0] * 6).runs() == [(3, 6), (9, 10), (11, 13)]
    assert Sparse.empty().runs() == []


def test_dense_and_below_follow_the_map_size():
    s = sparse([1, 4, 8], [0.25, 0.5, 1.0])
    assert s.dense(10).tolist() == [0, 0.25, 0, 0, 0.5, 0, 0, 0, 1.0, 0]
    assert s.below(8).blocks.tolist() == [1, 4]
    assert Sparse.empty().dense(4) is None
    assert Sparse.empty().dense(4, always=True).tolist() == [0, 0, 0, 0]
    assert s.where(s.values > 0.3).blocks.tolist() == [4, 8]


def test_byte_ranges_are_the_runs_in_bytes_with_the_last_clipped_to_the_size():
    from vmdisktouch.core.runs import byte_ranges, consecutive_edges, consecutive_runs
    blocks = np.array([1, 2, 3, 7, 9, 10])
    starts, stops = consecutive_edges(blocks)
    assert list(zip(starts.tolist(), stops.tolist())) == consecutive_runs(blocks)
    assert byte_ranges(starts, stops, 4096, 10 * 4096 + 100) == [
        [4096, 3 * 4096], [7 * 4096, 4096], [9 * 4096, 4096 + 100]]
    assert byte_ranges(*consecutive_edges(np.array([], np.int64)), 4096, 0) == []
