"""render: per-block maps to images (pure, synthetic maps)."""

import numpy as np
import pytest

from vmdisktouch.adapters.pictures import render
from vmdisktouch.adapters.pictures.render import Layout


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
    g = np.asarray(render.CACHED, dtype=float)
    assert img.size == (2, 2)
    assert tuple(px[0]) == tuple((0.5 * g).round().astype(int))       # mean of 0 and 1
    assert tuple(px[1]) == tuple((0.375 * g).round().astype(int))     # mean of 0.5 and 0.25
    assert tuple(px[2]) == render.CACHED                              # the short last pixel
    assert tuple(px[3]) == tuple(render.PADDING)


def test_block_map_priorities_rewritten_over_held_over_thrashing_over_cached():
    n = 10
    frac = np.ones(n)
    held = np.zeros(n, bool)
    red = np.zeros(n, bool)
    thrash = np.zeros(n, bool)
    held[2:6] = True
    red[4] = True
    thrash[5:8] = True
    px = pixels(render.block_map_image(frac, held, red, Layout.fit(n, blocks_per_pixel=1,
                                                                   width=n), thrash))
    assert [tuple(p) for p in px[:2]] == [render.CACHED] * 2
    assert [tuple(p) for p in px[2:4]] == [render.HELD] * 2
    assert tuple(px[4]) == render.REWRITTEN
    assert tuple(px[5]) == render.HELD                                # held over thrashing
    assert [tuple(p) for p in px[6:8]] == [render.THRASHING] * 2
    dark = render.block_map_image(np.zeros(n), None, None, Layout.fit(n, 1, width=n))
    assert pixels(dark).max() == 0


def test_the_colours_stay_apart_for_red_green_colour_blindness():
    """Deuteranopia simulated (Viénot et al. 1999, linear RGB): the map's colours, and
    black and the hole grey, stay at least 40 apart (0-255 scale) from each other."""
    m = np.array([[0.29275, 0.70725, 0.0], [0.29275, 0.70725, 0.0], [-0.02234, 0.02234, 1.0]])

    def deutan(c):
        lin = (np.asarray(c, float) / 255) ** 2.2
        return (np.clip(m @ lin, 0, 1) ** (1 / 2.2)) * 255

    colours = [render.CACHED, render.HELD, render.REWRITTEN, render.THRASHING,
               render.UNCACHED, render.HOLE[0]]
    for i, a in enumerate(colours):
        for b in colours[i + 1:]:
            assert np.linalg.norm(deutan(a) - deutan(b)) >= 40, (a, b)


def test_holes_are_a_checkerboard_not_black():
    n = 8
    holes = np.zeros(n, bool)
    holes[4:] = True
    lay = Layout.fit(n, blocks_per_pixel=1, width=8, scale=4)
    px = np.asarray(render.block_map_image(np.zeros(n), None, None, lay, hole_mask=holes))
    assert px[:, :16].max() == 0                                      # data, not cached
    hole = {tuple(p) for p in px[:, 16:].reshape(-1, 3)}
    assert hole == set(render.HOLE)                                   # both greys


def test_one_red_block_among_many_is_still_visible():
    n = 1024
    red = np.zeros(n, bool)
    red[700] = True
    px = pixels(render.block_map_image(np.zeros(n), None, red, Layout.fit(n, blocks_per_pixel=256)))
    assert (px[:, 0] >= 100).sum() == 1


def test_the_heat_scale_is_fixed_and_logarithmic_from_a_tenth_of_the_threshold():
    f = render.heat_fraction(np.array([0.0, 0.004, 0.005, 0.05, 2.0, 3.0]), 2.0, 0.005)
    assert f[0] == f[1] == f[2] == 0 and f[4] == f[5] == 1
    assert f[3] == pytest.approx(np.log10(10) / np.log10(400))      # the threshold, 38 %
    lay = Layout.fit(2, blocks_per_pixel=1, width=2)
    a = pixels(render.heat_image(np.array([0.5, 1.0]), lay, vmax=2.0))
    b = pixels(render.heat_image(np.array([0.5, 0.6]), lay, vmax=2.0))
    assert tuple(a[0]) == tuple(b[0])                # the same heat, the same colour


def test_held_pixels_are_outlined_on_the_heat_map():
    heat = np.zeros(16)
    held = np.zeros(16, bool)
    held[5:7] = True
    lay = Layout.fit(16, blocks_per_pixel=1, width=4, scale=4)       # 4 x 4 pixels of 4 x 4
    px = np.asarray(render.heat_image(heat, lay, vmax=1.0, held_mask=held))
    white = np.all(px == render.OUTLINE, axis=2)
    assert white[4:8, 4:12][[0, -1], :].all() and white[4:8, [4, 11]].all()   # the border
    assert not white[5:7, 5:11].any() and not white[:4].any()


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
