"""systemd/vmdisktouch.service, the host unit: made from the per-disk template (one
sandbox), `systemd-analyze verify` clean, its command line one the real CLI accepts, and
examples/host.toml a config `run` accepts."""

from __future__ import annotations

import pathlib
import shlex

from tests.e2e.test_unit import SHIPPED_EXE, U as TEMPLATE, verify
from tests.sandbox_exec import parse_unit
from tools.host_unit import TEMPLATE as TEMPLATE_PATH, host_unit
from vmdisktouch.commands import cli
from vmdisktouch.config import file as configfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "vmdisktouch.service"
TEXT = UNIT.read_text()
U = parse_unit(TEXT)


def test_the_shipped_host_unit_is_made_from_the_template():
    assert TEXT == host_unit(TEMPLATE_PATH.read_text()), \
        "regenerate: python -m tools.host_unit > systemd/vmdisktouch.service"


def test_the_sandbox_is_the_template_s():
    differ = {"ExecStart", "Environment"}
    host = {k: v for k, v in U["Service"].items() if k not in differ}
    template = {k: v for k, v in TEMPLATE["Service"].items() if k not in differ}
    assert host == template
    assert "Environment" not in U["Service"] and "RequiresMountsFor" not in U["Unit"]
    assert U["Install"] == TEMPLATE["Install"]


def test_systemd_analyze_verify_passes(tmp_path):
    exe = tmp_path / "vmdisktouch"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    unit = tmp_path / "vmdisktouch.service"
    unit.write_text(TEXT.replace(SHIPPED_EXE, str(exe)))
    r = verify(unit)
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_exec_start_is_the_libvirt_following_mode():
    [exec_start] = U["Service"]["ExecStart"]
    argv = shlex.split(exec_start[1:])
    assert argv[0] == SHIPPED_EXE
    args = cli.build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.libvirt and args.paths == []
    assert args.config == "/etc/vmdisktouch/host.toml"
    assert args.status == "/run/vmdisktouch/host.json"
    assert args.map_png == "/run/vmdisktouch/{disk}.map.png"
    assert args.heat_png == "/run/vmdisktouch/{disk}.heat.png"
    assert args.state_dir == "/var/lib/vmdisktouch"


def test_the_example_host_config_is_accepted():
    config, warnings, path = configfile.load_for_run({}, str(ROOT / "examples" / "host.toml"))
    assert warnings == [] and config.max_hold == 8 << 30 and config.min_free == 4 << 30
