"""Issue 34: one exit-code table for every subcommand (docs/exit-codes.md), each row run.

Every case is a subprocess of ``python -m vmdisktouch ...``: its exit status, and a
stderr of one ``vmdisktouch:`` line without a traceback (a refusal never prints a
page of usage). The table of docs/exit-codes.md lists exactly the codes tested here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from tests.support.common import require_tool
from tests.support.pagecache import data_image, held
from tests.support.common import ROOT
from tests.support.daemon_proc import DaemonProc
from vmdisktouch import errors

MiB = 1 << 20
NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]
RUN = ("--uri", "", "--min-free", "0")


def vmdt(*argv, prefix=(), timeout=60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "vmdisktouch", *map(str, argv)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


def one_line(r: subprocess.CompletedProcess, code: int, needle: str = "") -> str:
    """Exit ``code``; stderr is one ``vmdisktouch:`` line, no traceback, no usage."""
    err = r.stderr
    assert r.returncode == code, f"exit {r.returncode}, expected {code}: {err[-2000:]}"
    lines = err.splitlines()
    assert len(lines) == 1, err[-2000:]
    assert lines[0].startswith("vmdisktouch: "), lines[0]
    assert "Traceback" not in err and "usage:" not in err, err
    assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


@pytest.fixture
def image(tmp_path):
    return data_image(tmp_path / "disk.img", 8 * MiB)


# -- 2: the shape of the command line, every subcommand, one line ----------------------

USAGE = [
    (["--bogus", "status"], "unrecognized arguments: --bogus"),
    ([], "the following arguments are required: COMMAND"),
    (["nosuchcommand"], "invalid choice"),
    (["run", "--libvirt", "--max-hold"], "run: argument --max-hold: expected one argument"),
    (["run"], "run needs a disk image (PATH) or --libvirt"),
    (["run", "{image}", "--libvirt", "--max-hold", "8M"], "not both"),
    (["snapshot"], "snapshot: the following arguments are required: PATH"),
    (["snapshot", "--png", "{tmp}/m.png", "{image}", "{image}"],
     "--png needs exactly one PATH (got 2)"),
    (["snapshot", "--width", "4", "--blocks-per-pixel", "2", "{image}"], "not allowed with"),
    (["status", "--bogus"], "unrecognized arguments: --bogus"),
    (["status", "--top", "5", "--all"], "status: argument --all: not allowed with argument --top"),
    (["config"], "one of the arguments --example --check is required"),
    (["config", "--example", "--check", "x.toml"], "not allowed with"),
    (["discover", "--uri"], "discover: argument --uri: expected one argument"),
    (["unit-name"], "unit-name: the following arguments are required: PATH"),
    (["unit-name", "/a/../b"], "not a normalized path"),
    (["advise"], "give PATHs or --libvirt, not neither"),
    (["advise", "{image}", "--libvirt"], "give PATHs or --libvirt, not both"),
    (["adopt"], "adopt: the following arguments are required: DOMAIN/TARGET"),
    (["adopt", "web1"], "'web1': expected DOMAIN/TARGET"),
    (["release"], "name the disks (DOMAIN/TARGET) or --all"),
    (["release", "web1/vda", "--all"], "name the disks (DOMAIN/TARGET) or --all"),
]


@pytest.mark.parametrize("argv,needle", USAGE, ids=lambda v: " ".join(v) if isinstance(v, list)
                         else None)
def test_usage_is_2_in_one_line(tmp_path, image, argv, needle):
    argv = [a.format(image=image, tmp=tmp_path) for a in argv]
    one_line(vmdt(*argv), errors.EX_USAGE, needle)


# -- 78: a bad value, wherever it is given; the config file; an output path ------------

SETUP = [
    # issue 34: snapshot and run agree: a bad value is 78, naming the option
    (["run", "{image}", "--max-hold", "8M", "--interval", "0.01", *RUN],
     "option --interval: bad value '0.01'"),
    (["snapshot", "--width", "0", "{image}"], "option --width: bad value '0' for width"),
    (["snapshot", "--scale", "1000", "{image}"], "option --scale: bad value '1000'"),
    (["snapshot", "--blocks-per-pixel", "x", "{image}"], "option --blocks-per-pixel"),
    (["snapshot", "--block-size", "1000", "{image}"], "option --block-size: bad value '1000'"),
    (["run", "{image}", "--block-size", "1000", "--max-hold", "8M", *RUN],
     "option --block-size: bad value '1000'"),
    # "-1M" is the value, not an option: the value's check says why, in one line
    (["run", "{image}", "--max-hold", "-1M", *RUN], "option --max-hold: bad value '-1M'"),
    (["run", "{image}", "--max-hold=-1M", *RUN], "option --max-hold: bad value '-1M'"),
    (["snapshot", "--width", "-3", "{image}"], "option --width: bad value '-3'"),
    (["run", "{image}", *RUN], "max_hold is not set"),
    (["run", "{image}", "--max-hold", "8M", "--config", "{tmp}/none.toml", *RUN],
     "cannot read config file"),
    (["config", "--check", "{tmp}/none.toml"], "cannot read config file"),
    (["config", "--check", "{bad_value}"], "key decay: bad value"),
    (["run", "{image}", "--max-hold", "8M", "--status", "{tmp}/no/dir/s.json", *RUN],
     "does not exist"),
    (["snapshot", "--png", "{tmp}/no/dir/m.png", "{image}"], "refusing --png"),
    (["snapshot", "--png", "{image}", "{image}"], "it is the disk image"),
    (["advise", "{image}", "--duration", "x"], "bad value 'x' for --duration"),
    (["status", "--top", "0"], "bad value '0' for --top: at least 1 disk line"),
    (["status", "--top", "-3"], "bad value '-3' for --top: at least 1 disk line"),
    (["status", "--top", "x"], "bad value 'x' for --top: not a whole number"),
    (["advise", "{image}", "--png", "{image}"], "refusing --png"),
]


@pytest.mark.parametrize("argv,needle", SETUP, ids=lambda v: " ".join(v)[:60]
                         if isinstance(v, list) else None)
def test_refused_setup_is_78_in_one_line(tmp_path, image, argv, needle):
    bad_value = tmp_path / "bad.toml"
    bad_value.write_text('max_hold = "8M"\ndecay = 1e-320\n')
    argv = [a.format(image=image, tmp=tmp_path, bad_value=bad_value) for a in argv]
    one_line(vmdt(*argv), errors.EX_CONFIG, needle)


def test_a_flag_and_the_config_file_say_the_same_with_the_same_code(tmp_path, image):
    cfg = tmp_path / "vm.toml"
    cfg.write_text('max_hold = "8M"\ninterval = 0.01\n')
    by_file = one_line(vmdt("run", image, "--config", cfg, *RUN), errors.EX_CONFIG)
    by_flag = one_line(vmdt("run", image, "--max-hold", "8M", "--interval", "0.01", *RUN),
                       errors.EX_CONFIG)
    assert f"{cfg}: key interval: bad value 0.01 for interval" in by_file
    assert "option --interval: bad value '0.01' for interval" in by_flag
    assert by_file.split(" for interval ")[1] == by_flag.split(" for interval ")[1]


# -- a mistyped key: a warning at the top and inside [domain.x] alike --------------------

def test_a_mistyped_key_warns_at_the_top_and_in_a_domain_table(tmp_path):
    cfg = tmp_path / "host.toml"
    cfg.write_text('max_hold = "1G"\nmin_fre = "2G"\n[domain.db]\nwieght = 2.0\n'
                   '[domain.db.vdb]\ncpa = "1G"\n')
    r = vmdt("config", "--check", cfg)
    assert r.returncode == 0 and r.stdout == f"{cfg}: ok (3 warnings)\n", r.stderr
    warned = sorted(r.stderr.splitlines())
    assert warned == sorted([
        f"vmdisktouch: warning: {cfg}: unknown key 'min_fre' (did you mean 'min_free'?); "
        "ignored",
        f"vmdisktouch: warning: {cfg}: [domain.db]: unknown key 'wieght' (did you mean "
        "'weight'?); ignored",
        f"vmdisktouch: warning: {cfg}: [domain.db.vdb]: unknown key 'cpa' (did you mean "
        "'cap'?); ignored"]), r.stderr
    cfg.write_text('max_hold = "1G"\n[domain.db]\nweight = "heavy"\n')     # a bad value: 78
    one_line(vmdt("config", "--check", cfg), errors.EX_CONFIG, "[domain.db]: weight")


# -- 66: an input that cannot be used ---------------------------------------------------

def test_missing_input_is_66_for_every_command_that_reads_one(tmp_path, image):
    missing = tmp_path / "missing.img"
    one_line(vmdt("snapshot", missing), errors.EX_NOINPUT, f"{missing}: no such file")
    one_line(vmdt("run", missing, "--max-hold", "8M", *RUN), errors.EX_NOINPUT,
             f"{missing}: no such file")
    gone = tmp_path / "gone"                  # the test's own: never a path the machine may have
    one_line(vmdt("status", "--dir", gone), errors.EX_NOINPUT, f"{gone}: no such directory")
    empty = tmp_path / "run"
    empty.mkdir()
    one_line(vmdt("status", "--dir", empty, image), errors.EX_NOINPUT,
             f"no status file in {empty} serves it")


def test_snapshot_reports_the_good_paths_and_exits_with_the_first_failure(tmp_path, image):
    missing = tmp_path / "missing.img"
    r = vmdt("snapshot", "--json", image, missing)
    one_line(r, errors.EX_NOINPUT, str(missing))
    assert [rec["path"] for rec in json.loads(r.stdout)] == [image]


def snapshot_as(path, *prefix) -> subprocess.CompletedProcess:
    return vmdt("snapshot", "--json", path, prefix=prefix)


def test_snapshot_never_prints_the_kernels_all_resident_answer(shared_dir):
    """Linux >= 5.2 (can_do_mincore) says every page is cached to a caller that neither
    owns nor may write the file. Run for real: root's file, world-readable, a quarter
    of it cached; nobody is refused (66), where the old code printed 100 %; as its owner
    or with write access, nobody sees what root sees."""
    path = data_image(os.path.join(shared_dir, "disk.img"), 16 * MiB)
    os.chmod(path, 0o644)
    # the quarter held (mlock) for the whole test: reclaim cannot change the count
    # between root's snapshot and the others' (proactive reclaim takes idle cache here)
    with held(path, [(0, 4 * MiB)]):
        _compare_views(path)


def _compare_views(path):
    nobody = [require_tool("setpriv"), *NOBODY]
    root = json.loads(snapshot_as(path).stdout)[0]
    assert 0 < root["resident_pages"] < root["total_pages"], root

    r = snapshot_as(path, *nobody)
    one_line(r, errors.EX_NOINPUT, f"{path}: cannot see its residency")
    assert "run as its owner or as root" in r.stderr and json.loads(r.stdout) == []
    r = vmdt("snapshot", path, prefix=nobody)          # the summary: no number either
    one_line(r, errors.EX_NOINPUT, "cannot see its residency")
    assert r.stdout == ""

    # what the kernel does for such a caller: every page "resident" (so never shown)
    probe = textwrap.dedent(f"""
        import os
        from vmdisktouch.system.observe import residency
        fd = os.open({path!r}, os.O_RDONLY)
        res = residency.scan(fd, os.fstat(fd).st_size, use_cachestat=False)
        print(res.resident_pages, res.total_pages, res.partial_view)
    """)
    out = subprocess.run([*nobody, sys.executable, "-c", probe], capture_output=True,
                         text=True, cwd=ROOT, timeout=60)
    assert out.stdout.split() == [str(root["total_pages"])] * 2 + ["True"], out

    for grant in ("owner", "writer"):                  # the kernel answers truly: shown
        if grant == "owner":
            os.chown(path, 65534, 65534)
        else:
            os.chown(path, 0, 0)
            os.chmod(path, 0o666)
        r = snapshot_as(path, *nobody)
        assert r.returncode == 0 and r.stderr == "", (grant, r.stderr)
        rec = json.loads(r.stdout)[0]
        assert rec["resident_pages"] == root["resident_pages"], (grant, rec, root)
        assert rec["partial_view"] is False and rec["note"] is None


# -- 3: status, nothing live ------------------------------------------------------------

def test_status_with_nothing_live_is_3(tmp_path):
    empty = tmp_path / "run"
    empty.mkdir()
    r = vmdt("status", "--dir", empty)
    assert r.returncode == 3 and r.stderr == "" and "no status files" in r.stdout, r


# -- 1: a failure at run time -----------------------------------------------------------

@pytest.mark.parametrize("argv", [["snapshot", "{image}"], ["status", "--dir", "{tmp}"],
                                  ["config", "--example"], ["unit-name", "/a.img"]],
                         ids=lambda v: v[0])
def test_a_closed_output_is_1_in_one_line(tmp_path, image, argv):
    """`vmdisktouch ... | head -0`: the reader is gone before anything is written."""
    argv = [a.format(image=image, tmp=tmp_path) for a in argv]
    proc = subprocess.Popen([sys.executable, "-m", "vmdisktouch", *argv], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == errors.EX_ERROR, err
    assert err.splitlines() == ["vmdisktouch: standard output closed (broken pipe): output "
                                "cut short"], err


@pytest.mark.parametrize("argv", [["discover"], ["adopt", "web1/vda"], ["release", "web1/vda"]],
                         ids=lambda v: v[0])
def test_libvirt_unreachable_is_1_in_one_line(tmp_path, argv):
    """No libvirtd is asked: the socket does not exist."""
    r = vmdt(*argv, "--uri", f"qemu+unix:///system?socket={tmp_path}/gone/libvirt-sock",
             env={**os.environ, "VMDISKTOUCH_RUNTIME_DIR": str(tmp_path)})
    one_line(r, errors.EX_ERROR)


# -- 70: a bug --------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "snapshot", "status", "config", "discover",
                                     "unit-name", "advise", "adopt", "release"])
def test_a_bug_is_70_in_one_line_for_every_subcommand(command):
    module = command.replace("-", "_")
    code = textwrap.dedent(f"""
        import sys
        from vmdisktouch.commands import cli, {module} as m
        def broken(args):
            raise KeyError("a bug")
        m.main = broken
        sys.exit(cli.main(["{command}", *sys.argv[1:]]))
    """)
    argv = {"run": ["--libvirt"], "snapshot": ["x"], "config": ["--example"],
            "unit-name": ["x"], "advise": ["x"], "adopt": ["web1/vda"],
            "release": ["--all"]}.get(command, [])
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    one_line(r, errors.EX_SOFTWARE, "internal error: KeyError: 'a bug' (rerun with --debug)")


# -- 75: the image went while served; 0: a clean stop ----------------------------------

def test_the_image_deleted_while_served_is_75_and_a_stop_is_0(tmp_path, image):
    d = DaemonProc(tmp_path, image, "--max-hold", "8M", *RUN, "--interval", "0.2")
    try:
        d.wait_output("cycle 1:", "the first cycle")
        os.unlink(image)
        assert d.proc.wait(timeout=20) == errors.EX_TEMPFAIL, d.output()[-2000:]
        out = d.output()
        assert "Traceback" not in out and "internal error" not in out, out[-2000:]
        assert out.strip().splitlines()[-1].startswith("vmdisktouch: "), out[-2000:]
    finally:
        d.stop()
    other = data_image(tmp_path / "other.img", 8 * MiB)
    d = DaemonProc(tmp_path, other, "--max-hold", "8M", *RUN, "--interval", "0.2")
    try:
        d.wait_output("cycle 1:", "the first cycle")
    finally:
        assert d.stop() == 0, d.output()[-2000:]


# -- advise: 3 (nothing read), 77 (not root), 66, 78 (a kernel without the tracepoints),
# 130 (Ctrl-C): tests/e2e/test_advise.py

# -- the table of docs/exit-codes.md is what is tested here -----------------------------

def test_the_documented_table_is_the_tested_one():
    text = open(os.path.join(ROOT, "docs", "exit-codes.md"), encoding="utf-8").read()
    rows = [int(m) for m in re.findall(r"^\| (\d+) \|", text, re.M)]
    assert rows == [0, 1, 2, 3, 66, 70, 75, 77, 78]
    assert {errors.EX_ERROR, errors.EX_USAGE, errors.EX_NOINPUT, errors.EX_SOFTWARE,
            errors.EX_TEMPFAIL, errors.EX_NOPERM, errors.EX_CONFIG} <= set(rows)
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    commands = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    assert "(docs/exit-codes.md)" in commands
