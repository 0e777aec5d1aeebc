"""`vmdisktouch snapshot` end to end: golden output, JSON vs fincore, PNG, read-only, 1 TiB.

The CLI runs in a subprocess on images in the real page cache. States are
built with tests/support/pagecache.read_range (no readahead) and held with mlock
while they are measured (``held``): DAMON here pages out page cache it
judges idle, sometimes within seconds of the read. Every image's
first pages are read beforehand: open_image reads the first bytes (the qcow2
magic), and a cache hit there triggers no readahead, so the state the
snapshot sees is exactly the one the test built.

Golden files live in tests/golden/; the temporary directory and the elapsed
time are masked. Regenerate them with ``VMDT_UPDATE_GOLDEN=1`` (then review
the diff).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.support.images import evict, make_image
from tests.support.pagecache import PAGE, fincore_pages, held, page_ranges, vmtouch_pages
from vmdisktouch.commands import snapshot
from vmdisktouch.adapters.pictures import figure, render

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
MiB = 1 << 20
GiB = 1 << 30


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "vmdisktouch", "snapshot", *map(str, args)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def merged(reads, size):
    return page_ranges(reads, size)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("VMDT_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


# ---------------------------------------------------------------------------
# The deterministic case of the golden files

# 16 MiB + 3 pages + 100 bytes (odd tail block), three read ranges.
DET_SIZE = 16 * MiB + 3 * PAGE + 100
DET_READS = [(0, 16 * PAGE), (3 * MiB + PAGE, MiB), (16 * MiB + PAGE, 2 * PAGE + 100)]
FULL_SIZE = 2 * MiB + 5


@pytest.fixture
def det_images(tmp_path):
    a = make_image(tmp_path / "a.raw", DET_SIZE, sparse=False)
    b = make_image(tmp_path / "b.raw", FULL_SIZE, sparse=False)
    evict(a)
    evict(b)
    with held(a, DET_READS), held(b, [(0, FULL_SIZE)]):
        yield a, b


def mask(text: str, tmp_path) -> str:
    text = text.replace(str(tmp_path), "TMP")
    text = re.sub(r"(Elapsed: )\d+\.\d{6}( seconds)", r"\g<1>X\2", text)
    return re.sub(r'("scan_seconds": )[0-9.e-]+', r"\1X", text)


def test_summary_golden(det_images, tmp_path):
    proc = run_cli(*det_images)
    assert proc.returncode == 0 and proc.stderr == ""
    check_golden("snapshot_summary.txt", mask(proc.stdout, tmp_path))
    assert re.search(r"Elapsed: \d+\.\d{6} seconds", proc.stdout)


def test_json_golden(det_images, tmp_path):
    proc = run_cli("--json", *det_images)
    assert proc.returncode == 0 and proc.stderr == ""
    check_golden("snapshot.json", mask(proc.stdout, tmp_path))
    recs = json.loads(proc.stdout)
    assert recs[0]["resident_ranges"] == merged(DET_READS, DET_SIZE)
    assert recs[1]["resident_ranges"] == [[0, FULL_SIZE]]


def test_json_keys_and_values_match_fincore(det_images):
    a, b = det_images
    recs = json.loads(run_cli("--json", a, b).stdout)
    fin = [fincore_pages(a), fincore_pages(b)]
    vmt = [vmtouch_pages(a), vmtouch_pages(b)]
    assert [r["resident_pages"] for r in recs] == fin == vmt
    for rec, path, size in zip(recs, det_images, (DET_SIZE, FULL_SIZE)):
        assert set(rec) == {"path", "size_bytes", "page_size", "total_pages", "resident_pages",
                            "block_size", "scan_seconds", "resident_ranges", "kind", "format",
                            "used_cachestat", "partial_view", "note"}
        assert rec["path"] == path and rec["size_bytes"] == size
        assert rec["page_size"] == PAGE and rec["total_pages"] == -(-size // PAGE)
        assert rec["block_size"] == MiB and rec["kind"] == "file" and rec["format"] == "raw"
        assert rec["used_cachestat"] is True and rec["note"] is None
        assert 0 <= rec["scan_seconds"] < 5
        pages = sum(-(-n // PAGE) for _, n in rec["resident_ranges"])
        assert pages == rec["resident_pages"]
        ends = [o + n for o, n in rec["resident_ranges"]]
        starts = [o for o, _ in rec["resident_ranges"]]
        assert all(e < s for e, s in zip(ends, starts[1:]))        # merged, sorted, disjoint


def test_block_size_option(det_images):
    a, _ = det_images
    rec = json.loads(run_cli("--json", "--block-size", "64K", a).stdout)[0]
    assert rec["block_size"] == 64 * 1024
    assert rec["resident_pages"] == fincore_pages(a)
    assert rec["resident_ranges"] == merged(DET_READS, DET_SIZE)


def test_snapshot_does_not_change_what_it_measures(tmp_path):
    img = make_image(tmp_path / "cold.raw", 16 * MiB, sparse=False)
    evict(img)
    assert fincore_pages(img) == 0
    rec = json.loads(run_cli("--json", img).stdout)[0]
    after = fincore_pages(img)
    assert (rec["resident_pages"], after) == (0, 0)


# ---------------------------------------------------------------------------
# Pure formatting


def test_format_summary_percent_and_sizes():
    rec = {"path": "/x", "kind": "block", "format": "raw", "resident_pages": 1,
           "total_pages": 3, "page_size": 4096, "size_bytes": 3 * 4096 - 10,
           "scan_seconds": 0.5, "note": None}
    assert snapshot.format_summary(rec) == (
        "          Image: /x\n"
        "           Type: block device, raw\n"
        " Resident Pages: 1/3  4K/12K  33.3%\n"
        "        Elapsed: 0.500000 seconds")


def test_format_json_is_valid_and_compact_per_range():
    recs = [{"path": "p", "resident_ranges": [[0, 4096], [8192, 4096]]},
            {"path": "q", "resident_ranges": []}]
    text = snapshot.format_json(recs)
    assert json.loads(text) == recs
    assert "    [0, 4096],\n" in text
    assert snapshot.format_json([]) == "[]\n"


# ---------------------------------------------------------------------------
# PNG


def pixels(path):
    with Image.open(path) as im:
        assert im.format == "PNG"
        im.load()
        return im.convert("RGB").size, np.asarray(im.convert("RGB"))


def grid(path, width, height, scale):
    """The map's pixels, one RGB row per map pixel, out of the composed figure."""
    with Image.open(path) as im:
        assert im.format == "PNG" and im.width >= 512
        return figure.grid_pixels(im, width, height, scale)


def test_png_block_map(tmp_path):
    img = make_image(tmp_path / "d.raw", 60 * MiB)        # sparse; 4 padding pixels at 8 wide
    out = tmp_path / "map.png"
    proc = run_cli("--png", out, "--blocks-per-pixel", 1, "--width", 8, img)
    assert proc.returncode == 2 and "not allowed with" in proc.stderr   # exclusive options
    with held(img, [(0, 8 * MiB), (16 * MiB, MiB // 2), (59 * MiB, MiB)]):
        proc = run_cli("--png", out, "--width", 8, "--scale", 4, img)
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"Map: {re.escape(str(out))} \(\d+x\d+ pixels, 1 block per pixel\)",
                     proc.stdout), proc.stdout
    flat = grid(out, 8, 8, 4)
    green = np.asarray(render.CACHED, dtype=float)
    assert (flat[:8] == render.CACHED).all()              # blocks 0-7 fully cached
    assert tuple(flat[16]) == tuple((green / 2).round().astype(int))    # block 16 half cached
    assert tuple(flat[59]) == render.CACHED
    others = [i for i in range(60) if i not in (*range(8), 16, 59)]
    assert {tuple(p) for p in flat[others]} <= set(render.HOLE)   # holes, nothing cached
    assert (flat[60:] == render.PADDING).all()            # after the end of the image
    assert sorted(os.listdir(tmp_path)) == ["d.raw", "map.png"]   # no temporary left


def test_png_shows_the_holes_of_a_sparse_image_apart_from_uncached_data(tmp_path):
    img = make_image(tmp_path / "s.raw", 64 * MiB)                  # all a hole...
    with open(img, "r+b") as f:                                     # ...but blocks 8-15
        f.seek(8 * MiB)
        f.write(os.urandom(8 * MiB))
    evict(img)
    out = tmp_path / "map.png"
    proc = run_cli("--png", out, "--width", 8, "--scale", 8, img)
    assert proc.returncode == 0, proc.stderr
    flat = grid(out, 8, 8, 8)
    assert (flat[8:16] == 0).all()                                  # data, not cached
    hole = [tuple(p) for i, p in enumerate(flat) if not 8 <= i < 16]
    assert set(hole) <= set(render.HOLE) and len(hole) == 56


def test_png_blocks_per_pixel(tmp_path):
    img = make_image(tmp_path / "d.raw", 64 * MiB)
    out = tmp_path / "map.png"
    with held(img, [(0, 4 * MiB), (32 * MiB, MiB)]):
        proc = run_cli("--json", "--png", out, "--blocks-per-pixel", 4, img)
        fin = fincore_pages(img)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)[0]["resident_pages"] == fin == 5 * MiB // PAGE
    flat = grid(out, 4, 4, figure.fit_scale(4, None))     # 16 pixels: 4 x 4
    green = np.asarray(render.CACHED, dtype=float)
    assert tuple(flat[0]) == render.CACHED                # blocks 0-3 all cached
    assert tuple(flat[8]) == tuple((green / 4).round().astype(int))   # 32-35: one of four
    rest = flat[[i for i in range(16) if i not in (0, 8)]]
    assert {tuple(p) for p in rest} <= set(render.HOLE)    # holes of the sparse file


def test_png_unwritable_target_is_one_line(tmp_path):
    img = make_image(tmp_path / "d.raw", MiB)
    bad = tmp_path / "no-such-dir" / "map.png"
    proc = run_cli("--png", bad, img)
    assert proc.returncode == 78 and "Traceback" not in proc.stderr   # checked before the scan
    assert proc.stderr == (f"vmdisktouch: refusing --png {bad}: its directory "
                           f"{bad.parent} does not exist\n")
    assert proc.stdout == ""


# ---------------------------------------------------------------------------
# Read-only


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def test_snapshot_is_read_only(tmp_path):
    img = make_image(tmp_path / "d.raw", 32 * MiB + 123, sparse=False)
    before_sum = digest(img)                 # reads the file (may touch atime) first
    before = os.stat(img)
    for args in ([img], ["--json", img], ["--png", tmp_path / "m.png", img],
                 ["--block-size", "4K", "--json", img]):
        assert run_cli(*args).returncode == 0
    after = os.stat(img)
    assert (after.st_mtime_ns, after.st_ctime_ns, after.st_size) == \
        (before.st_mtime_ns, before.st_ctime_ns, before.st_size)
    assert after.st_atime_ns == before.st_atime_ns          # O_NOATIME
    assert digest(img) == before_sum


# ---------------------------------------------------------------------------
# Scale: 1 TiB sparse image


def test_one_tib_sparse_image(tmp_path):
    img = make_image(tmp_path / "huge.raw", 1 << 40)     # sparse: takes no space
    rng = np.random.default_rng(2024)
    mibs = rng.choice(1 << 20, size=300, replace=False)
    reads = [(0, 64 * 1024)]
    for i, m in enumerate(sorted(int(x) for x in mibs)):
        if i % 3 == 0:
            reads.append((m * MiB, 2 * MiB))                       # 2 whole blocks
        elif i % 3 == 1:
            reads.append((m * MiB + 5 * PAGE, MiB + 7 * PAGE))     # straddles a boundary
        else:
            reads.append((m * MiB + 100 * PAGE, 37 * PAGE))        # inside one block
    reads.append(((1 << 40) - 3 * MiB, 3 * MiB))                   # the very end
    with held(img, reads):
        proc = run_cli("--json", img)
        fin = fincore_pages(img)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(proc.stdout)[0]
    want = merged(reads, 1 << 40)
    assert rec["size_bytes"] == 1 << 40 and rec["total_pages"] == (1 << 40) // PAGE
    assert rec["resident_pages"] == fin == sum(n for _, n in want) // PAGE
    assert 200 * MiB < rec["resident_pages"] * PAGE < 400 * MiB      # a few hundred MiB
    assert rec["resident_ranges"] == want
    assert rec["used_cachestat"] is True


def test_without_cachestat_the_mincore_fallback_sees_the_same_pages(tmp_path):
    """VMDISKTOUCH_NO_CACHESTAT=1 scans as on a kernel before 6.5 (bench_scan measures it)."""
    img = make_image(tmp_path / "d.raw", 64 * MiB)
    with held(img, [(0, 4 * MiB), (40 * MiB, MiB)]):
        fast = run_cli("--json", img)
        env = dict(os.environ, VMDISKTOUCH_NO_CACHESTAT="1")
        slow = subprocess.run([sys.executable, "-m", "vmdisktouch", "snapshot", "--json", img],
                              cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    a, b = json.loads(fast.stdout)[0], json.loads(slow.stdout)[0]
    assert a["used_cachestat"] is True and b["used_cachestat"] is False
    assert a["resident_pages"] == b["resident_pages"] == 5 * MiB // PAGE
