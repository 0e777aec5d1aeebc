"""figure: the map PNGs an operator opens: size, header, axis, legend, colour bar."""

import dataclasses

import numpy as np
import pytest

from vmdisktouch.adapters.pictures import figure, render
from vmdisktouch.adapters.pictures.render import Layout

MiB = 1 << 20


def small_map():
    """64 blocks: 0-15 cached, 16-23 held, 24 rewritten, 32-39 thrashing, 48-63 holes."""
    n = 64
    frac = np.zeros(n)
    frac[:16] = 1.0
    held = np.zeros(n, bool)
    held[16:24] = True
    red = np.zeros(n, bool)
    red[24] = True
    thrash = np.zeros(n, bool)
    thrash[32:40] = True
    holes = np.zeros(n, bool)
    holes[48:] = True
    lay = Layout.fit(n, blocks_per_pixel=1, width=8)
    lay = dataclasses.replace(lay, scale=figure.fit_scale(lay.width, None))
    grid = render.block_map_image(frac, held, red, lay, thrash, holes)
    header = figure.header_lines("/img/vm1.raw", 0.0, held=8 * MiB, budget=16 * MiB,
                                 resident=16 * MiB, size=64 * MiB, cycle=7,
                                 blocks_per_pixel=1, block_size=MiB, what="block map")
    return figure.compose(grid, lay, MiB, header), lay


def test_fit_scale():
    assert figure.fit_scale(8, None) == 64            # 8 x 64 = 512
    assert figure.fit_scale(1, None) == 64            # at most 64
    assert figure.fit_scale(64, None) == 8            # 64 x 8 = 512
    assert figure.fit_scale(1024, None) == 1
    assert figure.fit_scale(64, 3) == 3               # as asked


def test_the_block_map_figure_is_wide_with_its_grid_at_golden_pixels():
    fig, lay = small_map()
    px = np.asarray(fig.image)
    assert fig.image.width >= 512 and lay.scale == 64
    k = lay.scale
    x0, y0 = fig.grid_origin

    def cell(block):                                  # the centre of a block's square
        r, c = divmod(block, lay.width)
        return tuple(px[y0 + r * k + k // 2, x0 + c * k + k // 2])

    assert cell(0) == render.CACHED and cell(15) == render.CACHED
    assert cell(16) == render.HELD and cell(23) == render.HELD
    assert cell(24) == render.REWRITTEN
    assert cell(32) == render.THRASHING
    assert cell(40) == render.UNCACHED
    assert cell(48) in render.HOLE and cell(63) in render.HOLE


def test_the_legend_shows_every_colour_and_the_header_and_axis_are_drawn():
    fig, lay = small_map()
    px = np.asarray(fig.image)
    assert set(fig.boxes) == {label for label, _ in figure.MAP_LEGEND}
    for label, colour in figure.MAP_LEGEND:
        x0, y0, x1, y1 = fig.boxes[label]
        assert tuple(px[y1 - 2, x1 - 2]) == (render.HOLE[1] if colour == render.HOLE[0]
                                              else colour), label
        assert y0 > fig.grid_origin[1] + lay.height * lay.scale          # below the grid
    gx, gy = fig.grid_origin
    header = px[:gy]
    assert (header.max(axis=2) > 120).sum() > 500                      # text
    axis = px[gy:gy + lay.height * lay.scale, :gx - 6]
    assert (axis.max(axis=2) > 100).sum() > 50                         # offset labels


def test_the_heat_figure_has_a_colour_bar_with_the_threshold_marked():
    n = 64
    lay = Layout.fit(n, blocks_per_pixel=1, width=8)
    lay = dataclasses.replace(lay, scale=figure.fit_scale(lay.width, None))
    grid = render.heat_image(np.linspace(0, 2, n), lay, vmax=2.0, vmin=0.005)
    fig = figure.compose(grid, lay, MiB, ["heat map: x", "t"], colorbar=(2.0, 0.05))
    px = np.asarray(fig.image)
    x0, y0, x1, y1 = fig.boxes["colorbar"]
    assert tuple(px[y0 + 7, x0]) == tuple(render.VIRIDIS[0])
    assert tuple(px[y0 + 7, x1 - 1]) == tuple(render.VIRIDIS[255])
    xt = fig.boxes["threshold"][0]
    expected = render.heat_fraction(np.array([0.05]), 2.0, 0.005)[0]
    assert (xt - x0) / (x1 - x0) == pytest.approx(expected, abs=0.01)
    assert tuple(px[y0 + 7, xt]) == render.OUTLINE


# -- the labels: round offsets evenly spaced, a log colour bar without a "0" -----------------

ROUND = (1, 2, 5)                                     # a step is 1, 2 or 5 x 10^e of a unit
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def drawn_texts(monkeypatch) -> list[tuple[float, float, str]]:
    """Every text ``figure`` draws, as (x, y, text)."""
    texts: list[tuple[float, float, str]] = []
    real = figure.ImageDraw.ImageDraw.text

    def text(self, xy, s, *args, **kw):
        texts.append((xy[0], xy[1], s))
        return real(self, xy, s, *args, **kw)

    monkeypatch.setattr(figure.ImageDraw.ImageDraw, "text", text)
    return texts


def is_round(step: float) -> bool:
    e = np.floor(np.log10(step))
    return any(np.isclose(step, m * 10 ** e) or np.isclose(step, m * 10 ** (e + 1)) for m in ROUND)


@pytest.mark.parametrize("size,width", [(3 << 30, None), (10 << 30, None), (100 << 30, None),
                                        (3 << 39, None), (3 << 30, 16), (700 << 20, None),
                                        (64 << 20, 8)])
def test_offset_labels_are_round_and_evenly_spaced(monkeypatch, size, width):
    """3G, 10G, 100G, 1.5T, 700M (and a narrow grid): the axis labels are 0 and multiples
    of one step of 1, 2 or 5 x 10^e of one unit, each beside the row holding its offset."""
    from PIL import Image
    texts = drawn_texts(monkeypatch)
    lay = Layout.fit(size // MiB, width=width)
    lay = dataclasses.replace(lay, scale=figure.fit_scale(lay.width, None))
    grid = Image.new("RGB", (lay.width * lay.scale, lay.height * lay.scale))
    fig = figure.compose(grid, lay, MiB, ["block map: x", "t"])
    x0, top = fig.grid_origin
    bottom = top + lay.height * lay.scale
    labels = [(y + 6, s) for x, y, s in texts if x == figure.PAD and top - 6 <= y + 6 <= bottom
              and s != "offset"]
    assert len(labels) >= 3, labels
    texts_only = [s for _, s in labels]
    assert texts_only[0] == "0", texts_only
    units = {s[-1] for s in texts_only[1:]}
    assert len(units) == 1 and units <= set(UNITS), texts_only          # one unit
    unit = UNITS[units.pop()]
    values = [float(s[:-1] or 0) if s != "0" else 0.0 for s in texts_only]
    steps = np.diff(values)
    assert np.allclose(steps, steps[0]) and is_round(steps[0]), texts_only
    assert values[-1] * unit <= size
    row_bytes = lay.width * lay.blocks_per_pixel * MiB
    for (y, s), v in zip(labels, values):                               # beside its row
        assert abs(y - (top + v * unit / row_bytes * lay.scale)) <= 1, (s, y)
    assert min(np.diff([y for y, _ in labels])) >= figure.LINE, labels   # readable


@pytest.mark.parametrize("vmax,threshold", [(2.0, 0.05), (1.0, 0.5), (17.0, 0.05), (2.0, 3e-4)])
def test_the_log_colour_bar_starts_at_a_real_value_never_0(monkeypatch, vmax, threshold):
    texts = drawn_texts(monkeypatch)
    lay = Layout.fit(64, blocks_per_pixel=1, width=8)
    lay = dataclasses.replace(lay, scale=figure.fit_scale(lay.width, None))
    grid = render.heat_image(np.linspace(0, vmax, 64), lay, vmax=vmax, vmin=threshold / 10)
    fig = figure.compose(grid, lay, MiB, ["heat map: x", "t"], colorbar=(vmax, threshold))
    x0, y0, x1, y1 = fig.boxes["colorbar"]
    ticks = sorted((x, s) for x, y, s in texts if y == y0 + 17)
    labels = [s for _, s in ticks]
    assert "0" not in labels and len(labels) >= 2, labels
    assert float(labels[0]) == pytest.approx(threshold / 10), labels     # the scale's floor
    assert float(labels[-1]) == pytest.approx(vmax), labels
    assert all(float(a) < float(b) for a, b in zip(labels, labels[1:])), labels
