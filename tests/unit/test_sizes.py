"""Sizes and durations: exact, bounded, and only ValueError for any input."""

import datetime
import time

import pytest

from vmdisktouch.sizes import (MAX_DURATION, MAX_SIZE, format_size, parse_duration,
                               parse_size)

MiB = 1 << 20


def short_id(value):
    """A test id for any value (str() refuses ints of more than 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"int{value.bit_length()}bits"
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}...{len(text)}chars"


@pytest.mark.parametrize("text,expected", [
    ("0", 0), ("512", 512), ("4K", 4096), ("256M", 256 * MiB), ("4G", 4 << 30),
    ("1.5GiB", 3 << 29), ("1.5gib", 3 << 29), ("4GB", 4 * 10 ** 9), ("1.5gb", 1_500_000_000),
    ("512MB", 512 * 10 ** 6), ("2kb", 2000), ("1EB", 10 ** 18), ("7B", 7),
    (" 2 m ", 2 * MiB), (".5K", 512), ("3.K", 3072),
    ("1E", 1 << 60), ("1EiB", MAX_SIZE), ("0001K", 1024),
    (5, 5), (0, 0), (1536.9, 1536), (-0.0, 0),
])
def test_parse_size(text, expected):
    n = parse_size(text)
    assert n == expected and type(n) is int


def test_parse_size_is_exact_and_rounds_down():
    # float arithmetic would round 1023.999...9K up to 1M
    assert parse_size("1023." + "9" * 40 + "K") == MiB - 1
    assert parse_size("0.1") == 0
    assert parse_size("1." + "0" * 100_000 + "1M") == MiB      # a long fraction is fine
    assert parse_size("0." + "9" * 59 + "1E") == MAX_SIZE - 1
    assert parse_size("1.5") == 1
    assert parse_size("0." + "9" * 80 + "GB") == 10 ** 9 - 1      # decimal units too
    assert parse_size("1.0000000001GB") == 10 ** 9
    assert parse_size(str(MAX_SIZE)) == MAX_SIZE


@pytest.mark.parametrize("value,needle", [
    (MAX_SIZE + 1, "too large: at most 1E"),
    (str(MAX_SIZE + 1), "too large"),
    ("1025P", "too large"),
    ("1" * 400, "too large"),                 # was OverflowError
    ("1" * 5000 + "G", "too large"),          # int() refuses > 4300 digits
    (10 ** 5000, "too large"),
    (1e308, "too large"),
    (float("inf"), "not a finite size"),
    (float("nan"), "not a finite size"),
    (-1, "must not be negative"),
    (-0.5, "must not be negative"),
    ("-1", "not a size"),
    ("inf", "not a size"),
    ("nan", "not a size"),
    ("1e9", "not a size"),
    ("4Gi", "not a size"),
    ("", "not a size"),
    ("lots", "not a size"),
    (True, "true/false"),
    (None, "not a size"),
    ([1], "not a size: a list"),
    ({"a": 1}, "not a size: a dict"),
    (datetime.date(2024, 1, 1), "not a size: a date"),
], ids=short_id)
def test_parse_size_refuses_with_value_error_only(value, needle):
    with pytest.raises(ValueError, match=needle):
        parse_size(value)


def test_parse_size_is_linear_on_long_garbage():
    start = time.monotonic()
    for text in ["9" * 200_000 + "x", "." + "9" * 200_000 + "x", "1" * 200_000 + "Kx"]:
        with pytest.raises(ValueError) as exc:
            parse_size(text)
        assert len(str(exc.value)) < 200
    assert time.monotonic() - start < 2


def test_format_size_up_to_the_cap():
    assert format_size(MAX_SIZE) == "1E"
    assert format_size(1536 * (1 << 50)) == "1.5E"
    assert parse_size(format_size(MAX_SIZE)) == MAX_SIZE


@pytest.mark.parametrize("text,expected", [
    ("5", 5.0), ("2.5s", 2.5), ("500ms", 0.5), ("100ms", 0.1), ("2m", 120.0), ("1h", 3600.0),
    (7, 7.0), (0.25, 0.25), (-0.0, 0.0), (MAX_DURATION, float(MAX_DURATION)),
])
def test_parse_duration(text, expected):
    x = parse_duration(text)
    assert x == expected and type(x) is float


@pytest.mark.parametrize("value,needle", [
    (float("inf"), "not a finite duration"),
    (float("nan"), "not a finite duration"),
    ("inf", "not a duration"),
    ("nan", "not a duration"),
    (1e308, "too large"),
    (10 ** 400, "too large"),                 # float() would overflow
    ("1" * 400, "too large"),                 # float() would give inf
    ("1" * 5000 + "h", "too large"),
    (str(MAX_DURATION + 1), "too large"),
    ("300000h", "too large"),
    (-1, "must not be negative"),
    ("-1", "not a duration"),
    ("soon", "not a duration"),
    (False, "true/false"),
    ([5], "not a duration: a list"),
    (datetime.time(1, 2), "not a duration: a time"),
], ids=short_id)
def test_parse_duration_refuses_with_value_error_only(value, needle):
    with pytest.raises(ValueError, match=needle):
        parse_duration(value)
