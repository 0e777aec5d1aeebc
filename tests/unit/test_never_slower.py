"""The judge of an adopted disk's windows against its baseline (``core.never_slower``)."""

from vmdisktouch.core import never_slower as ns
from vmdisktouch.core.never_slower import Counters, Judge, Window


def win(reads, read_us, writes=0, write_us=0.0, flushes=0, flush_us=0.0, seconds=10.0):
    return Window(seconds, (reads, writes, flushes),
                  (int(reads * read_us * 1e3), int(writes * write_us * 1e3),
                   int(flushes * flush_us * 1e3)))


def feed(judge, windows):
    return [judge.add(w) for w in windows]


def test_counters_from_libvirt_make_a_window_of_differences():
    a = Counters.from_libvirt({"rd_operations": 10, "rd_total_times": 1000,
                               "wr_operations": 5, "wr_total_times": 500}, 100.0)
    b = Counters.from_libvirt({"rd_operations": 30, "rd_total_times": 5000,
                               "wr_operations": 5, "wr_total_times": 500,
                               "flush_operations": 2, "flush_total_times": 40}, 110.0)
    w = b.since(a)
    assert (w.seconds, w.ops, w.ns) == (10.0, (20, 0, 2), (4000, 0, 40))
    assert Window.from_json(w.to_json()) == w


def test_counters_from_qmp_read_query_blockstats_fields():
    stats = {"rd_operations": 30, "rd_total_time_ns": 5000, "wr_operations": 5,
             "wr_total_time_ns": 500, "flush_operations": 2, "flush_total_time_ns": 40,
             "rd_bytes": 4096, "timed_stats": [], "invalid_rd_operations": 9}
    c = Counters.from_qmp(stats, 7.0)
    assert (c.when, c.ops, c.ns) == (7.0, (30, 5, 2), (5000, 500, 40))
    assert Counters.from_qmp({}, 1.0).ops == (0, 0, 0)       # a missing field counts 0


def test_timed_reads_every_disk_in_three_windows_and_nothing_for_0_s():
    n = {"a": 0, "b": 0}

    def read(key, per):
        n[key] += 1
        return Counters(float(n[key]), (n[key] * per, 0, 0), (n[key] * per * 1000, 0, 0))
    slept = []
    got = ns.timed({"a": lambda: read("a", 100), "b": lambda: read("b", 7)}, 30, slept.append)
    assert slept == [10.0] * ns.BASELINE_WINDOWS
    assert [w.ops[0] for w in got["a"]] == [100] * 3 and [w.ops[0] for w in got["b"]] == [7] * 3
    assert ns.timed({"a": lambda: read("a", 1)}, 0, slept.append) == {}


def test_a_disk_as_fast_as_before_is_kept_and_its_gain_is_one():
    judge = Judge([win(1000, 100), win(1000, 104), win(1000, 96)])
    verdicts = feed(judge, [win(1000, 100)] * 6)
    assert verdicts[:ns.SETTLE_WINDOWS] == [None] * ns.SETTLE_WINDOWS
    assert not any(v.release for v in verdicts[ns.SETTLE_WINDOWS:])
    assert abs(judge.gain - 1.0) < 0.01


def test_a_faster_disk_measures_its_gain():
    judge = Judge([win(1000, 300)] * 3)
    feed(judge, [win(3000, 100)] * 5)
    assert abs(judge.gain - 3.0) < 0.01


def test_slower_beyond_margin_and_noise_for_two_windows_in_a_row_releases():
    judge = Judge([win(1000, 100), win(1000, 110), win(1000, 90)])   # noise 10 %
    assert abs(judge.noise - 0.10) < 0.005
    settle = feed(judge, [win(1000, 200)] * ns.SETTLE_WINDOWS)
    assert settle == [None] * ns.SETTLE_WINDOWS
    first, second = feed(judge, [win(1000, 120), win(1000, 120)])   # 20 % > 5 % + 10 %
    assert not first.release and second.release
    assert "1.20x" in second.reason and "noise" in second.reason


def test_slower_within_the_noise_is_not_slower():
    judge = Judge([win(1000, 100), win(1000, 110), win(1000, 90)])
    verdicts = feed(judge, [win(1000, 112)] * 8)                     # 12 % < 15 %
    assert not any(v and v.release for v in verdicts)


def test_one_fast_window_breaks_the_run():
    judge = Judge([win(1000, 100)] * 3)
    out = feed(judge, [win(1000, 100)] * ns.SETTLE_WINDOWS
               + [win(1000, 150), win(1000, 100), win(1000, 150)])
    assert not any(v and v.release for v in out)


def test_the_baselines_mix_weighs_the_kinds():
    # before: half reads of 100 us, half writes of 1000 us; after, the guest reads 9x more
    # at the same times: at the baseline's mix it is no slower (a plain mean would say 5x
    # faster), and a write that takes twice as long counts for half the figure
    judge = Judge([win(500, 100, 500, 1000)] * 3)
    out = feed(judge, [win(4500, 100, 500, 1000)] * 4)
    assert not any(v and v.release for v in out) and abs(judge.gain - 1.0) < 0.01
    slower = Judge([win(500, 100, 500, 1000)] * 3)
    out = feed(slower, [win(500, 100, 500, 2000)] * 4)
    assert out[-1].release and abs(out[-1].slower_by - (2100 / 1100 - 1)) < 0.01


def test_too_few_ios_are_not_judged():
    judge = Judge([win(1000, 100)] * 3)
    out = feed(judge, [win(1000, 100)] * ns.SETTLE_WINDOWS + [win(10, 900)] * 4)
    assert out[ns.SETTLE_WINDOWS:] == [None] * 4
    idle = Judge([win(5, 100)] * 3)
    assert not idle.usable
    assert feed(idle, [win(1000, 900)] * 6) == [None] * 6
