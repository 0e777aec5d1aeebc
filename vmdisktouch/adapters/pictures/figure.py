"""A map PNG an operator can read: the grid of ``render`` with a header, an axis and a legend.

Layout, top to bottom: a header (what, when, held / budget, resident,
cycle), the grid with an offset axis on its left (round offsets evenly
spaced, ``offset_ticks``: 0, 0.5G, 1G, 1.5G, ... each beside the pixel row that
holds it), then a legend of the colours, or for the heat map a colour bar on
its fixed scale with the threshold marked (``colorbar_ticks``: a log scale has
no 0, so its first label is its floor). The canvas is at least ``MIN_WIDTH`` (512) pixels wide: a
small grid is scaled up by a whole factor (``fit_scale``) rather than drawn
in a corner. Text uses PIL's default font (FreeType when Pillow has it).
``Figure.boxes`` names where each legend swatch was drawn (the tests read
those pixels).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vmdisktouch.adapters.pictures import render
from vmdisktouch.sizes import format_size

MIN_WIDTH = 512
MAX_AUTO_SCALE = 64              # settings.MAX_SCALE
TEXT = (230, 230, 230)
DIM = (150, 150, 150)
PAD = 8
AXIS = 64             # px left of the grid for the offset labels
LINE = 16             # px per line of text
SWATCH = 12
NICE = (1, 2, 5, 10)  # a tick step is one of these times a power of ten, of one unit
UNITS = (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40), ("P", 1 << 50))

MAP_LEGEND = (("held by vmdisktouch", render.HELD),
              ("held, rewritten lately", render.REWRITTEN),
              ("cached by the guest (brighter = more)", render.CACHED),
              ("thrashing (refaults)", render.THRASHING),
              ("not cached", render.UNCACHED),
              ("hole (no data)", render.HOLE[0]))


def fit_scale(layout_width: int, scale: int | None) -> int:
    """The pixel scale: as given, else the smallest whole factor that makes the grid at
    least ``MIN_WIDTH`` wide (at most ``MAX_AUTO_SCALE``)."""
    if scale:
        return scale
    k = -(-MIN_WIDTH // max(1, layout_width))
    return max(1, min(MAX_AUTO_SCALE, k))


def grid_origin(header_lines: int = 2) -> tuple[int, int]:
    """Where ``compose`` puts the grid's top left (a run's maps have 2 header lines)."""
    return AXIS, PAD + LINE * header_lines + PAD


def grid_pixels(png: Image.Image, layout_width: int, layout_height: int, scale: int,
                header_lines: int = 2) -> np.ndarray:
    """The grid of a composed map as one RGB row per map pixel (tests, tools)."""
    x0, y0 = grid_origin(header_lines)
    a = np.asarray(png.convert("RGB"))[y0:y0 + layout_height * scale,
                                       x0:x0 + layout_width * scale]
    return a[scale // 2::scale, scale // 2::scale].reshape(-1, 3)


@functools.lru_cache(maxsize=None)
def load_font(size: int = 12):
    """Loaded once: the figure is drawn every cycle."""
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, ValueError, OSError, ImportError):   # no FreeType: the bitmap font
        return ImageFont.load_default()


@dataclass
class Figure:
    image: Image.Image
    grid_origin: tuple[int, int]                       # where the grid's top left is
    boxes: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)


def compose(grid: Image.Image, layout: render.Layout, block_size: int, header: list[str],
            *, legend=MAP_LEGEND, colorbar: tuple[float, float] | None = None) -> Figure:
    """The figure around ``grid`` (``render``'s image at ``layout``): ``header`` lines on
    top, the offset axis on the left, ``legend`` (label, colour) or, for the heat map,
    ``colorbar`` = (vmax, threshold) below."""
    font = load_font()
    gw, gh = grid.size
    head_h = grid_origin(len(header))[1]
    width = max(MIN_WIDTH, AXIS + gw + PAD)
    per_row = max(1, (width - AXIS) // 250)             # legend entries per line
    if colorbar is not None:
        foot_h = PAD + 17 + 3 * LINE + PAD
    else:
        foot_h = PAD + LINE * -(-len(legend) // per_row) + PAD
    img = Image.new("RGB", (width, head_h + gh + foot_h), tuple(int(x) for x in render.PADDING))
    img.paste(grid, (AXIS, head_h))
    d = ImageDraw.Draw(img)
    for k, text in enumerate(header):
        d.text((PAD, PAD + k * LINE), text, fill=TEXT if k == 0 else DIM, font=font)
    _axis(d, font, layout, block_size, head_h, gh)
    fig = Figure(img, (AXIS, head_h))
    y = head_h + gh + PAD
    if colorbar is not None:
        _colorbar(d, font, fig, colorbar, y, width)
    else:
        for k, (label, colour) in enumerate(legend):
            x = AXIS + (k % per_row) * 250
            yy = y + (k // per_row) * LINE
            box = (x, yy + 1, x + SWATCH, yy + 1 + SWATCH)
            if colour == render.HOLE[0]:
                d.rectangle(box, fill=render.HOLE[1], outline=DIM)
                d.rectangle((x, yy + 1, x + SWATCH // 2, yy + 1 + SWATCH // 2),
                            fill=render.HOLE[0])
            else:
                d.rectangle(box, fill=colour, outline=DIM)
            fig.boxes[label] = box
            d.text((x + SWATCH + 6, yy), label, fill=TEXT, font=font)
    return fig


def offset_ticks(size: int, most: int) -> list[tuple[float, str]]:
    """(offset in bytes, label) from 0 up to ``size``, at most ``most`` steps: the step is
    1, 2 or 5 x 10^e of the largest binary unit ``size`` reaches, so the labels are round,
    evenly spaced and in one unit (a 3G image: 0, 0.5G, 1G, ..., 2.5G)."""
    name, unit = "", 1
    for n, u in UNITS:
        if size >= u:
            name, unit = n, u
    span = size / unit
    if span <= 0:
        return [(0.0, "0")]
    raw = span / max(1, most)
    e = math.floor(math.log10(raw))
    m = next(m for m in NICE if m * 10.0 ** e >= raw * (1 - 1e-9))
    digits = max(0, -e if m < 10 else -e - 1)
    out = []
    for i in range(int(span / (m * 10.0 ** e) + 1e-9) + 1):
        v = round(i * m * 10.0 ** e, digits)
        out.append((v * unit, "0" if i == 0 else f"{v:.{digits}f}{name}"))
    return out


def _axis(d, font, layout: render.Layout, block_size: int, top: int, gh: int) -> None:
    """Offset labels down the left (``offset_ticks``), at most one every 3 lines, each
    beside the pixel row holding its offset."""
    row_bytes = layout.width * layout.blocks_per_pixel * block_size
    for offset, label in offset_ticks(layout.nblocks * block_size, gh // (LINE * 3)):
        y = top + int(round(offset / row_bytes * layout.scale))
        if offset and y > top + gh - LINE // 2:     # clear of the "offset" below the grid
            continue
        d.line((AXIS - 5, y, AXIS - 1, y), fill=DIM)
        d.text((PAD, y - 6), label, fill=DIM, font=font)
    d.text((PAD, top + gh + 2), "offset", fill=DIM, font=font)


def colorbar_ticks(vmax: float, threshold: float) -> list[float]:
    """The colour bar's tick values: on the log scale (``threshold`` > 0) its floor, a
    tenth of the threshold, the powers of ten between and ``vmax``, never 0 (a log scale
    has none); on the linear scale 0 and ``vmax``."""
    if not 0 < threshold / 10 < vmax:
        return [0.0, vmax]
    vmin = threshold / 10
    decades = range(math.floor(math.log10(vmin)) + 1, math.ceil(math.log10(vmax)))
    return [vmin, *(10.0 ** k for k in decades if vmin < 10.0 ** k < vmax), vmax]


def _colorbar(d, font, fig: Figure, colorbar, y: int, width: int) -> None:
    """The heat scale (``render.heat_fraction``: logarithmic from a tenth of the
    threshold), with tick labels, the threshold marked, and what the outline means."""
    vmax, threshold = colorbar
    vmin = threshold / 10 if threshold > 0 else None
    x0, x1 = AXIS, width - PAD
    span = max(1, x1 - x0 - 1)
    for x in range(x0, x1):
        c = render.VIRIDIS[int(round((x - x0) / span * 255))]
        d.line((x, y, x, y + 14), fill=tuple(int(v) for v in c))
    fig.boxes["colorbar"] = (x0, y, x1, y + 14)

    def at(v: float) -> int:
        return x0 + int(round(float(render.heat_fraction(np.array([v]), vmax, vmin)[0]) * span))

    ticks = colorbar_ticks(vmax, threshold)
    placed = []                                       # (value, x, label x, label width)
    for k, v in enumerate(ticks):
        x = at(v) if v > 0 else x0
        label = f"{v:g}"
        w = d.textlength(label, font=font)
        lx = min(max(x0, x - w / 2), x1 - w)
        while placed and lx < placed[-1][2] + placed[-1][3] + 6:
            if k < len(ticks) - 1 or len(placed) == 1:    # the two ends stay
                break
            placed.pop()                              # the last end wins over a middle one
        else:
            placed.append((v, x, lx, w))
    for v, x, lx, _ in placed:
        d.line((x, y + 14, x, y + 17), fill=DIM)
        d.text((lx, y + 17), f"{v:g}", fill=DIM, font=font)
    if vmin is not None and threshold < vmax:
        xt = at(threshold)
        d.line((xt, y - 3, xt, y + 16), fill=render.OUTLINE, width=2)
        fig.boxes["threshold"] = (xt, y - 3, xt, y + 16)
    d.text((x0, y + 17 + LINE), f"heat, log scale; white mark: the threshold "
           f"({threshold:g}), hotter blocks are candidates", fill=TEXT, font=font)
    d.text((x0, y + 17 + 2 * LINE), "white outline on the map: held by vmdisktouch",
           fill=TEXT, font=font)


def header_lines(path: str, when: float, *, held: int | None = None,
                 budget: int | None = None, resident: int, size: int,
                 cycle: int | None = None, blocks_per_pixel: int, block_size: int,
                 what: str) -> list[str]:
    import time
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when))
    second = f"{stamp}  resident {format_size(resident)} of {format_size(size)}"
    if held is not None:
        second += f"  held {format_size(held)}/{format_size(budget or 0)}"
    if cycle is not None:
        second += f"  cycle {cycle}"
    second += f"  ({format_size(blocks_per_pixel * block_size)} per pixel)"
    return [f"{what}: {path}", second]
