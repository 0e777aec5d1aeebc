"""bench_hotzone's chart (Pillow): IOPS (5 s rolling median) and held bytes over time, per scenario."""

from __future__ import annotations

import os

from benchmarks.hotzone_report import COLOURS, LABELS, Result, rolling_median
from benchmarks.report import chart_font
from tests.support.common import MiB


def draw_chart(results: dict[str, Result], path: str, duration: float, budget: int,
               hot_len: int, steady_from: float) -> None:
    from PIL import Image, ImageDraw
    W, H = 1100, 760
    img = Image.new("RGB", (W, H), "white")
    d = ImageDraw.Draw(img)
    font = chart_font(14)
    L, R = 80, W - 20
    panels = [(50, 470), (540, 700)]      # (top, bottom) of IOPS and held-bytes panels
    tmax = duration
    ymax = max([v for r in results.values() for _, v in rolling_median(r.series())] + [1]) * 1.1
    hmax = max([s.held for r in results.values() for s in r.samples] + [budget, 1]) * 1.1

    def x(t):
        return L + (R - L) * min(max(t, 0), tmax) / tmax

    def axes(top, bottom, vmax, unit, fmt):
        d.rectangle([L, top, R, bottom], outline=(0, 0, 0))
        for i in range(6):
            v = vmax * i / 5
            y = bottom - (bottom - top) * i / 5
            d.line([L, y, R, y], fill=(225, 225, 225))
            d.text((L - 8, y), fmt(v), fill=(0, 0, 0), font=font, anchor="rm")
        step = 10 if tmax <= 120 else 20 if tmax <= 240 else 60
        for t in range(0, int(tmax) + 1, step):
            d.line([x(t), bottom, x(t), bottom + 4], fill=(0, 0, 0))
            d.text((x(t), bottom + 6), f"{t}", fill=(0, 0, 0), font=font, anchor="mt")
        d.text((L, top - 6), unit, fill=(0, 0, 0), font=font, anchor="lb")

    top, bottom = panels[0]
    axes(top, bottom, ymax, "IOPS (5 s rolling median of per-second IOPS)", lambda v: f"{v / 1000:.0f}k")
    sx = x(steady_from)
    d.line([sx, top, sx, bottom], fill=(180, 180, 180), width=1)
    d.text((sx + 4, top + 4), "steady window", fill=(120, 120, 120), font=font)
    for name, r in results.items():
        pts = [(x(t), bottom - (bottom - top) * v / ymax) for t, v in rolling_median(r.series())]
        if len(pts) > 1:
            d.line(pts, fill=COLOURS[name], width=2)
    top, bottom = panels[1]
    axes(top, bottom, hmax, "held bytes (VmLck of the holder), MiB", lambda v: f"{v / MiB:.0f}")
    for level, label in ((budget, "budget"), (hot_len, "hot zone")):
        y = bottom - (bottom - top) * level / hmax
        d.line([L, y, R, y], fill=(200, 200, 200), width=1)
        d.text((R - 4, y + (-2 if label == "budget" else 2)), label, fill=(120, 120, 120),
               font=font, anchor="rb" if label == "budget" else "rt")
    for name, r in results.items():
        pts = [(x(s.t), bottom - (bottom - top) * s.held / hmax) for s in r.samples]
        if len(pts) > 1:
            d.line(pts, fill=COLOURS[name], width=2)
    d.text(((L + R) / 2, H - 30), "seconds since the workload started", fill=(0, 0, 0), font=font,
           anchor="mm")
    lx, ly = L + 10, 6
    for name in results:
        wtext = 40 + d.textlength(LABELS[name], font=font)
        if lx + wtext > R:                      # wrap the legend onto a second row
            lx, ly = L + 10, ly + 18
        d.rectangle([lx, ly, lx + 14, ly + 14], fill=COLOURS[name])
        d.text((lx + 20, ly + 7), LABELS[name], fill=(0, 0, 0), font=font, anchor="lm")
        lx += wtext
    os.makedirs(os.path.dirname(path), exist_ok=True)
    img.save(path + ".tmp.png")
    os.replace(path + ".tmp.png", path)

