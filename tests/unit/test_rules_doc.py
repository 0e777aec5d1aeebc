"""The rules table of docs/algorithm.md is generated from ``core.rules`` and is current."""

import pytest

from tools import rules_doc
from vmdisktouch.core import rules

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python


def test_the_table_is_what_the_generator_writes():
    assert rules_doc.main(["--check"]) == 0, "regenerate: python -m tools.rules_doc"


def test_the_table_has_every_rule_with_its_value():
    text = open(rules_doc.DOC).read()
    table = text[text.index(rules_doc.BEGIN):text.index(rules_doc.END)]
    for r in rules.RULES:
        assert f"[`{r.name}`](rationale.md#{r.key}) | {r.text} | {r.unit} |" in table, r.name


def test_every_rule_has_its_section_in_rationale_and_only_the_rules_do():
    import re
    text = open(rules_doc.RATIONALE).read()
    anchors = re.findall(r'<a id="([^"]+)"></a>\n### (\w+):', text)
    assert [(r.key, r.name) for r in rules.RULES] == anchors
