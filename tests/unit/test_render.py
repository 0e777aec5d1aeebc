"""render: per-block maps to images (pure, synthetic maps)."""

import numpy as np
import pytest

from vmdisktouch.adapters import render
from vmdisktouch.adapters.render import Layout


def pixels(img):
    return np.asarray(img.convert("RGB")).reshape(-1, 3)


def test_fit_covers_every_block_within_max_pixels():
    lay = Layout.fit(1 << 20, max_pixels=1 << 16)
    assert lay.blocks_per_pixel == 16
    assert lay.width * lay.height >= lay.npixels == (1 << 20) // 16
    assert lay.width * lay.height < lay.npixels + lay.width  # at most one padded row


def test_fit_width_and_aspect():
    assert Layout.fit(1000, blocks_per_pixel=1, width=100).height == 10
    wide = Layout.fit(10000, blocks_per_pixel=1, aspect=4.0)
    assert wide.width == pytest.approx(4 * wide.height, rel=0.05)
    assert Layout.fit(7, blocks_per_pixel=1, width=100).width == 7  # no empty columns


def test_fit_rejects_bad_values():
    with pytest.raises(ValueError):
        Layout.fit(10, blocks_per_pixel=0)


def test_green_is_the_cached_fraction_and_padding_is_grey():
    frac = np.array([0.0, 1.0, 0.5, 0.25, 1.0])
    img = render.residency_image(frac, Layout.fit(5, blocks_per_pixel=2, width=2))
    px = pixels(img)
    assert img.size == (2, 2)
    assert tuple(px[0]) == (0, 128, 0)        # mean of 0 and 1
    assert tuple(px[1]) == (0, 96, 0)         # mean of 0.5 and 0.25
    assert tuple(px[2]) == (0, 255, 0)        # the short last pixel
    assert tuple(px[3]) == tuple(render.PADDING)


def test_block_map_priorities_red_over_blue_over_green():
    n = 8
    frac = np.ones(n)
    held = np.zeros(n, bool)
    red = np.zeros(n, bool)
    held[2:6] = True
    red[4] = True
    px = pixels(render.block_map_image(frac, held, red, Layout.fit(n, blocks_per_pixel=1, width=n)))
    assert [tuple(p) for p in px[:2]] == [(0, 255, 0)] * 2
    assert all(p[2] == 255 and p[0] == p[1] == 0 for p in px[2:4])
    assert tuple(px[4]) == (255, 0, 0)
    assert tuple(px[5]) == (0, 0, 255)
    dark = render.block_map_image(np.zeros(n), None, None, Layout.fit(n, 1, width=n))
    assert pixels(dark).max() == 0


def test_one_red_block_among_many_is_still_visible():
    n = 1024
    red = np.zeros(n, bool)
    red[700] = True
    px = pixels(render.block_map_image(np.zeros(n), None, red, Layout.fit(n, blocks_per_pixel=256)))
    assert (px[:, 0] >= 128).sum() == 1


def test_heat_uses_viridis_and_pixel_max():
    heat = np.array([0.0, 0.0, 0.0, 2.0])
    px = pixels(render.heat_image(heat, Layout.fit(4, blocks_per_pixel=2, width=2)))
    assert tuple(px[0]) == tuple(render.VIRIDIS[0])
    assert tuple(px[1]) == tuple(render.VIRIDIS[255])
    lum = render.VIRIDIS.astype(float) @ [0.299, 0.587, 0.114]
    assert np.all(np.diff(lum) >= 0)  # perceptual: brightness never falls
    assert lum[-1] - lum[0] > 150


def test_scale_multiplies_size():
    img = render.heat_image(np.arange(6.0), Layout.fit(6, blocks_per_pixel=1, width=3, scale=4))
    assert img.size == (12, 8)
