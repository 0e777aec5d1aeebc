"""Settings are defined once: flags, defaults, validation and the docs agree."""

import argparse
import pathlib

import pytest

from vmdisktouch import settings
from vmdisktouch.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parent.parent


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
