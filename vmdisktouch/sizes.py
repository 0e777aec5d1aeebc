"""Human byte sizes, durations and counts: ``256M``, ``4G``, ``1.5GiB``, ``4GB``, ``30s``,
``2m``, ``1 region``.

Sizes are read as written, as dd(1) and coreutils read them: a bare letter or
the IEC form is binary (``4G`` = ``4GiB`` = 4 × 2^30 bytes), the SI form with
``B`` is decimal (``4GB`` = 4 × 10^9 bytes, what a disk's label says). Case
does not matter.

Both parsers take any value (a string from a flag, or whatever a TOML file
holds) and either return a finite result or raise ``ValueError`` with a
short reason: never ``OverflowError``, never an infinite or NaN result, and
no work that grows faster than the length of the text.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

MAX_SIZE = 1 << 60            # 1 EiB: more than any host has, far below 2**63
MAX_DURATION = 10 ** 9        # seconds (about 31 years)

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50,
          "e": 1 << 60}
_SI_UNITS = {"k": 10 ** 3, "m": 10 ** 6, "g": 10 ** 9, "t": 10 ** 12, "p": 10 ** 15,
             "e": 10 ** 18}
# No nested or overlapping repetitions: matching is linear in the length of the text.
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_SIZE_RE = re.compile(r"^\s*" + _NUMBER + r"\s*([kmgtpe]?)(i?b)?\s*$", re.IGNORECASE)
_DUR_RE = re.compile(r"^\s*" + _NUMBER + r"\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_DUR_UNITS = {None: Decimal(1), "ms": Decimal("0.001"), "s": Decimal(1), "m": Decimal(60),
              "h": Decimal(3600)}
# Every unit is at most 2**60 (or 10**18), so a fraction digit past the 60th cannot
# change floor(number * unit): dropping them keeps the result exact.
_FRACTION_DIGITS = 60


def _excerpt(text: str, limit: int = 40) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


def _split_number(number: str) -> tuple[str, str]:
    """``"0012.50"`` -> ``("12", "50")``: integer digits without leading zeros, fraction."""
    whole, _, fraction = number.partition(".")
    return whole.lstrip("0"), fraction


def parse_size(text: str | int | float) -> int:
    """Parse a byte size: K = KiB = 1024, KB = 1000 (and so on up to E). Raises ValueError.

    The result is a whole number of bytes (a fraction of a byte is dropped),
    from 0 to ``MAX_SIZE`` (1 EiB); larger, negative, infinite or NaN values
    and anything that is not a number or a string are refused.
    """
    if isinstance(text, bool):
        raise ValueError("not a size: true/false")
    if isinstance(text, int):
        value: int | Decimal = text
    elif isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"not a finite size: {text}")
        value = Decimal(text)              # exact
    elif isinstance(text, str):
        m = _SIZE_RE.match(text)
        if not m:
            raise ValueError(f"not a size: {_excerpt(text)} (expected e.g. 512M, 4G = 4GiB; 4GB is decimal, 4 x 10^9)")
        number, unit, byte = m.groups()
        whole, fraction = _split_number(number)
        if len(whole) > 20:                # > 10**19 > MAX_SIZE even without a unit
            raise ValueError(f"too large: at most {format_size(MAX_SIZE)} (1 EiB)")
        fraction = fraction[:_FRACTION_DIGITS]
        si = unit and byte is not None and byte.lower() == "b"
        scale = (_SI_UNITS if si else _UNITS)[unit.lower()]
        value = (int(whole or "0") * scale
                 + int(fraction or "0") * scale // 10 ** len(fraction))
    else:
        raise ValueError(f"not a size: a {type(text).__name__}")
    if value < 0:
        raise ValueError("must not be negative")
    if value > MAX_SIZE:
        raise ValueError(f"too large: at most {format_size(MAX_SIZE)} (1 EiB)")
    return int(value)                      # floor: value >= 0


def format_size(n: int | float) -> str:
    """Format bytes the way vmtouch does: 22M, 1.5G, 4K."""
    n = float(n)
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1024 or unit == "E":
            if unit == "":
                return f"{int(n)}"
            return f"{n:.0f}{unit}" if n >= 10 or n == int(n) else f"{n:.1f}{unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_duration(text: str | float | int) -> float:
    """Parse seconds: ``5``, ``2.5s``, ``500ms``, ``2m``, ``1h``. Raises ValueError.

    The result is finite, from 0 to ``MAX_DURATION`` seconds.
    """
    too_large = f"too large: at most {MAX_DURATION} s"
    if isinstance(text, bool):
        raise ValueError("not a duration: true/false")
    if isinstance(text, int):
        if text > MAX_DURATION:           # before float(), which overflows past 1e308
            raise ValueError(too_large)
        seconds = float(text)
    elif isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"not a finite duration: {text}")
        seconds = text + 0.0               # -0.0 -> 0.0
    elif isinstance(text, str):
        m = _DUR_RE.match(text)
        if not m:
            raise ValueError(f"not a duration: {_excerpt(text)} "
                             "(expected e.g. 5, 2.5s, 500ms, 2m)")
        number, unit = m.groups()
        whole, fraction = _split_number(number)
        if len(whole) > 15:
            raise ValueError(too_large)
        exact = Decimal(f"{whole or '0'}.{fraction[:30] or '0'}") * _DUR_UNITS[
            unit.lower() if unit else None]
        if exact > MAX_DURATION:
            raise ValueError(too_large)
        return float(exact)
    else:
        raise ValueError(f"not a duration: a {type(text).__name__}")
    if seconds < 0:
        raise ValueError("must not be negative")
    if seconds > MAX_DURATION:
        raise ValueError(too_large)
    return seconds


def counted(n: int, noun: str) -> str:
    """``1 region``, ``2 regions``: a count an operator reads agrees with its number."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
