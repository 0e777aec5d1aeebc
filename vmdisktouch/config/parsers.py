"""The value parsers of the settings (``vmdisktouch.config.settings``).

Each takes any value (a flag's string or a TOML value: inf, nan, a huge
integer, an array, a table, a date) and returns the setting's value, finite
and within its bounds, or raises ValueError saying what is wrong.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import reprlib
import socket
from typing import Any, Callable

from vmdisktouch.sizes import format_size, parse_duration, parse_size
from vmdisktouch.system.libc import PAGE_SIZE     # read once, there

MiB = 1 << 20
MAX_BLOCK_SIZE = 64 * MiB       # the checksum pass keeps a buffer of one block
MIN_LOAD_RATE = MiB             # slower, one chunk would take hours
MAX_PATH_BYTES = 4096


# ---------------------------------------------------------------------------
# Parsers: each takes any value (a flag's string or a TOML value) and returns
# the setting's value or raises ValueError saying what is wrong.


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
