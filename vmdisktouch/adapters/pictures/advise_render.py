"""The picture of ``vmdisktouch advise``: each disk's curve and the size advised on it.

Layout, top to bottom: a header (what was watched, for how long: the seconds
actually watched, when a signal cut the window short, and when); a
line per disk, its swatch in its own colour (``host_render.colours``: each
disk its own, first from its name as in the host PNG), its name, the evidence
its curve and advice stand on (reads and re-reads seen, the window) and its
advice; then the host PNG's
curves panel (``host_render.curves_panel``) with each disk's curve, a ring
where the size advised meets it. A disk with no size advised (no reads, no
re-reads) has no ring; a disk without a curve, or not read, is left out of the
panel.
"""

from __future__ import annotations

import time

from PIL import Image, ImageDraw

from vmdisktouch.adapters.pictures.figure import DIM, LINE, PAD, TEXT, load_font
from vmdisktouch.adapters.pictures.host_render import (BG, CURVES, SWATCH, WIDTH, DiskBand,
                                                       colours, curves_panel, fill_box,
                                                       fit_text)
from vmdisktouch.sizes import format_size

TITLE = ("each disk's curve: the share of its reads an LRU cache of the size serves; ring: "
         "the size advised (held hottest first, it serves the share above)")
ROW = 3 * LINE + 4          # a disk: its name, and its advice in up to two lines


def bands(report: dict) -> list[DiskBand]:
    """A ``DiskBand`` per disk of the report: its curve, the size advised as its share."""
    import numpy as np
    out = []
    for d in report["disks"]:
        size = d["advice"]["bytes"]
        out.append(DiskBand(name=d["path"], held_bytes=0, resident=np.zeros(0),
                            held=np.zeros(0, bool), domain=d.get("domain"),
                            target=d.get("target"), size_bytes=d["image_bytes"],
                            share_bytes=size or None, curve=d.get("curve")))
    return out


def wrap(draw, text: str, room: float, font, lines: int) -> list[str]:
    """``text`` in at most ``lines`` lines of ``room`` px, broken between words; the last
    shortened with "..." when it does not fit."""
    out, words = [], text.split(" ")
    while words and len(out) < lines:
        k = len(words)
        while k > 1 and draw.textlength(" ".join(words[:k]), font=font) > room:
            k -= 1
        out.append(" ".join(words[:k]))
        words = words[k:]
    if words:
        out[-1] = fit_text(draw, out[-1] + " " + " ".join(words), room, font, False)
    return out


def evidence_text(e: dict | None) -> str:
    """What a disk's curve and advice stand on, for its name line ("" for a report
    without it)."""
    if not e:
        return ""
    return (f"; evidence: {e['reads']:,} reads, {e['re_reads']:,} read again, in "
            f"{e['window_seconds']:g} s")


def header(report: dict) -> list[str]:
    """The picture's two header lines: the disks and the seconds actually watched (of the
    ``--duration`` asked, when a signal ended the watch early), then when and the kernel."""
    n = len(report["disks"])
    watched = f"{report['watched_seconds']:.1f} s"
    if report.get("interrupted"):
        watched += f" of {report['duration_seconds']:g} s (interrupted)"
    return [f"advise: {n} disk{'' if n == 1 else 's'} watched {watched}",
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["when"]))
            + f"  kernel {report['kernel']}"]


def advise_image(report: dict, width: int = WIDTH) -> Image.Image:
    """The picture of an ``advise`` report (``commands.advise``)."""
    font = load_font()
    disks = bands(report)
    shown = [k for k, (d, r) in enumerate(zip(disks, report["disks"]))
             if d.curve and len(d.curve) >= 2 and r["reads_per_second"] > 0]
    top = PAD + 2 * LINE + 6
    panel_y = top + len(disks) * ROW + PAD
    img = Image.new("RGB", (width, panel_y + (CURVES if shown else LINE) + PAD), BG)
    draw = ImageDraw.Draw(img)
    for k, line in enumerate(header(report)):
        draw.text((PAD, PAD + k * LINE), line, fill=TEXT if k == 0 else DIM, font=font)
    marks = colours(disks)
    for k, (d, r, colour) in enumerate(zip(report["disks"], disks, marks)):
        y = top + k * ROW
        fill_box(img, (PAD, y + 2, PAD + SWATCH - 1, y + 1 + SWATCH), colour)
        x, room = PAD + SWATCH + 6, width - 2 * PAD - SWATCH - 6
        name = (f"{d['name']} (cache={d['cache']}, {format_size(d['image_bytes'])} image"
                f"{evidence_text(d['advice'].get('evidence'))})")
        draw.text((x, y), fit_text(draw, name, room, font), fill=TEXT, font=font)
        for j, line in enumerate(wrap(draw, d["advice"]["advice"].replace("µs", "us"), room,
                                      font, 2)):
            draw.text((x, y + (j + 1) * LINE), line, fill=DIM, font=font)
    if shown:
        curves_panel(img, draw, font, [disks[k] for k in shown], [marks[k] for k in shown],
                     panel_y, width, TITLE)
    else:
        draw.text((PAD, panel_y), "no curve: no disk was read in the window", fill=DIM,
                  font=font)
    return img
