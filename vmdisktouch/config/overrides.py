"""Per-domain and per-disk settings of the host service, from its config file.

The host service (``run --libvirt``) serves every eligible disk under one
budget. Some VMs matter more, some must never take much, some not at all;
the config file says so by domain name and disk target::

    [domain.db01]            # every disk of domain db01
    weight = 2.0             # its heat counts twice when regions are ranked
    [domain.db01.vdb]        # one disk: its keys win over the domain's
    cap = "2G"               # it never holds more than this
    [domain.scratch]
    exclude = true           # never served (listed as skipped, with the reason)
    carry_heat = false       # its heat is not written into its metadata, nor read from it

``weight``: a number from 0.01 to 100 (default 1), multiplying the disk's
ranking heat, so a region of it outranks an equally hot region elsewhere.
``cap``: a size, the most the disk may hold of the budget. ``exclude``
and ``carry_heat`` (``adapters.libvirt.domain_heat``; unset: the daemon's
``carry_heat``): true or false. A bad value stops the start (exit 78; at a
reload, the current settings are kept), with the file and the key named. An
unknown key is treated as one at the top of the file is (``configfile.load``):
a warning naming the table and the key, with the closest known key, and
ignored, so a mistyped key never stops a daemon but is seen in the journal and
in ``vmdisktouch config --check``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vmdisktouch.config import read as configread
from vmdisktouch.errors import ConfigError
from vmdisktouch.sizes import counted, parse_size

TABLE = "domain"
KEYS = ("weight", "cap", "exclude", "carry_heat")
MIN_WEIGHT, MAX_WEIGHT = 0.01, 100.0


@dataclass(frozen=True)
class Override:
    weight: float = 1.0
    cap: int | None = None        # bytes
    exclude: bool = False
    carry_heat: bool | None = None   # None: the daemon's setting


Overrides = dict[tuple[str, "str | None"], dict[str, Any]]   # (domain, target or None) ->


def parse(data: Any, path: str, warnings: list[str] | None = None) -> Overrides:
    """The ``[domain...]`` table of a config file, checked; ConfigError names the key.
    Unknown keys are ignored; with ``warnings``, one line is appended per table that
    has some (at most ``configread.SHOWN_UNKNOWN_KEYS`` lines, then one line more)."""
    unknown: list[tuple[str, list[str]]] = []
    out = _parse(data, path, unknown)
    if warnings is not None and unknown:
        shown = unknown[:configread.SHOWN_UNKNOWN_KEYS]
        warnings += [configread.unknown_keys_warning(where, keys, KEYS) for where, keys in shown]
        if len(unknown) > len(shown):
            more = counted(len(unknown) - len(shown), f"more [{TABLE}...] table")
            warnings.append(f"{path}: unknown keys in {more}; ignored")
    return out


def _parse(data: Any, path: str, unknown: list[tuple[str, list[str]]]) -> Overrides:
    out: Overrides = {}
    if data is None:
        return out
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: key {TABLE} must be a table: [{TABLE}.NAME]")
    for domain, table in data.items():
        where = f"{path}: [{TABLE}.{domain}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table of {', '.join(KEYS)} "
                              "(or of disk targets)")
        own = {}
        for key, value in table.items():
            if isinstance(value, dict):
                out[(domain, key)] = _keys(value, f"{path}: [{TABLE}.{domain}.{key}]",
                                           unknown)
            else:
                own[key] = value
        out[(domain, None)] = _keys(own, where, unknown)
    return out


def _keys(table: dict, where: str, unknown: list[tuple[str, list[str]]]) -> dict[str, Any]:
    got: dict[str, Any] = {}
    mistyped: list[str] = []
    for key, value in table.items():
        if key == "weight":
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not MIN_WEIGHT <= value <= MAX_WEIGHT:
                raise ConfigError(f"{where}: weight must be a number from {MIN_WEIGHT} to "
                                  f"{MAX_WEIGHT:g}, not {value!r}")
            got["weight"] = float(value)
        elif key == "cap":
            try:
                got["cap"] = parse_size(value)
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{where}: cap must be a size (\"2G\"): {exc}") from None
        elif key in ("exclude", "carry_heat"):
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key} must be true or false, not {value!r}")
            got[key] = value
        else:
            mistyped.append(key)               # a table would be a disk target
    if mistyped:
        unknown.append((where, mistyped))
    return got


def for_disk(overrides: Overrides, domain: str, target: str) -> Override:
    """The override of one disk: its domain's keys, then its own."""
    merged = {**overrides.get((domain, None), {}), **overrides.get((domain, target), {})}
    return Override(**merged)
