"""Issue 45: the docs say what the code and the package do: the keys of a
``[domain.NAME]`` table (docs/status.md named ``[domain.x] max_hold``; the key is
``cap``), and the packages debian/control depends on and recommends."""

from __future__ import annotations

import pathlib
import re

import pytest

from vmdisktouch.config.overrides import KEYS

pytestmark = pytest.mark.repo

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMED = re.compile(r"\[domain\.[A-Za-z0-9_.-]+\]\s+([a-z_]+)")


def named_keys() -> list[tuple[str, str]]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "examples").glob("*"))]
    return [(p.name, m.group(1)) for p in texts if p.is_file()
            for m in NAMED.finditer(p.read_text(errors="replace"))]


def test_every_domain_key_the_docs_name_is_one_the_config_reads():
    found = named_keys()
    assert found, "the docs name no [domain.NAME] key: the pattern is stale"
    assert [(f, k) for f, k in found if k not in KEYS] == []


def control_field(name: str) -> list[str]:
    """The packages a field of debian/control lists (substitution variables left out)."""
    text = (ROOT / "debian" / "control").read_text()
    m = re.search(rf"^{name}:(.*?)(?=^\S)", text, re.M | re.S)
    return [p.strip().split()[0] for p in m.group(1).split(",")
            if p.strip() and not p.strip().startswith("${")]


def test_the_readme_names_the_packages_the_control_file_depends_on_and_recommends():
    """Issue 45: the README's dependency line differed from the control file (procps)."""
    readme = (ROOT / "README.md").read_text()
    said = readme.split("- It depends on", 1)[1].split("- It installs", 1)[0]
    depends, recommends = said.split("- It recommends", 1)
    assert control_field("Depends") and control_field("Recommends")
    for pkg in control_field("Depends"):
        assert pkg in depends, pkg
    for pkg in control_field("Recommends"):
        assert pkg in recommends, pkg
