"""FioJob.zones: the guest-like job's access distribution, as fio's zoned_abs percentages."""

import pytest

from tests.support.common import WorkloadError
from tests.support.fio import FioJob

MiB = 1 << 20


def test_equal_shares_and_the_rest_uniform():
    job = FioJob("x", 100 * MiB, [(10 * MiB, 10 * MiB), (50 * MiB, 10 * MiB)], hot_share=90)
    zones = job.zones()
    assert [n for _, n in zones] == [10 * MiB, 10 * MiB, 30 * MiB, 10 * MiB, 40 * MiB]
    assert sum(p for p, _ in zones) == 100
    assert zones[1][0] == zones[3][0] == 45                    # 90 % split equally
    assert zones[0][0] + zones[2][0] + zones[4][0] == 10       # the rest by length


def test_explicit_shares_per_zone():
    # Given out of offset order: each share stays with its own zone.
    job = FioJob("x", 100 * MiB, [(50 * MiB, 15 * MiB), (10 * MiB, 10 * MiB)],
                 zone_shares=[30, 60])
    zones = job.zones()
    hot = {n: p for p, n in zones if n in (10 * MiB, 15 * MiB)}
    assert hot == {10 * MiB: 60, 15 * MiB: 30}
    assert sum(p for p, _ in zones) == 100
    with pytest.raises(WorkloadError):
        FioJob("x", 100 * MiB, [(0, MiB)], zone_shares=[50, 40]).zones()
