"""Settings are defined once: flags, defaults, validation and the docs agree."""

import argparse
import datetime
import math
import os
import pathlib
import re
import time

import pytest

from vmdisktouch.config import settings
from vmdisktouch.errors import ConfigError
from vmdisktouch.sizes import format_size

ROOT = pathlib.Path(__file__).resolve().parents[2]


def parse(argv):
    p = argparse.ArgumentParser()
    settings.add_arguments(p)
    return vars(p.parse_args(argv))


def test_docs_are_generated_from_settings():
    assert (ROOT / "docs/configuration.md").read_text() == settings.configuration_doc()


def test_every_setting_has_a_flag_and_defaults_apply():
    cfg = settings.resolve(parse(["--max-hold", "1G"]))
    assert cfg.max_hold == 1 << 30
    for s in settings.SETTINGS:
        if not s.required:
            assert cfg[s.key] == s.default


@pytest.mark.parametrize("flag,value,key,expected", [
    ("--max-hold", "1.5GiB", "max_hold", int(1.5 * (1 << 30))),
    ("--min-free", "256M", "min_free", 256 << 20),
    ("--interval", "500ms", "interval", 0.5),
    ("--interval", "2m", "interval", 120.0),
    ("--threshold", "0.75", "threshold", 0.75),
    ("--blocks-per-pixel", "16", "blocks_per_pixel", 16),
])
def test_flags_parse_human_values(flag, value, key, expected):
    argv = ["--max-hold", "1G", flag, value] if flag != "--max-hold" else [flag, value]
    assert settings.resolve(parse(argv))[key] == expected


def test_cli_overrides_file_and_file_overrides_default():
    cfg = settings.resolve(parse(["--interval", "3"]), {"max_hold": "2G", "interval": 9,
                                                        "threshold": 0.5}, "f.toml")
    assert cfg.interval == 3.0 and cfg.max_hold == 2 << 30 and cfg.threshold == 0.5


@pytest.mark.parametrize("argv,needle", [
    (["--max-hold", "lots"], "--max-hold"),
    (["--max-hold", "0"], "--max-hold"),
    (["--max-hold", "1G", "--threshold", "0"], "--threshold"),
    (["--max-hold", "1G", "--interval", "-1"], "--interval"),
    (["--max-hold", "1G", "--scale", "0"], "--scale"),
])
def test_bad_values_name_the_option(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        settings.resolve(parse(argv))


def test_bad_file_value_names_file_and_key():
    with pytest.raises(ConfigError, match=r"host\.toml: key decay"):
        settings.resolve(parse([]), {"max_hold": "1G", "decay": "fast"}, "host.toml")


def test_missing_budget_is_an_error():
    with pytest.raises(ConfigError, match="--max-hold is required"):
        settings.resolve(parse([]))


# ---------------------------------------------------------------------------
# Every value is checked where the setting is defined: any input gives a
# bounded, finite value or a ConfigError naming where it came from.

NUMERIC = [s for s in settings.SETTINGS if s.kind in ("size", "duration", "number", "integer")]
PAGE = os.sysconf("SC_PAGE_SIZE")


def argv_with(s, value):
    return ([] if s.key == "max_hold" else ["--max-hold", "1G"]) + [f"{s.flag}={value}"]


def short_id(value):
    """A test id for any value (str() refuses ints of more than 4300 digits)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"int{value.bit_length()}bits"
    text = str(value)
    return text if len(text) <= 24 else f"{text[:12]}...{len(text)}chars"


@pytest.mark.parametrize("s", NUMERIC, ids=[s.key for s in NUMERIC])
@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "NaN", "infinity", "1e308", "1" * 400,
                                  "9" * 5000, "1" * 5000 + "s", ""], ids=short_id)
def test_non_finite_and_huge_flags_are_refused_naming_the_flag(s, text):
    with pytest.raises(ConfigError) as exc:
        settings.resolve(parse(argv_with(s, text)))
    msg = str(exc.value)
    assert msg.startswith(f"option {s.flag}: bad value ") and len(msg) < 300, msg


@pytest.mark.parametrize("s", NUMERIC, ids=[s.key for s in NUMERIC])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e308, -1e308, 10 ** 400,
                                   10 ** 5000, -(10 ** 5000)], ids=short_id)
def test_non_finite_and_huge_file_values_are_refused_naming_file_and_key(s, value):
    with pytest.raises(ConfigError) as exc:
        settings.resolve(parse([]), {"max_hold": "1G", s.key: value}, "host.toml")
    msg = str(exc.value)
    assert msg.startswith(f"host.toml: key {s.key}: bad value ") and len(msg) < 300, msg


ODD_VALUES = [True, False, None, [], [1], ["1G"], {}, {"path": "x"}, b"1G", object(),
              datetime.datetime(2024, 1, 1, 12, 0), datetime.date(2024, 1, 1),
              datetime.time(12, 0), -0.0, 0.0, -1, 0, 1, 2 ** 63, 1.5, 1e-320, "0", " ",
              "-0", "+5", "1_000", "0x10", "\0", "a\nb", "é" * 3000, "9" * 100_000 + "x"]


@pytest.mark.parametrize("s", settings.SETTINGS, ids=[s.key for s in settings.SETTINGS])
def test_any_value_parses_to_a_finite_value_or_a_config_error(s):
    for value in ODD_VALUES:
        start = time.monotonic()
        try:
            out = settings.parse_value(s, value, "W")
        except ConfigError as exc:
            assert str(exc).startswith(f"W: bad value ") and len(str(exc)) < 400, str(exc)
        else:
            assert type(out) is {"size": int, "integer": int, "duration": float,
                                 "number": float, "fraction": float, "path": str}[s.kind], (value, out)
            if s.kind != "path":
                assert math.isfinite(out) and out >= 0 and str(out)[0] != "-", (value, out)
        assert time.monotonic() - start < 0.5, (s.key, short_id(value))


def test_negative_zero_is_zero():
    cfg = settings.resolve(parse([]), {"max_hold": "1G", "amp_resident": -0.0,
                                       "min_free": -0.0, "load_rate": -0.0}, "f")
    assert str(cfg.amp_resident) == "0.0" and cfg.min_free == 0 and cfg.load_rate == 0


def test_400_digit_max_hold_is_a_config_error_not_an_overflow():
    with pytest.raises(ConfigError, match=r"option --max-hold: .*too large: at most 1E"):
        settings.resolve(parse(["--max-hold", "1" * 400]))


def test_block_size_must_be_a_page_multiple():
    with pytest.raises(ConfigError, match=re.escape(
            f"option --block-size: bad value '1000' for block_size (expected a size: must be a "
            f"multiple of the page size ({PAGE} bytes))")):
        settings.resolve(parse(["--max-hold", "1G", "--block-size", "1000"]))


# key -> (accepted values, refused values); each refused one with what the message says
BOUNDS = {
    "foreign_share": ([0, "0.1", 1, 0.25], [(1.5, "<= 1"), (-0.1, ">= 0"), ("nan", "finite")]),
    "checksum_share": ([1, "0.125", 0.5, 1 / 256],
                       [(0, ">= 0.00390625"), (1e-320, ">= 0.0039"), (1 / 257, ">= 0.0039"),
                        (1.5, "<= 1"), ("nan", "finite")]),
    "spill": ([0, "1", 4, 0.5], [(4.5, "<= 4"), (-1, ">= 0"), ("inf", "finite")]),
    "access_source": (["auto", "TRACE", "mincore"], [("ebpf", "one of"), (1, "one of"), ("", "one of")]),
    "carry_heat": (["auto", "ON", "off"], [("yes", "one of"), (1, "one of"), ("", "one of")]),
    "carry_interval": (["1", "30s", 86400], [(0.5, "at least 1 s"), (86401, "at most 86400")]),
    "max_hold": (["1", "1E", 1 << 60], [(0, "greater than 0"), ("1025P", "at most 1E")]),
    "min_free": ([0, "0", "1E"], [(-1, "negative"), ((1 << 60) + 1, "at most 1E")]),
    "interval": (["0.1", "100ms", 0.1, 86400, "24h"],
                 [("0.05", "at least 0.1 s"), (0.05, "at least 0.1 s"), ("99ms", "at least 0.1"),
                  (0, "at least 0.1"), (86401, "at most 86400 s"), ("25h", "at most 86400")]),
    "block_size": ([PAGE, 2 * PAGE, "64M"],
                   [(1000, "multiple of the page size"), (PAGE + 1, "multiple"),
                    (PAGE // 2, "multiple"), (0, "multiple"), ("128M", "at most 64M")]),
    "amp_resident": ([0, 1e6], [(-0.1, ">= 0"), (1e6 + 1, "<= 1000000")]),
    "amp_rewritten": ([0, "1e6"], [("-1", ">= 0"), ("2e6", "<= 1000000")]),
    "sigma_resident": ([0, 64, "64"], [(64.5, "<= 64"), (-1, ">= 0")]),
    "sigma_rewritten": ([0, 64], [(65, "<= 64"), (1e9, "<= 64")]),
    "decay": ([100, 1e-4, "0.001"], [(0, ">= 0.0001"), (1e-320, ">= 0.0001"),
                                    ("1e-320", ">= 0.0001"), (9.9e-5, ">= 0.0001"),
                                    (100.5, "<= 100")]),
    "threshold": ([1e6, 1e-4], [(0, ">= 0.0001"), (1e-320, ">= 0.0001"), (1e-9, ">= 0.0001"),
                                (2e6, "<= 1000000")]),
    "rewritten_seconds": ([86400, "1ms"], [(0, "greater than 0"), (86401, "at most 86400 s")]),
    "load_rate": ([0, "1M", "1E"], [(1, "0 (unpaced) or at least 1M/s"), ("1023K", "1M/s"),
                                    ((1 << 60) + 1, "at most 1E")]),
    "status": (["/a", "x" * 4096, "é" * 2048],
               [("", "file path"), ("a\0b", "NUL"), ("a\nb", "line break"), ("a\rb", "line"),
                ("x" * 4097, "longer than 4096 bytes"), ("é" * 2049, "4096 bytes"),
                (5, "file path")]),
    "blocks_per_pixel": ([1, 1 << 40, "16", 16.0],
                         [(0, ">= 1"), ((1 << 40) + 1, "<= 1099511627776"), (1.5, "whole"),
                          ("1" * 5000, "<= 1099511627776"), ("-" + "1" * 5000, ">= 1")]),
    "state_save_interval": ([1, 86400, "5m"], [(0.5, "at least 1 s"), (86401, "at most 86400 s")]),
    "width": ([1, 16384], [(0, ">= 1"), (16385, "<= 16384")]),
    "scale": ([1, 64], [(0, ">= 1"), (65, "<= 64")]),
    "aspect": ([0.01, 100], [(0.009, ">= 0.01"), (101, "<= 100"), (0, ">= 0.01")]),
    "metrics_listen": (["127.0.0.1:1", "127.255.0.9:65535", "[::1]:9105", "localhost:9105"],
                       [("127.0.0.1:0", "from 1 to 65535"), ("127.0.0.1:65536", "1 to 65535"),
                        ("0.0.0.0:9105", "not a loopback address"),
                        ("[::]:9105", "not a loopback address"),
                        ("192.168.1.5:9105", "not a loopback address"),
                        ("example.com:80", "not an IP address"), ("9105", "HOST:PORT"),
                        (9105, "HOST:PORT"), ("127.0.0.1", "HOST:PORT")]),
}


def test_every_setting_has_bounds_tested():
    paths = {"heat_png", "map_png", "host_png", "state_dir", "metrics_file"}   # as status
    assert set(BOUNDS) | paths == set(settings.BY_KEY)


@pytest.mark.parametrize("key", BOUNDS)
def test_bounds(key):
    good, bad = BOUNDS[key]
    s = settings.BY_KEY[key]
    for value in good:
        settings.parse_value(s, value, "W")
        if isinstance(value, str) and key != "status":  # the same through a flag
            settings.resolve(parse(argv_with(s, value)))
    for value, needle in bad:
        with pytest.raises(ConfigError) as exc:
            settings.parse_value(s, value, f"f.toml: key {key}")
        assert str(exc.value).startswith(f"f.toml: key {key}: bad value ")
        assert needle in str(exc.value), str(exc.value)


def test_help_states_the_bounds():
    for key, needle in [("interval", "From 0.1 s"), ("block_size", "multiple of the page size"),
                        ("sigma_resident", "From 0 to 64"), ("decay", "From 0.0001"),
                        ("decay", "to 100"), ("threshold", "From 0.0001"),
                        ("threshold", "below amp_resident + amp_rewritten"),
                        ("checksum_share", "From 1/256"),
                        ("load_rate", "0, or from 1M"), ("max_hold", "at most 1E"),
                        ("scale", "From 1 to 64"), ("aspect", "From 0.01 to 100")]:
        assert needle in settings.BY_KEY[key].help
    assert "at most 4096 bytes" in settings.configuration_doc()


# ---------------------------------------------------------------------------
# check_host: settings that can never work on this host

GiB = 1 << 30


def host_config(**over):
    values = {"max_hold": "4G", "min_free": "1G"}
    values.update(over)
    return settings.resolve({}, values, "f.toml")


def test_check_host_accepts_a_sane_config():
    assert settings.check_host(host_config(), 16 * GiB) == []


@pytest.mark.parametrize("min_free", ["16G", "100G", 16 * GiB + 1])
def test_check_host_refuses_a_floor_at_or_above_the_memory(min_free):
    with pytest.raises(ConfigError) as exc:
        settings.check_host(host_config(min_free=min_free), 16 * GiB)
    msg = str(exc.value)
    assert msg.startswith(f"min_free {format_size(settings.parse_size(min_free))} is not below "
                          "the host's memory (MemTotal 16G): nothing could ever be held"), msg


def test_check_host_message_example():
    with pytest.raises(ConfigError, match=re.escape(
            "min_free 100G is not below the host's memory (MemTotal 23G)")):
        settings.check_host(host_config(min_free="100G"), int(23.4 * GiB))


def test_check_host_refuses_a_budget_below_one_block():
    with pytest.raises(ConfigError, match=re.escape(
            "max_hold 512K is smaller than one block (block_size 1M): nothing could ever be "
            "held")):
        settings.check_host(host_config(max_hold="512K"), 16 * GiB)
    assert settings.check_host(host_config(max_hold="1M"), 16 * GiB) == []


def test_check_host_warns_about_a_budget_above_the_memory():
    warnings = settings.check_host(host_config(max_hold="64G"), 16 * GiB)
    assert len(warnings) == 1
    assert warnings[0].startswith("max_hold 64G is more than the host's memory (MemTotal 16G)")
    assert "min_free 1G" in warnings[0] and "can never be reached" in warnings[0]
    assert "\n" not in warnings[0]
    assert settings.check_host(host_config(max_hold="16G"), 16 * GiB) == []


# Floors: a value past one makes the daemon useless, so it is refused where the
# setting is defined, the same from a flag, a file, a reload and ``config --check``.

@pytest.mark.parametrize("key,value", [("decay", "1e-320"), ("decay", "0.00005"),
                                       ("threshold", "1e-320"), ("checksum_share", "1e-320")])
def test_a_value_below_the_floor_is_refused_from_a_flag_and_a_file(key, value):
    s = settings.BY_KEY[key]
    with pytest.raises(ConfigError, match=f"^option {s.flag}: bad value '{value}' for {key} "):
        settings.resolve(parse(argv_with(s, value)))
    with pytest.raises(ConfigError, match=f"^host.toml: key {key}: bad value {float(value)!r}"):
        settings.resolve(parse([]), {"max_hold": "1G", key: float(value)}, "host.toml")


def test_every_floor_is_stated_in_the_docs():
    doc = settings.configuration_doc()
    for needle in ["From 0.0001 (slower", "From 0.0001 (lower", "From 1/256",
                   "From 0.1 s", "From 1 s", "0, or from 1M"]:
        assert needle in doc, needle


@pytest.mark.parametrize("over,where", [
    ({"threshold": 2}, "f.toml: key threshold"),
    ({"threshold": 5, "amp_rewritten": 4}, "f.toml: key threshold"),
    ({"amp_resident": 0, "amp_rewritten": 0}, "f.toml: key amp_resident"),
    ({"amp_resident": 1e-320, "amp_rewritten": "1e-320"}, "f.toml: key amp_resident"),
    ({"amp_resident": 0.01, "amp_rewritten": 0.02}, "f.toml: key amp_resident"),
])
def test_a_threshold_no_heat_can_reach_is_refused_naming_the_key(over, where):
    with pytest.raises(ConfigError) as exc:
        settings.check_host(host_config(**over), 16 * GiB)
    msg = str(exc.value)
    assert msg.startswith(f"{where}: threshold ") and "nothing could ever be held" in msg, msg
    assert "\n" not in msg


def test_the_threshold_check_names_the_flag_and_passes_what_can_be_reached():
    cfg = settings.resolve(parse(["--max-hold", "4G", "--threshold", "3"]))
    with pytest.raises(ConfigError, match="^option --threshold: threshold 3 is not below "
                                          "amp_resident \\+ amp_rewritten = 2"):
        settings.check_host(cfg, 16 * GiB)
    assert settings.check_host(host_config(threshold=1.9, access_source="trace"), 16 * GiB) == []
    warnings = settings.check_host(host_config(threshold=1.5), 16 * GiB)   # auto: maybe mincore
    assert len(warnings) == 1 and "with the mincore source" in warnings[0], warnings
