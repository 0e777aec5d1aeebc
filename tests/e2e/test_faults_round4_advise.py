"""Fault table, issue 54 (hardening round four): ``vmdisktouch advise`` as hostile input meets it.

``advise --save`` replaced any file, the very disk image it watched
included, and made missing directories as root; ``--duration 0`` gave
confident advice; SIGTERM and SIGHUP killed it with two tracefs instances
left recording; on a disk a daemon serves it took the daemon's own
``O_DIRECT`` miss probe for QEMU's and said ``cache=none``; an interrupted
watch's PNG said "watched 60 s". Each row runs the real command as root
against real files, the real page cache and the kernel's tracepoints.
See ``tests/support/faultkit.py`` and ``docs/faults.md``.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
from PIL import Image, ImageChops, ImageDraw

from tests.support.common import ROOT
from tests.support.daemon_proc import DaemonProc
from tests.support.faultkit import (EX_CONFIG, MiB, Untouched, assert_clean, assert_refused,
                                    fault, rows_of, vmdt)
from tests.support.images import make_image
from tests.support.libvirt_env import (URI, DomainFactory, disk_xml,  # noqa: F401
                                       libvirt_daemons)
from tests.support.pagecache import data_image

pytestmark = [pytest.mark.root]

INSTANCES = "/sys/kernel/tracing/instances"
SLOW = "30"          # a --duration a refusal must not wait for
QUICK = 10.0         # s: a refusal comes before the watch, well within this


def instances_of(pid: int) -> list[str]:
    """The tracefs instances advise ``pid`` made (``vmdisktouch@advise-PID-K-...``)."""
    return [n for n in os.listdir(INSTANCES) if n.startswith(f"vmdisktouch@advise-{pid}-")]


def refused_quickly(argv, needle: str, env=None) -> str:
    """``advise ARGV`` refused with 78 in one line naming ``needle``, before any watch."""
    t0 = time.monotonic()
    r = vmdt("advise", *argv, timeout=120, env=env)
    took = time.monotonic() - t0
    last = assert_refused(r, EX_CONFIG, needle)
    assert took < QUICK, f"refused after {took:.1f} s: the watch ran first"
    assert r.stdout == "", r.stdout
    return last


class Kept:
    """A file's bytes, size, mtime and kind (a symlink is compared as itself)."""

    def __init__(self, path):
        self.path = str(path)
        self.before = self._now()

    def _now(self):
        st = os.lstat(self.path)
        if stat.S_ISLNK(st.st_mode):
            return ("link", os.readlink(self.path), st.st_mtime_ns)
        if not stat.S_ISREG(st.st_mode):
            return (stat.S_IFMT(st.st_mode), st.st_mtime_ns)
        with open(self.path, "rb") as f:
            return ("file", f.read(), st.st_size, st.st_mtime_ns)

    def check(self) -> None:
        assert self._now() == self.before, f"{self.path} was changed"


def an_advise_report(path) -> str:
    """A report as advise writes it (its fields), as the previous run would have left."""
    report = {"duration_seconds": 1.0, "interrupted": False, "kernel": os.uname().release,
              "when": time.time() - 60, "disks": [], "failed": {}}
    with open(path, "w") as f:
        json.dump(report, f)
    return str(path)


# -- 1: --save replaces whatever it names -----------------------------------------------

CASE_SAVE = "54 broke 1"

SAVE_REFUSALS = [
    ("the-image", "the disk image being advised", lambda t, img: img, "it is the disk image"),
    ("other-image", "another VM's image (32 MiB of data, not advised)",
     lambda t, img: data_image(t / "other-vm.img", 32 * MiB), "not a file vmdisktouch writes"),
    ("text-file", "an operator's text file",
     lambda t, img: _write(t / "notes.txt", "do not lose me\n"), "not a file vmdisktouch writes"),
    ("symlink", "a symlink to an earlier advise report",
     lambda t, img: _link(an_advise_report(t / "old.json"), t / "link.json"),
     "symbolic link"),
    ("fifo", "a FIFO", lambda t, img: _fifo(t / "pipe"), "FIFO"),
]


def _write(path, text: str) -> str:
    path.write_text(text)
    return str(path)


def _link(target: str, path) -> str:
    os.symlink(target, path)
    return str(path)


def _fifo(path) -> str:
    os.mkfifo(path)
    return str(path)


for _id, _what, _make, _needle in SAVE_REFUSALS:
    fault(f"advise-save-{_id}", f"`advise IMG --duration {SLOW} --save FILE`, FILE {_what}",
          "the file is untouched (bytes, size, mtime); refused before the watch starts",
          f"exit 78 within {QUICK:g} s, one line naming `{_needle}`; the file as it was",
          case=CASE_SAVE)(lambda tmp_path, image, make=_make, needle=_needle:
                          _save_refused(tmp_path, image, make, needle))


def _save_refused(tmp_path, image, make, needle: str) -> None:
    target = make(tmp_path, image)
    kept = Kept(target)
    resolved = Kept(os.path.realpath(target)) if os.path.islink(target) else None
    last = refused_quickly([image, "--cache", "none", "--duration", SLOW, "--save", target],
                           needle)
    assert last.startswith(f"vmdisktouch: refusing --save {target}: "), last
    kept.check()
    if resolved:
        resolved.check()


@fault("advise-save-missing-dir", "`advise IMG --save DIR/new/sub/a.json`, `DIR/new` missing",
       "no directory is made (advise runs as root: it made whatever directories the path "
       "named, anywhere); refused before the watch, as `run` refuses `--status` there",
       "exit 78 within 10 s naming `does not exist`; `DIR/new` still missing", case=CASE_SAVE)
def _(tmp_path, image):
    target = tmp_path / "new" / "sub" / "a.json"
    refused_quickly([image, "--cache", "none", "--duration", SLOW, "--save", target],
                    "does not exist")
    assert not (tmp_path / "new").exists(), "advise made the missing directory"


@fault("advise-save-same-as-png", "`advise IMG --png F --save F`, F a new file: one file for "
       "both (the PNG replaced the report just saved)",
       "refused before the watch; nothing written",
       "exit 78 within 10 s naming `names the same file`; F not made", case=CASE_SAVE)
def _(tmp_path, image):
    target = tmp_path / "both"
    refused_quickly([image, "--cache", "none", "--duration", SLOW, "--png", target,
                     "--save", target], "names the same file")
    assert not target.exists()


# -- what --save may do (not faults: kept as they were) ---------------------------------

def test_save_replaces_the_report_an_earlier_advise_left(tmp_path):
    """An advise report is what ``--save`` may replace (the check must not refuse it)."""
    image = data_image(tmp_path / "disk.img", 16 * MiB)
    target = an_advise_report(tmp_path / "advise.json")
    before = json.loads(open(target).read())["when"]
    r = vmdt("advise", image, "--cache", "none", "--duration", "1", "--save", target,
             timeout=60)
    assert_clean(r.stderr)
    assert r.returncode == 3, r.stderr
    report = json.loads(open(target).read())
    assert report["when"] > before and [d["path"] for d in report["disks"]] == [image], report


def test_the_default_save_makes_the_runtime_directory_and_only_it(tmp_path):
    """``advise IMG`` (the default ``--save``, /run/vmdisktouch/advise.json) where
    /run/vmdisktouch does not exist yet (a private mount namespace, an empty tmpfs on /run;
    no ``VMDISKTOUCH_RUNTIME_DIR``, which would move it):
    the project's runtime directory is the one directory advise makes, root's, 0755, as
    the daemon's lock makes it."""
    image = data_image(tmp_path / "disk.img", 16 * MiB)
    advise = f"{sys.executable} -m vmdisktouch advise {image} --cache none --duration 1"
    script = (f"mount -t tmpfs -o mode=0755 tmpfs /run && {advise} --save /run/other/a.json; "
              "echo rc=$?; ls /run; "
              f"{advise}; echo rc=$?; "
              "stat -c '%a %U %F' /run/vmdisktouch; cat /run/vmdisktouch/advise.json")
    env = {k: v for k, v in os.environ.items() if k != "VMDISKTOUCH_RUNTIME_DIR"}
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)
    assert_clean(r.stderr)
    assert "refusing --save /run/other/a.json: its directory /run/other does not exist" \
        in r.stderr, r.stderr
    head, _, body = r.stdout.partition("\n755 root directory\n")
    assert head.startswith("rc=78\n") and head.endswith("rc=3"), r.stdout + r.stderr
    assert "other" not in head, head
    assert [d["path"] for d in json.loads(body)["disks"]] == [image], body


@fault("advise-save-libvirt-disk", "`advise --libvirt --save F`, F the empty raw image (0 "
       "bytes: no content to tell it from a new file) of a domain that is defined but not "
       "running", "no disk of any domain libvirt knows is replaced, running or not",
       "exit 78 within 10 s naming the domain and its target; F still empty, same mtime",
       case=CASE_SAVE)
def _libvirt_disk(tmp_path, image):
    factory = DomainFactory(tmp_path)
    try:
        running = factory.define([disk_xml("vda", image)], tag="advise-save")
        empty = make_image(tmp_path / "empty.raw", 0)
        stopped = factory.define([disk_xml("vdb", empty)], start=False, tag="advise-save")
        kept = Kept(empty)
        last = refused_quickly(["--libvirt", URI, "--duration", SLOW, "--save", empty],
                               f"it is the disk vdb of domain {stopped}")
        assert running not in last
        kept.check()
    finally:
        factory.cleanup()


# -- 2: --duration 0 ------------------------------------------------------------------

@fault("advise-duration-zero", "`advise IMG --duration 0` (also `0s`, `0ms`, `-1`)",
       "a window of no time is no evidence: refused as a bad value, in one place",
       "each exit 78 within 10 s naming `--duration`, nothing printed on stdout",
       case="54 weak duration")
def _(tmp_path, image):
    for value in ("0", "0s", "0ms", "-1"):
        last = refused_quickly([image, "--cache", "none", f"--duration={value}", "--save", ""],
                               "--duration")
        assert repr(value) in last, last


# -- 3: SIGTERM and SIGHUP ----------------------------------------------------------------

def direct_reader(path: str, stop: threading.Event) -> threading.Thread:
    """Reads 4 KiB at random with O_DIRECT about 500 times a second until ``stop``."""
    def run():
        import mmap
        buf = mmap.mmap(-1, 4096)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            n = os.fstat(fd).st_size // 4096
            rng = random.Random(5)
            while not stop.wait(0.002):
                os.preadv(fd, [buf], rng.randrange(n) * 4096)
        finally:
            os.close(fd)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def advise_child(argv, ignore=()) -> subprocess.Popen:
    """``advise ARGV`` with SIGINT, SIGTERM and SIGHUP at their defaults (as an operator's
    shell starts it; a test run in the background inherits SIGINT ignored), but those in
    ``ignore`` ignored (``nohup``)."""
    def dispositions():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN if sig in ignore else signal.SIG_DFL)
    return subprocess.Popen([sys.executable, "-m", "vmdisktouch", "advise", *map(str, argv)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=dispositions)


def _signalled(tmp_path, image, sig: int, code: int) -> None:
    saved = tmp_path / "advise.json"
    stop = threading.Event()
    reader = direct_reader(image, stop)
    p = advise_child([image, "--cache", "none", "--duration", "60", "--save", saved],
                     ignore=(signal.SIGHUP,) if sig == signal.SIGTERM else ())
    try:
        deadline = time.monotonic() + 20
        while len(instances_of(p.pid)) < 1:
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.1)
        time.sleep(3)
        if sig == signal.SIGTERM:         # under nohup: a SIGHUP must change nothing
            p.send_signal(signal.SIGHUP)
            time.sleep(1)
            assert p.poll() is None, "an ignored SIGHUP (nohup) ended advise"
        p.send_signal(sig)
        t = time.monotonic()
        out, err = p.communicate(timeout=10)
        took = time.monotonic() - t
    finally:
        stop.set()
        reader.join(5)
        if p.poll() is None:
            p.kill()
            p.wait()
    name = signal.Signals(sig).name
    assert p.returncode == code, f"{name}: exit {p.returncode}, expected {code}: {err}"
    assert_clean(err)
    assert took <= 1.0, f"{name}: stopped {took:.1f} s after the signal"
    assert not instances_of(p.pid), f"{name}: its tracefs instances were left recording"
    row = next(line for line in out.splitlines() if line.startswith(image))
    assert "none" in row and "interrupted" in out, out
    report = json.loads(saved.read_text())
    assert report["interrupted"] is True and report["disks"][0]["reads_per_second"] > 50, \
        report


@fault("advise-sigterm", "SIGTERM to `advise IMG --duration 60` 3 s into its window, "
       "a reader doing 4 KiB O_DIRECT reads; before it, a SIGHUP to advise started under "
       "`nohup` (SIGHUP ignored)",
       "SIGTERM ends the watch as Ctrl-C does: the report of what was seen, its tracefs "
       "instances removed; an ignored SIGHUP stays ignored",
       "exit 143 (128 + 15) within 1 s, the table and `interrupted`, the saved report's reads; "
       "no `vmdisktouch@advise-PID-*` instance left; alive after the ignored SIGHUP",
       case="54 weak sigterm")
def _(tmp_path, image):
    _signalled(tmp_path, image, signal.SIGTERM, 128 + signal.SIGTERM)


@fault("advise-sighup", "SIGHUP (the terminal closed) to `advise IMG --duration 60` 3 s into "
       "its window, a reader doing 4 KiB O_DIRECT reads",
       "SIGHUP ends the watch as Ctrl-C does: the report of what was seen, its tracefs "
       "instances removed",
       "exit 129 (128 + 1) within 1 s, the table and `interrupted`, the saved report's reads; "
       "no `vmdisktouch@advise-PID-*` instance left", case="54 weak sigterm")
def _(tmp_path, image):
    _signalled(tmp_path, image, signal.SIGHUP, 128 + signal.SIGHUP)


# -- 4: a disk the daemon serves -----------------------------------------------------------

@fault("advise-daemon-served", "`advise IMG` while `vmdisktouch run IMG` serves it (its miss "
       "probe keeps an O_DIRECT descriptor of IMG) and a reader reads IMG through the page "
       "cache (buffered 4 KiB reads in a 16 MiB zone)",
       "the daemon's own descriptors are not QEMU's: the disk is seen through the page cache, "
       "its reads counted, the daemon named",
       "`cache` writethrough, `seen_by` page cache, reads > 50/s, advice not `no_reads`; "
       "`daemon_pid` the daemon's pid and its line in the table", case="54 weak daemon probe")
def _(tmp_path, image):
    env = dict(os.environ, VMDISKTOUCH_LOCK_DIR=str(tmp_path / "locks"))
    stop = threading.Event()

    def buffered_reader():
        fd = os.open(image, os.O_RDONLY)
        try:
            rng = random.Random(9)
            while not stop.wait(0.001):
                os.pread(fd, 4096, rng.randrange(4096) * 4096)
        finally:
            os.close(fd)

    with DaemonProc(tmp_path, image, "--uri", "", max_hold="8M", interval=1, env=env) as d:
        d.wait_status(lambda s: s.get("cycle", 0) >= 2, "two cycles")
        direct = [fd for fd in os.listdir(f"/proc/{d.pid}/fd")
                  if os.path.realpath(f"/proc/{d.pid}/fd/{fd}") == image
                  and "flags:\t" in (info := open(f"/proc/{d.pid}/fdinfo/{fd}").read())
                  and int(info.split("flags:\t")[1].split()[0], 8) & os.O_DIRECT]
        assert direct, "the daemon holds no O_DIRECT descriptor of the image: nothing tested"
        reader = threading.Thread(target=buffered_reader, daemon=True)
        reader.start()
        try:
            time.sleep(1)
            r = vmdt("advise", image, "--duration", "4", "--json", "--save", "", timeout=60,
                     env=env)
            text = vmdt("advise", image, "--duration", "1", "--save", "", timeout=60, env=env)
        finally:
            stop.set()
            reader.join(5)
        assert d.alive(), d.output()[-2000:]
    assert_clean(r.stderr)
    assert r.returncode == 0, r.stderr
    disk = json.loads(r.stdout)["disks"][0]
    assert disk["cache"] == "writethrough" and disk["seen_by"] == "page cache", disk
    assert disk["reads_per_second"] > 50, disk
    assert disk["advice"]["verdict"] != "no_reads", disk["advice"]
    assert disk["daemon_pid"] == d.pid, disk
    assert f"{image}: served by vmdisktouch (pid {d.pid})" in text.stdout, text.stdout


# -- 5: the interrupted PNG -----------------------------------------------------------------

@fault("advise-png-interrupted", "Ctrl-C to `advise IMG --duration 60 --png F` 3 s into its "
       "window", "the PNG says the seconds actually watched (it said \"watched 60 s\" "
       "after 14.7 s)",
       "the PNG's header line, pixel for pixel, is `advise: 1 disk watched S s of 60 s "
       "(interrupted)`, S the report's seconds (about 3)", case="54 weak png seconds")
def _(tmp_path, image):
    from vmdisktouch.adapters.pictures.figure import LINE, PAD, TEXT, load_font
    from vmdisktouch.adapters.pictures.host_render import BG
    png = tmp_path / "advise.png"
    p = advise_child([image, "--cache", "none", "--duration", "60", "--png", png, "--json",
                      "--save", ""])
    try:
        deadline = time.monotonic() + 20
        while not instances_of(p.pid):
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()
            time.sleep(0.1)
        time.sleep(3)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    seconds = json.loads(out)["disks"][0]["seconds"]
    assert 2 < seconds < 10, seconds
    said = f"advise: 1 disk watched {seconds:.1f} s of 60 s (interrupted)"
    with Image.open(png) as im:
        got = im.convert("RGB").crop((0, PAD, im.width, PAD + LINE))
    want = Image.new("RGB", got.size, BG)
    ImageDraw.Draw(want).text((PAD, 0), said, fill=TEXT, font=load_font())
    assert ImageChops.difference(got, want).getbbox() is None, \
        f"the PNG's header is not {said!r}"


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)
LIBVIRT = {"advise-save-libvirt-disk"}


def _run(row, tmp_path) -> None:
    image = data_image(tmp_path / "disk.img", 64 * MiB)
    kept = Untouched(image)
    row.check(tmp_path, str(image))
    kept.check()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("row", [r for r in ROWS if r.id not in LIBVIRT],
                         ids=[r.id for r in ROWS if r.id not in LIBVIRT])
def test_round4_advise_fault(row, tmp_path):
    _run(row, tmp_path)


@pytest.mark.qemu
@pytest.mark.timeout(180)
@pytest.mark.parametrize("row", [r for r in ROWS if r.id in LIBVIRT],
                         ids=[r.id for r in ROWS if r.id in LIBVIRT])
def test_round4_advise_libvirt_fault(row, tmp_path, libvirt_daemons):  # noqa: F811
    _run(row, tmp_path)
