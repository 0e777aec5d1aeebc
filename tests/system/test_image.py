"""open_image and `vmdisktouch snapshot` on good and bad paths.

Every bad path gives one ``vmdisktouch: <path>: <reason>`` line on stderr, no
traceback and exit status 1, both through ``open_image`` (an ImageError with a
one-line message) and through the CLI in a subprocess. With several paths the
good ones are still reported.

Tests run as root, and root reads any file whatever its mode bits, so the
"unreadable path" cases run the check as the unprivileged user nobody
(``setpriv --reuid=65534``), on a file under a world-searchable directory.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.support.common import require_tool
from tests.support.images import make_image
from tests.support.pagecache import PAGE
from vmdisktouch.errors import ImageError
from vmdisktouch.system.image import open_image, size_of_fd

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
NOBODY = ["--reuid=65534", "--regid=65534", "--clear-groups"]


def run_cli(*args, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "vmdisktouch", "snapshot", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def assert_one_line_error(proc, path, reason):
    assert proc.returncode == 66, proc          # errors.EX_NOINPUT, as `run` (issue 34)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"vmdisktouch: {path}: "), lines[0]
    assert reason in lines[0], lines[0]


# ---------------------------------------------------------------------------
# Bad paths, as root


@pytest.fixture
def bad_paths(tmp_path):
    """name -> (path, words the message must contain)."""
    empty = tmp_path / "empty.raw"
    empty.touch()
    (tmp_path / "adir").mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    paths = {
        "missing": (str(tmp_path / "no-such.raw"), "no such file"),
        "directory": (str(tmp_path / "adir"), "is a directory"),
        "empty": (str(empty), "is empty"),
        "fifo": (str(fifo), "is a FIFO"),
        "chardev": ("/dev/null", "is a character device"),
        "proc": ("/proc/self/status", "proc pseudo filesystem"),
        "socket": (str(sock_path), "is a socket"),
        "dangling-symlink": (str(tmp_path / "dangling"), "no such file"),
    }
    os.symlink(tmp_path / "gone", tmp_path / "dangling")
    yield paths
    sock.close()


BAD = ["missing", "directory", "empty", "fifo", "chardev", "proc", "socket", "dangling-symlink"]


@pytest.mark.parametrize("name", BAD)
def test_open_image_rejects(bad_paths, name):
    path, reason = bad_paths[name]
    with pytest.raises(ImageError) as exc:
        open_image(path)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"{path}: ") and reason in msg


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("json_mode", [False, True])
def test_cli_rejects_with_one_line(bad_paths, name, json_mode):
    path, reason = bad_paths[name]
    proc = run_cli(*(["--json"] if json_mode else []), path)
    assert_one_line_error(proc, path, reason)
    assert proc.stdout == ("[]\n" if json_mode else "")


def test_fifo_is_never_opened(bad_paths):
    """Opening a FIFO for reading blocks until a writer comes: it must not be opened."""
    path, _ = bad_paths["fifo"]
    proc = run_cli(path)          # would hit the 120 s timeout if it blocked
    assert proc.returncode == 66


def test_several_paths_one_bad_still_reports_the_good(tmp_path, bad_paths):
    good1 = make_image(tmp_path / "a.raw", 8 * MiB)
    good2 = make_image(tmp_path / "b.raw", 4 * MiB)
    bad, reason = bad_paths["directory"]
    proc = run_cli(good1, bad, good2)
    assert_one_line_error(proc, bad, reason)
    assert f"Image: {good1}" in proc.stdout and f"Image: {good2}" in proc.stdout
    assert proc.stdout.count("Resident Pages:") == 2

    proc = run_cli("--json", good1, bad, good2)
    assert_one_line_error(proc, bad, reason)
    assert [r["path"] for r in json.loads(proc.stdout)] == [good1, good2]


def test_all_bad_paths_each_reported(bad_paths):
    paths = [bad_paths[n][0] for n in BAD]
    proc = run_cli(*paths)
    assert proc.returncode == 66 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert [ln.split(": ")[1] for ln in lines] == paths
    assert "Traceback" not in proc.stderr


def test_usage_errors_are_one_line(tmp_path):
    img = make_image(tmp_path / "a.raw", MiB)
    proc = run_cli("--block-size", "1000", img)          # a bad value: 78, as `run` says it
    assert proc.returncode == 78 and "multiple of the page size" in proc.stderr
    assert proc.stderr.startswith("vmdisktouch: option --block-size: bad value '1000'")
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1
    proc = run_cli("--png", str(tmp_path / "m.png"), img, img)
    assert proc.returncode == 2 and proc.stdout == ""       # errors.EX_USAGE (issue 34)
    assert proc.stderr == "vmdisktouch: --png needs exactly one PATH (got 2)\n"
    assert not (tmp_path / "m.png").exists()


# ---------------------------------------------------------------------------
# Unreadable paths: as the unprivileged user nobody


def as_nobody_open_image(path):
    code = textwrap.dedent(f"""
        from vmdisktouch.system.image import open_image
        from vmdisktouch.errors import ImageError
        try:
            open_image({path!r})
        except ImageError as exc:
            print(exc)
        else:
            print("OPENED")
    """)
    setpriv = require_tool("setpriv")
    return subprocess.run([setpriv, *NOBODY, sys.executable, "-c", code], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_unreadable_file(shared_dir):
    path = make_image(os.path.join(shared_dir, "secret.raw"), MiB)
    os.chmod(path, 0o600)
    out = as_nobody_open_image(path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{path}: permission denied (cannot open for reading)"
    proc = run_cli(path, prefix=[require_tool("setpriv"), *NOBODY])
    assert_one_line_error(proc, path, "permission denied")


def test_path_in_unsearchable_directory(shared_dir):
    inner = os.path.join(shared_dir, "private")
    os.mkdir(inner, 0o700)
    path = make_image(os.path.join(inner, "disk.raw"), MiB)
    out = as_nobody_open_image(path)
    assert out.stdout.strip() == f"{path}: permission denied"
    proc = run_cli(path, prefix=[require_tool("setpriv"), *NOBODY])
    assert_one_line_error(proc, path, "permission denied")


def test_readable_but_not_writable_is_refused(shared_dir):
    """Linux >= 5.2 tells a caller that neither owns nor may write a file that every page
    is cached (can_do_mincore): snapshot refuses the image rather than print 100 %."""
    path = make_image(os.path.join(shared_dir, "ro.raw"), MiB)
    os.chmod(path, 0o644)
    for args in (["--json", path], [path]):
        proc = run_cli(*args, prefix=[require_tool("setpriv"), *NOBODY])
        assert_one_line_error(proc, path, "cannot see its residency")
        assert "run as its owner or as root" in proc.stderr
        assert proc.stdout in ("", "[]\n")


# ---------------------------------------------------------------------------
# Good images: raw, qcow2, block device


def test_raw_file(tmp_path):
    path = make_image(tmp_path / "disk.raw", 10 * MiB + 100)
    with open_image(path) as img:
        assert (img.kind, img.format, img.size) == ("file", "raw", 10 * MiB + 100)
    assert img.fd == -1


def test_qcow2_detected(tmp_path):
    qemu_img = require_tool("qemu-img")
    path = str(tmp_path / "disk.qcow2")
    subprocess.run([qemu_img, "create", "-q", "-f", "qcow2", path, "10G"], check=True)
    with open_image(path) as img:
        assert img.format == "qcow2" and img.kind == "file"
        assert img.size == os.path.getsize(path) < 10 << 30      # host file size
    proc = run_cli(path)
    assert proc.returncode == 0
    assert "Type: file, qcow2" in proc.stdout
    assert "offsets are host-file offsets, not guest offsets" in proc.stdout
    rec = json.loads(run_cli("--json", path).stdout)[0]
    assert rec["format"] == "qcow2" and "host-file offsets" in rec["note"]


def test_raw_image_that_merely_mentions_the_magic_later_is_raw(tmp_path):
    path = tmp_path / "disk.raw"
    path.write_bytes(b"\0" * PAGE + b"QFI\xfb" + b"\0" * PAGE)
    with open_image(str(path)) as img:
        assert img.format == "raw"


@pytest.fixture
def loop_device(loop_device_of):
    return loop_device_of(48 * MiB + 3 * PAGE)


def test_block_device_size(loop_device):
    assert os.stat(loop_device).st_size == 0          # why BLKGETSIZE64 is needed
    with open_image(loop_device) as img:
        assert img.kind == "block" and img.format == "raw"
        assert img.size == 48 * MiB + 3 * PAGE == size_of_fd(img.fd, "block")
    rec = json.loads(run_cli("--json", loop_device).stdout)[0]
    assert rec["kind"] == "block" and rec["size_bytes"] == 48 * MiB + 3 * PAGE
    assert rec["total_pages"] == 48 * MiB // PAGE + 3


def test_the_image_keeps_size_kind_allocation_and_where_its_data_lies(tmp_path):
    path = make_image(tmp_path / "sparse.raw", 16 * MiB)               # all hole
    with open_image(path) as img:
        assert img.is_regular and img.size == 16 * MiB
        assert img.data_runs((0, 16), MiB) == []
        empty = img.allocation()
        with open(path, "r+b") as f:
            f.seek(3 * MiB + PAGE)
            f.write(b"x" * PAGE)
            f.flush()
            os.fsync(f.fileno())
        assert img.data_runs((0, 16), MiB) == [(3, 4)]                 # a block with data: whole
        assert img.allocation() > empty
        os.truncate(path, 2 * MiB)
        assert img.size == 16 * MiB                                    # kept until refreshed
        assert not img.covers(3 * MiB) and img.covers(2 * MiB)
        assert img.refresh_size() == img.size == 2 * MiB
        assert img.data_runs((0, 16), MiB) == []


def test_a_block_device_has_no_allocation(loop_device):
    with open_image(loop_device) as img:
        assert not img.is_regular and img.allocation() is None
