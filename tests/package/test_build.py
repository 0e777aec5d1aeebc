"""scripts/build-deb.sh as `make deb` runs it: lintian clean, the files an operator needs
where Debian puts them, the units inert until configured, nothing left in the tree."""

from __future__ import annotations

import configparser
import io
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.package.conftest import Build
from tests.package.debroot import REPO, deb_field

pytestmark = pytest.mark.timeout(900)

SCRIPT = REPO / "scripts" / "build-deb.sh"


def _members(deb: Path) -> dict[str, tarfile.TarInfo]:
    """The .deb's data files by absolute path."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {"/" + m.name.lstrip("./"): m for m in tar.getmembers() if m.name != "./"}


def _file(deb: Path, path: str) -> str:
    out = subprocess.run(f"dpkg-deb --fsys-tarfile '{deb}' | tar -xOf - '.{path}'",
                         shell=True, check=True, capture_output=True, text=True)
    return out.stdout


def _control(deb: Path, name: str) -> str:
    out = subprocess.run(f"dpkg-deb --ctrl-tarfile '{deb}' | tar -xOf - './{name}'",
                         shell=True, check=True, capture_output=True, text=True)
    return out.stdout


def _repo_units() -> list[str]:
    return sorted(p.name for p in (REPO / "systemd").iterdir()
                  if p.suffix in (".service", ".socket"))


def test_lintian_reports_no_error_and_no_warning(build: Build):
    assert build.returncode == 0, f"{build.stderr}\n{build.stdout[-3000:]}\n{build.log_tail()}"
    report = build.one("*.lintian").read_text()
    bad = [line for line in report.splitlines() if line[:2] in ("E:", "W:")]
    assert not bad, report
    # an override that matches nothing, or matches differently, is itself a tag
    assert "unused-override" not in report and "mismatched-override" not in report, report


def test_the_output_directory_holds_the_deb_buildinfo_and_changes(build: Build, deb: Path):
    assert deb.name == f"vmdisktouch_{deb_field(deb, 'Version')}_all.deb"
    changes = build.one("*.changes").read_text()
    assert deb.name in changes and build.one("*.buildinfo").name in changes
    assert f"build-deb: {deb}" in build.stdout


def test_the_build_leaves_nothing_in_the_tree(deb: Path):
    # what dpkg-buildpackage and pybuild write in a source tree, had it built in place
    left = [p for p in ("debian/files", "debian/vmdisktouch", "debian/.debhelper",
                        "debian/debhelper-build-stamp", "debian/vmdisktouch.substvars",
                        ".pybuild", "build")
            if (REPO / p).exists()]
    assert not left, f"left in the tree: {left}"


def test_control_fields(deb: Path):
    assert deb_field(deb, "Architecture") == "all"
    depends = {d.strip().split()[0] for d in deb_field(deb, "Depends").split(",")}
    assert {"python3-numpy", "python3-pil", "python3-xxhash", "procps"} <= depends
    assert "python3:any" in depends   # ${python3:Depends} was filled in
    recommends = {d.strip() for d in deb_field(deb, "Recommends").split(",")}
    assert recommends == {"python3-libvirt", "python3-prometheus-client", "python3-systemd"}
    assert deb_field(deb, "Suggests") == "prometheus-node-exporter"


def test_the_files_an_operator_needs_are_where_debian_puts_them(deb: Path):
    files = _members(deb)
    for path in ("/usr/bin/vmdisktouch", "/usr/share/man/man1/vmdisktouch.1.gz",
                 # bash-completion loads the completion of `vmdisktouch` from this name
                 "/usr/share/bash-completion/completions/vmdisktouch",
                 "/etc/vmdisktouch/host.toml",
                 "/usr/lib/python3/dist-packages/vmdisktouch/commands/cli.py",
                 "/usr/share/doc/vmdisktouch/copyright"):
        assert path in files, path
    examples = sorted(p.rsplit("/", 1)[1] for p in files
                      if p.startswith("/usr/share/doc/vmdisktouch/examples/"))
    assert examples == sorted(p.name for p in (REPO / "examples").iterdir())
    assert files["/usr/bin/vmdisktouch"].mode & 0o111
    assert _file(deb, "/etc/vmdisktouch/host.toml") == (REPO / "examples/host.toml").read_text()
    # the state and runtime directories come from the units (StateDirectory=,
    # RuntimeDirectory=), not from the package
    assert not [p for p in files if p.startswith(("/var/", "/run/"))]


def test_the_man_page_is_installed_once(deb: Path):
    # not also under /usr/share/doc/vmdisktouch/docs/ (debian/vmdisktouch.docs ships docs/)
    pages = [p for p in _members(deb) if re.search(r"/vmdisktouch\.1(\.gz)?$", p)]
    assert pages == ["/usr/share/man/man1/vmdisktouch.1.gz"], pages


def test_the_licence_is_in_the_python_metadata(deb: Path):
    # pyproject.toml's licence, as Debian 12's setuptools 66 builds it (setup.cfg)
    [meta] = [p for p in _members(deb) if p.endswith(".dist-info/METADATA")]
    assert "\nLicense: GPL-2.0-or-later\n" in _file(deb, meta)


def test_host_toml_is_the_one_conffile(deb: Path):
    assert _control(deb, "conffiles").split() == ["/etc/vmdisktouch/host.toml"]


def test_every_unit_of_the_tree_is_installed_running_usr_bin(deb: Path):
    files = _members(deb)
    units = sorted(p.rsplit("/", 1)[1] for p in files if p.startswith("/lib/systemd/system/"))
    assert units == _repo_units()
    for unit in units:
        text = _file(deb, f"/lib/systemd/system/{unit}")
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        parser.optionxform = str
        parser.read_string(text)
        assert "/usr/local" not in text, unit      # Exec lines and comments alike
        if "# Install:" in text:
            install = text.split("# Install:", 1)[1].split("\n\n", 1)[0]
            assert "the Debian package vmdisktouch" in install and "/usr/bin/vmdisktouch" \
                in install, (unit, install)
        if unit.endswith(".service"):
            start = parser["Service"]["ExecStart"]
            assert start.startswith(":/usr/bin/vmdisktouch run "), (unit, start)


def test_the_maintainer_scripts_enable_nothing(deb: Path):
    # dh_installsystemd --no-enable: `deb-systemd-helper enable` only re-creates the
    # links of a unit already installed once (debian-installed), so that a unit the
    # operator enabled stays so; without it, the first installation enables the units
    sections = _control(deb, "postinst").split("# Automatically added by ")
    enabling = [sec for sec in sections if "deb-systemd-helper enable" in sec]
    assert enabling, "no dh_installsystemd section: are the units still installed?"
    for sec in enabling:
        assert "if deb-systemd-helper debian-installed" in sec, sec
    # purge removes the daemon's warm state and runtime files
    assert "rm -rf /var/lib/vmdisktouch /run/vmdisktouch" in _control(deb, "postrm")


@pytest.mark.parametrize("args, code, message", [
    ([], 2, "usage: bash scripts/build-deb.sh OUTDIR"),
    (["a", "b"], 2, "usage: bash scripts/build-deb.sh OUTDIR"),
    (["--help"], 2, "usage: bash scripts/build-deb.sh OUTDIR"),
    (["{file}"], 1, "exists and is not a directory"),
])
def test_bad_arguments_give_one_line_and_a_nonzero_exit(tmp_path, args, code, message):
    afile = tmp_path / "afile"
    afile.write_text("")
    args = [a.format(file=afile) for a in args]
    out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == code
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert out.stdout == ""
