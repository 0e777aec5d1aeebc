"""Human byte sizes and durations: ``256M``, ``4G``, ``1.5GiB``, ``30s``, ``2m``."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?)(i?b)?\s*$", re.IGNORECASE)
_DUR_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_DUR_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_size(text: str | int) -> int:
    """Parse a byte size; suffixes are binary (K = KiB = 1024). Raises ValueError."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (expected e.g. 512M, 4G, 1.5GiB)")
    number, unit, _ = m.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(n: int | float) -> str:
    """Format bytes the way vmtouch does: 22M, 1.5G, 4K."""
    n = float(n)
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1024 or unit == "P":
            if unit == "":
                return f"{int(n)}"
            return f"{n:.0f}{unit}" if n >= 10 or n == int(n) else f"{n:.1f}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_duration(text: str | float | int) -> float:
    """Parse seconds: ``5``, ``2.5s``, ``500ms``, ``2m``, ``1h``. Raises ValueError."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"duration must not be negative: {text}")
        return float(text)
    m = _DUR_RE.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (expected e.g. 5, 2.5s, 500ms, 2m)")
    number, unit = m.groups()
    return float(number) * _DUR_UNITS[unit.lower() if unit else None]
