"""unit-name: the Python escaping equals systemd-escape's, and round-trips through it.

Every case is checked against the real ``systemd-escape`` (Debian package
systemd, installed by scripts/install-deps.sh): the unit name must equal
``systemd-escape --path --template=vmdisktouch@.service PATH`` and the
instance must unescape (``systemd-escape --unescape --path``) to the
simplified path.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

import pytest

from vmdisktouch.commands import unit_name as unit_name_cmd
from vmdisktouch import unitname
from vmdisktouch.errors import ConfigError


def _systemd_escape() -> str:
    exe = shutil.which("systemd-escape")
    if exe is None:
        pytest.fail("systemd-escape not found: install the Debian package systemd "
                    "(scripts/install-deps.sh does)")
    return exe


def systemd_escape(*args: str | bytes) -> subprocess.CompletedProcess:
    return subprocess.run([_systemd_escape(), *args], capture_output=True, check=False)


# Absolute paths that systemd escapes without complaint.
PATHS = [
    "/var/lib/libvirt/images/vm1.img",
    "/var/lib/libvirt/images/my disk.qcow2",
    "/srv/vm-images/web-01.raw",
    "/srv/--double--dash--/x",
    "/dev/mapper/vg0-lv_vm1",
    "/dev/vg0/vm1",
    "/images/диск.img",
    "/images/日本語/ディスク.raw",
    "/images/emoji-\U0001F600.img",
    "/images/back\\slash.img",
    "/images/\\x2d-not-an-escape.img",
    "/.hidden/disk.img",
    "/images/.hidden.img",
    "/images/..double-dot-prefix.img",
    "/images/trailing.dot.",
    "/images/...",
    "/images/dir/",
    "//images///a//b.img//",
    "/images/./a/./b.img/.",
    "/images/a:b_c.d",
    "/images/100%.img",
    "/images/$HOME.img",
    "/images/semi;colon'quote\"dq.img",
    "/images/tab\there.img",
    "/images/new\nline.img",
    "/images/@at~tilde+plus=eq,comma.img",
    "/images/UPPER.lower.123",
    "/a",
    "/-",
    "/",
    "//",
    "/.",
]


def _simplified(path: str) -> str:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    return "/" + "/".join(parts)


@pytest.mark.parametrize("path", PATHS)
def test_unit_name_equals_systemd_escape(path):
    r = systemd_escape("--path", "--template=vmdisktouch@.service", "--", path)
    assert r.returncode == 0, r.stderr
    assert unitname.unit_name(path) == os.fsdecode(r.stdout.rstrip(b"\n"))


@pytest.mark.parametrize("path", PATHS)
def test_instance_round_trips_through_systemd_unescape(path):
    name = unitname.unit_name(path)
    instance = unitname.instance_of(name)
    assert instance == unitname.escape_path(path)
    r = systemd_escape("--unescape", "--path", "--", instance)
    assert r.returncode == 0, r.stderr
    assert os.fsdecode(r.stdout.rstrip(b"\n")) == _simplified(path)
    assert unitname.unescape_path(instance) == _simplified(path)


def test_non_utf8_file_name():
    raw = b"/images/latin1-\xe9t\xe9.img"
    path = os.fsdecode(raw)     # surrogate-escaped str, as sys.argv would hold it
    r = systemd_escape("--path", "--template=vmdisktouch@.service", "--", raw)
    assert r.returncode == 0, r.stderr
    assert unitname.unit_name(path) == r.stdout.decode().rstrip("\n")
    assert unitname.unit_name(raw) == unitname.unit_name(path)
    assert os.fsencode(unitname.unescape_path(unitname.escape_path(path))) == raw


def test_known_names():
    assert unitname.unit_name("/var/lib/libvirt/images/vm1.img") == \
        "vmdisktouch@var-lib-libvirt-images-vm1.img.service"
    assert unitname.escape_path("/a b/c-d") == "a\\x20b-c\\x2dd"
    assert unitname.escape_path("/") == "-"
    assert unitname.escape_path("/.x") == "\\x2ex"
    assert unitname.escape_path("/x/.y") == "x-.y"   # only the very first dot is escaped


def test_relative_path_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert unitname.unit_name("disk.img") == unitname.unit_name(str(tmp_path / "disk.img"))
    assert unitname.unit_name("./sub/../disk.img") == unitname.unit_name(
        str(tmp_path / "disk.img"))


@pytest.mark.parametrize("path", ["/a/../b", "/..", "/images/x/.."])
def test_dot_dot_in_absolute_path_is_refused_like_systemd(path):
    r = systemd_escape("--path", "--", path)
    assert r.returncode != 0
    with pytest.raises(ConfigError, match=r"'\.\.'.*realpath"):
        unitname.unit_name(path)


def test_empty_path_is_refused():
    with pytest.raises(ConfigError, match="empty path"):
        unitname.unit_name("")


def test_name_length_limit_matches_systemd():
    ok = "/" + "a" * 235        # vmdisktouch@ + 235 + .service = 255 characters
    too_long = "/" + "a" * 236
    r = systemd_escape("--path", "--template=vmdisktouch@.service", "--", ok)
    assert r.returncode == 0 and len(unitname.unit_name(ok)) == 255
    assert unitname.unit_name(ok) == r.stdout.decode().rstrip("\n")
    r = systemd_escape("--path", "--template=vmdisktouch@.service", "--", too_long)
    assert r.returncode != 0
    with pytest.raises(ConfigError, match="at most 255"):
        unitname.unit_name(too_long)


@pytest.mark.parametrize("instance", ["a--b", "-a", "a-", "", "a\\xzz", "a\\", "a-..",
                                      "a\\x2f\\x2fb"])
def test_unescape_refuses_what_systemd_refuses(instance):
    r = systemd_escape("--unescape", "--path", "--", instance)
    assert r.returncode != 0
    with pytest.raises(ConfigError):
        unitname.unescape_path(instance)


@pytest.mark.parametrize("instance", ["-", ".a", "\\x2ea", "a\\x2Fb", "a..-b"])
def test_unescape_agrees_with_systemd(instance):
    r = systemd_escape("--unescape", "--path", "--", instance)
    assert r.returncode == 0, r.stderr
    assert unitname.unescape_path(instance) == r.stdout.decode().rstrip("\n")


def _run_subcommand(argv):
    parser = argparse.ArgumentParser()
    unit_name_cmd.set_argparser(parser)
    return unit_name_cmd.main(parser.parse_args(argv))


def test_subcommand_prints_one_name_per_path(capsys):
    assert _run_subcommand(["/var/lib/libvirt/images/vm1.img", "/srv/my disk.img"]) == 0
    assert capsys.readouterr().out == ("vmdisktouch@var-lib-libvirt-images-vm1.img.service\n"
                                       "vmdisktouch@srv-my\\x20disk.img.service\n")
    assert _run_subcommand(["--instance", "/srv/my disk.img"]) == 0
    assert capsys.readouterr().out == "srv-my\\x20disk.img\n"


def test_cli_unit_name():
    """Through the real CLI (needs `unit-name` registered in cli.COMMANDS)."""
    path = "/var/lib/libvirt/images/odd name-1.img"
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "unit-name", path],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    expected = systemd_escape("--path", "--template=vmdisktouch@.service", "--", path)
    assert r.stdout == expected.stdout.decode()
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "unit-name", "/a/../b"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2                      # errors.EX_USAGE: a path it cannot name
    assert r.stderr.startswith("vmdisktouch: ") and "Traceback" not in r.stderr
