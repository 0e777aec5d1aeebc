"""debian/ against the project, without building: the package's version is the project's,
and every lintian override says why it is there."""

from __future__ import annotations

import configparser
import re
import subprocess

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from tests.package.debroot import REPO

DEBIAN = REPO / "debian"


def _changelog_version() -> str:
    return subprocess.run(["dpkg-parsechangelog", "-l", str(DEBIAN / "changelog"),
                           "-S", "Version"], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_the_package_version_is_the_projects():
    # native format: the Debian version is the upstream one, no revision to strip
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert _changelog_version() == project
    assert (DEBIAN / "source" / "format").read_text().strip() == "3.0 (native)"


def _overrides() -> list[tuple[str, int, str, str]]:
    """(file, line number, line, the line above) of every override in debian/."""
    out = []
    for path in sorted(DEBIAN.glob("*.lintian-overrides")) + sorted(
            DEBIAN.glob("source/lintian-overrides")):
        previous = ""
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip() and not line.startswith("#"):
                out.append((path.name, n, line, previous))
            previous = line
    return out


def test_every_lintian_override_has_its_reason_above_it():
    assert _overrides(), "debian/vmdisktouch.lintian-overrides is gone or empty"
    for name, n, line, previous in _overrides():
        assert previous.startswith("#"), (
            f"{name}:{n}: override without a reason on the line above: {line}")


def test_every_lintian_override_is_in_the_packaging_doc():
    doc = (REPO / "docs" / "packaging.md").read_text()
    for name, n, line, _ in _overrides():
        # [package[ type]: ]tag [context]
        tag = re.match(r"(?:[\w.+-]+(?: \w+)?: )?(\S+)", line.strip()).group(1)
        assert f"`{tag}`" in doc, f"{name}:{n}: {tag} is not explained in docs/packaging.md"


def test_the_licence_is_stated_as_both_setuptools_read_it_without_a_warning():
    """setuptools >= 77 (what pip fetches for `pip install -e .`) prints a deprecation
    block for a ``project.license`` table and for licence classifiers; Debian 12's 66
    refuses the SPDX string that replaces them. So the licence is dynamic, in setup.cfg,
    which both read without a word."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "license" not in project and "license" in project.get("dynamic", [])
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["metadata"]["license"] == "GPL-2.0-or-later"
