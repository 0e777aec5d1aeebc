"""Per-block maps to PIL images: the block map and the heat map.

Build, then emit: these functions return images; ``atomic.write_png`` writes
them. Blocks are laid out row by row, block 0 at the top left. Each pixel
covers ``blocks_per_pixel`` consecutive blocks; pixels after the end of the
image are padding (dark grey).

Colours of the block map (documented in docs/reference.md), from the Okabe-Ito
palette, which red-green colour-blind eyes tell apart, bright on a dark
background so the daemon's own holds are the most visible colour:

* vermillion: at least one block of the pixel was rewritten recently;
  brightness grows with the rewritten share of the pixel (from half to full);
* sky blue: otherwise, at least one block is held by the daemon; brightness
  grows with the held share (from half to full);
* yellow: otherwise, at least one block of the pixel is thrashing (the
  trace source: its pages keep refaulting, ``Policy.thrashing``) and is not
  held; brightness grows with the share of such blocks (from half to full);
* bluish green: otherwise, brightness is exactly the fraction of the pixel's
  pages that are cached (0 = black = data, none of it cached);
* a grey checkerboard: every block of the pixel is a hole of a sparse file
  (no data: nothing to cache or hold), when the holes are known;
* the background grey: past the end of the image.

A pixel's share is the mean over its blocks. Red and blue start at half
brightness so one block among many is still visible; green is linear so the
snapshot PNG can be read as a residency measure.

The heat map shows each pixel's hottest block on the viridis scale (dark
violet = cold, yellow = hot) on a fixed scale up to ``vmax`` (the run
passes the highest heat possible, ``amp_resident + amp_rewritten``), so a
colour means the same heat in every frame; the run's scale is logarithmic
from a tenth of the threshold (``vmin``), so the threshold, far below the
top, sits mid-scale and what is just above it is visible. Held pixels are
outlined in white. ``figure`` adds the header, the axis, the legend and the colour bar.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

PADDING = np.array([24, 24, 24], dtype=np.uint8)       # also the figure's background
UNCACHED = (0, 0, 0)
CACHED = (0, 158, 115)          # Okabe-Ito bluish green, scaled by the cached fraction
HELD = (86, 180, 233)           # sky blue
REWRITTEN = (213, 94, 0)        # vermillion
THRASHING = (240, 228, 66)      # yellow
HOLE = ((70, 70, 70), (46, 46, 46))   # checkerboard
OUTLINE = (255, 255, 255)

# viridis sampled at i/8 (matplotlib's published values); interpolated linearly.
_VIRIDIS_ANCHORS = np.array([
    (0x44, 0x01, 0x54), (0x47, 0x2D, 0x7B), (0x3B, 0x52, 0x8B), (0x2C, 0x72, 0x8E),
    (0x21, 0x91, 0x8C), (0x28, 0xAE, 0x80), (0x5E, 0xC9, 0x62), (0xAD, 0xDC, 0x30),
    (0xFD, 0xE7, 0x25)], dtype=np.float64)


def _viridis_lut() -> np.ndarray:
    x = np.linspace(0, 1, 256)
    xp = np.linspace(0, 1, len(_VIRIDIS_ANCHORS))
    return np.stack([np.interp(x, xp, _VIRIDIS_ANCHORS[:, c]) for c in range(3)],
                    axis=1).round().astype(np.uint8)


VIRIDIS = _viridis_lut()


@dataclass(frozen=True)
class Layout:
    nblocks: int
    blocks_per_pixel: int
    width: int
    height: int
    scale: int = 1

    @property
    def npixels(self) -> int:
        return -(-self.nblocks // self.blocks_per_pixel)

    @classmethod
    def fit(cls, nblocks: int, blocks_per_pixel: int | None = None, width: int | None = None,
            aspect: float = 1.0, scale: int = 1, max_pixels: int = 1 << 20) -> "Layout":
        """Choose the grid. Without ``blocks_per_pixel``, fit in ``max_pixels``."""
        if nblocks < 0:
            raise ValueError("nblocks must not be negative")
        nblocks = max(nblocks, 1)
        if blocks_per_pixel is None:
            blocks_per_pixel = max(1, -(-nblocks // max_pixels))
        if blocks_per_pixel < 1:
            raise ValueError("blocks per pixel must be at least 1")
        npix = -(-nblocks // blocks_per_pixel)
        if width is None:
            width = max(1, math.ceil(math.sqrt(npix * aspect)))
        width = max(1, min(width, npix))
        height = -(-npix // width)
        return cls(nblocks, blocks_per_pixel, width, height, max(1, scale))


def _per_pixel(values: np.ndarray, layout: Layout, how: str) -> np.ndarray:
    """Reduce per-block values to per-pixel values (float64, length npixels)."""
    v = np.asarray(values, dtype=np.float64)[:layout.nblocks]
    bpp = layout.blocks_per_pixel
    if v.size < layout.nblocks:
        v = np.concatenate([v, np.zeros(layout.nblocks - v.size)])
    if bpp == 1:
        return v
    whole = (v.size // bpp) * bpp
    head = v[:whole].reshape(-1, bpp)
    reduce = {"max": np.max, "min": np.min, "mean": np.mean}[how]
    out = reduce(head, axis=1)
    if whole < v.size:
        tail = v[whole:]
        out = np.append(out, reduce(tail))
    return out


def _to_image(rgb: np.ndarray, layout: Layout, hole: np.ndarray | None = None,
              outline: np.ndarray | None = None) -> Image.Image:
    """Place ``npixels`` RGB rows on the grid, pad, scale; ``hole`` pixels get the
    checkerboard, the edges of ``outline`` pixels a white line."""
    n = layout.width * layout.height
    grid = np.empty((n, 3), dtype=np.uint8)
    grid[:] = PADDING
    grid[:rgb.shape[0]] = rgb
    grid = grid.reshape(layout.height, layout.width, 3)
    k = layout.scale
    if k > 1:
        grid = grid.repeat(k, axis=0).repeat(k, axis=1)
    if hole is not None and hole.any():
        cells = _grid_mask(hole, layout).repeat(k, axis=0).repeat(k, axis=1)
        yy, xx = np.indices(cells.shape)
        check = ((yy // max(1, k // 2)) + (xx // max(1, k // 2))) % 2 == 0
        grid[cells & check] = HOLE[0]
        grid[cells & ~check] = HOLE[1]
    if outline is not None and outline.any():
        cells = _grid_mask(outline, layout).repeat(k, axis=0).repeat(k, axis=1)
        edge = np.zeros_like(cells)
        edge[1:, :] |= cells[1:, :] & ~cells[:-1, :]
        edge[:-1, :] |= cells[:-1, :] & ~cells[1:, :]
        edge[:, 1:] |= cells[:, 1:] & ~cells[:, :-1]
        edge[:, :-1] |= cells[:, :-1] & ~cells[:, 1:]
        edge[0, :] |= cells[0, :]
        edge[-1, :] |= cells[-1, :]
        edge[:, 0] |= cells[:, 0]
        edge[:, -1] |= cells[:, -1]
        grid[edge] = OUTLINE
    return Image.fromarray(np.ascontiguousarray(grid))          # uint8 H x W x 3: RGB


def _grid_mask(per_pixel: np.ndarray, layout: Layout) -> np.ndarray:
    m = np.zeros(layout.width * layout.height, dtype=bool)
    m[:per_pixel.size] = per_pixel
    return m.reshape(layout.height, layout.width)


def _shade(colour, share: np.ndarray) -> np.ndarray:
    """``colour`` from half (a small share) to full brightness (all of the pixel)."""
    f = np.where(share > 0, 0.5 + 0.5 * share, 0.0)[:, None]
    return (f * np.asarray(colour, dtype=np.float64)).round().astype(np.uint8)


def block_map_image(fraction: np.ndarray, held_mask: np.ndarray | None,
                    red_mask: np.ndarray | None, layout: Layout,
                    thrash_mask: np.ndarray | None = None,
                    hole_mask: np.ndarray | None = None) -> Image.Image:
    """The block map: rewritten > held > thrashing > cached (or a hole) > uncached."""
    cached = _per_pixel(np.clip(fraction, 0, 1), layout, "mean")
    rgb = (cached[:, None] * np.asarray(CACHED, dtype=np.float64)).round().astype(np.uint8)
    marked = np.zeros(cached.size, dtype=bool)
    for mask, colour in ((red_mask, REWRITTEN), (held_mask, HELD), (thrash_mask, THRASHING)):
        if mask is None:
            continue
        share = _per_pixel(mask, layout, "mean")
        on = (share > 0) & ~marked
        rgb[on] = _shade(colour, share[on])
        marked |= on
    hole = None
    if hole_mask is not None:
        hole = (_per_pixel(hole_mask, layout, "min") > 0) & ~marked & (cached == 0)
    return _to_image(rgb, layout, hole=hole)


def residency_image(fraction: np.ndarray, layout: Layout) -> Image.Image:
    """The snapshot's block map: green brightness = fraction of pages cached."""
    return block_map_image(fraction, None, None, layout)


def png_bytes(image: Image.Image) -> bytes:
    """The image encoded as PNG (``atomic.write_bytes`` or ``outputs`` writes it)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def heat_fraction(h: np.ndarray, vmax: float, vmin: float | None) -> np.ndarray:
    """Heat -> [0, 1] along the colour scale: linear from 0 to ``vmax`` without ``vmin``,
    else logarithmic from ``vmin`` (and below it: 0) to ``vmax``."""
    h = np.asarray(h, dtype=np.float64)
    if vmin is None or not 0 < vmin < vmax:
        return np.clip(h / vmax, 0, 1)
    lo, hi = math.log10(vmin), math.log10(vmax)
    with np.errstate(divide="ignore"):
        t = (np.log10(np.maximum(h, vmin)) - lo) / (hi - lo)
    return np.clip(t, 0, 1)


def heat_image(heat: np.ndarray, layout: Layout, vmax: float | None = None,
               held_mask: np.ndarray | None = None, vmin: float | None = None) -> Image.Image:
    """The heat map on the viridis scale up to ``vmax`` (default: the hottest block),
    logarithmic from ``vmin`` when given (``heat_fraction``); each pixel shows its hottest
    block; pixels with held blocks are outlined."""
    h = _per_pixel(heat, layout, "max")
    if vmax is None:
        vmax = float(h.max()) if h.size else 0.0
    if not vmax > 0:
        vmax = 1.0
    idx = (heat_fraction(h, vmax, vmin) * 255).round().astype(np.intp)
    held = _per_pixel(held_mask, layout, "max") > 0 if held_mask is not None else None
    return _to_image(VIRIDIS[idx], layout, outline=held)
