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
import signal
import subprocess
import sys
import time

import pytest

from tests.support.sandbox_exec import parse_unit
from vmdisktouch import errors
from vmdisktouch.commands import cli
from vmdisktouch.config import file as configfile
from vmdisktouch.config import settings
from vmdisktouch.unitname import escape_path, unit_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "vmdisktouch@.service"
SHIPPED_EXE = "/usr/local/bin/vmdisktouch"
DISK = "/var/lib/libvirt/images/vm1.img"


def systemd_analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.fail("systemd-analyze not found: install the Debian package systemd "
                    "(scripts/install-deps.sh does)")
    return exe


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
    """``systemd-analyze verify``, with the man page installed where ``man`` looks
    (MANPATH): verify checks that ``Documentation=man:vmdisktouch(1)`` resolves."""
    man1 = unit.parent / "man" / "man1"
    man1.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "docs" / "vmdisktouch.1", man1 / "vmdisktouch.1")
    env = dict(os.environ, MANPATH=str(unit.parent / "man"))
    return subprocess.run([systemd_analyze(), "verify", str(unit)], capture_output=True,
                          text=True, cwd=unit.parent, check=False, env=env)


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


# docs/unit.md: 1.8 before the device ACL, MDWE and @privileged/@resources; 1.7 after them;
# 2.0 since the read counter (issue 42) takes bpf(2) and perf_event_open(2) back and adds
# CAP_BPF and CAP_PERFMON.
MAX_EXPOSURE = 2.0


def exposure(unit: pathlib.Path) -> tuple[float, str]:
    """`systemd-analyze security --offline=true` of an installed copy: (score, table)."""
    r = subprocess.run([systemd_analyze(), "security", "--offline=true", "--no-pager", str(unit)],
                       capture_output=True, text=True, check=False)
    out = r.stdout + r.stderr
    if "unrecognized option" in out and "offline" in out:
        pytest.fail("systemd-analyze security --offline needs systemd >= 250 (Debian 12 has 252)")
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert m, out
    return float(m.group(1)), out


def test_security_exposure_stays_low(tmp_path):
    score, out = exposure(install_copy(tmp_path, DISK))
    assert score <= MAX_EXPOSURE, out
    # the hardening counts as done in systemd's own assessment
    for line in ("SystemCallFilter=~@resources", "MemoryDenyWriteExecute="):
        row = next(r for r in out.splitlines() if line in r)
        assert row.lstrip().startswith("\u2713"), row
    # what the read counter takes back, and only that (test_sandbox: the rest stays denied)
    for line, call in (("SystemCallFilter=~@privileged", "bpf"),
                       ("SystemCallFilter=~@debug", "perf_event_open")):
        row = next(r for r in out.splitlines() if line in r)
        assert f"(e.g. {call} is allowed)" in row, row
    row = next(r for r in out.splitlines() if "DeviceAllow=" in r)
    assert "block-*:r" in row and "no device ACL" not in row, row


def test_security_exposure_would_catch_a_regression(tmp_path):
    """Without this issue's settings the score is higher: the measurement means something."""
    shipped, _ = exposure(install_copy(tmp_path, DISK))
    (tmp_path / "old").mkdir()
    unit = install_copy(tmp_path / "old", DISK)
    text = unit.read_text()
    for line in ("DevicePolicy=closed\n", "DeviceAllow=block-* r\n", "MemoryDenyWriteExecute=yes\n"):
        assert line in text
        text = text.replace(line, "")
    unit.write_text(text.replace(" @privileged", "").replace(" @resources", ""))
    score, out = exposure(unit)
    assert score > shipped, out


def test_notify_watchdog_restart():
    assert one("Type") == "notify"
    assert one("NotifyAccess") == "main"
    assert one("WatchdogSec") == "60"
    assert one("Restart") == "on-failure"
    assert one("RestartSec") == "5"
    assert one("RestartPreventExitStatus") == "2 66 78"
    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    # the rate limit lives in [Unit]; 5 starts per 10 minutes
    assert one("StartLimitIntervalSec", U["Unit"]) == "10min"
    assert one("StartLimitBurst", U["Unit"]) == "5"
    assert "StartLimitIntervalSec" not in SERVICE
    assert U["Install"]["WantedBy"] == ["multi-user.target"]


def test_hardening():
    assert set(one("CapabilityBoundingSet").split()) == {
        "CAP_IPC_LOCK", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_SYS_ADMIN", "CAP_BPF",
        "CAP_PERFMON"}
    assert "AmbientCapabilities" not in SERVICE and "User" not in SERVICE
    expected = {"LimitMEMLOCK": "infinity", "ProtectSystem": "strict", "ProtectHome": "yes",
                "PrivateTmp": "yes", "NoNewPrivileges": "yes",
                "RuntimeDirectory": "vmdisktouch", "RuntimeDirectoryPreserve": "yes",
                "StateDirectory": "vmdisktouch", "StateDirectoryMode": "0700",
                "PrivateNetwork": "yes", "RestrictAddressFamilies": "AF_UNIX",
                "ProtectKernelTunables": "yes", "ProtectControlGroups": "yes"}
    for key, value in expected.items():
        assert one(key) == value, key
    assert "PrivateDevices" not in SERVICE      # LVM volumes are block devices
    # node_exporter's textfile directory on Debian, for metrics_file (docs/metrics.md);
    # '-': no error where it does not exist
    assert "-/var/lib/prometheus/node-exporter" in SERVICE["ReadWritePaths"]
    # ... but only read: every block device, and no device writable
    assert one("DevicePolicy") == "closed"
    assert SERVICE["DeviceAllow"] == ["block-* r"]
    assert one("MemoryDenyWriteExecute") == "yes"
    assert one("SystemCallArchitectures") == "native"
    assert one("SystemCallErrorNumber") == "EPERM"
    denied, allowed = SERVICE["SystemCallFilter"]
    assert denied.startswith("~")
    assert {"@privileged", "@resources", "@debug", "@mount", "@module", "@raw-io",
            "@clock", "@reboot", "@swap", "@obsolete", "@cpu-emulation"} <= set(denied[1:].split())
    assert allowed.split() == ["bpf", "perf_event_open"]      # the read counter's, back


# ---------------------------------------------------------------------------
# Exit statuses and the restart policy


def prevented() -> set[int]:
    return {int(s) for s in one("RestartPreventExitStatus").split()}


def test_restart_policy_matches_the_exit_codes():
    """systemd restarts on 1, 70 and 75 (on-failure), not on 2, 66 and 78."""
    assert one("Restart") == "on-failure"
    assert prevented() == {errors.EX_USAGE, errors.EX_NOINPUT, errors.EX_CONFIG} == {2, 66, 78}
    for code in (errors.EX_ERROR, errors.EX_SOFTWARE, errors.EX_TEMPFAIL):
        assert code not in prevented()
    # the unit's comment says what happens with each status
    for code in (0, 1, 2, 66, 70, 75, 78):
        assert re.search(rf"^#\s+{code}\s+\S", UNIT_TEXT, re.M), code


def run_cli(*argv, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "run", *argv],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("argv, code", [
    (["--bogus-option"], 2),                                        # usage
    (["{missing}", "--max-hold", "1M", "--uri", ""], 66),           # no image
    (["{image}", "--uri", ""], 78),                                 # max_hold unset
    (["{image}", "--max-hold", "lots", "--uri", ""], 78),           # bad setting
    (["{image}", "--max-hold", "1M", "--uri", "", "--status", "{tmp}/no/dir/s.json"], 78),
])
def test_what_a_restart_cannot_fix_is_not_restarted(tmp_path, argv, code):
    image = tmp_path / "disk.img"
    image.write_bytes(b"\0" * (1 << 20))
    argv = [a.format(missing=tmp_path / "missing.img", image=image, tmp=tmp_path) for a in argv]
    r = run_cli(*argv)
    assert r.returncode == code, r.stderr
    assert code in prevented()


@pytest.mark.timeout(120)
def test_a_deleted_image_is_restarted_once_then_stays_failed(tmp_path):
    """75 when the served image is deleted: systemd restarts; the restart exits 66: it stops."""
    image = tmp_path / "disk.img"
    image.write_bytes(os.urandom(4 << 20))
    argv = [str(image), "--max-hold", "1M", "--min-free", "0", "--interval", "0.2", "--uri", "",
            "--status", str(tmp_path / "s.json")]
    proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "run", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "s.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.1)
        image.unlink()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    assert proc.returncode == errors.EX_TEMPFAIL, out
    assert errors.EX_TEMPFAIL not in prevented()              # so systemd restarts it ...
    r = run_cli(*argv)
    assert r.returncode == errors.EX_NOINPUT, r.stderr        # ... and the restart fails for good
    assert errors.EX_NOINPUT in prevented()


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
                    "--heat-png": "/run/vmdisktouch/%i.heat.png",
                    "--state-dir": "/var/lib/vmdisktouch"}
    assert set(opts) == {settings.BY_KEY[k].flag for k in configfile.UNIT_CLI_KEYS}


def test_exec_start_parses_with_the_real_cli():
    """After specifier expansion the command line is one `vmdisktouch run` accepts."""
    disk = "/srv/vm images/odd-name.img"
    instance = escape_path(disk)
    # systemd splits the line into words first, then expands %f/%i in each word
    argv = [w.replace("%f", disk).replace("%i", instance)
            for w in shlex.split(one("ExecStart")[1:])]
    args = cli.build_parser().parse_args(argv[1:])
    assert args.command == "run" and args.paths == [disk]
    assert args.status == f"/run/vmdisktouch/{instance}.json"
    assert args.map_png == f"/run/vmdisktouch/{instance}.map.png"
    assert args.heat_png == f"/run/vmdisktouch/{instance}.heat.png"
    assert args.state_dir == "/var/lib/vmdisktouch"


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
