"""The systemd unit that watches one disk image: ``vmdisktouch unit-name PATH``.

The template unit ``vmdisktouch@.service`` takes the disk path as its
instance, escaped the way ``systemd-escape --path`` escapes it; inside the
unit ``%f`` gives the path back and ``%i`` the escaped instance. This module
computes that name in Python, byte for byte as systemd 252 does
(``unit_name_path_escape``, src/basic/unit-name.c), so the sysadmin never has
to escape a path by hand:

* the path is simplified like systemd's ``path_simplify``: duplicate slashes,
  ``.`` components and trailing slashes are dropped;
* a path with a ``..`` component is refused, as systemd refuses it (the
  unescaped ``%f`` would not name the same file if a component is a
  symlink); pass ``realpath -s PATH`` instead;
* the root path ``/`` is ``-``; otherwise the leading slash is dropped and
  every other ``/`` becomes ``-``;
* a leading ``.`` is escaped (``\\x2e``), so no unit name starts with a dot;
* every byte outside ``[a-zA-Z0-9:_.]`` (including ``-`` and ``\\``, and each
  byte of a multi-byte UTF-8 character) is written ``\\xNN``, lower-case hex;
* the whole unit name must fit in 255 characters, or systemd cannot load it.

One deliberate difference: ``systemd-escape --path`` escapes a *relative*
path as is (and warns that it is not reversible). Here a relative path is
made absolute first, against the current directory (``os.path.abspath``,
which also resolves ``..`` lexically), because the unit needs the absolute
path of the image.

Paths are handled as bytes (``os.fsencode``), so file names that are not
valid UTF-8 escape correctly too.
"""

from __future__ import annotations

import os

from vmdisktouch.errors import ConfigError

TEMPLATE_PREFIX = "vmdisktouch@"
TEMPLATE_SUFFIX = ".service"
TEMPLATE = TEMPLATE_PREFIX + TEMPLATE_SUFFIX
UNIT_NAME_MAX = 255   # systemd's UNIT_NAME_MAX (256) counts the NUL

_VALID = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _escape_byte(b: int) -> bytes:
    return b"\\x%02x" % b


def _simplify(raw: bytes) -> list[bytes]:
    """The components of an absolute path, like systemd's path_simplify + path_is_normalized."""
    parts = [p for p in raw.split(b"/") if p not in (b"", b".")]
    if b".." in parts:
        raise ConfigError(f"{os.fsdecode(raw)!r} is not a normalized path (it has a '..' "
                          "component); systemd refuses to escape it: pass `realpath -s PATH`")
    return parts


def escape_path(path: str | bytes) -> str:
    """The instance string for ``path``: what ``systemd-escape --path PATH`` prints.

    A relative path is made absolute first (see the module docstring). Raises
    ``ConfigError`` for an empty path or one with a ``..`` component.
    """
    raw = os.fsencode(path)
    if not raw:
        raise ConfigError("empty path: expected the path of a disk image")
    if b"\0" in raw:
        raise ConfigError(f"path {os.fsdecode(raw)!r} contains a NUL byte")
    if not raw.startswith(b"/"):
        raw = os.fsencode(os.path.abspath(os.fsdecode(raw)))
    parts = _simplify(raw)
    if not parts:
        return "-"
    body = b"/".join(parts)
    out = bytearray()
    for i, b in enumerate(body):
        if b == ord("/"):
            out += b"-"
        elif b in _VALID and not (i == 0 and b == ord(".")):
            out.append(b)
        else:
            out += _escape_byte(b)
    return out.decode("ascii")


def unit_name(path: str | bytes) -> str:
    """The unit to enable for ``path``: ``systemd-escape --path --template=vmdisktouch@.service``.

    Raises ``ConfigError`` when the name would be longer than systemd's limit
    of 255 characters (a very long path: use a shorter path or symlink).
    """
    name = TEMPLATE_PREFIX + escape_path(path) + TEMPLATE_SUFFIX
    if len(name) > UNIT_NAME_MAX:
        raise ConfigError(f"the unit name for {os.fsdecode(path)!r} would be {len(name)} "
                          f"characters; systemd allows at most {UNIT_NAME_MAX} (use a shorter "
                          "path, e.g. a symlink to the image)")
    return name


def instance_of(unit: str) -> str:
    """The instance part of ``vmdisktouch@INSTANCE.service`` (or INSTANCE itself)."""
    if unit.startswith(TEMPLATE_PREFIX) and unit.endswith(TEMPLATE_SUFFIX):
        return unit[len(TEMPLATE_PREFIX):-len(TEMPLATE_SUFFIX)]
    return unit


def unescape_path(instance: str) -> str:
    """The path an instance string stands for: ``systemd-escape --unescape --path``.

    The inverse of ``escape_path`` (``%f`` in the unit). Raises ``ConfigError``
    for a string systemd would refuse (empty, leading/trailing/double ``-``,
    a bad ``\\x`` escape).
    """
    if instance == "-":
        return "/"
    bad = ConfigError(f"{instance!r} is not an escaped path (see `systemd-escape --path`)")
    if not instance or instance.startswith("-") or instance.endswith("-") or "--" in instance:
        raise bad
    src = instance.encode("utf-8", "surrogateescape")
    out = bytearray(b"/")
    i = 0
    while i < len(src):
        b = src[i]
        if b == ord("-"):
            out += b"/"
            i += 1
        elif b == ord("\\"):
            if src[i + 1:i + 2] != b"x" or len(src) < i + 4 or not set(src[i + 2:i + 4]) <= _HEX:
                raise bad
            out.append(int(src[i + 2:i + 4], 16))
            i += 4
        else:
            out.append(b)
            i += 1
    if b"\0" in out:
        raise bad
    path = bytes(out)
    parts = path.split(b"/")[1:]
    if any(p in (b"", b".", b"..") for p in parts):
        raise bad
    return os.fsdecode(path)
