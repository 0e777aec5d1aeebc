"""bench_refault counts the map's thrashing pixels as the daemon draws them."""

import dataclasses

import numpy as np
import pytest

from benchmarks.bench_refault import yellow_pixels
from vmdisktouch.adapters.pictures import figure, render

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python

MiB = 1 << 20


def draw(path, nblocks, thrash):
    layout = render.Layout.fit(nblocks)
    layout = dataclasses.replace(layout, scale=figure.fit_scale(layout.width, None))
    held = np.zeros(nblocks, dtype=bool)
    held[: nblocks // 8] = True
    grid = render.block_map_image(np.zeros(nblocks), held, None, layout, thrash)
    figure.compose(grid, layout, MiB, ["a", "b"]).image.save(path)


@pytest.mark.parametrize("nblocks", [2048, 3000_000])     # 1 block a pixel; several, shaded
def test_the_thrashing_blocks_are_counted_and_the_legend_swatch_is_not(tmp_path, nblocks):
    png = str(tmp_path / "map.png")
    draw(png, nblocks, None)
    assert yellow_pixels(png, nblocks * MiB, MiB) == 0
    thrash = np.zeros(nblocks, dtype=bool)
    thrash[nblocks // 4: nblocks // 4 + nblocks // 8 + 1] = True     # some pixels partly
    draw(png, nblocks, thrash)
    bpp = render.Layout.fit(nblocks).blocks_per_pixel
    got = yellow_pixels(png, nblocks * MiB, MiB)
    assert nblocks // 8 // bpp <= got <= nblocks // 8 // bpp + 2
