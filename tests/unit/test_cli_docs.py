"""The man page and the bash completion: current, complete, and working in bash."""

import subprocess
import sys

import pytest

from tools import cli_docs
from vmdisktouch.commands import cli
from vmdisktouch.config import settings

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python

ROOT = cli_docs.ROOT


def test_both_are_generated_from_the_current_parser():
    r = subprocess.run([sys.executable, "-m", "tools.cli_docs", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_the_man_page_has_every_command_and_every_run_option():
    page = open(cli_docs.MAN).read()
    for name in cli.COMMANDS:
        assert f"vmdisktouch {name}" in page.replace("\\-", "-"), name
    for s in settings.SETTINGS:
        assert s.flag.replace("-", "\\-") in page, s.flag
    for section in (".SH EXIT STATUS", ".SH FILES", ".SH ENVIRONMENT", ".SH SEE ALSO"):
        assert section in page
    assert "\\fB78\\fR" in page


def complete(*words) -> list[str]:
    """What bash offers after ``words`` (the last one being completed)."""
    script = (f"source {cli_docs.COMPLETION}; COMP_WORDS=({' '.join(repr(w) for w in words)});"
              f" COMP_CWORD={len(words) - 1}; COMP_LINE={' '.join(words)!r};"
              " COMP_POINT=${#COMP_LINE}; _shtab_vmdisktouch; printf '%s\\n' \"${COMPREPLY[@]}\"")
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def test_bash_completes_commands_and_options():
    assert complete("vmdisktouch", "st") == ["status"]
    assert set(complete("vmdisktouch", "")) >= set(cli.COMMANDS)
    assert complete("vmdisktouch", "run", "--max") == ["--max-hold"]
    assert "--metrics-listen" in complete("vmdisktouch", "run", "--metrics")
    assert complete("vmdisktouch", "config", "--ch") == ["--check"]


def test_bash_completes_the_values_of_a_setting_with_choices():
    """Every setting read as one of a few words offers them, from the setting itself."""
    chosen = [s for s in settings.SETTINGS if s.choices]
    assert {s.key for s in chosen} >= {"access_source", "carry_heat"}
    for s in chosen:
        assert complete("vmdisktouch", "run", s.flag, "") == list(s.choices), s.flag
    assert complete("vmdisktouch", "run", "--access-source", "t") == ["trace"]
    assert complete("vmdisktouch", "run", "--carry-heat", "o") == ["on", "off"]
