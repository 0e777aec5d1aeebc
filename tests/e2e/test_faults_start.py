"""Fault table, part 1: bad inputs are refused at start, before anything is held.

Each row runs the real ``vmdisktouch run`` (or ``snapshot``) on a real data
image and checks the exit code, the one-line reason and that the image is
untouched. See ``tests/support/faultkit.py`` and ``docs/faults.md``.
"""

from __future__ import annotations

import os
import resource
import stat
import subprocess

import pytest

from tests.support.faultkit import (EX_CONFIG, EX_NOINPUT, MiB, Untouched, assert_refused, fault,
                            rows_of, vmdt)
from tests.support.faultkit import image  # noqa: F401 - the rows' fixture
from tests.support.common import require_tool
from tests.support.pagecache import data_image

RUN = ("run", "--uri", "", "--min-free", "0", "--interval", "0.2")
START = "the daemon refuses to start; the image is untouched; nothing is held"


def run(image, *args, **kw):
    return vmdt(*RUN[:1], image, *RUN[1:], *args, **kw)


def config(tmp_path, text: str, name: str = "vm.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- 1. an output path that is the image --------------------------------------------

def _output_is_image(tmp_path, image, flag):
    r = run(image, "--max-hold", "8M", flag, image)
    assert_refused(r, EX_CONFIG, f"refusing {flag} {image}: it is the disk image")


for _flag in ("--status", "--map-png", "--heat-png"):
    fault(f"output-is-image{_flag}", f"`run IMG {_flag} IMG`: the output names the image",
          START, f"exit 78, `refusing {_flag} IMG: it is the disk image`", "1")(
        lambda tmp_path, image, flag=_flag: _output_is_image(tmp_path, image, flag))


@fault("output-is-image-in-config", "`status = \"IMG\"` in the config file", START,
       "exit 78, `refusing --status IMG: it is the disk image`", "1")
def _(tmp_path, image):
    cfg = config(tmp_path, f'max_hold = "8M"\nstatus = "{image}"\n')
    assert_refused(run(image, "--config", cfg), EX_CONFIG, "it is the disk image")


@fault("output-symlink-to-image", "`--map-png LINK`, LINK a symlink to the image", START,
       "exit 78, `refusing --map-png LINK: it is the disk image`", "1")
def _(tmp_path, image):
    link = tmp_path / "link.png"
    link.symlink_to(image)
    assert_refused(run(image, "--max-hold", "8M", "--map-png", link), EX_CONFIG,
                   "it is the disk image")


@fault("output-hardlink-to-image", "`--status HARDLINK`, a hard link of the image", START,
       "exit 78, `refusing --status HARDLINK: it is the disk image`", "1")
def _(tmp_path, image):
    alias = tmp_path / "alias.json"
    os.link(image, alias)
    assert_refused(run(image, "--max-hold", "8M", "--status", alias), EX_CONFIG,
                   "it is the disk image")


@fault("output-is-block-device-alias", "image `/dev/loopN`; `--status` names another device "
       "node of the same block device (made with mknod)", START,
       "exit 78, `it is the disk image`; the node is still a block device", "1")
def _(tmp_path, image):
    dev = subprocess.run([require_tool("losetup"), "-f", "--show", image], check=True,
                         capture_output=True, text=True).stdout.strip()
    try:
        node = tmp_path / "node"
        os.mknod(node, stat.S_IFBLK | 0o600, os.stat(dev).st_rdev)
        assert_refused(run(dev, "--max-hold", "8M", "--status", node), EX_CONFIG,
                       "it is the disk image")
        assert stat.S_ISBLK(os.lstat(node).st_mode)
    finally:
        subprocess.run(["losetup", "-d", dev], check=True)


@fault("output-is-config", "`--status` names the config file", START,
       "exit 78, `it is the config file`; the config file unchanged", "1")
def _(tmp_path, image):
    cfg = config(tmp_path, 'max_hold = "8M"\n', "vm.json")
    before = open(cfg).read()
    assert_refused(run(image, "--config", cfg, "--status", cfg), EX_CONFIG,
                   "it is the config file")
    assert open(cfg).read() == before


@fault("outputs-collide", "`--status F --map-png F`: two outputs, one file", START,
       "exit 78, `--status names the same file`")
def _(tmp_path, image):
    out = tmp_path / "same"
    assert_refused(run(image, "--max-hold", "8M", "--status", out, "--map-png", out),
                   EX_CONFIG, "--status names the same file")


@fault("output-is-foreign-file", "`--status` names an existing file that is not a status file "
       "(another VM's image, say)", START + "; the file is untouched",
       "exit 78, `it exists and is not a file vmdisktouch writes`")
def _(tmp_path, image):
    other = data_image(tmp_path / "other-vm.img", 1 * MiB)
    kept = Untouched(other)
    assert_refused(run(image, "--max-hold", "8M", "--status", other), EX_CONFIG,
                   "is not a file vmdisktouch writes")
    kept.check()


@fault("snapshot-png-is-image", "`snapshot IMG --png IMG`", "the snapshot refuses; the image "
       "is untouched", "exit 78, `refusing --png IMG: it is the disk image`", "1")
def _(tmp_path, image):
    r = vmdt("snapshot", image, "--png", image)
    assert_refused(r, EX_CONFIG, "it is the disk image")


@fault("output-is-fifo", "`--status` names an existing FIFO", START + "; no hang",
       "exit 78, `it is a FIFO, not a regular file`", "1")
def _(tmp_path, image):
    fifo = tmp_path / "status.json"
    os.mkfifo(fifo)
    assert_refused(run(image, "--max-hold", "8M", "--status", fifo), EX_CONFIG,
                   "it is a FIFO")


# -- 4. values that are not finite numbers, and settings that can never work ----------

BAD_VALUES = [
    ("interval-nan", "interval = nan", "interval"),
    ("interval-inf", "interval = inf", "interval"),
    ("sigma-inf", "sigma_resident = inf", "sigma_resident"),
    ("decay-inf", "decay = inf", "decay"),
]
for _id, _line, _key in BAD_VALUES:
    fault(f"config-{_id}", f"`{_line}` in the config file", START,
          f"exit 78, the file and key `{_key}` named", "4")(
        lambda tmp_path, image, line=_line, key=_key: assert_refused(
            run(image, "--config", config(tmp_path, f'max_hold = "8M"\n{line}\n')),
            EX_CONFIG, f"key {key}"))

BAD_FLAGS = [
    ("max-hold-400-digits", ["--max-hold", "9" * 400], "--max-hold", "4"),
    ("block-size-1000", ["--max-hold", "8M", "--block-size", "1000"], "--block-size", "4"),
    ("interval-below-floor", ["--max-hold", "8M", "--interval", "0.05"], "--interval", "4"),
    ("scale-huge", ["--max-hold", "8M", "--scale", "1000000"], "--scale", ""),
    ("load-rate-crawl", ["--max-hold", "8M", "--load-rate", "1"], "--load-rate", ""),
]
for _id, _args, _flag, _case in BAD_FLAGS:
    fault(f"flag-{_id}", f"`{' '.join(a if len(a) < 20 else a[:8] + '…' for a in _args)}`",
          START, f"exit 78, `option {_flag}` named", _case)(
        lambda tmp_path, image, args=_args, flag=_flag: assert_refused(
            vmdt("run", image, "--uri", "", *args), EX_CONFIG, f"option {flag}"))


@fault("min-free-above-memory", "`--min-free` above the host's memory (MemTotal)", START,
       "exit 78, `nothing could ever be held`", "4")
def _(tmp_path, image):
    r = vmdt("run", image, "--uri", "", "--max-hold", "8M", "--min-free", "64T")
    assert_refused(r, EX_CONFIG, "min_free")


@fault("budget-below-one-block", "`--max-hold 512K` with 1 MiB blocks", START,
       "exit 78, `smaller than one block`")
def _(tmp_path, image):
    assert_refused(run(image, "--max-hold", "512K"), EX_CONFIG, "smaller than one block")


@fault("budget-above-lock-limit", "`--max-hold 8M` without CAP_IPC_LOCK and with "
       "RLIMIT_MEMLOCK 4M (`setpriv`, `prlimit`)", START,
       "exit 78, `above this process's lock limit`")
def _(tmp_path, image):
    assert resource.getrlimit(resource.RLIMIT_MEMLOCK)[1] >= 4 * MiB   # lowered, never raised
    prefix = [require_tool("prlimit"), "--memlock=4194304:4194304",
              require_tool("setpriv"), "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock"]
    r = vmdt("run", image, "--uri", "", "--max-hold", "8M", "--min-free", "0", prefix=prefix)
    assert_refused(r, EX_CONFIG, "above this process's lock limit")


# -- 5. config files that are not files ---------------------------------------------

@fault("config-dev-zero", "`--config /dev/zero`", START + "; no unbounded read",
       "exit 78 within the timeout, `character device` named", "5")
def _(tmp_path, image):
    assert_refused(run(image, "--config", "/dev/zero", timeout=15), EX_CONFIG, "/dev/zero")


@fault("config-fifo", "`--config FIFO` with no writer", START + "; no hang in open",
       "exit 78 within the timeout", "5")
def _(tmp_path, image):
    fifo = tmp_path / "cfg.toml"
    os.mkfifo(fifo)
    assert_refused(run(image, "--config", fifo, timeout=15), EX_CONFIG, str(fifo))


@fault("config-directory", "`--config DIR`", START, "exit 78, the path named", "5")
def _(tmp_path, image):
    assert_refused(run(image, "--config", tmp_path), EX_CONFIG, str(tmp_path))


@fault("config-too-big", "a 2 MiB config file", START, "exit 78, the size cap named", "5")
def _(tmp_path, image):
    cfg = config(tmp_path, 'max_hold = "8M"\n' + "# padding\n" * (2 * MiB // 10))
    assert_refused(run(image, "--config", cfg), EX_CONFIG, cfg)


@fault("config-deep-nesting", "a config of 100,000 nested arrays", START,
       "exit 78, the file named")
def _(tmp_path, image):
    cfg = config(tmp_path, "x = " + "[" * 100_000 + "\n")
    assert_refused(run(image, "--config", cfg), EX_CONFIG, cfg)


@fault("config-not-utf8", "a config file with invalid UTF-8", START, "exit 78, `UTF-8`")
def _(tmp_path, image):
    path = tmp_path / "vm.toml"
    path.write_bytes(b'max_hold = "8M"\n# \xff\xfe\n')
    assert_refused(run(image, "--config", path), EX_CONFIG, "UTF-8")


# -- 6. outputs that cannot be written ----------------------------------------------

@fault("output-dir-missing", "`--status TMP/missing/s.json`, a directory that does not "
       "exist", START,
       "exit 78, `its directory ... does not exist`", "6")
def _(tmp_path, image):
    r = run(image, "--max-hold", "8M", "--status", tmp_path / "missing" / "s.json")
    assert_refused(r, EX_CONFIG, "does not exist")


@fault("output-in-proc", "`--status /proc/vmdt.json` (a pseudo file system)", START,
       "exit 78, `cannot create a file in /proc`", "6")
def _(tmp_path, image):
    assert_refused(run(image, "--max-hold", "8M", "--status", "/proc/vmdt.json"), EX_CONFIG,
                   "cannot create a file in /proc")


@fault("output-read-only-fs", "`--status` on a read-only file system (a tmpfs mounted ro)",
       START, "exit 78, `Read-only file system`", "6")
def _(tmp_path, image):
    mnt = tmp_path / "ro"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], check=True)
    try:
        assert_refused(run(image, "--max-hold", "8M", "--status", mnt / "s.json"), EX_CONFIG,
                       "Read-only file system")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@fault("output-is-directory", "`--map-png DIR`", START, "exit 78, `it is a directory`", "6")
def _(tmp_path, image):
    assert_refused(run(image, "--max-hold", "8M", "--map-png", tmp_path), EX_CONFIG,
                   "it is a directory")


# -- 8. images that cannot be opened -------------------------------------------------

@fault("image-missing", "an image path that does not exist", "exit 66 (systemd does not "
       "restart: RestartPreventExitStatus)", "exit 66, `no such file or directory`", "8")
def _(tmp_path, image):
    assert_refused(run(tmp_path / "nope.img", "--max-hold", "8M"), EX_NOINPUT,
                   "no such file or directory")


@fault("image-fifo", "the image is a FIFO", "refused at once, no hang in open",
       "exit 66, `is a FIFO`")
def _(tmp_path, image):
    fifo = tmp_path / "fifo.img"
    os.mkfifo(fifo)
    assert_refused(run(fifo, "--max-hold", "8M", timeout=15), EX_NOINPUT, "is a FIFO")


@fault("image-char-device", "the image is `/dev/zero`", "refused", "exit 66, "
       "`is a character device`")
def _(tmp_path, image):
    assert_refused(run("/dev/zero", "--max-hold", "8M"), EX_NOINPUT, "character device")


@fault("image-directory", "the image is a directory", "refused", "exit 66, `is a directory`")
def _(tmp_path, image):
    assert_refused(run(tmp_path, "--max-hold", "8M"), EX_NOINPUT, "is a directory")


@fault("image-proc-file", "the image is `/proc/self/status`", "refused",
       "exit 66, `pseudo filesystem` or `empty`")
def _(tmp_path, image):
    r = run("/proc/self/status", "--max-hold", "8M")
    assert_refused(r, EX_NOINPUT, "/proc/self/status")


@fault("image-name-with-newline", "a missing image whose name holds a newline",
       "the reason stays on one line", "exit 66, one `vmdisktouch:` line")
def _(tmp_path, image):
    r = run(tmp_path / "a\nb.img", "--max-hold", "8M")
    assert_refused(r, EX_NOINPUT, "b.img: no such file")
    assert sum(line.startswith("vmdisktouch:") for line in r.stderr.splitlines()) == 1


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_start_fault(row, tmp_path, image):
    kept = Untouched(image)
    row.check(tmp_path, image)
    kept.check()
