"""Every setting of ``vmdisktouch run``, defined once.

Each ``Setting`` carries its default, type, unit and help text. The CLI flags
(``add_arguments``), the config-file keys and the configuration table in the
docs (``markdown_table``) are all generated from ``SETTINGS``; nothing else
in the project spells a default. A bad value raises ``ConfigError`` naming
where it came from (the flag, or the file and key) and what was expected.

Flags, the config file and a reload (SIGHUP) all go through ``parse_value``,
so each value is checked once, here: whatever the input (any string, any
TOML value: inf, nan, a huge integer, an array, a table, a date), the result
is a finite value within the bounds stated in the setting's help, or a
``ConfigError``, never another exception. ``check_host`` checks what only
the host's memory, or two settings together (a threshold the amplitudes
cannot reach), can tell.
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import re
import reprlib
import socket
from dataclasses import dataclass
from typing import Any, Callable

from vmdisktouch.config import overrides
from vmdisktouch.errors import ConfigError
from vmdisktouch.sizes import MAX_SIZE, format_size, parse_duration, parse_size
from vmdisktouch.system.libc import PAGE_SIZE     # read once, there

MiB = 1 << 20
# The bounds, each with why: outside them a value makes the daemon useless or
# harmful. Bounds that need two settings (threshold and the amplitudes) and
# the host (min_free, max_hold) are ``check_host``'s.
MIN_INTERVAL = 0.1              # a shorter cycle would keep a core busy
MAX_SECONDS = 86400.0           # interval, rewritten_seconds: one day
MAX_AMP = 1e6
MAX_SIGMA = 64.0                # blocks; the kernel has 8 x sigma + 1 taps
# 1/s. Slower than MIN_DECAY (a time constant over 2.8 h), a block read without pause
# takes 8 min to reach the default threshold and an unused hold 10 h to be let go.
MIN_DECAY = 1e-4
MAX_DECAY = 100.0               # 1/s
MIN_THRESHOLD = 1e-4            # lower, a lone cached block's faint smoothing edge is use
MAX_THRESHOLD = 1e6
MIN_CHECKSUM_SHARE = 1 / 256    # rarer, a held block's rewrites are seen 256+ cycles late
MAX_BLOCKS_PER_PIXEL = 1 << 40
MAX_WIDTH = 16384
MAX_SCALE = 64
MAX_SPILL = 4.0                 # x max_hold
MIN_ASPECT, MAX_ASPECT = 0.01, 100.0
MAX_BLOCK_SIZE = 64 * MiB       # the checksum pass keeps a buffer of one block
MIN_LOAD_RATE = MiB             # slower, one chunk would take hours
MAX_PATH_BYTES = 4096


# -- the value parsers ------------------------------------------------------------------
# Each takes any value (a flag's string or a TOML value: inf, nan, a huge integer, an
# array, a table, a date) and returns the setting's value, finite and within its bounds,
# or raises ValueError saying what is wrong; ``parse_value`` names where it came from.


def number_text(x: float) -> str:
    """A bound as the user would write it: 100, 0.1, 1000000."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else repr(float(x))


def _finite(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("not true/false")
    if isinstance(v, int):
        if abs(v) > 1e300:                 # exact comparison; float() would overflow
            raise ValueError("too large")
        x = float(v)
    elif isinstance(v, float):
        x = v
    elif isinstance(v, str):
        try:
            x = float(v)
        except ValueError:
            raise ValueError(f"not a number: {shown(v)}") from None
    else:
        raise ValueError(f"not a {type(v).__name__}")
    if math.isinf(x) and not (isinstance(v, str) and "inf" in v.lower()):
        raise ValueError("too large")      # "1" * 400 parses as inf
    if not math.isfinite(x):
        raise ValueError(f"must be finite, not {x}")
    return x + 0.0                         # -0.0 -> 0.0


def float_between(lo: float, hi: float, lo_open: bool = False) -> Callable[[Any], float]:
    def parse(v):
        x = _finite(v)
        if x < lo or (lo_open and x == lo):
            raise ValueError(f"must be {'>' if lo_open else '>='} {number_text(lo)}")
        if x > hi:
            raise ValueError(f"must be <= {number_text(hi)}")
        return x
    return parse


_INT_RE = re.compile(r"^\s*([+-]?)0*(\d+)\s*$")


def _whole(v: Any) -> int | float:
    """A whole number (a float only if it is beyond every bound: +-inf or a huge float)."""
    if isinstance(v, bool):
        raise ValueError("expected a whole number, not true/false")
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v) and v.is_integer():   # TOML 16.0
        return int(v) if abs(v) < 2 ** 62 else v
    if isinstance(v, str):
        m = _INT_RE.match(v)
        if m:
            sign, digits = m.groups()
            if len(digits) > 20:           # int() refuses more than 4300 digits
                return -math.inf if sign == "-" else math.inf
            return int(sign + digits)
    raise ValueError(f"expected a whole number, not {shown(v)}")


def int_between(lo: int, hi: int) -> Callable[[Any], int]:
    def parse(v):
        n = _whole(v)
        if n < lo:
            raise ValueError(f"must be >= {lo}")
        if n > hi:
            raise ValueError(f"must be <= {hi}")
        return int(n)
    return parse


def duration_between(lo: float, hi: float, lo_open: bool = False) -> Callable[[Any], float]:
    def parse(v):
        x = parse_duration(v)
        if x < lo or (lo_open and x == lo):
            raise ValueError("must be greater than 0" if (lo, lo_open) == (0, True)
                             else f"must be at least {number_text(lo)} s")
        if x > hi:
            raise ValueError(f"must be at most {number_text(hi)} s")
        return x
    return parse


def positive_size(v):
    n = parse_size(v)
    if n <= 0:
        raise ValueError("must be greater than 0")
    return n


def block_size_value(v):
    n = parse_size(v)
    if n < PAGE_SIZE or n % PAGE_SIZE:
        raise ValueError(f"must be a multiple of the page size ({PAGE_SIZE} bytes)")
    if n > MAX_BLOCK_SIZE:
        raise ValueError(f"must be at most {format_size(MAX_BLOCK_SIZE)}")
    return n


def load_rate_value(v):
    n = parse_size(v)
    if 0 < n < MIN_LOAD_RATE:
        raise ValueError(f"must be 0 (unpaced) or at least {format_size(MIN_LOAD_RATE)}/s")
    return n


def path_value(v):
    if not isinstance(v, str) or not v:
        raise ValueError("expected a file path")
    if "\0" in v:
        raise ValueError("must not contain a NUL byte")
    if "\n" in v or "\r" in v:
        raise ValueError("must not contain a line break")
    try:
        n = len(os.fsencode(v))
    except UnicodeError:
        raise ValueError("not encodable as a file name") from None
    if n > MAX_PATH_BYTES:
        raise ValueError(f"longer than {MAX_PATH_BYTES} bytes")
    return v


def one_of(*choices):
    def parse(v):
        if isinstance(v, str) and v.lower() in choices:
            return v.lower()
        raise ValueError("expected one of " + ", ".join(choices))
    parse.choices = choices          # for the help's metavar and the shell's completion
    return parse


def _bool(v):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "yes", "1", "on"):
        return True
    if isinstance(v, str) and v.lower() in ("false", "no", "0", "off"):
        return False
    raise ValueError("expected true or false")


class _ShortRepr(reprlib.Repr):
    """repr() cut to a readable length; safe for ints of any size."""

    def __init__(self):
        super().__init__()
        self.maxstring = self.maxother = 60
        self.maxlong = 40

    def repr_int(self, x, level):
        if x.bit_length() > 128:           # repr() refuses ints of more than 4300 digits
            digits = int(x.bit_length() * math.log10(2)) + 1
            digits -= 10 ** (digits - 1) > abs(x)
            return f"<an integer of {digits} digits>"
        return super().repr_int(x, level)


def shown(value: Any) -> str:
    return _ShortRepr().repr(value)


def loopback_listen(v):
    """``HOST:PORT`` on a loopback address: ``127.0.0.1:9105``, ``[::1]:9105``,
    ``localhost:9105``. Returns the text as given (checked)."""
    if not isinstance(v, str):
        raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:9105")
    m = re.fullmatch(r"\[([0-9a-fA-F:.]+)\]:(\d{1,5})|([^:\[\]]+):(\d{1,5})", v.strip())
    if not m:
        raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:9105 or [::1]:9105")
    host, port = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    if not 1 <= int(port) <= 65535:
        raise ValueError("the port must be from 1 to 65535")
    if host == "localhost":
        _resolves_to_loopback(host, int(port))
    else:
        try:
            loopback = is_loopback(host)
        except ValueError:
            raise ValueError(f"{host!r} is not an IP address or localhost") from None
        if not loopback:
            raise ValueError(f"{host} is not a loopback address: the endpoint has no "
                             "authentication; use 127.0.0.1 or ::1 (and a proxy or "
                             "node_exporter's textfile collector, metrics_file, for a "
                             "remote Prometheus)")
    return v.strip()


def _resolves_to_loopback(host: str, port: int) -> None:
    """``host`` (a name) resolves to loopback addresses only, or ``ValueError``: the name is
    not trusted, since ``/etc/hosts`` may map ``localhost`` to any address (a
    hosts file that did so made the endpoint, which has no authentication, listen on
    192.0.2.2)."""
    try:
        found = {a[4][0] for a in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                     flags=socket.AI_PASSIVE)}
    except OSError as exc:
        raise ValueError(f"{host} does not resolve: {exc.strerror or exc}") from None
    other = sorted(a for a in found if not is_loopback(a))
    if other or not found:
        raise ValueError(f"{host} resolves to {', '.join(other) or 'nothing'}, not a loopback "
                         "address (see /etc/hosts): the endpoint has no authentication; use "
                         "127.0.0.1 or ::1")


def is_loopback(host: str) -> bool:
    """Whether the IP address ``host`` is a loopback one, the one rule for every metrics
    endpoint (it has no authentication): an IPv4-mapped ``::ffff:127.0.0.1``, as a
    dual-stack socket reports it, is one too. ``ValueError`` when not an IP address."""
    ip = ipaddress.ip_address(host.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def split_listen(text: str) -> tuple[str, int]:
    """``loopback_listen``'s text -> (host, port)."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


_EIB = format_size(MAX_SIZE)


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

    @property
    def choices(self) -> tuple[str, ...]:
        """The words it is one of (``one_of``), or none."""
        return getattr(self.parse, "choices", ())

    def default_text(self) -> str:
        if self.required:
            return "(required)"
        return self.text(self.default)

    def text(self, value: Any) -> str:
        """``value`` of this setting as a human writes it: 4G, 5.0, true, (none)."""
        if value is None:
            return "(none)"
        if self.kind == "size":
            return format_size(value)
        return str(value).lower() if isinstance(value, bool) else str(value)


SETTINGS: tuple[Setting, ...] = (
    Setting("max_hold", positive_size, None, "size", "bytes",
            "Byte budget: the most the daemon holds (mlocks) of this image, at every instant. "
            f"Greater than 0, at most {_EIB}; less than one block is refused at start, and "
            "more than the host's memory is a warning.",
            required=True, group="budget"),
    Setting("min_free", parse_size, 1 << 30, "size", "bytes",
            "Free-memory floor: load only while MemAvailable minus the load stays above it; "
            "below it, release the lowest-priority regions. Must be below the host's memory "
            "(MemTotal), checked at start.", group="budget"),
    Setting("interval", duration_between(MIN_INTERVAL, MAX_SECONDS), 5.0, "duration", "seconds",
            "Cycle duration: how often residency is sampled and the plan applied. "
            f"From {number_text(MIN_INTERVAL)} s (a shorter cycle would keep a core busy) to "
            f"{number_text(MAX_SECONDS)} s."),
    Setting("block_size", block_size_value, MiB, "size", "bytes",
            "Block size: the unit of heat, hold and checksum. A multiple of the page size "
            f"(4K on x86-64), at most {format_size(MAX_BLOCK_SIZE)} (the checksum pass "
            "buffers one block)."),
    Setting("amp_resident", float_between(0, MAX_AMP), 1.0, "number", "heat per resident block",
            "Amplitude A_r of the Gaussian filter applied to the residency map. "
            f"From 0 to {number_text(MAX_AMP)}; amp_resident + amp_rewritten must be above threshold "
            "(checked at start).", group="heat"),
    Setting("sigma_resident", float_between(0, MAX_SIGMA), 2.0, "number", "blocks",
            "Width sigma_r of the Gaussian filter applied to the residency map. "
            f"From 0 to {number_text(MAX_SIGMA)} (the filter has 8 x sigma + 1 taps: its cost grows "
            "with sigma).", group="heat"),
    Setting("amp_rewritten", float_between(0, MAX_AMP), 1.0, "number", "heat per rewritten block",
            "Amplitude A_w of the Gaussian filter applied to the rewritten-blocks map. "
            f"From 0 to {number_text(MAX_AMP)}; see amp_resident.", group="heat"),
    Setting("sigma_rewritten", float_between(0, MAX_SIGMA), 2.0, "number", "blocks",
            "Width sigma_w of the Gaussian filter applied to the rewritten-blocks map. "
            f"From 0 to {number_text(MAX_SIGMA)}.", group="heat"),
    Setting("decay", float_between(MIN_DECAY, MAX_DECAY), 0.1, "number", "1/s",
            "Decay coefficient: heat relaxes toward the current input with time constant "
            f"1/decay seconds. From {number_text(MIN_DECAY)} (slower, a block the guest reads "
            "without pause takes minutes to be held and an unused hold hours to be let go) "
            f"to {number_text(MAX_DECAY)}.", group="heat"),
    Setting("threshold", float_between(MIN_THRESHOLD, MAX_THRESHOLD), 0.05, "number", "heat",
            "Threshold: blocks with heat at or above it form the candidate regions. "
            f"From {number_text(MIN_THRESHOLD)} (lower, the faint edge of the smoothing of a lone "
            f"cached block counts as use) to {number_text(MAX_THRESHOLD)}, and below amp_resident + "
            "amp_rewritten (the most heat a block can reach), checked at start.",
            group="heat"),
    Setting("rewritten_seconds", duration_between(0, MAX_SECONDS, lo_open=True), 60.0, "duration",
            "seconds", "How long a rewritten block stays red on the block map. "
            f"Greater than 0, at most {number_text(MAX_SECONDS)} s.", group="output"),
    Setting("load_rate", load_rate_value, 256 * MiB, "size", "bytes/s",
            "Pace of loading new regions (0 = unpaced), so a load burst does not starve "
            f"the guest's own I/O. 0, or from {format_size(MIN_LOAD_RATE)} (slower would "
            f"take hours per chunk) to {_EIB}.", group="budget"),
    Setting("foreign_share", float_between(0, 1), 0.1, "fraction", "of the group's limit",
            "Most the daemon keeps locked while charged to a memory-limited cgroup other "
            "than its own (a VM's), as a share of that group's limit; never past the "
            "group's free headroom. Held pages over it are recharged to the daemon's group "
            "by reloading them (see docs/architecture.md). From 0 to 1; 1 = no cap.",
            group="budget"),
    Setting("spill", float_between(0, MAX_SPILL), 1.0, "number", "x max_hold",
            "trace source only: past the budget, the next-hottest regions, up to spill x "
            "max_hold, are read into the page cache without being locked, while MemFree "
            "(memory nobody uses) minus the read stays above min_free and the daemon's own "
            "memory cgroup has room; the kernel reclaims them before anything locked. "
            f"0 turns it off. From 0 to {number_text(MAX_SPILL)}.", group="budget"),
    Setting("access_source", one_of("auto", "trace", "mincore"), "auto", "choice", "",
            "How the guest's reads and writes are seen: trace (kernel tracepoints through "
            "tracefs: every read and write, exactly), mincore (the paper's polling of "
            "residency and checksums of held blocks), or auto (trace where tracefs is "
            "usable, else mincore; said in one log line at start).", group="access"),
    Setting("checksum_share", float_between(MIN_CHECKSUM_SHARE, 1), 1 / 16, "fraction",
            "of the held bytes per cycle",
            "mincore source only: the share of the held bytes checksummed per cycle, "
            "rotating, so every held block is checked within 1/share cycles and the cost "
            f"is bounded. From 1/{round(1 / MIN_CHECKSUM_SHARE)} (rarer, rewrites are seen "
            "long after they happened) to 1 (every held block every cycle).",
            group="access"),
    Setting("status", path_value, None, "path", "",
            "Write a JSON status file here every cycle (replaced atomically). Without it, "
            "run writes one where `vmdisktouch status` reads: /run/vmdisktouch/ESCAPED.json, "
            "the first image's path escaped as its unit's instance (host.json with "
            "--libvirt), or says once why it cannot.", group="output"),
    Setting("heat_png", path_value, None, "path", "",
            "Write the heat map PNG here every cycle (replaced atomically).", group="output"),
    Setting("map_png", path_value, None, "path", "",
            "Write the block map PNG here every cycle (replaced atomically).", group="output"),
    Setting("host_png", path_value, None, "path", "",
            "Several images or --libvirt: write the host overview PNG here every cycle "
            "(replaced atomically): the budget split between the disks, and one band per "
            "disk with what it holds and has cached (past 13 disks, the 12 holding most "
            "and one band summing the rest).", group="output"),
    Setting("metrics_file", path_value, None, "path", "",
            "Write Prometheus metrics here every cycle (text format, replaced atomically; "
            "removed at a clean stop), for node_exporter's textfile collector: a *.prom "
            "file in its directory, on Debian /var/lib/prometheus/node-exporter, which the "
            "units may write. One file per daemon: vmdisktouch.prom for the host service; "
            "for a per-disk unit, in its own INSTANCE.toml, vmdisktouch@INSTANCE.prom. The "
            "directory must exist (else the start is refused). Needs the prometheus_client "
            "package.", group="output"),
    Setting("metrics_listen", loopback_listen, None, "address", "",
            "Serve Prometheus metrics over HTTP on this loopback address, HOST:PORT "
            "(127.0.0.1:9105, [::1]:9105 or localhost:9105; other addresses are refused: "
            "the endpoint has no authentication). Unset: no endpoint. Not under the units, "
            "whose private network would hide it: there, vmdisktouch-metrics.socket passes "
            "the host service a socket on 127.0.0.1:9479. Needs the prometheus_client "
            "package.", group="output"),
    Setting("state_dir", path_value, None, "path", "",
            "Save each image's heat and held regions in this directory (one file per "
            "image, replaced atomically) every state_save_interval and at stop, and "
            "restore them at start, so a restarted daemon starts warm (the units: "
            "/var/lib/vmdisktouch). Unset: no warm restart.", group="output"),
    Setting("state_save_interval", duration_between(1, MAX_SECONDS), 300.0, "duration", "seconds",
            "How often the warm-restart state is saved (with state_dir). "
            f"From 1 s to {number_text(MAX_SECONDS)} s.", group="output"),
    Setting("carry_heat", one_of("auto", "on", "off"), "auto", "switch", "",
            "Keep a summary of each disk's hot regions in its libvirt domain's live "
            "metadata, and start a disk whose domain arrives with one (a migration, a "
            "restore, a managedsave) from it: on, off, or auto (on with --libvirt). "
            "Per domain: carry_heat in [domain.NAME].", group="output"),
    Setting("carry_interval", duration_between(1, MAX_SECONDS), 30.0, "duration", "seconds",
            "Shortest time between two writes of a domain's heat summary (written when its "
            f"regions move by an eighth). From 1 s to {number_text(MAX_SECONDS)} s.", group="output"),
    Setting("blocks_per_pixel", int_between(1, MAX_BLOCKS_PER_PIXEL), None, "integer", "blocks",
            "Blocks per pixel in the PNGs (default: fit the image in about 1 M pixels). "
            f"From 1 to {MAX_BLOCKS_PER_PIXEL} (2^40).", group="output"),
    Setting("width", int_between(1, MAX_WIDTH), None, "integer", "pixels",
            f"Width of the PNGs (default: from the aspect ratio). From 1 to {MAX_WIDTH}.",
            group="output"),
    Setting("aspect", float_between(MIN_ASPECT, MAX_ASPECT), 1.0, "number", "width/height",
            f"Aspect ratio of the PNGs. From {number_text(MIN_ASPECT)} to {number_text(MAX_ASPECT)}.",
            group="output"),
    Setting("scale", int_between(1, MAX_SCALE), None, "integer", "",
            "Draw each PNG pixel as a scale x scale square (default: the smallest whole "
            f"factor that makes the map at least 512 pixels wide). From 1 to {MAX_SCALE}.",
            group="output"),
)

BY_KEY = {s.key: s for s in SETTINGS}


class Config(dict):
    """Resolved settings: ``config.max_hold`` or ``config["max_hold"]``. ``origins``: where
    ``resolve`` took each from ("flag", "file" or "default"; empty for a copy)."""

    origins: dict[str, str] = {}
    file_name: str = ""          # the config file ``resolve`` read, if any

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one flag per setting. Flags default to None so a config file can fill in."""
    for s in SETTINGS:
        metavar = {"size": "SIZE", "duration": "SECONDS", "path": "FILE"}.get(s.kind, "N")
        metavar = "DIR" if s.key.endswith("_dir") else metavar
        metavar = "{" + ",".join(s.choices) + "}" if s.choices else metavar
        unit = f" [{s.unit}]" if s.unit else ""
        parser.add_argument(s.flag, dest=s.key, default=None, metavar=metavar,
                            help=f"{s.help}{unit} Default: {s.default_text()}.")


def parse_value(setting: Setting, value: Any, where: str) -> Any:
    """``setting.parse(value)``; any failure is a ConfigError naming ``where``."""
    try:
        return setting.parse(value)
    except (ValueError, TypeError, ArithmeticError) as exc:
        article = "an" if setting.kind[0] in "aeiou" else "a"
        raise ConfigError(f"{where}: bad value {shown(value)} for {setting.key} "
                          f"(expected {article} {setting.kind}: {exc})") from None


def resolve(cli: dict[str, Any], file_values: dict[str, Any] | None = None,
            file_name: str = "") -> Config:
    """Merge defaults < config file < command line, parsing and validating each."""
    out = Config()
    out.origins = {}
    out.file_name = file_name
    file_values = file_values or {}
    for s in SETTINGS:
        if cli.get(s.key) is not None:
            out[s.key] = parse_value(s, cli[s.key], f"option {s.flag}")
            out.origins[s.key] = "flag"
        elif s.key in file_values:
            out[s.key] = parse_value(s, file_values[s.key], f"{file_name}: key {s.key}")
            out.origins[s.key] = "file"
        elif s.required:
            raise ConfigError(f"{s.flag} is required (or set {s.key} in the config file)")
        else:
            out[s.key] = s.default
            out.origins[s.key] = "default"
    return out


def in_force(config: Config, file_name: str = "") -> str:
    """One line: every setting's value, grouped by where it came from (flag, file, default)."""
    groups: dict[str, list[str]] = {"flag": [], "file": [], "default": []}
    for s in SETTINGS:
        where = config.origins.get(s.key, "default")
        groups[where].append(f"{s.key}={s.text(config.get(s.key))}")
    names = {"flag": "from flags", "file": f"from {file_name or 'the file'}",
             "default": "defaults"}
    return "settings in force: " + "; ".join(
        f"{names[k]}: {' '.join(v)}" for k, v in groups.items() if v)


def check_host(config: Config, mem_total: int) -> list[str]:
    """Check ``config`` against a host with ``mem_total`` bytes of memory (MemTotal).

    Raises ConfigError for settings that could never hold anything; returns
    warnings (one line each) for settings that work but cannot be reached.
    Pure: the caller reads /proc/meminfo, at start and on every reload.
    """
    warnings = _check_heat(config)
    mem = format_size(mem_total)
    if config.min_free >= mem_total:
        raise ConfigError(f"min_free {format_size(config.min_free)} is not below the host's "
                          f"memory (MemTotal {mem}): nothing could ever be held")
    if config.max_hold < config.block_size:
        raise ConfigError(f"max_hold {format_size(config.max_hold)} is smaller than one block "
                          f"(block_size {format_size(config.block_size)}): nothing could ever "
                          "be held")
    if config.max_hold > mem_total:
        warnings.append(f"max_hold {format_size(config.max_hold)} is more than the host's "
                        f"memory (MemTotal {mem}): allowed, since the free-memory floor "
                        f"(min_free {format_size(config.min_free)}) still limits what is held, "
                        "but the budget can never be reached")
    return warnings


def _where(config: Config, key: str) -> str:
    """Where ``config[key]`` came from, as a ConfigError names it."""
    origin = config.origins.get(key, "default")
    if origin == "flag":
        return f"option {BY_KEY[key].flag}"
    return f"{config.file_name or 'the config file'}: key {key}" if origin == "file" else key


def _check_heat(config: Config) -> list[str]:
    """Refuse a threshold no heat can reach: a block's heat never exceeds amp_resident +
    amp_rewritten (each input is a fraction, smoothed by a unit-sum kernel and averaged).
    Warn when only the trace source can start a hold: mincore sees rewrites only in
    blocks already held, so what it starts holding has at most amp_resident."""
    amps = config.amp_resident + config.amp_rewritten
    keys = ["threshold", "amp_resident", "amp_rewritten"]
    key = next((k for k in keys if config.origins.get(k, "default") != "default"), keys[0])
    if config.threshold >= amps:
        raise ConfigError(f"{_where(config, key)}: threshold {config.threshold:g} is not below "
                          f"amp_resident + amp_rewritten = {amps:g}, the most heat a block "
                          "can reach: nothing could ever be held")
    if config.threshold >= config.amp_resident and config.access_source != "trace":
        return [f"threshold {config.threshold:g} is not below amp_resident "
                f"{config.amp_resident:g}: with the mincore source (access_source "
                f"{config.access_source}) nothing is ever held: only writes the trace "
                "source sees can heat a block that is not held past it"]
    return []


def markdown_table() -> str:
    rows = ["| key | flag | type | unit | default | meaning |", "|---|---|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.key}` | `{s.flag}` | {s.kind} | {s.unit} | {s.default_text()} "
                    f"| {s.help} |")
    return "\n".join(rows)


def configuration_doc() -> str:
    """The text of docs/configuration.md (regenerate with ``python -m vmdisktouch.config.settings``)."""
    return ("# Configuration of `vmdisktouch run`\n\n"
            "Generated from `vmdisktouch/config/settings.py` by `python -m vmdisktouch.config.settings > "
            "docs/configuration.md`; a test checks it is current.\n\n"
            "Sizes are read as written, as dd(1) reads them: `512M`, `4G` and `1.5GiB` are "
            "binary (4G = 4 × 2^30 bytes), `4GB` and `500MB` decimal (4 × 10^9 bytes); "
            "durations take `ms`, `s`, `m`, "
            "`h` (plain numbers are seconds). Sizes are at most `1E` (1 EiB). Paths are "
            f"non-empty, at most {MAX_PATH_BYTES} bytes, without NUL bytes or line breaks.\n\n"
            + markdown_table() + "\n\n" + overrides.DOC)


if __name__ == "__main__":
    print(configuration_doc(), end="")
