"""The host overview PNG: every disk in one picture, and how the budget is split.

Top: one line of text (the sum held of the budget, the number of disks)
over the *budget bar*, as wide as the budget: each disk's held bytes are a
segment in the disk's own colour, in order, and what is left of the budget
is dark grey; so the split is seen at a glance. Below, one *band* per disk:
its colour swatch and name with its held bytes and share of the budget,
then its whole image squeezed into the band's width, each column a slice of
its blocks: blue where the daemon holds blocks (brighter = more of the
slice), else green as bright as the share cached, else black (the block
map's colours, ``render``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

WIDTH = 1024
LABEL = 300                 # pixels of a band's label
BAND = 18                   # pixels per disk band
BAR = 18
TEXT = 16
BG = (24, 24, 24)
UNUSED = (70, 70, 70)
# distinct on a dark background and for red-green colour blindness (Okabe-Ito)
PALETTE = [(230, 159, 0), (86, 180, 233), (0, 158, 115), (240, 228, 66), (0, 114, 178),
           (213, 94, 0), (204, 121, 167), (255, 255, 255)]


@dataclass(frozen=True)
class DiskBand:
    name: str
    held_bytes: int
    resident: np.ndarray        # per block: the fraction cached
    held: np.ndarray            # per block: held (bool)


def _size(n: int) -> str:
    from vmdisktouch.sizes import format_size
    return format_size(n)


def _columns(values: np.ndarray, width: int) -> np.ndarray:
    """``values`` (per block) as ``width`` column means (a block spans columns when the
    image has fewer blocks than columns)."""
    n = values.size
    if not n:
        return np.zeros(width, dtype=np.float32)
    if n < width:
        return values[np.arange(width) * n // width].astype(np.float32)
    col = np.arange(n) * width // n
    sums = np.bincount(col, weights=values.astype(np.float64), minlength=width)
    return (sums / np.bincount(col, minlength=width)).astype(np.float32)


def host_overview_image(disks: list[DiskBand], budget: int, width: int = WIDTH) -> Image.Image:
    height = TEXT + BAR + 4 + len(disks) * (BAND + 2) + 2
    img = Image.new("RGB", (width, height), BG)
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    held = sum(d.held_bytes for d in disks)
    draw.text((4, 2), f"host: held {_size(held)} of {_size(budget)} budget, {len(disks)} disks",
              fill=(230, 230, 230), font=font)
    # the budget bar
    y = TEXT
    draw.rectangle([0, y, width - 1, y + BAR - 1], fill=UNUSED)
    x = 0.0
    for k, d in enumerate(disks):
        w = width * d.held_bytes / budget if budget else 0.0
        if w > 0:
            draw.rectangle([int(x), y, max(int(x), int(x + w) - 1), y + BAR - 1],
                           fill=PALETTE[k % len(PALETTE)])
        x += w
    # the bands
    y = TEXT + BAR + 4
    span = width - LABEL
    for k, d in enumerate(disks):
        colour = PALETTE[k % len(PALETTE)]
        draw.rectangle([0, y, 10, y + BAND - 1], fill=colour)
        share = d.held_bytes / budget if budget else 0.0
        name = d.name if len(d.name) <= 32 else "..." + d.name[-29:]
        label = f"{name}  {_size(d.held_bytes)} ({share:.0%})"
        draw.text((14, y + 3), label, fill=(230, 230, 230), font=font)
        held_cols = _columns(d.held.astype(np.float32), span)
        cached = _columns(np.clip(d.resident, 0, 1), span)
        rgb = np.zeros((span, 3), dtype=np.uint8)
        rgb[:, 1] = (cached * 255).round().astype(np.uint8)
        on = held_cols > 0
        rgb[on] = 0
        rgb[on, 2] = (127.5 + 127.5 * held_cols[on]).round().astype(np.uint8)
        band = np.repeat(rgb[np.newaxis, :, :], BAND, axis=0)
        img.paste(Image.fromarray(np.ascontiguousarray(band)), (LABEL, y))
        y += BAND + 2
    return img
