"""meminfo: MemAvailable and VmLck from a fake procfs tree and from the real one."""

import os
import subprocess

import pytest

from tests.support.common import require_tool
from vmdisktouch.system import meminfo
from vmdisktouch.errors import VmdtError

MEMINFO = """MemTotal:       24684092 kB
MemFree:        22961728 kB
MemAvailable:   24120844 kB
Buffers:           45128 kB
"""

STATUS = """Name:\tpython3
Pid:\t4242
VmPeak:\t  123456 kB
VmLck:\t   16384 kB
VmPin:\t       0 kB
"""


def fake_procfs(tmp_path, meminfo_text=MEMINFO, status_text=STATUS, pid=4242):
    (tmp_path / "meminfo").write_text(meminfo_text)
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "status").write_text(status_text)
    return str(tmp_path)


def test_fake_procfs_is_parsed_in_bytes(tmp_path):
    root = fake_procfs(tmp_path)
    assert meminfo.mem_available(root) == 24120844 * 1024


@pytest.mark.parametrize("text, what", [
    ("MemTotal: 1 kB\nMemFree: 1 kB\n", "no MemAvailable line"),
    ("MemAvailable: lots kB\n", "cannot parse"),
    ("MemAvailable:\n", "cannot parse"),
    ("MemAvailable: 12 furlongs\n", "cannot parse"),
])
def test_bad_meminfo_is_a_one_line_error(tmp_path, text, what):
    root = fake_procfs(tmp_path, meminfo_text=text)
    with pytest.raises(meminfo.MemInfoError, match=what) as info:
        meminfo.mem_available(root)
    assert isinstance(info.value, VmdtError)
    assert "\n" not in str(info.value)


def test_missing_files_are_errors(tmp_path):
    with pytest.raises(meminfo.MemInfoError, match="cannot read .*meminfo"):
        meminfo.mem_available(str(tmp_path))


def test_real_mem_available_matches_free():
    free = require_tool("free")
    ours = meminfo.mem_available()
    out = subprocess.run([free, "-b"], check=True, capture_output=True, text=True).stdout
    header, mem = out.splitlines()[0].split(), out.splitlines()[1].split()
    theirs = int(mem[1 + header.index("available")])
    # Both read /proc/meminfo a few ms apart; allow 64 MiB of drift.
    assert abs(ours - theirs) <= 64 << 20, (ours, theirs)
    assert ours > 0
