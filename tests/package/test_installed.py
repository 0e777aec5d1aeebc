"""The .deb installed with apt into a clean Debian 12 root, as an operator installs it,
run there, then purged: nothing may be left.

The root is made by mmdebstrap from the machine's apt sources (conftest.base_root).
The package's Depends and Recommends are installed first (``apt-get satisfy``, from
Debian's archive), and the root's file list is taken; then ``apt-get install -y
./vmdisktouch_*.deb`` must install that package alone, and after ``apt-get purge`` the
file list must be the same again. The tests in between run the installed commands.
The last test purges: keep it last in this file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time

import pytest

from tests.package import debroot
from tests.support.pagecache import held

pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

MiB = 1 << 20
STATE_DIR = "/var/lib/vmdisktouch"
RUNTIME_DIR = "/run/vmdisktouch"
# A stand-in for systemctl on a booted host (the root has no running systemd): it
# records every call; what works on files (is-enabled, preset, enable, ...) the real
# systemctl does in the root; no unit is running; any other call (daemon-reload,
# start, ...) succeeds and does nothing. The maintainer scripts reach it through PATH:
# apt runs dpkg with PATH=/usr/sbin:/usr/bin:/sbin:/bin (DPkg::Path), and Debian's is
# /usr/bin/systemctl.
SYSTEMCTL_SHIM = """#!/bin/sh
echo "$*" >> /tmp/systemctl.calls
case " $* " in
  *" is-active "*) exit 3 ;;
  *" is-enabled "*|*" preset "*|*" enable "*|*" disable "*|*" reenable "*|*" mask "*|*" unmask "*)
    exec /usr/bin/systemctl "$@" ;;
esac
exit 0
"""
# Writes a file of random data, fsyncs it and drops it from the page cache; then reads
# it whole again when asked (argv: path, MiB, "hot" or "cold").
MAKE_IMAGE = """
import os, sys
path, mib, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(fd, os.urandom(mib << 20))
os.fsync(fd)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
if kind == "hot":
    os.lseek(fd, 0, os.SEEK_SET)
    while os.read(fd, 1 << 20):
        pass
os.close(fd)
"""
# Debian's prometheus_client reads the text format back: {metric name: value} of the
# samples, from stdin.
PARSE_METRICS = """
import json, sys
from prometheus_client.parser import text_string_to_metric_families
print(json.dumps({s.name: s.value for f in text_string_to_metric_families(sys.stdin.read())
                  for s in f.samples}))
"""


@dataclasses.dataclass
class Installed:
    """The root with the package installed, and what the installation showed."""

    root: debroot.Root
    deb_name: str
    before: dict[str, str]   # the root's files with the dependencies, before the package
    apt_output: str
    systemctl_calls: list[tuple[str, list[str]]]   # (install/upgrade, the call's words)


def _with_systemctl_shim(root: debroot.Root, steps):
    """Run ``steps`` [(label, argv)] in the root as on a booted host (/run/systemd/system,
    the shim for systemctl); return their outputs and their systemctl calls [(label,
    the call's words)]; leave no trace."""
    shim = root.host("/usr/sbin/systemctl")
    calls_file = root.host("/tmp/systemctl.calls")
    made = root.host("/run/systemd")
    assert not made.exists(), "the clean root already has /run/systemd"
    assert not shim.exists() and root.host("/usr/bin/systemctl").exists()
    shim.write_text(SYSTEMCTL_SHIM)
    shim.chmod(0o755)
    root.host("/run/systemd/system").mkdir(parents=True)
    outputs, calls = [], []
    try:
        for label, argv in steps:
            calls_file.write_text("")
            outputs.append(root.run(*argv, timeout=600).stdout)
            calls += [(label, line.split()) for line in calls_file.read_text().splitlines()]
    finally:
        shim.unlink()
        calls_file.unlink(missing_ok=True)
        shutil.rmtree(made)
    return outputs, calls


@pytest.fixture(scope="module")
def installed(base_root, deb):
    """A copy of the clean root with the package installed by apt, once for the module:
    installing takes a minute, and the tests only read the root (the last one purges)."""
    top = debroot.scratch_dir("vmdt-inst-")
    try:
        debroot.copy_tree(base_root, top / "root")
        root = debroot.Root(top / "root")
        shutil.copy(deb, root.host("/tmp"))
        needs = f"{debroot.deb_field(deb, 'Depends')}, {debroot.deb_field(deb, 'Recommends')}"
        root.run("apt-get", "satisfy", "-y", "-o", "APT::Keep-Downloaded-Packages=false",
                 needs, timeout=900)
        before = root.files()
        outputs, calls = _with_systemctl_shim(root, [
            ("install", ["apt-get", "install", "-y", f"/tmp/{deb.name}"]),
            # the same version again: dpkg runs the scripts as for an upgrade
            ("upgrade", ["dpkg", "-i", f"/tmp/{deb.name}"]),
        ])
        yield Installed(root, deb.name, before, outputs[0], calls)
    finally:
        debroot.remove_tree(top)


def test_apt_installs_the_package_alone_its_dependencies_from_debian(installed, deb):
    root = installed.root
    # its dependencies were all there: apt installs this package and nothing else
    assert "0 upgraded, 1 newly installed, 0 to remove" in installed.apt_output, \
        installed.apt_output
    status = root.run("dpkg-query", "-W", "-f", "${db:Status-Abbrev}${Version}",
                      "vmdisktouch").stdout
    assert status.split() == ["ii", debroot.deb_field(deb, "Version")]
    # every Recommends is installed, as apt installs them by default
    for name in ("python3-libvirt", "python3-prometheus-client", "python3-systemd"):
        out = root.run("dpkg-query", "-W", "-f", "${db:Status-Abbrev}", name).stdout
        assert out.split() == ["ii"], name


def test_version(installed, deb):
    out = installed.root.run("vmdisktouch", "--version")
    assert out.stdout.strip() == f"vmdisktouch {debroot.deb_field(deb, 'Version')}"
    # the console script runs Debian's Python, not a venv's
    assert installed.root.host("/usr/bin/vmdisktouch").read_text().startswith(
        "#!/usr/bin/python3\n")


def test_snapshot_sees_a_read_file_resident_and_an_evicted_one_not(installed):
    root = installed.root
    root.run("python3", "-c", MAKE_IMAGE, "/tmp/snap-hot.img", "8", "hot")
    root.run("python3", "-c", MAKE_IMAGE, "/tmp/snap-cold.img", "8", "cold")
    # the hot file held (mlock, from here: the root's /tmp is a plain directory) while it
    # is scanned: reclaim once took 3 of its idle pages between the read and the scan
    with held(root.host("/tmp/snap-hot.img"), [(0, 8 * MiB)]):
        out = root.run("vmdisktouch", "snapshot", "--json", "/tmp/snap-hot.img",
                       "/tmp/snap-cold.img")
    hot, cold = json.loads(out.stdout)
    assert hot["total_pages"] == cold["total_pages"] == 8 * MiB // hot["page_size"]
    assert hot["resident_pages"] == hot["total_pages"], hot
    assert cold["resident_pages"] <= cold["total_pages"] // 20, cold


def test_config_check_accepts_the_shipped_host_toml(installed):
    out = installed.root.run("vmdisktouch", "config", "--check", "/etc/vmdisktouch/host.toml")
    assert out.stdout.strip() == "/etc/vmdisktouch/host.toml: ok", out.stdout + out.stderr
    conffiles = installed.root.run("dpkg-query", "-W", "-f", "${Conffiles}",
                                   "vmdisktouch").stdout
    assert conffiles.split()[0] == "/etc/vmdisktouch/host.toml"


def _units(installed) -> list[str]:
    return sorted(p.name for p in installed.root.host("/lib/systemd/system").iterdir()
                  if p.name.startswith("vmdisktouch"))


def test_systemd_analyze_verify_passes_on_every_installed_unit(installed):
    root = installed.root
    units = _units(installed)
    assert {"vmdisktouch.service", "vmdisktouch@.service"} <= set(units)
    # a template is verified through an instance; its name from the command itself
    instance = root.run("vmdisktouch", "unit-name",
                        "/var/lib/libvirt/images/vm1.img").stdout.strip()
    assert instance == "vmdisktouch@var-lib-libvirt-images-vm1.img.service"
    args = [instance if u.endswith("@.service") else f"/lib/systemd/system/{u}" for u in units]
    for arg in args:
        out = root.run("systemd-analyze", "verify", arg, check=False)
        # a warning (an unknown key, a missing man page) exits 0 too: none is allowed
        assert out.returncode == 0 and not out.stdout and not out.stderr, (
            f"systemd-analyze verify {arg}: {out.returncode}\n{out.stdout}{out.stderr}")


def test_the_units_run_usr_bin_vmdisktouch(installed):
    for unit in _units(installed):
        text = installed.root.host(f"/lib/systemd/system/{unit}").read_text()
        execs = [line for line in text.splitlines() if re.match(r"Exec\w*=", line)]
        assert not [line for line in execs if "/usr/local/bin" in line], unit
        if unit.endswith(".service"):
            start = [line for line in execs if line.startswith("ExecStart=")]
            assert len(start) == 1 and start[0].startswith(
                "ExecStart=:/usr/bin/vmdisktouch run "), start


def test_no_unit_is_enabled(installed):
    root = installed.root
    etc = root.host("/etc/systemd/system")
    links = [str(p.relative_to(etc)) for p in etc.rglob("*")
             if "vmdisktouch" in p.name or (p.is_symlink() and "vmdisktouch" in os.readlink(p))]
    assert not links, links
    for unit in _units(installed):
        out = root.run("systemctl", "is-enabled", unit, check=False)
        assert out.stdout.strip() == "disabled", (unit, out.stdout, out.stderr)


def _verbs(calls, label):
    return [(words, next(w for w in words if not w.startswith("-"))) for lab, words in calls
            if lab == label]


def test_neither_install_nor_upgrade_starts_or_enables_a_unit(installed):
    install = _verbs(installed.systemctl_calls, "install")
    upgrade = _verbs(installed.systemctl_calls, "upgrade")
    # the scripts did ask (so the check below saw the real decision) ...
    asked = {words[-1] for words, verb in install if verb == "is-enabled"}
    assert "vmdisktouch.service" in asked, installed.systemctl_calls
    # ... and, the units being disabled and not running, started and enabled nothing
    acting = {"start", "restart", "enable", "preset", "reenable", "reload-or-restart",
              "try-restart"}
    assert not [w for w, verb in install if verb in acting], install
    # an upgrade restarts the running per-disk daemons (none here), nothing else
    assert [w for w, verb in upgrade if verb in acting] == [
        ["try-restart", "vmdisktouch@*.service"]], upgrade


def test_the_man_page_is_found(installed):
    root = installed.root
    assert root.run("man", "-w", "vmdisktouch").stdout.strip() == \
        "/usr/share/man/man1/vmdisktouch.1.gz"
    page = root.run("man", "-P", "cat", "vmdisktouch", env={"MANWIDTH": "80"}).stdout
    assert "vmdisktouch snapshot" in page


DOC = "/usr/share/doc/vmdisktouch"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")       # [text](target#anchor)


def test_the_installed_docs_links_resolve_there(installed):
    """README.md and docs/ are shipped uncompressed, side by side as in the repository,
    so every link from one document to another (or to a picture, an example, the man page
    or the completion) that a reader follows in /usr/share/doc names a file that is there
    (dh_compress would have renamed each page to .md.gz, and the man page is only in
    man1, as .1.gz)."""
    doc = installed.root.host(DOC)
    pages = [doc / "README.md", *sorted((doc / "docs").glob("*.md")),
             doc / "examples" / "DEPLOY.md"]
    checked, broken = 0, []
    for page in pages:
        assert page.is_file(), page
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if "://" in target or target.endswith(".py"):
                continue            # the source files linked are in the repository only
            checked += 1
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(doc)} -> {target}")
    assert checked > 20 and not broken, broken


def test_bash_completion_loads_it_for_the_command(installed):
    # bash-completion finds the file by the command's name and completes subcommands
    script = ("source /usr/share/bash-completion/bash_completion; "
              "__load_completion vmdisktouch || exit 9; "
              "COMP_WORDS=(vmdisktouch sn); COMP_CWORD=1; COMP_LINE='vmdisktouch sn'; "
              "COMP_POINT=${#COMP_LINE}; "
              "fn=$(complete -p vmdisktouch | sed -E 's/.* -F ([^ ]+) .*/\\1/'); "
              "$fn vmdisktouch sn vmdisktouch; printf '%s\\n' \"${COMPREPLY[@]}\"")
    out = installed.root.run("bash", "-c", script)
    assert out.stdout.split() == ["snapshot"], out.stdout


def test_python3_sees_debians_prometheus_client_and_systemd_journal(installed):
    out = installed.root.run("python3", "-c", (
        "import importlib.metadata as m, prometheus_client, systemd.journal as j; "
        "print(m.version('prometheus_client'), prometheus_client.__file__, "
        "callable(j.send), j.JournalHandler.__name__)"))
    version, path, send, handler = out.stdout.split()
    assert version.startswith("0.16."), version   # Debian 12's, older than pip's 0.20
    assert path.startswith("/usr/lib/python3/dist-packages/")
    assert (send, handler) == ("True", "JournalHandler")


@dataclasses.dataclass
class DaemonRun:
    """What one run of the installed daemon wrote, said and sent."""

    metrics: str           # the metrics file as it was while the daemon ran
    returncode: int        # after SIGTERM
    stderr: str
    journal: list[dict[str, str]]   # the native journal entries it sent
    state_files: list[str]
    runtime_files: list[str]


def _journal_entry(datagram: bytes) -> dict[str, str]:
    """One entry of journald's native protocol (systemd.journal-fields(7)): ``KEY=value``
    lines, or ``KEY``, a 64-bit little-endian length and the value, for binary values."""
    entry, i = {}, 0
    while i < len(datagram):
        nl = datagram.index(b"\n", i)
        line = datagram[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            i = nl + 1
        else:
            key, size = line, int.from_bytes(datagram[nl + 1:nl + 9], "little")
            value = datagram[nl + 9:nl + 9 + size]
            i = nl + 9 + size + 1
        entry[key.decode()] = value.decode(errors="replace")
    return entry


@pytest.fixture(scope="module")
def daemon_run(installed):
    """`vmdisktouch run` on a file read whole, for a few cycles, with a metrics file, the
    state and runtime directories systemd would make, and stderr the journal's stream
    (JOURNAL_STREAM names it) beside a stand-in for journald's native socket."""
    root = installed.root
    root.run("python3", "-c", MAKE_IMAGE, "/tmp/hot.img", "8", "hot")
    for d in (STATE_DIR, RUNTIME_DIR):   # StateDirectory=, RuntimeDirectory=
        root.host(d).mkdir(mode=0o700)
    sock_dir = root.host("/run/systemd/journal")
    sock_dir.mkdir(parents=True)
    journald = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journald.bind(str(sock_dir / "socket"))
    journald.setblocking(False)
    metrics = root.host("/tmp/vmdisktouch.prom")
    err_path = root.host("/tmp/daemon.err")
    datagrams, seen = [], ""
    try:
        with open(err_path, "w") as err:
            st = os.fstat(err.fileno())
            proc = root.popen(
                "vmdisktouch", "run", "/tmp/hot.img", "--max-hold", "16M", "--min-free", "64M",
                "--interval", "0.5", "--uri", "", "--access-source", "mincore",
                "--metrics-file", "/tmp/vmdisktouch.prom", "--state-dir", STATE_DIR,
                "--status", f"{RUNTIME_DIR}/hot.json",
                env={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"},
                stdout=subprocess.DEVNULL, stderr=err)
            try:
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and proc.poll() is None:
                    text = metrics.read_text() if metrics.exists() else ""
                    m = re.search(r"^vmdisktouch_held_bytes\{[^}]*\} (\S+)$", text, re.M)
                    if m and float(m.group(1)) > 0:
                        seen = text
                        break
                    time.sleep(0.2)
                proc.send_signal(signal.SIGTERM)
                returncode = proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        while True:
            try:
                datagrams.append(journald.recv(1 << 20))
            except BlockingIOError:
                break
        run = DaemonRun(seen, returncode, err_path.read_text(),
                        [_journal_entry(d) for d in datagrams],
                        sorted(os.listdir(root.host(STATE_DIR))),
                        sorted(os.listdir(root.host(RUNTIME_DIR))))
    finally:
        journald.close()
        shutil.rmtree(root.host("/run/systemd"))
        for name in ("hot.img", "vmdisktouch.prom", "daemon.err"):
            root.host(f"/tmp/{name}").unlink(missing_ok=True)
    return run


def test_the_daemon_writes_its_metrics_file_with_debians_prometheus_client(installed,
                                                                          daemon_run):
    assert daemon_run.metrics, f"no held_bytes > 0 in the metrics file:\n{daemon_run.stderr}"
    parsed = json.loads(installed.root.run("python3", "-c", PARSE_METRICS,
                                           input=daemon_run.metrics).stdout)
    assert parsed["vmdisktouch_held_bytes"] == 8 * MiB
    assert parsed["vmdisktouch_size_bytes"] == 8 * MiB
    assert parsed["vmdisktouch_cycles_total"] >= 1


def test_the_daemon_stops_cleanly_on_sigterm_leaving_its_state(daemon_run):
    assert daemon_run.returncode == 0, daemon_run.stderr
    # the warm-restart state (kept at stop) and the status file: purge must remove them
    assert daemon_run.state_files, "nothing saved in the state directory"
    assert "hot.json" in daemon_run.runtime_files


def test_the_daemon_logs_to_the_journal_natively_with_fields(daemon_run):
    entries = [e for e in daemon_run.journal if e.get("SYSLOG_IDENTIFIER") == "vmdisktouch"]
    assert entries, f"no native journal entry; stderr was:\n{daemon_run.stderr}"
    assert all(e["PRIORITY"].isdigit() and "MESSAGE" in e for e in entries)
    assert any(e.get("DISK") == "/tmp/hot.img" for e in entries), entries
    # native entries go to the socket, not to the stream as well
    assert "released all holds" not in daemon_run.stderr


def test_purge_leaves_nothing_behind(installed):
    """Keep last: it removes the package the tests above use."""
    root = installed.root
    _, calls = _with_systemctl_shim(root, [("purge", ["apt-get", "purge", "-y", "vmdisktouch"])])
    # the running daemons are stopped before their program goes: the host service and
    # its socket (dh_installsystemd) and every per-disk instance (debian/prerm)
    stops = [words for _, words in calls if "stop" in words]
    assert ["stop", "vmdisktouch@*.service"] in stops, calls
    assert any("vmdisktouch.service" in words for words in stops), calls
    status = root.run("dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "vmdisktouch",
                      check=False)
    assert status.returncode != 0 or status.stdout.strip() in ("", "un", "pn"), status.stdout
    after = root.files()
    added = sorted(set(after) - set(installed.before))
    removed = sorted(set(installed.before) - set(after))
    changed = sorted(p for p in set(after) & set(installed.before)
                     if after[p] != installed.before[p])
    assert (added, removed, changed) == ([], [], []), shlex.join(added + removed + changed)
    for gone in ("/etc/vmdisktouch", STATE_DIR, RUNTIME_DIR, "/usr/bin/vmdisktouch"):
        assert not root.host(gone).exists(), gone
