"""bench_hotzone's options: the holder group's section and the scenarios it allows."""

import pytest

from benchmarks.hotzone_args import parse_args, section_name

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python


def test_holder_limit_writes_its_own_section():
    a, names = parse_args(["--variant", "bigset", "--holder-limit", "767M",
                           "--tuned-args=--access-source mincore",
                           "--scenarios", "vmdisktouch,tuned", "--no-doc"], "t")
    assert section_name(a) == "hotzone-bigset-holder-limit"
    assert names == ["vmdisktouch", "tuned"]
    a, _ = parse_args(["--variant", "bigset", "--scenarios", "vmdisktouch", "--no-doc"], "t")
    assert section_name(a) == "hotzone-bigset"


def test_holder_limit_refuses_the_vmtouch_scenarios(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--holder-limit", "767M", "--scenarios", "oracle,vmdisktouch"], "t")
    assert exc.value.code == 2
    assert "vmtouch scenarios" in capsys.readouterr().err
