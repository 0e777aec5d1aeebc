"""The config file: every key works from the file and from the CLI, the CLI wins,
unknown keys warn, bad values fail naming the file and the key, and the shipped
example is current.

The last tests run the real CLI (``python -m vmdisktouch run IMG --config
FILE``) in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import tomllib

import pytest

from vmdisktouch import configfile, settings
from vmdisktouch.errors import ConfigError
from vmdisktouch.settings import SETTINGS
from vmdisktouch.unitname import escape_path

ROOT = pathlib.Path(__file__).resolve().parent.parent
MiB = 1 << 20

# Per kind: two valid values, each as (TOML literal, CLI string, resolved value),
# both different from every default; and one value of the wrong type/shape.
GOOD = {
    "size": [('"3M"', "3M", 3 * MiB), ("5242880", "5242880", 5 * MiB)],
    "duration": [('"1500ms"', "1500ms", 1.5), ("7", "7s", 7.0)],
    "number": [("0.75", "0.75", 0.75), ("3", "3", 3.0)],
    "integer": [("7", "7", 7), ("12", "12", 12)],
    "path": [('"/run/vmdisktouch/a.out"', "/run/vmdisktouch/a.out", "/run/vmdisktouch/a.out"),
             ('"/tmp/b out"', "/tmp/b out", "/tmp/b out")],
    "boolean": [("true", "yes", True), ("false", "no", False)],
}
BAD = {"size": '"lots"', "duration": '"soon"', "number": '"high"', "integer": "1.5",
       "path": "5", "boolean": '"maybe"'}


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
    assert f"expected a {s.kind}" in msg


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
    assert len(warnings) == 3
    assert warnings[0] == f"{path}: unknown key 'treshold' (did you mean 'threshold'?); ignored"
    assert warnings[1] == f"{path}: unknown key 'max-hold' (did you mean 'max_hold'?); ignored"
    assert warnings[2].startswith(f"{path}: unknown key 'foo' (known keys: max_hold, ")


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
                                                    "Is a directory")):
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
        "regenerate: python -m vmdisktouch.configfile --example > examples/vmdisktouch.toml")


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


def test_module_prints_the_example_and_checks_files(tmp_path):
    r = subprocess.run([sys.executable, "-m", "vmdisktouch.configfile", "--example"],
                       capture_output=True, text=True, check=True, cwd=ROOT)
    assert r.stdout == configfile.example_config()
    bad = write(tmp_path, 'max_hold = "1G"\ndecay = "fast"\n')
    r = subprocess.run([sys.executable, "-m", "vmdisktouch.configfile", "--check", bad],
                       capture_output=True, text=True, check=False, cwd=ROOT)
    assert r.returncode == 1 and f"{bad}: key decay" in r.stderr
    odd = write(tmp_path, 'max_hold = "1G"\ntreshold = 1\n', "odd.toml")
    r = subprocess.run([sys.executable, "-m", "vmdisktouch.configfile", "--check", odd],
                       capture_output=True, text=True, check=False, cwd=ROOT)
    assert r.returncode == 0 and "did you mean 'threshold'" in r.stderr
    assert r.stdout == f"{odd}: ok (1 warnings)\n"


# ---------------------------------------------------------------------------
# Through the real CLI: vmdisktouch run IMG --config FILE


def run_cli(*argv, timeout=60):
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "run", *argv],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


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
    assert r.returncode == 1, r.stderr
    assert needle.format(cfg=cfg) in r.stderr
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("vmdisktouch: ")]
    assert len(lines) == 1, r.stderr


def test_cli_missing_config_file_fails(tmp_path, image):
    r = run_cli(image, "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 1
    assert f"vmdisktouch: {tmp_path}/nope.toml: cannot read config file" in r.stderr


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
