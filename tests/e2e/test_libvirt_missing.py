"""Without an importable libvirt-python, ``discover`` and ``run --libvirt`` say which
interpreter could not import it and how Debian provides it, in one line: a venv on
a pyenv ``python3`` cannot import Debian's python3-libvirt, and the old message
("not installed") sent an operator who had installed it looking elsewhere."""

from __future__ import annotations

import subprocess
import sys

import pytest

# sys.modules["libvirt"] = None makes `import libvirt` raise ImportError, as on an
# interpreter that does not have it.
HIDE = ("import sys; sys.modules['libvirt'] = None; "
        "from vmdisktouch.commands.cli import main; sys.exit(main(sys.argv[1:]))")


# discover fails as any libvirt failure does (1); run --libvirt refuses to start (78)
# rather than wait for a module that no retry brings (docs/exit-codes.md).
@pytest.mark.parametrize("argv, code", [(["discover"], 1),
                                        (["run", "--libvirt", "--max-hold", "16M"], 78)])
def test_names_the_interpreter_and_debians_package(argv, code, tmp_path):
    out = subprocess.run([sys.executable, "-c", HIDE, *argv], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == code, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert sys.executable in lines[0]
    assert "python3-libvirt" in lines[0] and "/usr/bin/python3" in lines[0]
    assert "Traceback" not in out.stderr
