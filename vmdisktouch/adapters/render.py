"""Per-block maps to PIL images: the block map and the heat map.

Build, then emit: these functions return images; ``atomic.write_png`` writes
them. Blocks are laid out row by row, block 0 at the top left. Each pixel
covers ``blocks_per_pixel`` consecutive blocks; pixels after the end of the
image are padding (dark grey).

Colours of the block map (documented in the README):

* red: at least one block of the pixel was rewritten recently while held; brightness
  grows with the rewritten share of the pixel (from half to full);
* blue: otherwise, at least one block is held by the daemon; brightness
  grows with the held share (from half to full);
* yellow: otherwise, at least one block of the pixel is thrashing (the
  trace source: its pages keep refaulting, ``Policy.thrashing``) and is not
  held; brightness grows with the share of such blocks (from half to full);
* green: otherwise, brightness is exactly the fraction of the pixel's pages
  that are cached (0 = black = nothing cached).

A pixel's share is the mean over its blocks. Red and blue start at half
brightness so one block among many is still visible; green is linear so the
snapshot PNG can be read as a residency measure.

The heat map shows each pixel's hottest block on the viridis scale (dark
violet = cold, yellow = hot), normalised to ``vmax`` (default: the hottest
block of the map).
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

PADDING = np.array([40, 40, 40], dtype=np.uint8)

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
    out = head.max(axis=1) if how == "max" else head.mean(axis=1)
    if whole < v.size:
        tail = v[whole:]
        out = np.append(out, tail.max() if how == "max" else tail.mean())
    return out


def _to_image(rgb: np.ndarray, layout: Layout) -> Image.Image:
    """Place ``npixels`` RGB rows on the grid, pad, scale."""
    grid = np.empty((layout.width * layout.height, 3), dtype=np.uint8)
    grid[:] = PADDING
    grid[:rgb.shape[0]] = rgb
    img = Image.fromarray(grid.reshape(layout.height, layout.width, 3), "RGB")
    if layout.scale > 1:
        img = img.resize((layout.width * layout.scale, layout.height * layout.scale),
                         Image.NEAREST)
    return img


def _brightness(share: np.ndarray) -> np.ndarray:
    return np.where(share > 0, 127.5 + 127.5 * share, 0).round().astype(np.uint8)


def block_map_image(fraction: np.ndarray, held_mask: np.ndarray | None,
                    red_mask: np.ndarray | None, layout: Layout,
                    thrash_mask: np.ndarray | None = None) -> Image.Image:
    """The block map: red rewritten > blue held > yellow thrashing > green cached > black."""
    cached = _per_pixel(np.clip(fraction, 0, 1), layout, "mean")
    rgb = np.zeros((cached.size, 3), dtype=np.uint8)
    rgb[:, 1] = (cached * 255).round().astype(np.uint8)
    if thrash_mask is not None:
        thrash = _per_pixel(thrash_mask, layout, "mean")
        on = thrash > 0
        rgb[on] = 0
        rgb[on, 0] = rgb[on, 1] = _brightness(thrash[on])
    if held_mask is not None:
        held = _per_pixel(held_mask, layout, "mean")
        on = held > 0
        rgb[on] = 0
        rgb[on, 2] = _brightness(held[on])
    if red_mask is not None:
        red = _per_pixel(red_mask, layout, "mean")
        on = red > 0
        rgb[on] = 0
        rgb[on, 0] = _brightness(red[on])
    return _to_image(rgb, layout)


def residency_image(fraction: np.ndarray, layout: Layout) -> Image.Image:
    """The snapshot's block map: green brightness = fraction of pages cached."""
    return block_map_image(fraction, None, None, layout)


def png_bytes(image: Image.Image) -> bytes:
    """The image encoded as PNG (``atomic.write_bytes`` or ``outputs`` writes it)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def heat_image(heat: np.ndarray, layout: Layout, vmax: float | None = None) -> Image.Image:
    """The heat map on the viridis scale; each pixel shows its hottest block."""
    h = _per_pixel(heat, layout, "max")
    if vmax is None:
        vmax = float(h.max()) if h.size else 0.0
    if not vmax > 0:
        vmax = 1.0
    idx = (np.clip(h / vmax, 0, 1) * 255).round().astype(np.intp)
    return _to_image(VIRIDIS[idx], layout)
