"""The tests make what they need: no test relies on a fixed path being absent.

A test that passes ``/nonexistent`` for "a path that does not exist" fails on a
machine where that directory happens to exist (issue 54 saw it). A missing
path is made under the test's own ``tmp_path`` instead (``tmp_path / "gone"``).
This check reads every test module's string literals with ``ast`` and refuses
an absolute path whose name says it is meant to be missing.
"""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

pytestmark = pytest.mark.repo     # the repository's own files: the same on every Python

TESTS = pathlib.Path(__file__).resolve().parents[1]
# an absolute path (or one inside a URI's socket=) whose name says "missing"
MEANT_MISSING = re.compile(r"(?:^|[=\s])/+(?:non-?exist\w*|does-?not-?exist\w*|missing\w*|"
                           r"no-?such\w*)(?:/|$)", re.IGNORECASE)


def missing_paths_named(source: str) -> list[tuple[int, str]]:
    """The (line, literal) of each string constant naming a fixed path meant to be missing."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MEANT_MISSING.search(node.value):
                out.append((node.lineno, node.value))
    return out


def test_the_check_finds_a_fixed_missing_path_and_spares_a_tmp_one():
    assert missing_paths_named('x = "/nonexistent"') == [(1, "/nonexistent")]
    assert missing_paths_named('u = "qemu+unix:///system?socket=/nonexistent/s"')
    assert missing_paths_named('p = "/missing/dir/s.json"')
    assert not missing_paths_named('p = tmp_path / "missing.img"')
    assert not missing_paths_named('u = "qemu:///nonexistent"')   # a URI's name, not a path


def test_no_test_relies_on_a_fixed_path_being_absent():
    found = [f"{p.relative_to(TESTS.parent)}:{line}: {text!r}"
             for p in sorted(TESTS.rglob("*.py")) if p.resolve() != pathlib.Path(__file__)
             for line, text in missing_paths_named(p.read_text())]
    assert not found, ("make the missing path under the test's tmp_path:\n" +
                       "\n".join(found))
