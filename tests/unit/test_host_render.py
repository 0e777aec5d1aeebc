"""The host overview PNG: a header, the budget bar split by disk, a band per disk (its
swatch, its allocation bar against the budget, its image strip) and a legend; a disk's
colour comes from its name, never its place in the list."""

from __future__ import annotations

import numpy as np

from vmdisktouch.adapters.pictures import render
from vmdisktouch.adapters.pictures.host_render import (BAND, BAR, BG, HEAD, LABEL, LINE, MIN_STRIP, PAD,
                                              PALETTE, ROW, SHARE, UNUSED, WIDTH, DiskBand,
                                              band_top, colours, columns_x, disk_colour,
                                              host_overview_image, strip_width, swatch_box)

MiB = 1 << 20
GiB = 1 << 30
SPAN = columns_x(WIDTH)[2]            # the widest image strip


def band(name, n, held_blocks=(0, 0), cached_blocks=(0, 0), held_bytes=0, *, size=None,
         domain=None, target=None, share=None, wanted=None, limited_by=None):
    held = np.zeros(n, bool)
    held[held_blocks[0]:held_blocks[1]] = True
    res = np.zeros(n, np.float32)
    res[cached_blocks[0]:cached_blocks[1]] = 1.0
    return DiskBand(name, held_bytes, res, held, domain=domain, target=target,
                    size_bytes=n * MiB if size is None else size, share_bytes=share,
                    wanted_bytes=wanted, limited_by=limited_by)


def pixels(disks, budget=1000 * MiB, **kw) -> np.ndarray:
    return np.asarray(host_overview_image(disks, budget, **kw))


def swatch(img, k) -> tuple:
    """The colour most of band ``k``'s swatch is (the hatch, if any, is a minority)."""
    x0, y0, x1, y1 = swatch_box(k)
    px = img[y0:y1 + 1, x0:x1 + 1].reshape(-1, 3)
    values, counts = np.unique(px, axis=0, return_counts=True)
    return tuple(int(v) for v in values[counts.argmax()])


def same_colour_as(d: DiskBand) -> DiskBand:
    """Another libvirt disk that draws ``d``'s colour."""
    for i in range(1000):
        o = band("/other", 10, domain=f"vm{i}", target="vdb")
        if disk_colour(o) == disk_colour(d):
            return o
    raise AssertionError("no colour twin in 1000 names")


def test_the_budget_bar_shows_each_disk_s_held_bytes_in_its_colour():
    a = band("/a", 1000, (0, 500), (0, 500), 500 * MiB, domain="vm1", target="vda")
    b = band("/b", 1000, (0, 250), (0, 500), 250 * MiB, domain="vm2", target="vda")
    if disk_colour(a) == disk_colour(b):
        b = band("/b", 1000, (0, 250), (0, 500), 250 * MiB, domain="vm3", target="vda")
    assert disk_colour(a) != disk_colour(b)
    img = pixels([a, b])
    bar = img[HEAD + BAR // 2, PAD:WIDTH - PAD]
    w = WIDTH - 2 * PAD                   # the bar is the budget
    assert tuple(bar[5]) == disk_colour(a) and tuple(bar[w // 2 - 3]) == disk_colour(a)
    assert tuple(bar[w // 2 + 3]) == disk_colour(b) and tuple(bar[3 * w // 4 - 3]) == disk_colour(b)
    assert tuple(bar[3 * w // 4 + 3]) == UNUSED and tuple(bar[w - 1]) == UNUSED


def test_a_disk_keeps_its_colour_when_the_list_order_changes():
    disks = [band(f"/img/{n}.raw", 100, (0, 10), (0, 20), 10 * MiB, domain=n, target="vda")
             for n in ("web", "db", "cache", "build")]
    disks.append(band("/srv/plain.raw", 100, (0, 10), (0, 20), 10 * MiB))   # no domain
    first = pixels(disks)
    again = pixels(disks[::-1])
    n = len(disks)
    for k, d in enumerate(disks):
        assert swatch(first, k) == swatch(again, n - 1 - k) == disk_colour(d)
        assert disk_colour(d) in PALETTE
    # the whole swatch, hatch included, does not depend on the order
    for k in range(n):
        x0, y0, x1, y1 = swatch_box(k)
        x0b, y0b, x1b, y1b = swatch_box(n - 1 - k)
        assert (first[y0:y1 + 1, x0:x1 + 1] == again[y0b:y1b + 1, x0b:x1b + 1]).all()


def test_the_colour_comes_from_domain_and_target_else_the_path():
    a = band("/img/a.raw", 10, domain="vm1", target="vda")
    moved = band("/elsewhere/a.raw", 10, domain="vm1", target="vda")   # same disk, new path
    assert disk_colour(a) == disk_colour(moved)
    assert disk_colour(band("/img/a.raw", 10)) == disk_colour(band("/img/a.raw", 99))
    keys = [band("/x", 10, domain=f"vm{i}", target="vda") for i in range(60)]
    assert {disk_colour(d) for d in keys} == set(PALETTE)   # the names spread over all


def test_the_disk_colours_are_none_of_the_block_map_s():
    theirs = [render.CACHED, render.HELD, render.REWRITTEN, render.THRASHING,
              render.UNCACHED, UNUSED, BG, SHARE]
    for c in PALETTE:
        for t in theirs:
            assert np.linalg.norm(np.subtract(c, t, dtype=float)) > 60, (c, t)
    assert len(set(PALETTE)) == len(PALETTE)


def test_disks_sharing_a_colour_are_told_apart_by_a_hatch_whatever_the_order():
    a = band("/a", 10, domain="vm-a", target="vda")
    twin = same_colour_as(a)
    first, second = sorted([a, twin], key=lambda d: f"{d.domain}/{d.target}")
    assert colours([a, twin]) == [(disk_colour(a), int(a is second)),
                                  (disk_colour(a), int(twin is second))]
    assert colours([twin, a]) == colours([a, twin])[::-1]
    img = pixels([first, second])
    x0, y0, x1, y1 = swatch_box(0)
    assert (img[y0:y1 + 1, x0:x1 + 1] == disk_colour(a)).all()          # solid
    x0, y0, x1, y1 = swatch_box(1)
    hatched = img[y0:y1 + 1, x0:x1 + 1].reshape(-1, 3)
    assert (hatched == BG).all(axis=1).sum() > 10                       # dark stripes
    assert swatch(img, 1) == disk_colour(a)                             # the same colour
    alone = pixels([second])                                            # no twin: solid
    x0, y0, x1, y1 = swatch_box(0)
    assert (alone[y0:y1 + 1, x0:x1 + 1] == disk_colour(a)).all()


def test_the_header_prints_the_time_and_the_free_memory():
    disks = [band("/a", 10, (0, 5), (0, 5), 5 * MiB)]
    img = pixels(disks, when=1_700_000_000.0, above_floor=GiB)
    head = img[PAD:PAD + 2 * LINE, PAD:WIDTH // 2]
    for line in (head[:LINE], head[LINE:]):
        assert (line != BG).any(axis=2).sum() > 200                     # text on both lines
    later = pixels(disks, when=1_700_003_723.0, above_floor=GiB)
    assert (later[PAD + LINE:PAD + 2 * LINE] != img[PAD + LINE:PAD + 2 * LINE]).any()
    assert (later[PAD:PAD + LINE] == img[PAD:PAD + LINE]).all()         # same sums
    less = pixels(disks, when=1_700_000_000.0, above_floor=2 * GiB)
    assert (less[PAD + LINE:PAD + 2 * LINE] != img[PAD + LINE:PAD + 2 * LINE]).any()


def test_a_band_per_disk_and_a_legend_below():
    def h(n):
        return pixels([band(f"/d{k}", 10) for k in range(n)]).shape[0]
    assert h(3) - h(2) == h(2) - h(1) == BAND
    img = pixels([band("/a", 10), band("/b", 10)])
    legend = img[band_top(2):]
    assert legend.shape[0] >= 5 * LINE
    rows_with_text = [(row != BG).any(axis=1).sum() > 20 for row in legend]
    assert sum(rows_with_text) > 3 * 8                                  # lines of legend
    colours_in_legend = {tuple(p) for p in legend.reshape(-1, 3)}
    assert {render.HELD, render.CACHED, UNUSED} <= colours_in_legend


def test_each_image_strip_draws_held_sky_blue_cached_bluish_green():
    a = band("/a", SPAN, (0, SPAN // 7), (0, SPAN // 2), 100 * MiB)   # a column per block
    b = band("/b", SPAN, (SPAN // 2, SPAN), (SPAN // 2, SPAN), 350 * MiB)
    img = pixels([a, b])
    strip_x = columns_x(WIDTH)[1]
    row_a = img[band_top(0) + LINE, strip_x:strip_x + SPAN]
    row_b = img[band_top(1) + LINE, strip_x:strip_x + SPAN]
    assert tuple(row_a[5]) == render.HELD
    assert tuple(row_a[SPAN // 3]) == render.CACHED                    # cached, not held
    assert tuple(row_a[SPAN - 5]) == render.UNCACHED
    assert tuple(row_b[5]) == render.UNCACHED and tuple(row_b[SPAN - 5]) == render.HELD


def test_an_image_larger_than_its_strip_is_averaged_per_column():
    d = band("/a", 10 * SPAN, (0, 5 * SPAN), (0, 10 * SPAN), MiB)
    strip_x = columns_x(WIDTH)[1]
    row = pixels([d], 2 * MiB)[band_top(0) + LINE, strip_x:strip_x + SPAN]
    half = SPAN // 2
    assert (row[:half - 1] == render.HELD).all() and (row[half + 1:] == render.CACHED).all()


def test_the_strip_width_grows_with_the_image_size():
    assert strip_width(GiB, GiB, SPAN) == SPAN
    assert strip_width(196 << 10, GiB, SPAN) == MIN_STRIP
    assert strip_width(GiB // 2, GiB, SPAN) == round(SPAN * 0.9)
    widths = [strip_width(s, 64 * GiB, SPAN) for s in (256 * MiB, GiB, 8 * GiB, 64 * GiB)]
    assert widths == sorted(widths) and len(set(widths)) == len(widths)
    assert strip_width(MiB, 64 * GiB, SPAN) == MIN_STRIP
    # drawn: the frame around each strip is as wide as its image says
    img = pixels([band("/big", 1024, size=GiB), band("/tiny", 1, size=196 << 10)])
    strip_x = columns_x(WIDTH)[1]

    def drawn(k):
        row = img[band_top(k) + LINE, strip_x - 1:]
        return int(np.flatnonzero((row != BG).any(axis=1))[-1])    # the right frame
    assert drawn(0) == SPAN + 1 and drawn(1) == MIN_STRIP + 1


def test_the_allocation_bar_shows_held_wanted_and_the_share_against_the_budget():
    d = band("/a", 100, (0, 10), (0, 10), 200 * MiB, domain="vm1", target="vda",
             share=500 * MiB, wanted=800 * MiB, limited_by="budget")
    img = pixels([d], 1000 * MiB)
    alloc_w = columns_x(WIDTH)[0]
    y = band_top(0) + 2 + ROW // 2
    row = img[y, LABEL:LABEL + alloc_w]
    c = disk_colour(d)
    assert tuple(row[alloc_w // 5 - 3]) == c                            # held: 200M
    dim = tuple(row[alloc_w * 7 // 10])                                 # wanted: to 800M
    assert dim != c and dim != tuple(row[alloc_w - 3])
    assert tuple(row[alloc_w // 2 - 1]) == SHARE                        # share: to 500M
    top = img[band_top(0) + 1, LABEL:LABEL + alloc_w]
    assert (top[:alloc_w // 2 - 1] == SHARE).all() and tuple(top[alloc_w // 2 + 2]) != SHARE
    # a share unknown: no outline
    bare = pixels([band("/a", 100, (0, 10), (0, 10), 200 * MiB)], 1000 * MiB)
    assert not (bare[band_top(0) + 1, LABEL:LABEL + alloc_w] == SHARE).all(axis=1).any()


def test_a_long_name_never_runs_into_the_allocation_bar():
    d = band("/srv/" + "very-long-directory-name/" * 8 + "image.raw", 10,
             limited_by="below_threshold")
    img = pixels([d])
    text = img[band_top(0):band_top(0) + 2 * LINE, PAD:LABEL]
    assert (text != BG).any(axis=2).sum() > 100
    assert (img[band_top(0):band_top(0) + 2 * LINE, LABEL - 8:LABEL] == BG).all()
    plain = pixels([band(d.name, 10)])
    assert (plain[band_top(0) + LINE:band_top(0) + 2 * LINE, PAD:LABEL]
            != img[band_top(0) + LINE:band_top(0) + 2 * LINE, PAD:LABEL]).any()  # the reason


def test_the_curves_panel_draws_each_curve_in_its_disk_s_colour_with_a_dot_where_it_holds():
    """Two disks with curves: a climbs to 90 % at 64M and is flat past it, b stays low.
    Each line is in its disk's colour, at the heights its curve says on the log size axis;
    a's dot (held 64M) sits on its line; without a curve there is no panel."""
    from vmdisktouch.adapters.pictures.host_render import CHART, CURVES
    a = band("/a", 1024, held_bytes=64 * MiB, domain="vm1", target="vda", share=1024 * MiB)
    b = band("/b", 1024, domain="vm2", target="vda")
    if disk_colour(a) == disk_colour(b):
        b = band("/b", 1024, domain="vm3", target="vda")
    sizes = [MiB * 2 ** k for k in range(11)]                     # 1M ... 1G
    a = DiskBand(**{**a.__dict__, "curve": [[s, min(0.9, 0.9 * s / (64 * MiB))]
                                            for s in sizes]})
    b = DiskBand(**{**b.__dict__, "curve": [[s, 0.1] for s in sizes]})
    plain = pixels([band("/a", 1024), band("/b", 1024)])
    img = pixels([a, b])
    assert img.shape[0] == plain.shape[0] + CURVES              # the panel, only with curves
    top = band_top(2) + LINE + 4
    bottom = top + CHART - 1
    x0, x1 = PAD + 44, WIDTH - PAD - 1

    def column(x):                    # the colours down the plot at x, top to bottom
        return [tuple(int(v) for v in img[y, x]) for y in range(top, bottom + 1)]

    def height_of(colour, x) -> float:
        ys = [y for y, c in enumerate(column(x)) if c == colour]
        assert ys, f"no {colour} at x={x}"
        return 1 - (sum(ys) / len(ys)) / (CHART - 1)
    right = int(x0 + (x1 - x0) * 0.95)                        # about 700M: both flat
    assert abs(height_of(disk_colour(a), right) - 0.9) < 0.03
    assert abs(height_of(disk_colour(b), right) - 0.1) < 0.03
    left = int(x0 + (x1 - x0) * 0.2)                          # 4M: a at 5.6 %
    assert height_of(disk_colour(a), left) < 0.1
    dot_x = int(x0 + (x1 - x0) * 0.6)                         # 64M = 2**6 of 2**10
    assert sum(1 for c in column(dot_x) if c == SHARE) >= 2    # the dot's white outline
    ring_x = x1 - 2                                           # a's share, 1G: its ring
    above = [c for c in column(ring_x)[:int(0.1 * CHART) + 6]]  # 90 % and above
    assert above.count(disk_colour(a)) >= 4 and SHARE not in above


def test_disks_not_served_are_listed_with_why_and_those_that_would_gain_marked():
    from vmdisktouch.adapters.pictures.host_render import (DiskBand, Unserved, WOULD_GAIN,
                                                           band_top, host_overview_image)
    one = DiskBand("/img/a.raw", 0, np.zeros(4), np.zeros(4, bool), domain="web",
                   target="vda", size_bytes=4 << 20)
    plain = host_overview_image([one], 8 << 20)
    unserved = [Unserved("db/vdb", "cache=none (O_DIRECT)", "1.5G: 88% from memory"),
                Unserved("web/hdc", "read-only cdrom")]
    img = host_overview_image([one], 8 << 20, unserved=unserved)
    assert img.height == plain.height + 3 * 16 + 8      # a title and a line each
    rows = np.asarray(img.convert("RGB"))[band_top(1):band_top(1) + 3 * 16 + 8]
    tri = (rows[:, :20] == WOULD_GAIN).all(axis=2).sum()
    assert tri > 20, "no triangle marks the disk that would gain"
    # only one of the two is marked: the triangle's pixels sit in one row band
    ys = np.flatnonzero((rows[:, :20] == WOULD_GAIN).all(axis=2).any(axis=1))
    assert ys.max() - ys.min() < 16, ys


def test_every_disk_not_served_is_a_row_with_its_reason_in_the_report_s_order():
    """Issue 45, part 3: the host PNG's rows are the report's ``skipped`` (ineligible,
    excluded, out of scope), each with its reason; advice marks only those it says gain."""
    from vmdisktouch.adapters.pictures.host_render import Unserved, unserved_rows
    skipped = [{"domain": "test-1", "target": "vda", "code": "excluded",
                "reason": "excluded by [scope] exclude 'test-*'"},
               {"domain": "web", "target": "vdb", "code": "o_direct", "reason": "cache=none"},
               {"domain": "web", "target": "hdc", "code": "not_included",
                "reason": "not in [scope] include"}]
    advice = {"when": 0.0, "disks": {"web/vdb": {"verdict": "hold", "bytes": 1 << 30,
                                                 "hit_ratio": 0.5},
                                     "web/hdc": {"verdict": "no_reuse"}}}
    rows = unserved_rows(skipped, advice)
    assert [(u.key, u.reason) for u in rows] == [
        ("test-1/vda", "excluded by [scope] exclude 'test-*'"), ("web/vdb", "cache=none"),
        ("web/hdc", "not in [scope] include")]
    assert [u.gain is not None for u in rows] == [False, True, False]
    assert unserved_rows(None, None) == [] and isinstance(rows[0], Unserved)
