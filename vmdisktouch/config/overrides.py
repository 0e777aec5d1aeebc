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

Which domains the host service serves at all (``[scope]``), because operators
share hosts::

    [scope]
    include = ["web-*"]            # domain-name globs (fnmatch, whole name, case-sensitive)
    exclude = ["web-test*"]
    include_labels = ["vmdisktouch"]   # globs over the labels in the domain's metadata
    exclude_labels = ["tenant-b"]

A domain is out of scope when it matches an exclude (a name glob, a label glob, or its
``[domain...] exclude = true``), else when there are includes and it matches none:
exclude wins. A label is a word in the domain's ``<label>`` element of the namespace
``LABEL_NS`` (``virsh metadata``; docs/configuration.md). ``Rules.out_of_scope``
is the one verdict, used by the host service and by ``discover``.

Which ``cache=none`` disks the host service adopts by itself (``[adopt]``, the same four
keys; ``vmdisktouch adopt``, docs/adopt.md): none unless an include or an include_labels
matches the domain, and never one an exclude matches (``Rules.adopts``). Off by default:
an empty or missing table adopts nothing.

The host service asks that verdict for every disk each cycle, so its cost must not
grow with the cycles: each list is compiled once, when the file is read (``Globs``:
a set of the names without a wildcard, one regular expression of the others), and
each name's match is memoised. Before, ``fnmatch`` compiled each glob on use and
caches 32,768 of them: a list of 60,000 recompiled them all at every verdict, and a
1 s cycle took 6 s of CPU. A list is at most ``MAX_SCOPE_PATTERNS``
globs (a ``ConfigError`` naming the key, at ``config --check``, at start, and at a
reload, which keeps the current settings): a longer one is no list an operator
keeps by hand, and its expression's cost grows faster than its length.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from vmdisktouch.config import read as configread
from vmdisktouch.errors import ConfigError
from vmdisktouch.sizes import counted, parse_size

TABLE = "domain"
KEYS = ("weight", "cap", "exclude", "carry_heat")
MIN_WEIGHT, MAX_WEIGHT = 0.01, 100.0
SCOPE = "scope"
# the operator's labels for a domain, which [scope] matches: the words of the <label>
# element in this namespace of its <metadata> (``libvirt_disks.labels_of``)
LABEL_NS = "http://vmdisktouch.org/xmlns/label/1"
SCOPE_KEYS = ("include", "exclude", "include_labels", "exclude_labels")
ADOPT = "adopt"             # [adopt]: the same keys, for the disks the service adopts
MAX_SCOPE_PATTERNS = 1000   # globs in one [scope] list (the module docstring)
MEMO_NAMES = 4096           # names whose match a ``Globs`` keeps; then it starts again
WILDCARDS = frozenset("*?[")


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


# docs/configuration.md's section on these tables (``settings.configuration_doc``)
DOC = f"""## The host service's domains: `[domain...]`, `[scope]` and `[adopt]`

In the host service's file (`/etc/vmdisktouch/host.toml`, `run --libvirt`), and
read by any `run` whose disks a libvirt domain uses.
`[domain.NAME]` and `[domain.NAME.TARGET]` set, for a domain or one of its
disks, `weight` (0.01 to 100, default 1: its heat counts this many times when
regions are ranked), `cap` (a size: the most it may hold), `exclude` (true:
never served) and `carry_heat` (true or false; unset: the daemon's
`carry_heat`). A disk's own keys win over its domain's.

`[scope]` says which domains the service serves at all, because operators share
hosts. Each key is a list of glob patterns (`*`, `?`, `[...]`, matched against
the whole string, case-sensitive):

| key | matches |
|---|---|
| `include` | domain names to serve; with any include (or include_labels), a domain that matches none is not served (`not_included`) |
| `exclude` | domain names never to serve (`excluded`) |
| `include_labels` | labels of domains to serve, as `include` |
| `exclude_labels` | labels of domains never to serve, as `exclude` |

Each list holds at most {MAX_SCOPE_PATTERNS} patterns: a longer one stops the start
(exit 78, as `config --check` says; at a reload, the current settings stay). The
patterns are compiled once, when the file is read, so a long list costs the
service's cycle nothing more.

Exclude wins over include; `[domain.NAME] exclude = true` is an exclude too. A
label is a word of the `<label>` element a domain carries in its metadata under
the namespace `{LABEL_NS}`, which the operator sets (`--live` for the running
domain, `--config` for its next boots):

```sh
virsh metadata web-1 {LABEL_NS} --key vmdt --set '<label>tenant-a shared</label>' --live --config
```

A label changed on a running domain is followed: libvirt's metadata-change
event makes the service read that domain's live XML again and wakes it at once
(a domain's XML is read when it arrives, on libvirt's events and at least every
minute, not each cycle: other applications' metadata there costs nothing per
cycle); a domain that leaves the scope is released within a cycle, one that
enters it is served. A change of the file itself takes effect at a reload
(`systemctl reload vmdisktouch`). `vmdisktouch discover` says which eligible
disks the file leaves out and why (`--config`, default the host file), `vmdisktouch
status` lists each disk not served with its code and reason, and the metric
`vmdisktouch_disk_unserved` has one series per such disk (docs/metrics.md).
A bad value (not a list of non-empty strings) stops the start with one line
naming the file and the key (exit 78; at a reload, the current settings stay).

`[adopt]` says which `cache=none` disks the service switches to the host page
cache by itself, as `vmdisktouch adopt` does ([adopt.md](adopt.md)), with the
four keys of `[scope]`. Off by default: a disk is adopted only when an
`include` or `include_labels` names its domain, and never when an `exclude` or
`exclude_labels` does, when `[scope]` leaves it out, when advise's last report
said it gains nothing, or when the operator released it (`vmdisktouch
release`) since its domain started. Each refusal is said once; a domain paused,
migrating or running a job is tried again 30 s later. The service serves an
adopted disk within the one budget, and releases what it adopted when it stops.

```toml
[adopt]
include_labels = ["adopt"]
exclude = ["db-*"]
```
"""


class Globs:
    """A list of glob patterns compiled once (the module docstring): ``first(names)`` is
    the first pattern, in the list's order, that matches one of ``names`` whole, as
    ``fnmatch.fnmatchcase`` says, or None; each name's match is memoised."""

    def __init__(self, patterns=()):
        self.patterns = tuple(patterns)
        self._literal: dict[str, int] = {}       # a name without wildcards -> its index
        globs = []
        for i, p in enumerate(self.patterns):
            if WILDCARDS.isdisjoint(p):
                self._literal.setdefault(p, i)
            else:
                globs.append(f"(?P<vdt{i}>{fnmatch.translate(p)})")
        # the alternatives are tried in order: the first that matches whole is the group
        # that closed last (``lastgroup``), each translation ending in \Z
        self._regex = re.compile("|".join(globs)) if globs else None
        self._memo: dict[str, int | None] = {}

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def __eq__(self, other) -> bool:
        """Equal to the same patterns, as a ``Globs`` or a tuple."""
        if isinstance(other, Globs):
            other = other.patterns
        return isinstance(other, tuple) and other == self.patterns

    def __hash__(self) -> int:
        return hash(self.patterns)

    def __repr__(self) -> str:
        return f"Globs({len(self.patterns)} patterns)"

    def first(self, names) -> str | None:
        found = [i for i in map(self._index, names) if i is not None]
        return self.patterns[min(found)] if found else None

    def _index(self, name: str) -> int | None:
        try:
            return self._memo[name]
        except KeyError:
            pass
        i = self._literal.get(name)
        m = self._regex.match(name) if self._regex is not None else None
        if m is not None:
            g = int(m.lastgroup[3:])
            i = g if i is None else min(i, g)
        if len(self._memo) >= MEMO_NAMES:
            self._memo.clear()
        self._memo[name] = i
        return i


def _globs(value=()) -> Globs:
    return value if isinstance(value, Globs) else Globs(value)


@dataclass(frozen=True)
class Scope:
    """The ``[scope]`` table: globs over domain names and over their labels, each list
    compiled once (``Globs``; a tuple of strings given is compiled)."""
    include: Globs = field(default_factory=Globs)
    exclude: Globs = field(default_factory=Globs)
    include_labels: Globs = field(default_factory=Globs)
    exclude_labels: Globs = field(default_factory=Globs)

    def __post_init__(self):
        for key in SCOPE_KEYS:
            object.__setattr__(self, key, _globs(getattr(self, key)))


def parse_scope(data: Any, path: str, warnings: list[str] | None = None,
                table: str = SCOPE) -> Scope:
    """The ``[scope]`` table (or ``[adopt]``: ``table``), checked: each key a list of
    non-empty strings (ConfigError naming the file and the key); unknown keys are a
    warning, as in ``parse``."""
    if data is None:
        return Scope()
    where = f"{path}: [{table}]"
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: key {table} must be a table: [{table}] with "
                          f"{', '.join(SCOPE_KEYS)}")
    got: dict[str, tuple[str, ...]] = {}
    for key, value in data.items():
        if key not in SCOPE_KEYS:
            continue
        if not isinstance(value, list):
            raise ConfigError(f"{where}: {key} must be a list of glob patterns "
                              f"([\"web-*\"]), not {value!r}")
        if len(value) > MAX_SCOPE_PATTERNS:
            raise ConfigError(f"{where}: {key} has {len(value)} patterns, more than "
                              f"{MAX_SCOPE_PATTERNS}: shorten it (a wider glob, or labels: "
                              "include_labels)")
        for v in value:
            if not isinstance(v, str) or not v:
                raise ConfigError(f"{where}: {key} must hold non-empty strings (glob "
                                  f"patterns), not {v!r}")
        got[key] = Globs(value)
    mistyped = [k for k in data if k not in SCOPE_KEYS]
    if warnings is not None and mistyped:
        warnings.append(configread.unknown_keys_warning(where, mistyped, SCOPE_KEYS))
    return Scope(**got)


@dataclass(frozen=True)
class Rules:
    """What the config file says of libvirt's domains: the ``[domain...]`` overrides and
    the ``[scope]``."""
    per: Overrides
    scope: Scope = Scope()
    adopt: Scope = Scope()

    def for_disk(self, domain: str, target: str) -> Override:
        return for_disk(self.per, domain, target)

    def adopts(self, domain: str, target: str, labels: tuple[str, ...]) -> bool:
        """Whether the host service adopts this ``cache=none`` disk by itself (the module
        docstring): in scope, matched by an ``[adopt]`` include, no ``[adopt]`` exclude."""
        a = self.adopt
        if self.out_of_scope(domain, target, labels) is not None:
            return False
        if a.exclude.first((domain,)) is not None or a.exclude_labels.first(labels) is not None:
            return False
        return a.include.first((domain,)) is not None or a.include_labels.first(labels) is not None

    def out_of_scope(self, domain: str, target: str,
                     labels: tuple[str, ...]) -> tuple[str, str] | None:
        """(code, reason) when the host service leaves the disk out (the module docstring:
        exclude wins over include), else None."""
        s = self.scope
        if self.for_disk(domain, target).exclude:
            return "excluded", "excluded by the config file"
        pattern = s.exclude.first((domain,))
        if pattern is not None:
            return "excluded", f"excluded by [scope] exclude {pattern!r}"
        pattern = s.exclude_labels.first(labels)
        if pattern is not None:
            return "excluded", (f"excluded by [scope] exclude_labels {pattern!r} (labels: "
                                f"{' '.join(labels)})")
        if (s.include or s.include_labels) and s.include.first((domain,)) is None \
                and s.include_labels.first(labels) is None:
            return "not_included", ("not in [scope] include or include_labels (labels: "
                                    f"{' '.join(labels) or 'none'})")
        return None
