"""The config file: every key works from the file and from the CLI, the CLI wins,
unknown keys warn, bad values fail naming the file and the key, and the shipped
example is current.

The last tests run the real CLI (``python -m vmdisktouch run IMG --config
FILE``) in a subprocess.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import pathlib
import re
import resource
import signal
import socket
import subprocess
import sys
import time
try:
    import tomllib
except ImportError:        # Python < 3.11
    import tomli as tomllib

import pytest

from vmdisktouch.config import file as configfile
from vmdisktouch.config import settings
from vmdisktouch.errors import ConfigError
from vmdisktouch.config.settings import SETTINGS
from vmdisktouch.unitname import escape_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
MiB = 1 << 20

# Per kind: two valid values, each as (TOML literal, CLI string, resolved value),
# both different from every default; and one value of the wrong type/shape.
GOOD = {
    "size": [('"3M"', "3M", 3 * MiB), ("5242880", "5242880", 5 * MiB)],
    "duration": [('"1500ms"', "1500ms", 1.5), ("7", "7s", 7.0)],
    "number": [("0.75", "0.75", 0.75), ("3", "3", 3.0)],
    "fraction": [("0.75", "0.75", 0.75), ("1", "1", 1.0)],
    "integer": [("7", "7", 7), ("12", "12", 12)],
    "path": [('"/run/vmdisktouch/a.out"', "/run/vmdisktouch/a.out", "/run/vmdisktouch/a.out"),
             ('"/tmp/b out"', "/tmp/b out", "/tmp/b out")],
    "boolean": [("true", "yes", True), ("false", "no", False)],
    "choice": [('"trace"', "trace", "trace"), ('"MINCORE"', "mincore", "mincore")],
    "switch": [('"on"', "on", "on"), ('"OFF"', "off", "off")],
    "address": [('"127.0.0.1:9105"', "127.0.0.1:9105", "127.0.0.1:9105"),
                ('"[::1]:80"', "[::1]:80", "[::1]:80")],
}
BAD = {"size": '"lots"', "duration": '"soon"', "number": '"high"', "fraction": "1.5",
       "integer": "1.5",
       "path": "5", "boolean": '"maybe"', "choice": '"sometimes"', "switch": '"maybe"',
       "address": '"0.0.0.0:9105"'}


# Pythons with the integer-string limit (3.11, 3.10.7+, 3.9.14+) refuse a 5000-digit
# literal in the TOML parser; older ones parse it and the size check refuses it. Either
# way it is one line naming the file.
INT_DIGIT_LIMIT = hasattr(sys, "get_int_max_str_digits")
HUGE_INT_REFUSAL = ("cannot parse: Exceeds the limit (4300" if INT_DIGIT_LIMIT
                    else "too large: at most 1E")

def parse_cli(argv):
    """argv through the same flags as `vmdisktouch run` (without PATH)."""
    p = argparse.ArgumentParser()
    settings.add_arguments(p)
    configfile.add_arguments(p)
    return vars(p.parse_args(argv))


def write(tmp_path, text, name="vm.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def base_toml(key):
    """A file that sets the required budget unless the key under test is the budget."""
    return "" if key == "max_hold" else 'max_hold = "1G"\n'


def base_argv(key):
    return [] if key == "max_hold" else ["--max-hold", "1G"]


def test_every_kind_has_samples():
    for s in SETTINGS:
        assert s.kind in GOOD and s.kind in BAD, f"add samples for kind {s.kind!r}"
        for _toml, _cli, value in GOOD[s.kind]:
            assert value != s.default, f"sample for {s.key} equals its default"


@pytest.mark.parametrize("s", SETTINGS, ids=[s.key for s in SETTINGS])
@pytest.mark.parametrize("which", [0, 1])
def test_every_key_from_the_file(tmp_path, s, which):
    literal, _cli, expected = GOOD[s.kind][which]
    path = write(tmp_path, base_toml(s.key) + f"{s.key} = {literal}\n")
    cfg, warnings = configfile.resolve_run_config(parse_cli([]), path)
    assert warnings == []
    assert cfg[s.key] == expected
    for other in SETTINGS:       # nothing else moved
        if other.key not in (s.key, "max_hold"):
            assert cfg[other.key] == other.default


@pytest.mark.parametrize("s", SETTINGS, ids=[s.key for s in SETTINGS])
def test_every_key_from_the_cli(s):
    _literal, cli, expected = GOOD[s.kind][0]
    cfg, warnings = configfile.resolve_run_config(parse_cli(base_argv(s.key) + [s.flag, cli]),
                                                  None)
    assert warnings == [] and cfg[s.key] == expected


@pytest.mark.parametrize("s", SETTINGS, ids=[s.key for s in SETTINGS])
def test_cli_overrides_the_file(tmp_path, s):
    literal, _cli, in_file = GOOD[s.kind][0]
    _literal, cli, on_cli = GOOD[s.kind][1]
    path = write(tmp_path, base_toml(s.key) + f"{s.key} = {literal}\n")
    cfg, _ = configfile.resolve_run_config(parse_cli(base_argv(s.key) + [s.flag, cli]), path)
    assert cfg[s.key] == on_cli != in_file


@pytest.mark.parametrize("s", SETTINGS, ids=[s.key for s in SETTINGS])
def test_bad_value_names_file_and_key(tmp_path, s):
    path = write(tmp_path, base_toml(s.key) + f"{s.key} = {BAD[s.kind]}\n")
    with pytest.raises(ConfigError) as exc:
        configfile.load(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: key {s.key}: bad value"), msg
    assert f"expected {'an' if s.kind[0] in 'aeiou' else 'a'} {s.kind}" in msg


def test_bad_value_fails_even_when_the_cli_overrides_it(tmp_path):
    path = write(tmp_path, 'max_hold = "1G"\ndecay = "fast"\n')
    with pytest.raises(ConfigError, match=re.escape(f"{path}: key decay: bad value 'fast'")):
        configfile.resolve_run_config(parse_cli(["--decay", "0.5"]), path)


@pytest.mark.parametrize("text,needle", [
    ('max_hold = 0\n', "key max_hold: bad value 0 for max_hold (expected a size: must be "
                       "greater than 0)"),
    ('max_hold = "1G"\nthreshold = 0\n', "key threshold: bad value 0"),
    ('max_hold = "1G"\ndecay = 0.0\n', "key decay: bad value 0.0"),
    ('max_hold = "1G"\ninterval = -1\n', "key interval: bad value -1"),
    ('max_hold = "1G"\nscale = 0\n', "key scale: bad value 0"),
    ('max_hold = "1G"\ninterval = true\n', "key interval: bad value True"),
    ('max_hold = ["1G"]\n', "key max_hold: bad value ['1G']"),
    ('max_hold = "1G"\n[status]\npath = "x"\n', "key status: bad value {'path': 'x'}"),
])
def test_out_of_range_and_wrong_type(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {needle}")):
        configfile.load(path)


def test_unknown_key_warns_with_a_suggestion(tmp_path):
    path = write(tmp_path, 'max_hold = "1G"\ntreshold = 0.3\nmax-hold = "2G"\nfoo = 1\n')
    cfg, warnings = configfile.resolve_run_config(parse_cli([]), path)
    default = next(s.default for s in SETTINGS if s.key == "threshold")
    assert cfg.max_hold == 1 << 30 and cfg.threshold == default != 0.3   # typos are ignored
    assert warnings == [f"{path}: 3 unknown keys: 'treshold' (did you mean 'threshold'?), "
                        "'max-hold' (did you mean 'max_hold'?), 'foo' (known keys: max_hold, "
                        f"{', '.join(s.key for s in SETTINGS[1:])}); ignored"]
    path = write(tmp_path, 'max_hold = "1G"\ntreshold = 0.3\n')
    assert configfile.load(path)[1] == [
        f"{path}: unknown key 'treshold' (did you mean 'threshold'?); ignored"]
    path = write(tmp_path, 'foo = 1\n')
    assert configfile.load(path)[1][0].startswith(f"{path}: unknown key 'foo' (known keys: ")


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, 'interval = 5\nmax_hold = 4G\n')
    with pytest.raises(ConfigError, match=re.escape(f"{path}:2:13: TOML syntax error: ")):
        configfile.load(path)


def test_duplicate_key_is_a_syntax_error(tmp_path):
    path = write(tmp_path, 'max_hold = "1G"\nmax_hold = "2G"\n')
    with pytest.raises(ConfigError, match=re.escape(f"{path}:2:")):
        configfile.load(path)


def test_unreadable_files(tmp_path):
    missing = str(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match=re.escape(f"{missing}: cannot read config file: "
                                                    "No such file or directory")):
        configfile.load(missing)
    with pytest.raises(ConfigError, match=re.escape(f"{tmp_path}: cannot read config file: "
                                                    "it is a directory, not a regular file")):
        configfile.load(str(tmp_path))
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes(b'# caf\xe9\nmax_hold = "1G"\n')
    with pytest.raises(ConfigError, match=re.escape(f"{latin1}: not UTF-8 text")):
        configfile.load(str(latin1))


def test_empty_file_is_fine_but_the_budget_is_required(tmp_path):
    path = write(tmp_path, "# nothing yet\n")
    assert configfile.load(path) == ({}, [])
    with pytest.raises(ConfigError, match=re.escape(
            f"max_hold is not set: pass --max-hold or set max_hold in {path}")):
        configfile.resolve_run_config(parse_cli([]), path)
    cfg, _ = configfile.resolve_run_config(parse_cli(["--max-hold", "2G"]), path)
    assert cfg.max_hold == 2 << 30


# ---------------------------------------------------------------------------
# Hostile files: values that are not finite, files that are not files, too
# big, too many keys, too deep. Each is a ConfigError naming the file (or one
# warning line), fast, never another exception.

NUMERIC = [s for s in SETTINGS if s.kind in ("size", "duration", "number", "integer")]


@contextlib.contextmanager
def within(seconds):
    """Fail (instead of hanging) if the block takes longer than ``seconds``."""
    def expire(_signum, _frame):
        raise TimeoutError(f"took more than {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def refused(path, needle=""):
    with within(10), pytest.raises(ConfigError) as exc:
        configfile.load(path)
    msg = str(exc.value)
    assert needle in msg and msg.startswith(f"{path}") and "\n" not in msg, msg
    assert len(msg) < 400, msg
    return msg


@pytest.mark.parametrize("s", NUMERIC, ids=[s.key for s in NUMERIC])
@pytest.mark.parametrize("literal", ["nan", "+nan", "-nan", "inf", "+inf", "-inf", "1e308",
                                     "-1e308", "1" * 400, "-" + "9" * 4000, "true",
                                     "1979-05-27T07:32:00Z", "07:32:00", "[]", "{}"],
                         ids=lambda t: t[:12])
def test_non_finite_huge_and_odd_values_in_the_file(tmp_path, s, literal):
    path = write(tmp_path, base_toml(s.key) + f"{s.key} = {literal}\n")
    refused(path, f"{path}: key {s.key}: bad value ")


@pytest.mark.parametrize("text,needle", [
    ("max_hold = 1" + "0" * 5000 + "\n", HUGE_INT_REFUSAL),
    ("max_hold = " + "[" * 100_000 + "\n", "nested too deeply"),
    ("x = " + "{a = " * 100_000 + "\n", "nested too deeply"),
    ('max_hold = "1G"\nx = ' + "[" * 100_000 + "1" + "]" * 100_000 + "\n", "nested too deeply"),
], ids=["5000digits", "deep-arrays", "deep-inline-tables", "deep-closed-arrays"])
def test_what_the_toml_parser_cannot_take_is_a_config_error(tmp_path, text, needle):
    refused(write(tmp_path, text), needle)


@pytest.mark.parametrize("text,needle", [
    ('max_hold = "1G"\n[interval]\n', "key interval: bad value {}"),
    ('max_hold = "1G"\n[[decay]]\nx = 1\n', "key decay: bad value [{'x': 1}]"),
    ('max_hold = "1G"\nscale.x = 1\n', "key scale: bad value {'x': 1}"),
    ('max_hold = "1G"\nstatus = "a\\u0000b"\n', "key status: bad value 'a\\x00b'"),
    ('max_hold = "1G"\nstatus = "a\\nb"\n', "key status: bad value 'a\\nb'"),
    ('max_hold = "1G"\nwidth = ' + "9" * 4000 + "\n", "key width: bad value <an integer of"),
    ('max_hold = "1G"\nblock_size = 1000\n', "must be a multiple of the page size"),
    ('max_hold = "1G"\ninterval = 0.05\n', "key interval: bad value 0.05 for interval "
                                           "(expected a duration: must be at least 0.1 s)"),
])
def test_known_keys_with_odd_values(tmp_path, text, needle):
    refused(write(tmp_path, text), needle)


def test_interval_floor_accepted(tmp_path):
    path = write(tmp_path, 'max_hold = "1G"\ninterval = 0.1\n')
    assert configfile.resolve_run_config(parse_cli([]), path)[0].interval == 0.1


def test_odd_key_names_give_one_short_warning_line(tmp_path):
    path = write(tmp_path, 'max_hold = "1G"\n"" = 1\n"a\\nb" = 2\n"\\u0000" = 3\n'
                           f'"{"k" * 100_000}" = 4\nx.y.z = 5\n')
    with within(10):
        values, warnings = configfile.load(path)
    assert values == {"max_hold": "1G"} and len(warnings) == 1
    w = warnings[0]
    assert "\n" not in w and "\0" not in w and len(w) < 1000, w
    assert w.startswith(f"{path}: 5 unknown keys: '', 'a\\nb', '\\x00', 'kkkk") and "'x'" in w


def limit_memory():
    """In a child: 1 GiB of address space, so a reader that does not stop fails fast."""
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def check_file(path):
    """``vmdisktouch config --check PATH``, bounded in time and memory
    (in a child: reading /dev/zero unbounded would eat the memory of this process)."""
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "config", "--check", path],
                          capture_output=True, text=True, timeout=30, cwd=ROOT,
                          preexec_fn=limit_memory)


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/null", "/dev/urandom", "zero-link"])
def test_devices_are_refused_fast(tmp_path, special):
    if special == "zero-link":
        special = str(tmp_path / "zero.toml")
        os.symlink("/dev/zero", special)
    start = time.monotonic()
    r = check_file(special)
    assert time.monotonic() - start < 20
    assert r.returncode == 78 and r.stderr == (
        f"vmdisktouch: {special}: cannot read config file: it is a character device, not a "
        "regular file\n")


def test_fifo_directory_socket_and_symlinks(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)                               # open() would block without a writer
    refused(str(fifo), "it is a FIFO, not a regular file")
    refused(str(tmp_path), "it is a directory, not a regular file")
    sock_path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        refused(str(sock_path), "it is a socket, not a regular file")
    good = tmp_path / "real.toml"
    good.write_text('max_hold = "2G"\n')
    (tmp_path / "link.toml").symlink_to(good)     # a symlink to a regular file is fine
    assert configfile.load(str(tmp_path / "link.toml")) == ({"max_hold": "2G"}, [])


def test_unusable_path_names():
    for path in ["a\0b", "\udcff\ud800"]:
        with pytest.raises(ConfigError, match="cannot read config file"):
            configfile.load(path)


def test_reload_of_a_file_replaced_by_a_fifo_is_refused(tmp_path):
    path = tmp_path / "vm.toml"
    path.write_text('max_hold = "1G"\n')
    cfg, _, _ = configfile.load_for_run(parse_cli([]), str(path), {})
    assert cfg.max_hold == 1 << 30
    path.unlink()
    os.mkfifo(path)
    with within(10), pytest.raises(ConfigError, match="it is a FIFO"):
        configfile.load_for_run(parse_cli([]), str(path), {})


def test_size_cap(tmp_path):
    cap = configfile.MAX_CONFIG_BYTES
    assert cap == 1 << 20
    line = "# " + "x" * 97 + "\n"
    at_cap = tmp_path / "at_cap.toml"
    at_cap.write_text('max_hold = "1G"\n' + line * ((cap - 16) // 100) + "#" * ((cap - 16) % 100))
    assert at_cap.stat().st_size == cap
    assert configfile.load(str(at_cap)) == ({"max_hold": "1G"}, [])
    big = tmp_path / "big.toml"
    big.write_text('max_hold = "1G"\n' + line * (2 * cap // 100))      # about 2 MiB
    refused(str(big), f"{big}: config file larger than 1M (1048576 bytes)")
    one_over = tmp_path / "one_over.toml"
    one_over.write_text(at_cap.read_text() + "#")
    refused(str(one_over), "larger than 1M")


def test_many_unknown_keys_are_one_warning_and_fast(tmp_path, monkeypatch):
    lines = [f'k{i:05d} = "{i:05d}"' for i in range(60_000)]
    path = write(tmp_path, 'max_hold = "1G"\n' + "\n".join(lines) + "\n")
    assert 900_000 < os.path.getsize(path) <= configfile.MAX_CONFIG_BYTES
    calls = []
    real = difflib.get_close_matches
    monkeypatch.setattr(difflib, "get_close_matches",
                        lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    start = time.monotonic()
    with within(20):
        values, warnings = configfile.load(path)
    assert time.monotonic() - start < 3
    assert values == {"max_hold": "1G"} and len(warnings) == 1
    assert warnings[0].startswith(f"{path}: 60000 unknown keys: 'k00000', 'k00001', 'k00002', "
                                  "'k00003', 'k00004' "
                                  "and 59995 more (known keys: max_hold, ")
    assert len(calls) <= 5 and "\n" not in warnings[0]


# ---------------------------------------------------------------------------
# Finding the file of a unit instance


DISK = "/var/lib/libvirt/images/my vm-1.img"


def test_find_config_prefers_the_instance_file(tmp_path):
    etc = str(tmp_path)
    instance = escape_path(DISK)
    assert instance == "var-lib-libvirt-images-my\\x20vm\\x2d1.img"
    assert configfile.find_config(instance, etc) is None
    default = write(tmp_path, 'max_hold = "1G"\n', "default.toml")
    assert configfile.find_config(instance, etc) == default
    own = write(tmp_path, 'max_hold = "2G"\n', instance + ".toml")
    assert configfile.find_config(instance, etc) == own
    assert configfile.find_config(DISK, etc) == own          # a path is escaped first
    assert configfile.config_candidates(DISK, etc) == [own, default]


def test_load_for_run(tmp_path):
    etc = str(tmp_path / "etc")
    os.mkdir(etc)
    instance = escape_path(DISK)
    env = {configfile.INSTANCE_ENV: instance}

    # under the unit, no file at all: the error says which files to create
    with pytest.raises(ConfigError) as exc:
        configfile.load_for_run(parse_cli([]), None, env, etc)
    assert str(exc.value) == (f"max_hold is not set: pass --max-hold or create "
                              f"{etc}/{instance}.toml or {etc}/default.toml with max_hold = ...")

    default = os.path.join(etc, "default.toml")
    pathlib.Path(default).write_text('max_hold = "1G"\n')
    cfg, warnings, used = configfile.load_for_run(parse_cli([]), None, env, etc)
    assert (cfg.max_hold, warnings, used) == (1 << 30, [], default)

    own = os.path.join(etc, instance + ".toml")
    pathlib.Path(own).write_text('max_hold = "2G"\nbogus = 1\n')
    cfg, warnings, used = configfile.load_for_run(parse_cli([]), None, env, etc)
    assert (cfg.max_hold, used) == (2 << 30, own) and "'bogus'" in warnings[0]

    # --config wins over the instance file
    explicit = write(tmp_path, 'max_hold = "3G"\n', "explicit.toml")
    args = parse_cli(["--config", explicit])
    cfg, _, used = configfile.load_for_run(args, args["config"], env, etc)
    assert (cfg.max_hold, used) == (3 << 30, explicit)

    # by hand, without the unit's variable: no file is picked up implicitly
    with pytest.raises(ConfigError, match="--max-hold"):
        configfile.load_for_run(parse_cli([]), None, {}, etc)
    cfg, _, used = configfile.load_for_run(parse_cli(["--max-hold", "4G"]), None, {}, etc)
    assert (cfg.max_hold, used) == (4 << 30, None)

    # an explicit --config that does not exist is an error, not a silent default
    with pytest.raises(ConfigError, match="cannot read config file"):
        configfile.load_for_run(parse_cli([]), str(tmp_path / "nope.toml"), env, etc)


# ---------------------------------------------------------------------------
# The example config


EXAMPLE = ROOT / "examples" / "vmdisktouch.toml"


def test_shipped_example_is_current():
    assert EXAMPLE.read_text() == configfile.example_config(), (
        "regenerate: vmdisktouch config --example > examples/vmdisktouch.toml")


def test_example_loads_without_warnings():
    assert configfile.load(str(EXAMPLE)) == ({}, [])


def test_example_comments_every_key_and_uncommented_gives_the_defaults(tmp_path):
    text = configfile.example_config()
    assignment = re.compile(r"^#([a-z_]+) = (.*)$", re.M)
    keys = [m.group(1) for m in assignment.finditer(text)]
    assert keys == [s.key for s in SETTINGS]
    for s in SETTINGS:     # a comment paragraph with the help text, unit and default
        paragraph = text.split(f"\n#{s.key} = ")[0].rsplit("\n\n", 1)[1]
        flat = " ".join(line[2:] for line in paragraph.splitlines())
        assert flat.startswith(f"{s.key}: {s.kind}")
        assert s.help in flat and f"default: {s.default_text()}" in flat
        if s.unit:
            assert f"[{s.unit}]" in flat
    path = write(tmp_path, assignment.sub(r"\1 = \2", text))
    values, warnings = configfile.load(path)
    assert warnings == [] and sorted(values) == sorted(s.key for s in SETTINGS)
    cfg = settings.resolve({}, values, path)
    for s in SETTINGS:
        if s.default is not None:
            assert cfg[s.key] == s.default, s.key


def test_toml_value_round_trips():
    for value in ["plain", 'quote " and \\ backslash', "tab\tnew\nline", "ünï", 1, 0,
                  2.5, 0.01, 1e-07, True, False]:
        assert tomllib.loads(f"k = {configfile.toml_value(value)}")["k"] == value


def config_cmd(*argv):
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "config", *argv],
                          capture_output=True, text=True, check=False, cwd=ROOT)


def test_config_prints_the_example_and_checks_files(tmp_path):
    r = config_cmd("--example")
    assert r.returncode == 0 and r.stdout == configfile.example_config()
    bad = write(tmp_path, 'max_hold = "1G"\ndecay = "fast"\n')
    r = config_cmd("--check", bad)
    assert r.returncode == 78 and f"{bad}: key decay" in r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stdout == ""
    odd = write(tmp_path, 'max_hold = "1G"\ntreshold = 1\n', "odd.toml")
    r = config_cmd("--check", odd)
    assert r.returncode == 0 and "did you mean 'threshold'" in r.stderr
    assert r.stdout == f"{odd}: ok (1 warning)\n"
    odder = write(tmp_path, 'max_hold = "1G"\ntreshold = 1\n[domain.vm1]\nwieght = 2\n',
                  "odder.toml")
    assert config_cmd("--check", odder).stdout == f"{odder}: ok (2 warnings)\n"


@pytest.mark.parametrize("text,needle", [
    ('max_hold = "1G"\nblock_size = "6K"\n', "multiple of the page size"),
    ('interval = 5\n', "max_hold is not set"),
    ('max_hold = "1G"\nmin_free = "1E"\n', "not below the host's memory"),
    ('max_hold = "4K"\n', "smaller than one block"),
    ('max_hold = "1G"\n[domain.web]\nweight = -1\n', "weight"),
])
def test_config_check_refuses_what_run_refuses(tmp_path, text, needle):
    path = write(tmp_path, text)
    r = config_cmd("--check", path)
    assert r.returncode == 78 and needle in r.stderr, r.stderr
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    img = tmp_path / "disk.img"
    img.write_bytes(b"\0" * 65536)
    r = run_cli(str(img), "--config", path, "--uri", "")       # and run refuses it alike
    assert r.returncode == 78 and needle in r.stderr, r.stderr


# ---------------------------------------------------------------------------
# Through the real CLI: vmdisktouch run IMG --config FILE


def run_cli(*argv, timeout=60, preexec_fn=None):
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "run", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          preexec_fn=preexec_fn)


def assert_one_fatal_line(stderr):
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("vmdisktouch: ")]
    assert len(lines) == 1, stderr


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "disk.img"
    with open(path, "wb") as f:
        f.write(os.urandom(4 * MiB))
    return str(path)


@pytest.mark.parametrize("text,needle", [
    ('max_hold = "1G"\ndecay = "fast"\n', "{cfg}: key decay: bad value 'fast' for decay "
                                          "(expected a number"),
    ('max_hold = "1G"\nthreshold = 0\n', "{cfg}: key threshold: bad value 0"),
    ('max_hold = 4G\n', "{cfg}:1:13: TOML syntax error"),
    ('interval = 2\n', "max_hold is not set: pass --max-hold or set max_hold in {cfg}"),
])
def test_cli_bad_config_fails_at_start_naming_file_and_key(tmp_path, image, text, needle):
    cfg = write(tmp_path, text)
    r = run_cli(image, "--config", cfg)
    assert r.returncode == 78, r.stderr
    assert needle.format(cfg=cfg) in r.stderr
    assert_one_fatal_line(r.stderr)


def test_cli_missing_config_file_fails(tmp_path, image):
    r = run_cli(image, "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 78
    assert f"vmdisktouch: {tmp_path}/nope.toml: cannot read config file" in r.stderr


HOSTILE_FILES = {
    "interval-nan": ('max_hold = "1G"\ninterval = nan\n', "{cfg}: key interval: bad value nan"),
    "interval-inf": ('max_hold = "1G"\ninterval = inf\n', "{cfg}: key interval: bad value inf"),
    "interval-0.05": ('max_hold = "1G"\ninterval = 0.05\n', "at least 0.1 s"),
    "sigma-inf": ('max_hold = "1G"\nsigma_resident = inf\n', "key sigma_resident: bad value inf"),
    "decay-inf": ('max_hold = "1G"\ndecay = inf\n', "{cfg}: key decay: bad value inf"),
    "max_hold-400-digits": ("max_hold = " + "1" * 400 + "\n",
                            "key max_hold: bad value <an integer of 400 digits> for max_hold "
                            "(expected a size: too large: at most 1E"),
    "max_hold-5000-digits": ("max_hold = " + "1" * 5000 + "\n",
                             "{cfg}: cannot parse" if INT_DIGIT_LIMIT else "{cfg}: key max_hold"),
    "block_size-1000": ('max_hold = "1G"\nblock_size = 1000\n', "multiple of the page size"),
    "deep-nesting": ('max_hold = "1G"\nx = ' + "[" * 100_000 + "\n", "nested too deeply"),
    "2MiB": ('max_hold = "1G"\n' + ("#" * 99 + "\n") * 21_000, "larger than 1M"),
}


@pytest.mark.parametrize("name", HOSTILE_FILES)
def test_cli_hostile_config_exits_78_with_one_line(tmp_path, image, name):
    text, needle = HOSTILE_FILES[name]
    cfg = write(tmp_path, text)
    r = run_cli(image, "--uri", "", "--config", cfg, timeout=30, preexec_fn=limit_memory)
    assert r.returncode == 78, r.stderr[-2000:]
    assert needle.format(cfg=cfg) in r.stderr, r.stderr[-2000:]
    assert_one_fatal_line(r.stderr)


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo", "directory"])
def test_cli_config_that_is_not_a_file_exits_78_fast(tmp_path, image, kind):
    path = {"/dev/zero": "/dev/zero", "fifo": str(tmp_path / "fifo"),
            "directory": str(tmp_path)}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    start = time.monotonic()
    r = run_cli(image, "--uri", "", "--config", path, timeout=30, preexec_fn=limit_memory)
    assert time.monotonic() - start < 20
    assert r.returncode == 78, r.stderr
    assert f"vmdisktouch: {path}: cannot read config file: it is a" in r.stderr
    assert_one_fatal_line(r.stderr)


@pytest.mark.parametrize("flags,needle", [
    (["--max-hold", "1" * 400], "option --max-hold: bad value '1111"),
    (["--max-hold", "9" * 5000], "too large: at most 1E"),
    (["--max-hold", "1G", "--block-size", "1000"], "option --block-size: bad value '1000'"),
    (["--max-hold", "1G", "--interval", "nan"], "option --interval: bad value 'nan'"),
    (["--max-hold", "1G", "--interval", "0.05"], "must be at least 0.1 s"),
    (["--max-hold", "1G", "--decay=inf"], "option --decay: bad value 'inf'"),
    (["--max-hold", "1G", "--sigma-rewritten", "1e400"], "option --sigma-rewritten"),
    (["--max-hold", "1G", "--load-rate", "1K"], "0 (unpaced) or at least 1M/s"),
    (["--max-hold", "1G", "--status", "a\nb"], "option --status: bad value 'a\\nb'"),
], ids=lambda v: "_".join(v)[:40] if isinstance(v, list) else "")
def test_cli_bad_flags_exit_78_with_one_line(image, flags, needle):
    r = run_cli(image, "--uri", "", *flags, timeout=30, preexec_fn=limit_memory)
    assert r.returncode == 78, r.stderr
    assert needle in r.stderr
    assert_one_fatal_line(r.stderr)


def test_cli_runs_with_file_values_and_cli_overrides(tmp_path, image):
    status = tmp_path / "status.json"
    cfg = write(tmp_path, f'max_hold = "1M"\nmin_free = "3M"\ninterval = "200ms"\n'
                          f'status = "{status}"\nmystery_key = 1\n')
    proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", image,
                             "--config", cfg, "--max-hold", "2M"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not status.exists():
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "no status file after 60 s"
            time.sleep(0.1)
        obj = json.loads(status.read_text())
        assert obj["budget_bytes"] == 2 * MiB        # the flag overrides the file's 1M
        assert obj["min_free_bytes"] == 3 * MiB      # from the file
    finally:
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"{cfg}: unknown key 'mystery_key'" in err


def test_run_logs_every_setting_in_force_and_where_it_came_from(tmp_path):
    """Once the daemon has started (a refusal before that stays one line)."""
    path = write(tmp_path, 'max_hold = "2G"\ndecay = 0.2\n')
    img = tmp_path / "disk.img"
    img.write_bytes(b"\0" * 65536)
    proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", str(img), "--config",
                             path, "--interval", "2", "--uri", "", "--min-free", "0"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        line = ""
        deadline = time.monotonic() + 30
        while "settings in force" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert (f"from flags: min_free=0 interval=2.0; from {path}: max_hold=2G decay=0.2; "
            "defaults: ") in line, line
    for s in SETTINGS:
        assert f" {s.key}=" in line, s.key
    assert "access_source=auto" in line and proc.returncode == 0
