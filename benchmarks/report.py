"""Shared by the benchmarks: write a result section into docs/benchmarks.md.

Each benchmark owns one section, delimited by HTML comments
``<!-- BEGIN name -->`` / ``<!-- END name -->``; re-running a benchmark
replaces its own section and leaves the others alone. Every section starts
with the date, the machine and the command that produced it.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
HEADER = ("# Benchmarks\n\n"
          "Every figure here was produced by a command in `benchmarks/`; each section names "
          "its command, date and machine. The machines are shared and noisy (2 cores), so "
          "compare the ratios measured side by side in one run, not absolute times.\n")


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return (f"{platform.node()}: Linux {platform.release()}, {os.cpu_count()} CPUs ({cpu}), "
            f"{mem / 2**30:.0f} GiB RAM")


def provenance(command: str | None = None) -> str:
    command = command or "python " + " ".join(sys.argv)
    today = datetime.date.today().isoformat()
    return f"Measured {today} on {machine()}.\nCommand: `{command}`\n"


def update_section(name: str, markdown: str, path: str = DOC) -> None:
    """Replace (or append) section ``name`` of docs/benchmarks.md with ``markdown``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.rstrip()}\n{end}\n"
    text = HEADER
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def chart_font(size: int = 14):
    """Pillow's default font at ``size`` (older Pillow: its fixed-size bitmap font)."""
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()
