"""systemd/vmdisktouch.service, the host unit: made from the per-disk template (one
sandbox), `systemd-analyze verify` clean, its command line one the real CLI accepts, and
examples/host.toml a config `run` accepts; systemd/vmdisktouch-metrics.socket, the socket
it may be passed for its HTTP metrics, `systemd-analyze verify` clean beside it."""

from __future__ import annotations

import json
import pathlib
import shlex
import time

import pytest
from PIL import Image

from tests.e2e.test_unit import SHIPPED_EXE, U as TEMPLATE, verify
from tests.support.daemon_proc import DaemonProc
from tests.support.libvirt_env import URI, disk_xml, domains, libvirt_daemons  # noqa: F401
from tests.support.pagecache import data_image
from tests.support.sandbox_exec import parse_unit
from tests.support.host_unit import TEMPLATE as TEMPLATE_PATH, host_unit
from vmdisktouch.commands import cli
from vmdisktouch.config import file as configfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "vmdisktouch.service"
TEXT = UNIT.read_text()
U = parse_unit(TEXT)
SOCKET = ROOT / "systemd" / "vmdisktouch-metrics.socket"
S = parse_unit(SOCKET.read_text())


def test_the_shipped_host_unit_is_made_from_the_template():
    assert TEXT == host_unit(TEMPLATE_PATH.read_text()), \
        "regenerate: python -m tests.support.host_unit > systemd/vmdisktouch.service"


def test_the_sandbox_is_the_template_s():
    differ = {"ExecStart", "Environment"}
    host = {k: v for k, v in U["Service"].items() if k not in differ}
    template = {k: v for k, v in TEMPLATE["Service"].items() if k not in differ}
    assert host == template
    assert "Environment" not in U["Service"] and "RequiresMountsFor" not in U["Unit"]
    assert U["Install"] == TEMPLATE["Install"]


def install_copies(tmp_path, socket_text: str | None = None) -> pathlib.Path:
    """The host unit (ExecStart at a stub) and the socket unit side by side; the socket's
    path (verify finds the service it names in the same directory)."""
    exe = tmp_path / "vmdisktouch"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    (tmp_path / "vmdisktouch.service").write_text(TEXT.replace(SHIPPED_EXE, str(exe)))
    sock = tmp_path / SOCKET.name
    sock.write_text(SOCKET.read_text() if socket_text is None else socket_text)
    return sock


def test_systemd_analyze_verify_passes(tmp_path):
    install_copies(tmp_path)
    r = verify(tmp_path / "vmdisktouch.service")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_systemd_analyze_verify_passes_for_the_socket_unit(tmp_path):
    r = verify(install_copies(tmp_path))
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_verify_of_the_socket_unit_would_catch_mistakes(tmp_path):
    text = SOCKET.read_text()
    bad = tmp_path / "bad"
    bad.mkdir()
    r = verify(install_copies(bad, text.replace("Service=vmdisktouch.service",
                                                "Service=vmdisktuch.service")))
    assert r.returncode != 0 and "vmdisktuch.service not loaded" in r.stderr, r.stderr
    typo = tmp_path / "typo"
    typo.mkdir()
    r = verify(install_copies(typo, text.replace("ListenStream=", "ListenStreem=")))
    assert r.returncode != 0 and "ListenStreem" in r.stderr, r.stderr


def test_the_socket_unit_passes_a_loopback_socket_named_metrics_to_the_host_service():
    from vmdisktouch.adapters.metrics.metrics import PASSED_NAME
    sock = S["Socket"]
    assert sock["ListenStream"] == ["127.0.0.1:9479"]
    assert sock["FileDescriptorName"] == [PASSED_NAME] == ["metrics"]
    assert sock["Service"] == [UNIT.name]
    assert sock.get("Accept", ["no"]) == ["no"]          # one socket, the daemon accepts
    # it lives and dies with the service; not enabled by anything shipped
    assert S["Unit"]["PartOf"] == [UNIT.name] and S["Install"] == {"WantedBy": [UNIT.name]}
    # ... whose network stays closed: the socket is the way in
    assert U["Service"]["PrivateNetwork"] == ["yes"]
    assert U["Service"]["RestrictAddressFamilies"] == ["AF_UNIX"]
    assert "127.0.0.1:9479" in (ROOT / "docs" / "metrics.md").read_text()
    assert SOCKET.name in (ROOT / "docs" / "unit.md").read_text()


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
    assert args.host_png == "/run/vmdisktouch/host.png"      # the picture docs/unit.md shows


def test_the_example_host_config_is_accepted():
    config, warnings, path = configfile.load_for_run({}, str(ROOT / "examples" / "host.toml"))
    assert warnings == [] and config.max_hold == 8 << 30 and config.min_free == 4 << 30
    assert config.metrics_file is None            # commented out: its directory may be missing


def test_the_example_metrics_line_uncommented_is_node_exporter_s_directory(tmp_path):
    """One line to uncomment, in the directory the units may write (ReadWritePaths=)."""
    text = (ROOT / "examples" / "host.toml").read_text()
    [line] = [x for x in text.splitlines() if x.startswith("#metrics_file")]
    edited = tmp_path / "host.toml"
    edited.write_text(text.replace(line, line[1:]))
    config, warnings, _ = configfile.load_for_run({}, str(edited))
    assert warnings == []
    assert config.metrics_file == "/var/lib/prometheus/node-exporter/vmdisktouch.prom"
    assert "-" + str(pathlib.Path(config.metrics_file).parent) in U["Service"]["ReadWritePaths"]


@pytest.mark.timeout(180)
def test_the_unit_s_command_line_draws_the_host_png(tmp_path, domains):  # noqa: F811
    """The ExecStart as shipped, its directories moved under ``tmp_path`` and the shipped
    examples/host.toml as its config, serves a libvirt domain and writes the host PNG."""
    img = data_image(tmp_path / "vm.raw", 16 << 20)
    name = domains.define([disk_xml("vda", img)], tag="hostunit")
    [exec_start] = U["Service"]["ExecStart"]
    argv = shlex.split(exec_start[1:])
    assert argv[:2] == [SHIPPED_EXE, "run"]
    moved = {"/run/vmdisktouch/": f"{tmp_path}/run/", "/var/lib/vmdisktouch": f"{tmp_path}/state",
             "/etc/vmdisktouch/host.toml": str(ROOT / "examples" / "host.toml")}
    args = []
    for a in argv[2:]:
        for old, new in moved.items():
            a = a.replace(old, new)
        args.append(a)
    (tmp_path / "run").mkdir()
    (tmp_path / "state").mkdir()
    d = DaemonProc(tmp_path, [], *args, "--uri", URI, "--interval", "0.5", "--min-free", "0",
                   status=None)
    png = tmp_path / "run" / "host.png"
    status = tmp_path / "run" / "host.json"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (png.exists() and status.exists()):
            assert d.alive(), d.output()[-3000:]
            time.sleep(0.2)
        assert status.exists() and png.exists(), d.output()[-3000:]
        st = json.loads(status.read_text())
        assert f"{name}/vda" in [f"{x['domain']}/{x['target']}" for x in st["host"]["disks"]]
        with Image.open(png) as im:
            im.verify()
            assert im.format == "PNG" and im.size[0] >= 760, im.size
    finally:
        assert d.stop() == 0, d.output()[-3000:]
