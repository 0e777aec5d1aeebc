"""The TOML config file of ``vmdisktouch run``.

The keys are exactly the setting keys of ``vmdisktouch.config.settings.SETTINGS``
(snake_case, as listed in docs/configuration.md), at the top level of the
file::

    max_hold = "4G"
    interval = "2s"
    threshold = 0.3

Values are TOML strings or numbers: sizes as ``"512M"`` or a byte count,
durations as seconds or ``"500ms"``. The command line overrides the file,
which overrides the defaults (``settings.resolve``).

* Unknown keys are one warning line (naming the file, how many, and the
  first few with the closest known key), so a typo does not stop a daemon,
  but is seen in the journal and in ``vmdisktouch config --check``. The
  same holds inside the ``[domain.NAME]`` tables (``overrides``): one line
  per table with unknown keys, naming the table. A mistyped key is never a
  refusal: a key a newer version added (a rollback), or an older one
  dropped (an upgrade), must not stop the daemon, as systemd's own unit
  files warn and go on. A known key with a bad value is a refusal.
* A TOML syntax error, an unreadable file, a file that is not a regular
  file (a directory, FIFO, device...) or is larger than
  ``MAX_CONFIG_BYTES`` (1 MiB), or a bad value is a ``ConfigError`` naming
  the file (and the line, or the key, and what was expected): the daemon
  does not start, and a reload (SIGHUP) keeps the current settings.

Under systemd the unit sets ``VMDISKTOUCH_INSTANCE=%i`` (the escaped disk
path, see ``vmdisktouch.unitname``); the config is then
``/etc/vmdisktouch/<instance>.toml`` if it exists, else
``/etc/vmdisktouch/default.toml``, else none (``find_config``). ``--config
FILE`` names a file explicitly and must exist.

``vmdisktouch config --example`` prints the example config
(examples/vmdisktouch.toml, generated from SETTINGS; a test checks it is
current); ``vmdisktouch config --check FILE`` reads a file as ``run`` would
(``configcmd``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import textwrap
from typing import Any, Mapping

from vmdisktouch.config import read as configread
from vmdisktouch.config import overrides
from vmdisktouch.config import settings
from vmdisktouch.config.read import MAX_CONFIG_BYTES  # noqa: F401 - part of this API
from vmdisktouch.errors import ConfigError
from vmdisktouch.config.settings import BY_KEY, SETTINGS, Config, Setting
from vmdisktouch.sizes import format_size
from vmdisktouch.unitname import escape_path

ETC_DIR = "/etc/vmdisktouch"
DEFAULT_NAME = "default"
INSTANCE_ENV = "VMDISKTOUCH_INSTANCE"


# ---------------------------------------------------------------------------
# Loading


def load(path: str) -> tuple[dict[str, Any], list[str]]:
    """Read and check a config file: ``(values, warnings)``.

    ``values`` holds the known keys with their raw TOML values (parsed again
    by ``settings.resolve``); every one has been checked with the setting's
    parser, so a bad value fails here even if the command line overrides it.
    ``warnings`` has one line naming the unknown keys at the top level, then
    one per ``[domain...]``, ``[scope]`` or ``[adopt]`` table with unknown keys (``overrides``). Only a
    regular file of at most ``MAX_CONFIG_BYTES`` is read (``configread``).
    """
    data = configread.parse_toml(path, configread.read_text(path))
    values: dict[str, Any] = {}
    unknown: list[str] = []
    table_warnings: list[str] = []
    for key, value in data.items():
        if key == overrides.TABLE:          # the host service's per-domain settings
            overrides.parse(value, path, table_warnings)
            continue
        if key == overrides.SCOPE:          # ... and which domains it serves
            overrides.parse_scope(value, path, table_warnings)
            continue
        if key == overrides.ADOPT:          # ... and which cache=none disks it adopts
            overrides.parse_scope(value, path, table_warnings, overrides.ADOPT)
            continue
        setting = BY_KEY.get(key)
        if setting is None:
            unknown.append(key)
            continue
        settings.parse_value(setting, value, _where(path, key))
        values[key] = value
    warnings = [configread.unknown_keys_warning(path, unknown, BY_KEY)] if unknown else []
    return values, warnings + table_warnings


def load_rules(path: str | None) -> overrides.Rules:
    """The ``[domain...]`` tables, the ``[scope]`` and the ``[adopt]`` of the config file
    (``overrides``);
    none without a file."""
    if not path:
        return overrides.Rules({})
    data = configread.parse_toml(path, configread.read_text(path))
    return overrides.Rules(overrides.parse(data.get(overrides.TABLE), path),
                           overrides.parse_scope(data.get(overrides.SCOPE), path),
                           overrides.parse_scope(data.get(overrides.ADOPT), path, None,
                                                 overrides.ADOPT))


def _where(path: str, key: str) -> str:
    return f"{path}: key {key}"


def config_candidates(instance_or_path: str, etc_dir: str = ETC_DIR) -> list[str]:
    """The files ``find_config`` tries, in order.

    ``instance_or_path`` is either an escaped instance string (``%i``; it
    never contains ``/``) or a disk path (it contains ``/``), which is escaped
    with ``unitname.escape_path`` first.
    """
    instance = escape_path(instance_or_path) if "/" in instance_or_path else instance_or_path
    return [os.path.join(etc_dir, instance + ".toml"),
            os.path.join(etc_dir, DEFAULT_NAME + ".toml")]


def find_config(instance_or_path: str, etc_dir: str = ETC_DIR) -> str | None:
    """``<etc_dir>/<instance>.toml``, else ``<etc_dir>/default.toml``, else None."""
    for candidate in config_candidates(instance_or_path, etc_dir):
        if os.path.exists(candidate):
            return candidate
    return None


def resolve_run_config(cli_values: Mapping[str, Any], config_path: str | None,
                       *, searched: list[str] | tuple[str, ...] = ()
                       ) -> tuple[Config, list[str]]:
    """Defaults < config file < command line: ``(Config, warnings)``.

    ``cli_values`` is ``vars(args)`` (a flag not given is None). A bad value
    in the file names the file and the key; a missing required setting names
    the file that should have set it (or the files that were ``searched``).
    """
    values, warnings = load(config_path) if config_path else ({}, [])
    for s in SETTINGS:
        if s.required and cli_values.get(s.key) is None and s.key not in values:
            if config_path:
                where = f"set {s.key} in {config_path}"
            elif searched:
                where = f"create {' or '.join(searched)} with {s.key} = ..."
            else:
                where = f"set {s.key} in the config file (--config FILE)"
            raise ConfigError(f"{s.key} is not set: pass {s.flag} or {where}")
    return settings.resolve(dict(cli_values), values, config_path or ""), warnings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--config FILE`` flag of ``vmdisktouch run``."""
    parser.add_argument(
        "--config", metavar="FILE", default=None,
        help="read settings from this TOML file (keys as in docs/configuration.md; flags "
             f"override it). Default: when {INSTANCE_ENV} is set (by the systemd unit), "
             f"{ETC_DIR}/<instance>.toml, else {ETC_DIR}/{DEFAULT_NAME}.toml, if present; "
             "otherwise no file.")


def load_for_run(cli_values: Mapping[str, Any], config_arg: str | None = None,
                 environ: Mapping[str, str] | None = None, etc_dir: str = ETC_DIR
                 ) -> tuple[Config, list[str], str | None]:
    """The whole policy of ``run``: ``(Config, warnings, config_path_used)``.

    ``--config FILE`` wins (and must be readable); else, under the unit
    (``VMDISKTOUCH_INSTANCE`` set), ``find_config(instance)``; else no file
    (a hand-started ``run`` never picks up /etc/vmdisktouch by surprise).
    Call it again on SIGHUP to reload.
    """
    env = os.environ if environ is None else environ
    searched: list[str] = []
    if config_arg:
        path: str | None = config_arg
    elif env.get(INSTANCE_ENV):
        searched = config_candidates(env[INSTANCE_ENV], etc_dir)
        path = find_config(env[INSTANCE_ENV], etc_dir)
    else:
        path = None
    config, warnings = resolve_run_config(cli_values, path, searched=searched)
    return config, warnings, path


# ---------------------------------------------------------------------------
# The example config, generated from SETTINGS

# Sample values for settings without a default (so the example shows one).
_SAMPLES = {
    "max_hold": "4G",
    "status": "/run/vmdisktouch/vm1.json",
    "heat_png": "/run/vmdisktouch/vm1.heat.png",
    "map_png": "/run/vmdisktouch/vm1.map.png",
    "blocks_per_pixel": 16,
    "width": 1024,
    "metrics_file": "/var/lib/prometheus/node-exporter/vmdisktouch.prom",
    "metrics_listen": "127.0.0.1:9105",
}
_KIND_SAMPLES = {"size": "1G", "duration": "5s", "number": 1.0, "fraction": 0.5, "integer": 1,
                 "path": "/run/vmdisktouch/file", "boolean": True}
_KIND_NOTES = {
    "size": 'a byte count or a string: "512M", "4G", "1.5GiB" (binary), "4GB" (decimal)',
    "duration": 'seconds, or a string: "500ms", "30s", "2m", "1h"',
    "number": "a number",
    "fraction": "a number from 0 to 1",
    "integer": "a whole number",
    "path": f"a file path (a non-empty string of at most {settings.MAX_PATH_BYTES} bytes, "
            "without line breaks)",
    "boolean": "true or false",
    "address": 'a loopback HOST:PORT string: "127.0.0.1:9105", "[::1]:9105"',
}
# Set on the unit's command line (per-instance names); a file value is overridden there.
UNIT_CLI_KEYS = ("status", "heat_png", "map_png", "state_dir")


def toml_value(value: Any) -> str:
    """A TOML literal for a str, bool, int or float."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"no TOML literal for {value!r}")
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid TOML basic string
    raise TypeError(f"no TOML literal for {type(value).__name__}")


def sample_value(s: Setting) -> Any:
    """The value the example shows for ``s``: its default, else a sample."""
    if s.default is not None and not s.required:
        return format_size(s.default) if s.kind == "size" else s.default
    if s.key in _SAMPLES:
        return _SAMPLES[s.key]
    if s.kind in _KIND_SAMPLES:
        return _KIND_SAMPLES[s.kind]
    raise ValueError(f"no sample value for setting {s.key} of kind {s.kind}: "
                     "add one to configfile._SAMPLES")


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, width=77, initial_indent="# ", subsequent_indent="# ",
                         break_on_hyphens=False) or ["#"]


def example_config() -> str:
    """The text of examples/vmdisktouch.toml: every key, commented, with its default."""
    out = _comment(
        "vmdisktouch configuration (TOML). Generated by `vmdisktouch config "
        "--example` from vmdisktouch/config/settings.py; do not edit the copy in examples/, "
        "regenerate it.")
    out += ["#"]
    out += _comment(
        f"Under systemd, vmdisktouch@INSTANCE.service reads {ETC_DIR}/INSTANCE.toml, or "
        f"{ETC_DIR}/{DEFAULT_NAME}.toml when that does not exist. INSTANCE is the escaped "
        "disk path: `vmdisktouch unit-name --instance /path/to/disk.img`. By hand: "
        "`vmdisktouch run PATH --config FILE`.")
    out += ["#"]
    out += _comment(
        "Every key is optional except max_hold, and every key is commented out below with "
        "its default (or, if it has none, a sample value): uncomment and edit what you "
        "need. A command-line flag (--max-hold for max_hold, ...) overrides the file. An "
        "unknown key is a warning in the journal; a bad value stops the daemon at start-up "
        "with a message naming this file and the key. After an edit, `systemctl reload "
        "vmdisktouch@INSTANCE.service` applies it without dropping the current holds.")
    for s in SETTINGS:
        out.append("")
        head = f"{s.key}: {s.kind}"
        if s.unit:
            head += f" [{s.unit}]"
        head += f"; flag {s.flag}; default: {s.default_text()}."
        out += _comment(head)
        out += _comment(s.help)
        note = _KIND_NOTES.get(s.kind)
        if note:
            out += _comment(f"Value: {note}.")
        if s.required:
            out += _comment("Required: the daemon does not start without it.")
        if s.key in UNIT_CLI_KEYS:
            where = ("/var/lib/vmdisktouch" if s.key == "state_dir"
                     else "/run/vmdisktouch/INSTANCE.*")
            out += _comment(f"The systemd unit sets it on the command line to {where}, "
                            "which overrides this file; change it there with a drop-in "
                            "(systemctl edit).")
        out.append(f"#{s.key} = {toml_value(sample_value(s))}")
    return "\n".join(out) + "\n"
