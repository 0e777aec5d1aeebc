"""tests.support.nbd: a real qemu-nbd on a small temporary file, read and written through it with qemu-io."""

import os
import shutil
import subprocess

import pytest

from tests.support.common import WorkloadError
from tests.support.fio import FioJob
from tests.support.nbd import QemuNbd

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python

needs_qemu = pytest.mark.skipif(not (shutil.which("qemu-nbd") and shutil.which("qemu-io")),
                                reason="qemu-nbd and qemu-io (Debian: qemu-utils) not installed")


def qemu_io(uri: str, command: str) -> str:
    r = subprocess.run(["qemu-io", "-f", "raw", "-c", command, uri], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0 and "fail" not in r.stdout.lower(), r.stdout + r.stderr
    return r.stdout


@pytest.fixture
def image(tmp_path):
    path = tmp_path / "disk.raw"
    path.write_bytes(bytes(range(256)) * 4096)      # 1 MiB
    return str(path)


@needs_qemu
def test_serves_the_image_and_stops(image):
    nbd = QemuNbd(image)
    with nbd:
        assert nbd.alive() and os.path.exists(nbd.socket)
        assert nbd.uri == f"nbd+unix:///?socket={nbd.socket}"
        qemu_io(nbd.uri, "write -P 0x5a 4096 4096")          # through QEMU's block layer
        with open(image, "rb") as f:
            f.seek(4096)
            assert f.read(4096) == b"\x5a" * 4096
        assert "pattern" not in qemu_io(nbd.uri, "read -P 0x5a 4096 4096")  # persistent: a 2nd client
        proc = nbd.proc
        assert nbd.memory().get("VmRSS", 0) > 0
    assert proc.poll() is not None and not nbd.alive()       # stopped by its PID, reaped
    assert not os.path.exists(nbd.dir)
    nbd.stop()                                               # idempotent


@needs_qemu
def test_stopped_when_the_body_raises(image):
    nbd = QemuNbd(image)
    with pytest.raises(RuntimeError):
        with nbd:
            proc = nbd.proc
            raise RuntimeError("boom")
    assert proc.poll() is not None


@needs_qemu
def test_a_missing_image_is_a_workload_error(tmp_path):
    nbd = QemuNbd(str(tmp_path / "absent.raw"), log=str(tmp_path / "nbd.log"))
    with pytest.raises(WorkloadError, match="exited"):
        nbd.start(timeout=10)
    assert nbd.proc is None and not os.path.exists(nbd.dir)


def test_fio_job_through_nbd_keeps_the_file_job_otherwise():
    zones = [(1 << 20, 1 << 20)]
    plain = FioJob("/img", 8 << 20, zones, seed=1).argv()
    nbd = FioJob("/img", 8 << 20, zones, seed=1, nbd_uri="nbd+unix:///?socket=/s").argv()
    assert "--ioengine=psync" in plain and "--sync=dsync" in plain
    assert "--ioengine=nbd" in nbd and "--uri=nbd+unix:///?socket=/s" in nbd
    assert "--fsync=1" in nbd and not any(a.startswith("--sync=") for a in nbd)
    common = {a for a in plain if a.split("=")[0] in ("--bs", "--rw", "--rwmixread", "--iodepth",
                                                     "--random_distribution", "--randseed",
                                                     "--size", "--runtime")}
    assert common <= set(nbd)
    no_flush = FioJob("/img", 8 << 20, zones, nbd_uri="u", nbd_fsync=0).argv()
    assert not any(a.startswith("--fsync") for a in no_flush)
