"""The host overview PNG: a header, the budget bar split by disk, a band per disk (its
swatch, its allocation bar against the budget, its image strip) and a legend; a disk's
colour is its own in the picture, first from its name, never its place in the list."""

from __future__ import annotations

import numpy as np
import pytest

from vmdisktouch.adapters.pictures import render
from vmdisktouch.adapters.pictures.host_render import (BAND, BAR, BG, HEAD, LABEL, LINE, MIN_STRIP, PAD,
                                              OTHERS, PALETTE, ROW, SHARE, TOP_BANDS, UNUSED,
                                              WIDTH, ColourBook, DiskBand, band_top, colours,
                                              columns_x, host_overview_image, palette,
                                              strip_width, swatch_box)

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


def test_the_budget_bar_shows_each_disk_s_held_bytes_in_its_colour():
    a = band("/a", 1000, (0, 500), (0, 500), 500 * MiB, domain="vm1", target="vda")
    b = band("/b", 1000, (0, 250), (0, 500), 250 * MiB, domain="vm2", target="vda")
    ca, cb = colours([a, b])
    assert ca != cb
    img = pixels([a, b])
    bar = img[HEAD + BAR // 2, PAD:WIDTH - PAD]
    w = WIDTH - 2 * PAD                   # the bar is the budget
    assert tuple(bar[5]) == ca and tuple(bar[w // 2 - 3]) == ca
    assert tuple(bar[w // 2 + 3]) == cb and tuple(bar[3 * w // 4 - 3]) == cb
    assert tuple(bar[3 * w // 4 + 3]) == UNUSED and tuple(bar[w - 1]) == UNUSED


def test_a_disk_keeps_its_colour_when_the_list_order_changes():
    disks = [band(f"/img/{n}.raw", 100, (0, 10), (0, 20), 10 * MiB, domain=n, target="vda")
             for n in ("web", "db", "cache", "build")]
    disks.append(band("/srv/plain.raw", 100, (0, 10), (0, 20), 10 * MiB))   # no domain
    first = pixels(disks)
    again = pixels(disks[::-1])
    n = len(disks)
    for k, c in enumerate(colours(disks)):
        assert swatch(first, k) == swatch(again, n - 1 - k) == c
        assert c in PALETTE                                  # five disks: the first six


def test_the_colour_comes_from_domain_and_target_else_the_path():
    a = band("/img/a.raw", 10, domain="vm1", target="vda")
    moved = band("/elsewhere/a.raw", 10, domain="vm1", target="vda")   # same disk, new path
    assert colours([a]) == colours([moved])
    assert colours([band("/img/a.raw", 10)]) == colours([band("/img/a.raw", 99)])
    keys = [band("/x", 10, domain=f"vm{i}", target="vda") for i in range(60)]
    assert {colours([d])[0] for d in keys} == set(PALETTE)   # the names spread over all


def test_the_disk_colours_are_none_of_the_block_map_s():
    theirs = [render.CACHED, render.HELD, render.REWRITTEN, render.THRASHING,
              render.UNCACHED, UNUSED, BG, SHARE]
    for c in PALETTE:
        for t in theirs:
            assert np.linalg.norm(np.subtract(c, t, dtype=float)) > 60, (c, t)
    more = palette(40)
    assert more[:len(PALETTE)] == tuple(PALETTE) and len(set(more)) == 40
    far = np.linalg.norm(cie_lab(more)[:, None] - cie_lab(theirs)[None], axis=-1)
    assert far.min() >= 20, far.min()


def test_a_disk_keeps_its_colour_while_it_stays_and_gets_it_back_when_it_returns():
    """The daemon's book: two disks whose names pick the same colour get two; a disk that
    leaves takes nothing from the others, and finds its colour again when it returns."""
    names = [f"vm{i}/vda" for i in range(40)]
    pick = {k: colours([band("/x", 1, domain=k.split("/")[0], target="vda")])[0]
            for k in names}
    a, twin = next((x, y) for x in names for y in names if x < y and pick[x] == pick[y])
    c = next(k for k in names if pick[k] != pick[a])
    book = ColourBook()
    first = dict(zip([a, twin, c], book.colours([a, twin, c])))
    assert first[a] == pick[a] and first[twin] != pick[a]          # the first by name wins
    assert len(set(first.values())) == 3
    assert dict(zip([c, a], book.colours([c, a]))) == {k: first[k] for k in (c, a)}
    assert book.colours([twin, c, a]) == [first[twin], first[c], first[a]]   # back, the same
    assert book.colours([c]) == [first[c]]
    assert ColourBook().colours([twin, c]) != [first[twin], first[c]]     # a fresh picture


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
    [c] = colours([d])
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
    ca, cb = colours([a, b])
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
    assert abs(height_of(ca, right) - 0.9) < 0.03
    assert abs(height_of(cb, right) - 0.1) < 0.03
    left = int(x0 + (x1 - x0) * 0.2)                          # 4M: a at 5.6 %
    assert height_of(ca, left) < 0.1
    dot_x = int(x0 + (x1 - x0) * 0.6)                         # 64M = 2**6 of 2**10
    assert sum(1 for c in column(dot_x) if c == SHARE) >= 2    # the dot's white outline
    ring_x = x1 - 2                                           # a's share, 1G: its ring
    above = [c for c in column(ring_x)[:int(0.1 * CHART) + 6]]  # 90 % and above
    assert above.count(ca) >= 4 and SHARE not in above


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


def test_the_curves_size_labels_are_round_powers_of_4(monkeypatch):
    """Curves from 3M (not round) to a 1.5G image: the size axis is labelled at powers of
    4 (4M, 16M, ...), evenly spaced on the log axis, never at 3M x 4^k."""
    from PIL import ImageDraw

    from vmdisktouch.adapters.pictures.host_render import CHART
    from vmdisktouch.sizes import parse_size
    texts = []
    real = ImageDraw.ImageDraw.text
    monkeypatch.setattr(ImageDraw.ImageDraw, "text",
                        lambda self, xy, s, *a, **kw: (texts.append((xy, s)),
                                                       real(self, xy, s, *a, **kw))[1])
    d = band("/a", 1536, domain="vm1", target="vda")
    d = DiskBand(**{**d.__dict__, "curve": [[3 * MiB << k, min(1.0, 0.1 * k)]
                                            for k in range(9)]})
    host_overview_image([d], GiB)
    bottom = band_top(1) + LINE + 4 + CHART - 1
    labels = [(xy[0], s) for xy, s in texts if xy[1] == bottom + 4]
    sizes = [parse_size(s) for _, s in labels]
    assert len(sizes) >= 3, labels
    assert all(s & (s - 1) == 0 and (s.bit_length() - 1) % 2 == 0 for s in sizes), labels
    ratios = {b // a for a, b in zip(sizes, sizes[1:])}
    assert len(ratios) == 1, labels


def cie_lab(rgb) -> np.ndarray:
    """sRGB (D65) -> CIE L*a*b*, the textbook formulas (independent of the module's)."""
    c = np.asarray(rgb, float) / 255
    lin = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    m = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    t = (lin @ m.T) / np.array([0.95047, 1.0, 1.08883])
    f = np.where(t > (6 / 29) ** 3, np.cbrt(t), t / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]),
                     200 * (f[..., 1] - f[..., 2])], axis=-1)


def two_disks_each(n):
    return [(f"vm{k // 2 + 1}", f"vd{'ab'[k % 2]}") for k in range(n)]


@pytest.mark.parametrize("keys", [[(f"vm{k}", "vda") for k in range(1, 5)],   # issue 45
                                  two_disks_each(2), two_disks_each(4), two_disks_each(6),
                                  two_disks_each(8), two_disks_each(12), two_disks_each(24)],
                         ids=["4 domains", "2", "4", "6", "8", "12", "24"])
def test_every_disk_has_a_colour_of_its_own(keys):
    """Four domains of one disk (the operator's host: two shared a colour), and n disks of
    two a domain: every swatch drawn is solid (no hatching) and any two disks' colours are
    at least 20 apart in CIE Lab (Delta E 1976; 2.3 is a just-noticeable difference), those
    the book gives too; past TOP_BANDS + 1 disks, the bands' swatches and the summary's
    grey."""
    n = len(keys)
    disks = [band(f"/img/{k}.raw", 10, domain=dom, target=t) for k, (dom, t) in enumerate(keys)]
    img = pixels(disks)
    drawn = n if n <= TOP_BANDS + 1 else TOP_BANDS
    got = []
    for k in range(drawn):
        x0, y0, x1, y1 = swatch_box(k)
        px = img[y0:y1 + 1, x0:x1 + 1].reshape(-1, 3)
        assert (px == px[0]).all(), f"disk {k}'s swatch is hatched"
        got.append(tuple(int(v) for v in px[0]))
    if drawn < n:
        assert swatch(img, TOP_BANDS) == OTHERS
    for cs in (got, colours(disks)):
        lab = cie_lab(cs)
        dist = np.linalg.norm(lab[:, None] - lab[None], axis=-1)[np.triu_indices(len(cs), 1)]
        assert dist.min() >= 20, (cs, dist.min())


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
