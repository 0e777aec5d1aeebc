"""The host overview PNG: the budget bar split by disk, one band per disk."""

from __future__ import annotations

import numpy as np

from vmdisktouch.adapters.host_render import (BAND, BAR, LABEL, PALETTE, TEXT, UNUSED,
                                              DiskBand, host_overview_image)

MiB = 1 << 20


def band(name, n, held_blocks, cached_blocks, held_bytes):
    held = np.zeros(n, bool)
    held[held_blocks[0]:held_blocks[1]] = True
    res = np.zeros(n, np.float32)
    res[cached_blocks[0]:cached_blocks[1]] = 1.0
    return DiskBand(name, held_bytes, res, held)


def test_the_budget_bar_shows_each_disk_s_share_in_its_colour():
    disks = [band("/a", 1000, (0, 500), (0, 500), 500 * MiB),
             band("/b", 1000, (0, 250), (0, 500), 250 * MiB)]
    img = np.asarray(host_overview_image(disks, 1000 * MiB, width=1000))
    bar = img[TEXT + BAR // 2]
    assert tuple(bar[10]) == PALETTE[0] and tuple(bar[499]) == PALETTE[0]
    assert tuple(bar[500]) == PALETTE[1] and tuple(bar[749]) == PALETTE[1]
    assert tuple(bar[750]) == UNUSED and tuple(bar[999]) == UNUSED


def test_each_band_draws_its_disk_held_blue_cached_green():
    disks = [band("/a", 700, (0, 100), (0, 350), 100 * MiB),
             band("/b", 700, (350, 700), (350, 700), 350 * MiB)]
    width = LABEL + 700                                   # one column per block
    img = np.asarray(host_overview_image(disks, 1000 * MiB, width=width))
    assert img.shape == (TEXT + BAR + 4 + 2 * (BAND + 2) + 2, width, 3)
    row_a = img[TEXT + BAR + 4 + BAND // 2, LABEL:]
    row_b = img[TEXT + BAR + 4 + BAND + 2 + BAND // 2, LABEL:]
    assert tuple(row_a[50]) == (0, 0, 255)                # held
    assert tuple(row_a[200]) == (0, 255, 0)               # cached, not held
    assert tuple(row_a[500]) == (0, 0, 0)                 # neither
    assert tuple(row_b[100]) == (0, 0, 0) and tuple(row_b[600]) == (0, 0, 255)
    swatch_b = img[TEXT + BAR + 4 + BAND + 2 + BAND // 2, 5]
    assert tuple(swatch_b) == PALETTE[1]


def test_an_image_larger_than_the_band_is_averaged_per_column():
    disks = [band("/a", 10_000, (0, 5_000), (0, 10_000), MiB)]
    img = np.asarray(host_overview_image(disks, 2 * MiB, width=LABEL + 100))
    row = img[TEXT + BAR + 4 + BAND // 2, LABEL:]
    assert (row[:50, 2] == 255).all() and (row[50:, 1] == 255).all()
