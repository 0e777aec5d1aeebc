"""systemd/vmdisktouch@.service: `systemd-analyze verify` passes, and the key directives.

`systemd-analyze verify` loads the unit offline (no running systemd needed).
It exits 0 even for unknown keys or unparsable values, which it only prints
as warnings, so a clean unit is one with exit status 0 *and* no output. It
does fail (exit 1) when the ExecStart binary is missing, so the tests copy
the unit under a real instance name and point ExecStart at a stub
executable; the shipped path, /usr/local/bin/vmdisktouch, is checked
separately.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess

import pytest

from vmdisktouch import cli, configfile, settings
from vmdisktouch.unitname import escape_path, unit_name

ROOT = pathlib.Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "vmdisktouch@.service"
SHIPPED_EXE = "/usr/local/bin/vmdisktouch"
DISK = "/var/lib/libvirt/images/vm1.img"


def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze not found: install the Debian package systemd "
                    "(scripts/install-deps.sh does)")
    return exe


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (a key may repeat); comments and blank lines dropped."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert section is not None, line
        section.setdefault(key.strip(), []).append(value.strip())
    return out


UNIT_TEXT = UNIT.read_text()
U = parse_unit(UNIT_TEXT)
SERVICE = U["Service"]


def one(key: str, section: dict = SERVICE) -> str:
    values = section[key]
    assert len(values) == 1, (key, values)
    return values[0]


def install_copy(tmp_path, disk: str, exe_name="vmdisktouch", make_exe=True) -> pathlib.Path:
    """The unit as <tmp>/vmdisktouch@<instance>.service, ExecStart pointing at a stub."""
    exe = tmp_path / exe_name
    if make_exe:
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
    unit = tmp_path / unit_name(disk)
    unit.write_text(UNIT_TEXT.replace(SHIPPED_EXE, str(exe)))
    return unit


def verify(unit: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True,
                          text=True, cwd=unit.parent, check=False)


@pytest.mark.parametrize("disk", [DISK, "/srv/vm images/web-01 (copy).qcow2",
                                  "/dev/mapper/vg0-vm1"])
def test_systemd_analyze_verify_passes(tmp_path, disk):
    r = verify(install_copy(tmp_path, disk))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and r.stderr == "", r.stdout + r.stderr


def test_verify_would_catch_mistakes(tmp_path):
    """The checks above mean something: verify reports a typo and a missing binary."""
    unit = install_copy(tmp_path, DISK)
    unit.write_text(unit.read_text().replace("WatchdogSec=60", "WatchdogSec=sixty"))
    r = verify(unit)
    assert "WatchdogSec" in r.stderr or "sixty" in r.stderr, r.stderr
    unit = install_copy(tmp_path, DISK, exe_name="missing", make_exe=False)
    r = verify(unit)
    assert r.returncode != 0 and "not executable" in r.stderr


def test_security_exposure_stays_low(tmp_path):
    r = subprocess.run([systemd_analyze(), "security", "--offline=yes", "--no-pager",
                        str(install_copy(tmp_path, DISK))],
                       capture_output=True, text=True, check=False)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 2.5, r.stdout


def test_notify_watchdog_restart():
    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("WatchdogSec") == "60"
    assert one("Restart") == "on-failure"
    assert one("RestartSec") == "5"
    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    # the rate limit lives in [Unit]; 5 starts per 10 minutes
    assert one("StartLimitIntervalSec", U["Unit"]) == "10min"
    assert one("StartLimitBurst", U["Unit"]) == "5"
    assert "StartLimitIntervalSec" not in SERVICE
    assert U["Install"]["WantedBy"] == ["multi-user.target"]


def test_hardening():
    assert set(one("CapabilityBoundingSet").split()) == {
        "CAP_IPC_LOCK", "CAP_DAC_READ_SEARCH", "CAP_FOWNER"}
    assert "AmbientCapabilities" not in SERVICE and "User" not in SERVICE
    expected = {"LimitMEMLOCK": "infinity", "ProtectSystem": "strict", "ProtectHome": "yes",
                "PrivateTmp": "yes", "NoNewPrivileges": "yes",
                "RuntimeDirectory": "vmdisktouch", "RuntimeDirectoryPreserve": "yes",
                "PrivateNetwork": "yes", "RestrictAddressFamilies": "AF_UNIX",
                "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes"}
    for key, value in expected.items():
        assert one(key) == value, key
    assert "PrivateDevices" not in SERVICE      # LVM volumes are block devices


def test_exec_start_runs_the_daemon_on_the_instance_path():
    exec_start = one("ExecStart")
    assert exec_start.startswith(":" + SHIPPED_EXE + " run %f ")
    assert one("Environment") == f"{configfile.INSTANCE_ENV}=%i"
    assert one("RequiresMountsFor", U["Unit"]) == "%f"
    # outputs, one set per instance, in the runtime directory
    argv = shlex.split(exec_start[1:])
    opts = dict(zip(argv[3::2], argv[4::2]))
    assert opts == {"--status": "/run/vmdisktouch/%i.json",
                    "--map-png": "/run/vmdisktouch/%i.map.png",
                    "--heat-png": "/run/vmdisktouch/%i.heat.png"}
    assert set(opts) == {settings.BY_KEY[k].flag for k in configfile.UNIT_CLI_KEYS}


def test_exec_start_parses_with_the_real_cli():
    """After specifier expansion the command line is one `vmdisktouch run` accepts."""
    disk = "/srv/vm images/odd-name.img"
    instance = escape_path(disk)
    # systemd splits the line into words first, then expands %f/%i in each word
    argv = [w.replace("%f", disk).replace("%i", instance)
            for w in shlex.split(one("ExecStart")[1:])]
    args = cli.build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.path == disk
    assert args.status == f"/run/vmdisktouch/{instance}.json"
    assert args.map_png == f"/run/vmdisktouch/{instance}.map.png"
    assert args.heat_png == f"/run/vmdisktouch/{instance}.heat.png"


def test_shipped_unit_points_at_the_documented_binary():
    assert SHIPPED_EXE in UNIT_TEXT
    assert "pip install" in UNIT_TEXT and "ln -s" in UNIT_TEXT   # how it gets there
    assert os.path.basename(UNIT) == "vmdisktouch@.service"


# ---------------------------------------------------------------------------
# The deployment examples next to the unit


EXAMPLES = ROOT / "examples"


def test_domain_disk_example_is_valid_libvirt_xml(tmp_path):
    import xml.etree.ElementTree as ET

    text = (EXAMPLES / "domain-disk.xml").read_text()
    disk = ET.fromstring(text)
    assert disk.tag == "disk"
    driver = disk.find("driver")
    assert driver.get("cache") == "writethrough" and driver.get("io") == "threads"
    exe = shutil.which("virt-xml-validate")
    if exe is None:
        pytest.fail("virt-xml-validate not found: install the Debian package libvirt-clients")
    body = re.sub(r"<\?xml[^>]*\?>", "", text)
    domain = tmp_path / "domain.xml"
    domain.write_text("<domain type='kvm'><name>example</name><memory unit='MiB'>64</memory>"
                      "<os><type arch='x86_64'>hvm</type></os><devices>"
                      f"{body}</devices></domain>\n")
    r = subprocess.run([exe, str(domain), "domain"], capture_output=True, text=True,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_deploy_walkthrough_uses_real_names():
    text = (EXAMPLES / "DEPLOY.md").read_text()
    for path in ("/var/lib/libvirt/images/vm1.img",):
        assert unit_name(path) in text
    assert "# " + escape_path("/var/lib/libvirt/images/db.img") in text
    assert "systemd/vmdisktouch@.service" in text and SHIPPED_EXE in text
    for key in ("budget_bytes", "held_bytes", "min_free_bytes"):
        assert key in text
