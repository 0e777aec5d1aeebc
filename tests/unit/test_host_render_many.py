"""The host PNG of a host of a hundred disks: the TOP_BANDS disks holding most as bands,
the rest summed in one band (their count, their sums, what needs a look counted), the
budget bar's others in one grey segment, only the bands' curves; the height bounded by
that of TOP_BANDS + 1 disks, and the rows of disks not served by UNSERVED_ROWS."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image, ImageDraw

from vmdisktouch.adapters.pictures import render
from vmdisktouch.adapters.pictures.host_render import (BAR, BG, CHART, CURVES_TITLE, HEAD,
                                                       LABEL, LINE, OTHERS, PAD, ROW,
                                                       SWATCH, TOP_BANDS, TRACK, UNSERVED_ROWS,
                                                       UNUSED, WIDTH, WOULD_GAIN, ColourBook,
                                                       DiskBand, Unserved, band_top, colours,
                                                       columns_x, host_overview_image,
                                                       picture_height, summary_lines,
                                                       swatch_box, top_and_rest)

MiB = 1 << 20
GiB = 1 << 30
BUDGET = 10 * GiB


def disk(k: int, held: int, *, wanted=None, share=..., limited_by=None, adopted=False,
         curve=None) -> DiskBand:
    return DiskBand(f"/img/{k}.raw", held, np.zeros(8, np.float32), np.zeros(8, bool),
                    domain=f"vm{k:03d}", target="vda", size_bytes=GiB,
                    share_bytes=held if share is ... else share, wanted_bytes=wanted,
                    limited_by=limited_by, adopted=adopted, curve=curve)


def host(n: int, seed: int = 1) -> list[DiskBand]:
    """``n`` disks holding distinct amounts (1 to n MiB, shuffled: the daemon's order is not
    the ranking), each wanting twice what it holds (a hundred want 9.9 GiB in all)."""
    helds = [(k + 1) * MiB for k in range(n)]
    random.Random(seed).shuffle(helds)
    return [disk(k, h, wanted=2 * h) for k, h in enumerate(helds)]


def texts_of(monkeypatch, *args, **kw) -> tuple[Image.Image, list[tuple[tuple, str]]]:
    """The picture and every text drawn on it, with where."""
    texts = []
    real = ImageDraw.ImageDraw.text
    monkeypatch.setattr(ImageDraw.ImageDraw, "text",
                        lambda self, xy, s, *a, **k: (texts.append((tuple(xy), s)),
                                                      real(self, xy, s, *a, **k))[1])
    return host_overview_image(*args, **kw), texts


def names_drawn(texts) -> list[str]:
    """The first text line of each band, top to bottom (the disk's name)."""
    x = PAD + SWATCH + 6
    return [s for (tx, ty), s in sorted(texts, key=lambda t: t[0][1])
            if tx == x and band_top(0) <= ty < band_top(TOP_BANDS + 2)
            and (ty - band_top(0)) % (band_top(1) - band_top(0)) == 0]


def test_a_hundred_disks_are_as_tall_as_thirteen_and_decode():
    """Up to TOP_BANDS + 1 disks a band each (the picture grows by a band); past it, the
    height stops at that of TOP_BANDS + 1 disks, with or without curves; the PNG decodes."""
    def h(n, **kw):
        return host_overview_image(host(n), BUDGET, **kw).height
    assert h(TOP_BANDS + 1) - h(TOP_BANDS) == band_top(1) - band_top(0)
    assert h(100) == h(TOP_BANDS + 2) == h(TOP_BANDS + 1) == picture_height(TOP_BANDS + 1)
    img = host_overview_image(host(100), BUDGET)
    assert img.height < 900
    curved = [DiskBand(**{**d.__dict__, "curve": [[MiB, 0.1], [GiB, 0.8]]}) for d in host(100)]
    with_curves = host_overview_image(curved, BUDGET)
    assert with_curves.height == picture_height(100, curves=True) > img.height
    with Image.open(io.BytesIO(render.png_bytes(with_curves))) as png:
        png.load()
        assert png.size == (WIDTH, with_curves.height) and png.format == "PNG"
        assert (np.asarray(png.convert("RGB")) == np.asarray(with_curves)).all()


def test_the_bands_are_the_disks_holding_most_then_wanting_most(monkeypatch):
    disks = host(100)
    # a tie at the 12th place: the one wanting more ranks first, whatever the list order
    ties = sorted(disks, key=lambda d: -d.held_bytes)[TOP_BANDS - 1].held_bytes
    disks.append(disk(200, ties, wanted=10 * ties))
    _, texts = texts_of(monkeypatch, disks, BUDGET)
    ranked = sorted(disks, key=lambda d: (-d.held_bytes, -(d.wanted_bytes or 0)))
    names = names_drawn(texts)
    assert names[:TOP_BANDS] == [f"{d.domain}/vda" for d in ranked[:TOP_BANDS]]
    assert "vm200/vda" in names[:TOP_BANDS]
    assert names[TOP_BANDS] == f"{len(disks) - TOP_BANDS} more disks"
    assert len(names) == TOP_BANDS + 1
    top, rest = top_and_rest(disks)
    assert top == ranked[:TOP_BANDS] and sorted(rest, key=id) == sorted(ranked[TOP_BANDS:], key=id)


def test_thirteen_disks_are_all_bands_in_the_daemon_s_order(monkeypatch):
    disks = host(TOP_BANDS + 1)
    img, texts = texts_of(monkeypatch, disks, BUDGET)
    assert names_drawn(texts) == [f"{d.domain}/vda" for d in disks]      # not ranked
    assert not any("more disk" in s for _, s in texts)
    px = np.asarray(img)
    assert not (px[HEAD + BAR // 2] == OTHERS).all(axis=1).any()          # no others' segment
    assert top_and_rest(disks) == (disks, [])


def test_the_summary_band_sums_the_rest_and_its_bar_is_their_held_and_wanted(monkeypatch):
    disks = host(100)
    top, rest = top_and_rest(disks)
    held, wanted = sum(d.held_bytes for d in rest), sum(d.wanted_bytes for d in rest)
    assert 0 < held < wanted < BUDGET
    img, texts = texts_of(monkeypatch, disks, BUDGET)
    px = np.asarray(img)
    alloc_w = columns_x(WIDTH)[0]
    y = band_top(TOP_BANDS)
    row = px[y + 2 + ROW // 2, LABEL:LABEL + alloc_w]
    solid = int((row == OTHERS).all(axis=1).sum())
    assert abs(solid - alloc_w * held / BUDGET) <= 2, (solid, alloc_w * held / BUDGET)
    # the dim part ends where the summed want does; past it, the bare track
    end = int(np.flatnonzero((row != TRACK).any(axis=1))[-1]) + 1
    assert abs(end - alloc_w * wanted / BUDGET) <= 2, (end, alloc_w * wanted / BUDGET)
    x0, y0, x1, y1 = swatch_box(TOP_BANDS)
    assert (px[y0:y1 + 1, x0:x1 + 1] == OTHERS).all()
    name, sums, limited, flags = summary_lines(rest)
    assert name == "88 more disks" and limited == "" and flags == ""
    from vmdisktouch.sizes import format_size
    assert sums == (f"hold {format_size(held)} of {format_size(held)} share, "
                    f"want {format_size(wanted)}")
    drawn = [s for (tx, ty), s in texts if y <= ty < y + 2 * LINE]
    assert "88 more disks" in drawn and f"88 more disks: {sums}" in drawn
    assert any(s.startswith(f"held {format_size(held)}") for s in drawn)    # under the bar


def test_disks_needing_a_look_are_counted_in_the_summary(monkeypatch):
    """Small disks that are limited, adopted or without a share fall in the summary: each
    is counted, by reason, in words drawn on the summary band."""
    disks = host(40)
    odd = [disk(300, MiB, limited_by="floor", wanted=GiB),
           disk(301, MiB, limited_by="floor", wanted=GiB),
           disk(302, MiB, limited_by="lock_limit", wanted=GiB),
           disk(303, MiB, adopted=True),
           disk(304, 0, share=None),
           disk(305, 0, limited_by="not_loaded", share=None)]
    disks[5:5] = odd
    top, rest = top_and_rest(disks)
    assert all(any(d is r for r in rest) for d in odd)
    name, _, limited, flags = summary_lines(rest)
    assert name == f"{len(disks) - TOP_BANDS} more disks"
    assert limited == ("4 limited: 2 by the memory floor, 1 by a load error, "
                       "1 by the lock limit")
    assert flags == "1 adopted, 2 no share yet"
    img, texts = texts_of(monkeypatch, disks, BUDGET)
    y = band_top(TOP_BANDS)
    drawn = " ".join(s for (tx, ty), s in texts if y <= ty < y + 2 * LINE)
    assert limited in drawn and flags in drawn
    assert summary_lines([disk(1, MiB, limited_by="cap")])[2] == "1 limited by its cap"


def test_the_budget_bar_draws_the_bands_in_colour_and_the_rest_as_one_grey_segment():
    disks = host(100)
    top, rest = top_and_rest(disks)
    px = np.asarray(host_overview_image(disks, BUDGET))
    bar = px[HEAD + BAR // 2, PAD:WIDTH - PAD]
    w = WIDTH - 2 * PAD
    x = 0.0
    for d, c in zip(top, colours(top)):                  # the bands' colours, in their order
        dx = w * d.held_bytes / BUDGET
        assert tuple(bar[int(x + dx / 2)]) == c
        x += dx
    grey = np.flatnonzero((bar == OTHERS).all(axis=1))
    assert grey.size and (np.diff(grey) == 1).all()      # one segment
    assert abs(grey.size - w * sum(d.held_bytes for d in rest) / BUDGET) <= 3
    assert abs(grey[0] - x) <= 2 and tuple(bar[-1]) == UNUSED


def test_the_curves_panel_draws_only_the_bands_curves_and_says_so(monkeypatch):
    """Every disk has a curve: the bands' flat at 90 %, the others' at 30 %. Only the 90 %
    lines are drawn, and the title says whose they are; with few disks the title is as
    ever."""
    def with_curve(d, top):
        return DiskBand(**{**d.__dict__, "curve": [[MiB, 0.9 if top else 0.3],
                                                   [GiB, 0.9 if top else 0.3]]})
    disks = host(100)
    top, _ = top_and_rest(disks)
    ids = {id(d) for d in top}
    curved = [with_curve(d, id(d) in ids) for d in disks]
    img, texts = texts_of(monkeypatch, curved, BUDGET)
    px = np.asarray(img)
    y = band_top(TOP_BANDS + 1)
    titles = [s for (tx, ty), s in texts if ty == y]
    assert titles and titles[0].startswith(f"curves of the {TOP_BANDS} disks holding most: ")
    top_y, bottom = y + LINE + 4, y + LINE + 4 + CHART - 1
    x0, x1 = PAD + 44, WIDTH - PAD - 1

    def row(ratio):
        return px[round(bottom - ratio * (bottom - top_y)), x0 + 20:x1 - 20]
    assert (row(0.3) == TRACK).all()                      # no line of the others
    drawn = {tuple(int(v) for v in p) for p in row(0.9)}
    assert drawn & set(colours(top))
    few = [with_curve(d, True) for d in host(3)]
    _, texts = texts_of(monkeypatch, few, BUDGET)
    assert (((PAD, band_top(3)), CURVES_TITLE)) in texts


def test_the_bands_colours_stay_far_apart_at_a_hundred_disks():
    """The book colours only the bands: at most TOP_BANDS colours, the first of the
    palette, at least 23 apart (Delta E 1976), frame after frame as the ranking moves."""
    from tests.unit.test_host_render import cie_lab
    book = ColourBook()
    for seed in range(6):                                  # the ranking shuffles each frame
        disks = host(100, seed)
        px = np.asarray(host_overview_image(disks, BUDGET, book=book))
        got = []
        for k in range(TOP_BANDS):
            x0, y0, x1, y1 = swatch_box(k)
            sw = px[y0:y1 + 1, x0:x1 + 1].reshape(-1, 3)
            assert (sw == sw[0]).all()
            got.append(tuple(int(v) for v in sw[0]))
        lab = cie_lab(got + [OTHERS])
        dist = np.linalg.norm(lab[:, None] - lab[None], axis=-1)[np.triu_indices(len(got) + 1, 1)]
        assert dist.min() >= 23, (seed, got, dist.min())


def test_the_rows_of_disks_not_served_stop_at_unserved_rows(monkeypatch):
    disks = host(3)
    many = [Unserved(f"x{k}/vdb", "cache=none", "1G: 50%" if k in (30, 35) else None)
            for k in range(40)]
    at_most = host_overview_image(disks, BUDGET, unserved=many[:UNSERVED_ROWS])
    img, texts = texts_of(monkeypatch, disks, BUDGET, unserved=many)
    assert img.height == at_most.height == picture_height(3, 40)
    y = band_top(3)
    rows = [s for (tx, ty), s in sorted(texts, key=lambda t: t[0][1])
            if y < ty <= y + UNSERVED_ROWS * LINE and tx == PAD + SWATCH + 6]
    assert rows[0].startswith("x30/vdb") and rows[1].startswith("x35/vdb")   # gains first
    assert rows[2].startswith("x0/vdb") and len(rows) == UNSERVED_ROWS
    assert rows[-1] == f"and {40 - UNSERVED_ROWS + 1} more (vmdisktouch discover lists every disk)"
    tri = np.asarray(img)[y + LINE:y + 3 * LINE, :SWATCH]
    assert (tri == WOULD_GAIN).all(axis=2).sum() > 20
    assert [s for (tx, ty), s in texts if ty == y][0].startswith("not served: 40 disks, 2 would")


def test_the_example_tool_writes_the_picture_of_a_hundred_disks(tmp_path):
    from tools import host_example
    out = tmp_path / "host.png"
    assert host_example.main(["--png", str(out)]) == 0
    with Image.open(out) as png:
        png.load()
        assert png.width == WIDTH and png.height == picture_height(100, 5, curves=True)
        px = np.asarray(png.convert("RGB"))
    assert (px[HEAD + BAR // 2] == OTHERS).all(axis=1).any()      # the others' segment
    assert (px == BG).all(axis=2).mean() > 0.3


@pytest.mark.parametrize("n", [TOP_BANDS + 2, 100, 500])
def test_the_height_is_bounded_whatever_the_count(n):
    assert host_overview_image(host(n), BUDGET).height == picture_height(TOP_BANDS + 1)


def test_the_bound_the_docs_state():
    """The module's docstring and docs/reference.md: 1056 px at most, 840 with no disk not
    served, whatever the number of disks (at the default width)."""
    assert picture_height(10 ** 4, 10 ** 4, curves=True) == 1056
    assert picture_height(10 ** 4, 0, curves=True) == 840
    unserved = [Unserved(f"x{k}/vdb", "cache=none") for k in range(200)]
    curved = [DiskBand(**{**d.__dict__, "curve": [[MiB, 0.1], [GiB, 0.8]]}) for d in host(300)]
    assert host_overview_image(curved, BUDGET, unserved=unserved).height == 1056
