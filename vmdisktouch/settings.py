"""Every setting of ``vmdisktouch run``, defined once.

Each ``Setting`` carries its default, type, unit and help text. The CLI flags
(``add_arguments``), the config-file keys and the configuration table in the
docs (``markdown_table``) are all generated from ``SETTINGS``; nothing else
in the project spells a default. A bad value raises ``ConfigError`` naming
where it came from (the flag, or the file and key) and what was expected.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from vmdisktouch.errors import ConfigError
from vmdisktouch.sizes import format_size, parse_duration, parse_size


def _positive_size(v):
    n = parse_size(v)
    if n <= 0:
        raise ValueError("must be greater than 0")
    return n


def _float(lo=None, hi=None, lo_open=False):
    def parse(v):
        if isinstance(v, bool):
            raise ValueError("expected a number")
        x = float(v)
        if x != x:
            raise ValueError("expected a number")
        if lo is not None and (x < lo or (lo_open and x == lo)):
            raise ValueError(f"must be {'>' if lo_open else '>='} {lo}")
        if hi is not None and x > hi:
            raise ValueError(f"must be <= {hi}")
        return x
    return parse


def _int(lo=None):
    def parse(v):
        if isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()):
            raise ValueError("expected a whole number")
        x = int(v)
        if lo is not None and x < lo:
            raise ValueError(f"must be >= {lo}")
        return x
    return parse


def _duration_positive(v):
    x = parse_duration(v)
    if x <= 0:
        raise ValueError("must be greater than 0")
    return x


def _path(v):
    if not isinstance(v, str) or not v:
        raise ValueError("expected a file path")
    return v


def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "yes", "1", "on"):
        return True
    if isinstance(v, str) and v.lower() in ("false", "no", "0", "off"):
        return False
    raise ValueError("expected true or false")


@dataclass(frozen=True)
class Setting:
    key: str                 # config key; the flag is --key-with-dashes
    parse: Callable[[Any], Any]
    default: Any
    kind: str                # human type for docs: size, duration, number, ...
    unit: str
    help: str
    required: bool = False
    group: str = "daemon"

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def default_text(self) -> str:
        if self.required:
            return "(required)"
        if self.default is None:
            return "(none)"
        if self.kind == "size":
            return format_size(self.default)
        return str(self.default).lower() if isinstance(self.default, bool) else str(self.default)


MiB = 1 << 20
SETTINGS: tuple[Setting, ...] = (
    Setting("max_hold", _positive_size, None, "size", "bytes",
            "Byte budget: the most the daemon holds (mlocks) of this image, at every instant.",
            required=True, group="budget"),
    Setting("min_free", parse_size, 1 << 30, "size", "bytes",
            "Free-memory floor: load only while MemAvailable minus the load stays above it; "
            "below it, release the lowest-priority regions.", group="budget"),
    Setting("interval", _duration_positive, 5.0, "duration", "seconds",
            "Cycle duration: how often residency is sampled and the plan applied."),
    Setting("block_size", _positive_size, MiB, "size", "bytes",
            "Block size: the unit of heat, hold and checksum (a multiple of the page size)."),
    Setting("amp_resident", _float(0), 1.0, "number", "heat per resident block",
            "Amplitude A_r of the Gaussian filter applied to the residency map.", group="heat"),
    Setting("sigma_resident", _float(0), 2.0, "number", "blocks",
            "Width sigma_r of the Gaussian filter applied to the residency map.", group="heat"),
    Setting("amp_rewritten", _float(0), 1.0, "number", "heat per rewritten block",
            "Amplitude A_w of the Gaussian filter applied to the rewritten-blocks map.",
            group="heat"),
    Setting("sigma_rewritten", _float(0), 2.0, "number", "blocks",
            "Width sigma_w of the Gaussian filter applied to the rewritten-blocks map.",
            group="heat"),
    Setting("decay", _float(0, lo_open=True), 0.1, "number", "1/s",
            "Decay coefficient: heat relaxes toward the current input with time constant "
            "1/decay seconds.", group="heat"),
    Setting("threshold", _float(0, lo_open=True), 0.05, "number", "heat",
            "Threshold: blocks with heat at or above it form the candidate regions.",
            group="heat"),
    Setting("rewritten_seconds", _duration_positive, 60.0, "duration", "seconds",
            "How long a rewritten block stays red on the block map.", group="output"),
    Setting("load_rate", parse_size, 256 * MiB, "size", "bytes/s",
            "Pace of loading new regions (0 = unpaced), so a load burst does not starve "
            "the guest's own I/O.", group="budget"),
    Setting("status", _path, None, "path", "",
            "Write a JSON status file here every cycle (replaced atomically).", group="output"),
    Setting("heat_png", _path, None, "path", "",
            "Write the heat map PNG here every cycle (replaced atomically).", group="output"),
    Setting("map_png", _path, None, "path", "",
            "Write the block map PNG here every cycle (replaced atomically).", group="output"),
    Setting("blocks_per_pixel", _int(1), None, "integer", "blocks",
            "Blocks per pixel in the PNGs (default: fit the image in about 1 M pixels).",
            group="output"),
    Setting("width", _int(1), None, "integer", "pixels",
            "Width of the PNGs (default: from the aspect ratio).", group="output"),
    Setting("aspect", _float(0, lo_open=True), 1.0, "number", "width/height",
            "Aspect ratio of the PNGs.", group="output"),
    Setting("scale", _int(1), 1, "integer", "",
            "Draw each PNG pixel as a scale x scale square.", group="output"),
)

BY_KEY = {s.key: s for s in SETTINGS}


class Config(dict):
    """Resolved settings: ``config.max_hold`` or ``config["max_hold"]``."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting. Flags default to None so a config file can fill in."""
    for s in SETTINGS:
        metavar = {"size": "SIZE", "duration": "SECONDS", "path": "FILE"}.get(s.kind, "N")
        unit = f" [{s.unit}]" if s.unit else ""
        parser.add_argument(s.flag, dest=s.key, default=None, metavar=metavar,
                            help=f"{s.help}{unit} Default: {s.default_text()}.")


def parse_value(setting: Setting, value: Any, where: str) -> Any:
    try:
        return setting.parse(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: bad value {value!r} for {setting.key} "
                          f"(expected a {setting.kind}: {exc})") from None


def resolve(cli: dict[str, Any], file_values: dict[str, Any] | None = None,
            file_name: str = "") -> Config:
    """Merge defaults < config file < command line, parsing and validating each."""
    out = Config()
    file_values = file_values or {}
    for s in SETTINGS:
        if cli.get(s.key) is not None:
            out[s.key] = parse_value(s, cli[s.key], f"option {s.flag}")
        elif s.key in file_values:
            out[s.key] = parse_value(s, file_values[s.key], f"{file_name}: key {s.key}")
        elif s.required:
            raise ConfigError(f"{s.flag} is required (or set {s.key} in the config file)")
        else:
            out[s.key] = s.default
    return out


def markdown_table() -> str:
    rows = ["| key | flag | type | unit | default | meaning |", "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.key}` | `{s.flag}` | {s.kind} | {s.unit} | {s.default_text()} "
                    f"| {s.help} |")
    return "\n".join(rows)


def configuration_doc() -> str:
    """The text of docs/configuration.md (regenerate with ``python -m vmdisktouch.settings``)."""
    return ("# Configuration of `vmdisktouch run`\n\n"
            "Generated from `vmdisktouch/settings.py` by `python -m vmdisktouch.settings > "
            "docs/configuration.md`; a test checks it is current.\n\n"
            "Sizes take binary suffixes (`512M`, `4G`, `1.5GiB`); durations take `ms`, `s`, `m`, "
            "`h` (plain numbers are seconds).\n\n" + markdown_table() + "\n")


if __name__ == "__main__":
    print(configuration_doc(), end="")
