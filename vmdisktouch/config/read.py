"""Reading a config file safely: the text, the TOML table, the unknown-key warning.

``configfile.load`` uses these. Whatever the path names, reading it is
bounded in time and memory: only a regular file is read (a FIFO, device,
socket or directory is refused before it is opened, and again by fstat on
the descriptor, opened with O_NONBLOCK so a FIFO swapped in cannot block),
and only up to ``MAX_CONFIG_BYTES``. Every failure is a ``ConfigError``
naming the file.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
try:
    import tomllib                      # Python 3.11+
except ImportError:                     # 3.9, 3.10: the same parser, as a package
    import tomli as tomllib
from typing import Any, Iterable

from vmdisktouch.errors import ConfigError, file_kind
from vmdisktouch.sizes import format_size

MAX_CONFIG_BYTES = 1 << 20
SHOWN_UNKNOWN_KEYS = 5        # the unknown keys the warning names (with a hint each)
_LONGEST_KEY_HINTED = 64      # longer keys get no did-you-mean (difflib is quadratic)

_LINE_RE = re.compile(r"^(.*?)\s*\(at line (\d+), column (\d+)\)\s*$")


def _refuse_unless_regular(path: str, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    raise ConfigError(f"{path}: cannot read config file: it is {file_kind(mode)}, "
                      "not a regular file")


def _cannot_read(path: str, exc: OSError) -> ConfigError:
    return ConfigError(f"{path}: cannot read config file: {exc.strerror or exc}")


def read_text(path: str) -> str:
    """The UTF-8 text of the regular file ``path`` (symlinks followed), at most 1 MiB."""
    try:
        _refuse_unless_regular(path, os.stat(path).st_mode)   # never open a device
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    except ValueError as exc:              # a NUL byte, or not encodable as a file name
        raise ConfigError(f"{path!r}: cannot read config file: {exc}") from None
    try:
        _refuse_unless_regular(path, os.fstat(fd).st_mode)    # what was really opened
        chunks, total = [], 0
        while total <= MAX_CONFIG_BYTES:
            chunk = os.read(fd, MAX_CONFIG_BYTES + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as exc:
        raise _cannot_read(path, exc) from None
    finally:
        os.close(fd)
    if total > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: config file larger than {format_size(MAX_CONFIG_BYTES)} "
                          f"({MAX_CONFIG_BYTES} bytes), the most read; is it the right file?")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_toml(path: str, text: str) -> dict[str, Any]:
    """``tomllib.loads(text)``; anything it raises is a ConfigError naming the file."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = _LINE_RE.match(str(exc))
        if m:
            raise ConfigError(f"{path}:{m.group(2)}:{m.group(3)}: TOML syntax error: "
                              f"{m.group(1)}") from None
        raise ConfigError(f"{path}: TOML syntax error: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: cannot parse: arrays or tables nested too deeply") from None
    except ValueError as exc:              # e.g. an integer of more than 4300 digits
        reason = str(exc).split(":")[0] if "integer string conversion" in str(exc) else exc
        raise ConfigError(f"{path}: cannot parse: {reason}") from None
    except Exception as exc:  # noqa: BLE001 - no input may crash the daemon or a reload
        raise ConfigError(f"{path}: cannot parse: {type(exc).__name__}: {exc}") from None


def _show_key(key: Any) -> str:
    if not isinstance(key, str):
        return f"<a {type(key).__name__}>"
    return repr(key) if len(key) <= 40 else repr(key[:40]) + f"... ({len(key)} chars)"


def _close_key(key: Any, known: list[str]) -> str | None:
    if not isinstance(key, str) or len(key) > _LONGEST_KEY_HINTED:
        return None
    normal = key.strip().lower().replace("-", "_")
    if normal in known:
        return normal
    close = difflib.get_close_matches(normal, known, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_keys_warning(path: str, keys: list[str], known: Iterable[str]) -> str:
    """One line for all the unknown ``keys``: the first few with a hint each, then a count.

    Hints are computed only for the keys shown, so a file of a million typos
    costs no more than one of five.
    """
    known = list(known)
    shown = []
    unmatched = False
    for key in keys[:SHOWN_UNKNOWN_KEYS]:
        match = _close_key(key, known)
        unmatched |= match is None
        shown.append(_show_key(key) + (f" (did you mean {match!r}?)" if match else ""))
    if len(keys) == 1:
        head = f"unknown key {shown[0]}"
    else:
        more = len(keys) - len(shown)
        head = f"{len(keys)} unknown keys: {', '.join(shown)}" + (
            f" and {more} more" if more else "")
    tail = f" (known keys: {', '.join(known)})" if unmatched else ""
    return f"{path}: {head}{tail}; ignored"
