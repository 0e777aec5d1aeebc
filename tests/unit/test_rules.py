"""The rules are data (``core.rules``): one record each, the modules decide with its value."""

from __future__ import annotations

import importlib
import re

from vmdisktouch.core import rules


def test_every_rule_is_bound_to_its_name_and_stated():
    names = [r.name for r in rules.RULES]
    assert len(set(names)) == len(names)
    for r in rules.RULES:
        assert getattr(rules, r.name) is r.value, r.name
        assert r.unit and r.meaning.endswith("."), r.name
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", r.key), r.key
        if r.shown:
            assert eval(r.shown) == r.value, r.name      # "1/16" is 1 / 16


def test_the_modules_decide_with_the_rules_values():
    """Each module applying a rule has it under the name it uses (thrash's without the
    prefix), with the rule's value."""
    for r in rules.RULES:
        module = importlib.import_module(f"vmdisktouch.{r.module}")
        local = r.name.removeprefix("THRASH_") if r.module == "core.thrash" else r.name
        assert getattr(module, local) is r.value, (r.module, local)


def test_no_module_of_the_core_defines_a_rule_of_its_own():
    """A rule's value is written once, in core.rules."""
    import pathlib
    core = pathlib.Path(rules.__file__).parent
    for path in core.glob("*.py"):
        if path.name == "rules.py":
            continue
        for r in rules.RULES:
            assert not re.search(rf"^{r.name}\s*=", path.read_text(), re.M), (path, r.name)


def test_no_bare_issue_number_in_the_package():
    """The reasons are said in words or linked (docs/rationale.md, docs/benchmarks.md): an
    issue number points to no public tracker."""
    import pathlib
    package = pathlib.Path(rules.__file__).parents[1]
    bare = re.compile(r"issue [0-9]+|#[0-9]{2}\b", re.I)
    found = [f"{p}:{n}" for p in sorted(package.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if bare.search(line)]
    assert not found, found
