"""The operator's path, in a booted Debian 12 under its own systemd 252: install the
.deb, run the per-disk unit and the host service with the shipped sandbox, watch them
through systemctl, the journal, status and the metrics socket, upgrade, purge.

The tests are steps of one story on one guest, in the order of this file: each starts
from what the previous one left (the package installed, an instance running, ...).
A step that fails leaves the next ones failing too; read the first failure.
"""

from __future__ import annotations

import json
import re
import shlex
import time

import pytest

from tests.vm.conftest import UPGRADE_SUFFIX
from tests.vm.guest import Guest

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

MiB = 1 << 20
IMAGE = "/var/lib/libvirt/images/disk1.raw"
DOMAIN_IMAGE = "/var/lib/libvirt/images/vm1.raw"
BUDGET = 64 * MiB
# The settings an operator writes: a budget this guest (3 GiB) can give.
DEFAULT_TOML = 'max_hold = "64M"\nmin_free = "256M"\n'
# A nested domain under TCG: QEMU only has to open its raw disk with the host cache.
DOMAIN_XML = f"""<domain type='qemu'>
  <name>vm1</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writethrough'/>
      <source file='{DOMAIN_IMAGE}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
"""
WATCHDOG_SEC = 10  # the test's drop-in; the shipped unit says 60
RESTART_SEC = 5    # the shipped unit's RestartSec=


def unit_of(g: Guest) -> str:
    return g.out(f"vmdisktouch unit-name {IMAGE}")


def main_pid(g: Guest, unit: str) -> int:
    return int(g.out(f"systemctl show -p MainPID --value {unit}"))


def prop(g: Guest, unit: str, name: str) -> str:
    return g.out(f"systemctl show -p {name} --value {unit}")


def vmlck(g: Guest, pid: int) -> int:
    text = g.out(f"grep VmLck /proc/{pid}/status")
    return int(text.split()[1]) * 1024


def journal_json(g: Guest, *match: str) -> list[dict]:
    """The journal entries matching ``match`` (journalctl's arguments), as dicts."""
    out = g.journal("-o", "json", *match)
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def make_image(g: Guest, path: str, mib: int) -> None:
    """Random data, written, synced and dropped from the page cache."""
    g.run(f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0])} && "
          f"dd if=/dev/urandom of={path} bs=1M count={mib} status=none conv=fsync && "
          f"dd if={path} iflag=nocache count=0 status=none")


def test_install_enables_and_starts_nothing(guest):
    out = guest.run("cd /mnt/payload && apt-get install -y ./vmdisktouch_*_all.deb 2>&1",
                    timeout=300).out
    assert "Setting up vmdisktouch" in out, out[-2000:]
    for unit in ("vmdisktouch.service", "vmdisktouch-metrics.socket"):
        assert guest.run(f"systemctl is-enabled {unit}", check=False).out.strip() == "disabled"
        assert guest.run(f"systemctl is-active {unit}", check=False).out.strip() == "inactive"
    assert guest.out("systemctl list-units --no-legend --state=active 'vmdisktouch*'") == ""
    assert guest.run("pgrep -f /usr/bin/vmdisktouch", check=False).rc == 1


def test_an_instance_is_active_after_ready_and_status_shows_it(guest):
    make_image(guest, IMAGE, 128)
    guest.run(f"printf %s {shlex.quote(DEFAULT_TOML)} > /etc/vmdisktouch/default.toml")
    unit = unit_of(guest)
    assert unit == "vmdisktouch@var-lib-libvirt-images-disk1.raw.service"
    # Type=notify: `start` returns once the daemon sent READY=1 (after its first scan).
    guest.run(f"systemctl enable --now {unit}", timeout=180)
    assert prop(guest, unit, "ActiveState") == "active"
    assert prop(guest, unit, "Type") == "notify"
    assert prop(guest, unit, "StatusText"), "no STATUS= from the daemon"
    status = guest.out("vmdisktouch status")
    assert IMAGE in status and "LIVE" in status and f"pid {main_pid(guest, unit)}" in status, \
        status


def test_reload_rereads_the_settings_and_the_journal_says_so(guest):
    unit = unit_of(guest)
    pid = main_pid(guest, unit)
    guest.run(f"systemctl reload {unit}")
    guest.wait_for(f"journalctl -u {unit} _PID={pid} -o cat | grep -q 'reloaded settings from "
                   "/etc/vmdisktouch/default.toml'", 30, "the daemon did not log the reload")
    assert main_pid(guest, unit) == pid


def test_a_reader_makes_it_hold_under_the_sandbox(guest):
    unit = unit_of(guest)
    pid = main_pid(guest, unit)
    guest.run("systemd-run --unit=vmdt-reader --collect sh -c 'while :; do dd "
              f"if={IMAGE} of=/dev/null bs=1M count=32 status=none; sleep 0.2; done'")
    try:
        guest.wait_for(f"[ $(awk '/VmLck/ {{print $2}}' /proc/{pid}/status) -gt 0 ]", 90,
                       "the daemon holds nothing while a reader reads the image")
        # Most of the 32 MiB the reader keeps reading (an RLIMIT_MEMLOCK of 8 MiB, the
        # default without LimitMEMLOCK= and CAP_IPC_LOCK, would stop it short), never
        # more than the budget.
        guest.wait_for(f"[ $(awk '/VmLck/ {{print $2}}' /proc/{pid}/status) -ge 24576 ]", 60,
                       "the daemon holds less than 24 MiB of the 32 MiB read")
        assert 24 * MiB <= vmlck(guest, pid) <= BUDGET
    finally:
        guest.run("systemctl stop vmdt-reader", check=False)
    log = guest.journal("-u", unit, f"_PID={pid}", "-o", "cat")
    assert_source_said(log)
    # cachestat(2) works (Linux >= 6.5), or its fallback is said once.
    kernel = guest.out("uname -r")
    said = log.count("scanning with mincore(2) instead")
    assert said == (1 if int(kernel.split(".")[0]) * 100 + int(kernel.split(".")[1]) < 605
                    else 0), log[-3000:]
    # No seccomp kill or audit line for the daemon, and it was never killed by SIGSYS.
    kernel_log = guest.journal("-k", "-o", "cat")
    assert "type=1326" not in kernel_log and "SIGSYS" not in kernel_log
    assert "status=31/SYS" not in guest.journal("-u", unit, "-o", "cat")


def assert_source_said(log: str) -> None:
    """The trace source, or why not in words that name the cause: never the sandbox's
    read-only tracefs, and never a file error standing in for a missing tracepoint."""
    source = re.search(r"access source: (\w+)( \(tracing is not usable: ([^)]*)\))?", log)
    assert source, log[-3000:]
    if source.group(1) != "trace":
        why = source.group(3)
        assert not any(w in why for w in ("read-only", "permission", "cannot read")), \
            source.group(0)


def test_stop_is_quick_and_leaves_no_trace_instance(guest):
    unit = unit_of(guest)
    started = time.monotonic()
    guest.run(f"systemctl stop {unit}")
    took = time.monotonic() - started
    assert took <= 5, f"systemctl stop took {took:.1f} s"
    assert prop(guest, unit, "ActiveState") == "inactive"
    assert guest.out("ls /sys/kernel/tracing/instances | grep '^vmdisktouch@' || true") == ""


def test_the_watchdog_kills_a_stopped_daemon_and_systemd_restarts_it_warm(guest):
    unit = unit_of(guest)
    dropin = f"/etc/systemd/system/{unit}.d"
    guest.run(f"mkdir -p {dropin} && printf '[Service]\\nWatchdogSec={WATCHDOG_SEC}s\\n' "
              f"> {dropin}/watchdog.conf && systemctl daemon-reload")
    try:
        guest.run(f"systemctl start {unit}", timeout=180)
        pid = main_pid(guest, unit)
        guest.run(f"sleep {WATCHDOG_SEC}")   # pinging at WATCHDOG_USEC/2 keeps it alive
        assert main_pid(guest, unit) == pid and prop(guest, unit, "NRestarts") == "0"
        guest.run(f"kill -STOP {pid}")
        stopped = time.monotonic()
        guest.wait_for(f"p=$(systemctl show -p MainPID --value {unit}); [ $p != 0 ] && "
                       f"[ $p != {pid} ] && systemctl is-active -q {unit}",
                       WATCHDOG_SEC + RESTART_SEC + 40, "no restart after the watchdog")
        took = time.monotonic() - stopped
        # Killed at WatchdogSec, started RestartSec later, READY after its first scan.
        assert took <= WATCHDOG_SEC + RESTART_SEC + 25, took
        log = guest.journal("-u", unit, "-o", "cat")
        assert "Failed with result 'watchdog'" in log, log[-2000:]
        new = main_pid(guest, unit)
        restarted = guest.journal("-u", unit, f"_PID={new}", "-o", "cat")
        assert "restored the heat saved" in restarted, restarted[-2000:]
    finally:
        guest.run(f"rm -rf {dropin} && systemctl daemon-reload")


def test_each_unit_s_exposure_is_at_most_2(guest):
    for unit in ("vmdisktouch.service", "vmdisktouch@x.service"):
        out = guest.out(f"systemd-analyze security --no-pager {unit}")
        level = re.search(r"Overall exposure level for \S+: ([\d.]+)", out)
        assert level, out[-1000:]
        assert float(level.group(1)) <= 2.0, out


def test_the_host_service_serves_a_libvirt_domain(guest):
    make_image(guest, DOMAIN_IMAGE, 64)
    guest.run(f"dd if={DOMAIN_IMAGE} of=/dev/null bs=1M count=32 status=none")  # hot
    guest.run(f"cat > /root/vm1.xml <<'EOF'\n{DOMAIN_XML}EOF\n"
              "virsh -q create /root/vm1.xml", timeout=120)
    # The operator's edit of the shipped settings: a budget this guest can give.
    guest.run("sed -i 's/^max_hold = .*/max_hold = \"64M\"/; s/^min_free = .*/min_free = "
              "\"256M\"/' /etc/vmdisktouch/host.toml")
    guest.run("systemctl enable --now vmdisktouch.service", timeout=180)
    guest.wait_for("vmdisktouch status | grep -q 'vm1/vda.*held [1-9]'", 90,
                   "the host service does not hold vm1/vda")
    assert_source_said(guest.journal("-u", "vmdisktouch.service", "-o", "cat"))
    discover = json.loads(guest.out("vmdisktouch discover --json"))
    disks = discover["disks"] if isinstance(discover, dict) else discover
    vda = [d for d in disks if d.get("domain") == "vm1" and d.get("target") == "vda"]
    assert vda and vda[0]["eligible"], discover
    # The host PNG of the shipped unit.
    assert guest.out("head -c 8 /run/vmdisktouch/host.png | od -An -c | tr -d ' '") \
        .startswith("211PNG")


def test_the_metrics_socket_serves_the_daemon_in_its_own_network(guest):
    guest.run("systemctl stop vmdisktouch.service && systemctl start "
              "vmdisktouch-metrics.socket")
    # The first connection starts the daemon: 503 until its first cycle, then samples.
    guest.wait_for("curl -sf 127.0.0.1:9479/metrics > /tmp/m.txt", 120,
                   "no 200 from the metrics socket")
    metrics = guest.out("cat /tmp/m.txt")
    assert re.search(r'^vmdisktouch_build_info\{.*\} 1', metrics, re.M), metrics[:2000]
    assert re.search(r'^vmdisktouch_held_bytes\{.*domain="vm1".*\} \d', metrics, re.M), \
        metrics[:3000]
    pid = main_pid(guest, "vmdisktouch.service")
    assert guest.out(f"readlink /proc/{pid}/ns/net") != guest.out("readlink /proc/1/ns/net")


def test_the_journal_selects_a_disk_s_and_a_domain_s_lines_with_priorities(guest):
    domain = journal_json(guest, "-u", "vmdisktouch.service", "DOMAIN=vm1")
    assert domain and all(e.get("DOMAIN") == "vm1" for e in domain)
    assert any(e.get("TARGET") == "vda" and e.get("PRIORITY") == "6"
               and "cycle " in e["MESSAGE"] for e in domain), domain[-3:]
    disk = journal_json(guest, "-u", unit_of(guest), f"DISK={IMAGE}")
    assert disk and all(e.get("DISK") == IMAGE for e in disk)
    # A warning is priority 4: the access source that is not the trace one says why.
    warnings = [e for e in journal_json(guest, "-u", unit_of(guest), "-p", "warning")
                if "access source" in e["MESSAGE"]]
    infos = [e for e in disk if e["MESSAGE"].startswith("cycle ")]
    assert infos and all(e["PRIORITY"] == "6" for e in infos)
    assert all(e["PRIORITY"] == "4" for e in warnings)


def test_a_destroyed_domain_is_followed(guest):
    guest.run("virsh -q destroy vm1")
    guest.wait_for("journalctl -u vmdisktouch.service -o cat | grep -q "
                   f"'{DOMAIN_IMAGE}: no running domain uses it any more'", 60,
                   "the host service did not follow the destroy")
    guest.wait_for("vmdisktouch status | grep -q '0 disks served'", 30,
                   "status still shows the domain's disk")


def test_an_upgrade_restarts_what_runs_and_keeps_the_operator_s_settings(guest):
    unit = unit_of(guest)
    guest.run(f"systemctl start {unit}", timeout=180)
    before = {u: main_pid(guest, u) for u in (unit, "vmdisktouch.service")}
    assert all(before.values()), before
    out = guest.run("cd /mnt/payload && apt-get install -y "
                    f"./vmdisktouch_*{UPGRADE_SUFFIX}_all.deb 2>&1", timeout=300).out
    assert "Unpacking vmdisktouch" in out, out[-2000:]
    assert guest.out("dpkg-query -W -f '${Version}' vmdisktouch").endswith(UPGRADE_SUFFIX)
    for u, pid in before.items():
        guest.wait_for(f"systemctl is-active -q {u}", 120, f"{u} is not active after the upgrade")
        assert main_pid(guest, u) not in (0, pid), f"{u} was not restarted"
    assert 'max_hold = "64M"' in guest.out("cat /etc/vmdisktouch/host.toml")


def test_purge_stops_everything_and_leaves_nothing(guest):
    guest.run("apt-get purge -y vmdisktouch 2>&1", timeout=300)
    assert guest.run("pgrep -f /usr/bin/vmdisktouch", check=False).rc == 1
    # No unit file and no enablement link (the operator's instance's included).
    left = guest.out("find /etc/systemd /lib/systemd /usr/lib/systemd -name '*vmdisktouch*' "
                     "2>/dev/null || true")
    assert left == "", left
    for d in ("/var/lib/vmdisktouch", "/run/vmdisktouch"):
        assert guest.run(f"test -e {d}", check=False).rc == 1, f"{d} is left"
    assert guest.out("systemctl list-units --all --no-legend 'vmdisktouch*'") == ""
