"""What adopting does to a guest that writes, beside advise's forecast of it.

An adopted disk keeps the guest's write cache (QEMU's ``cache.writeback``), so a write
is copied into the page cache and done, and the guest's flush writes it back; a switch
to ``cache=writethrough`` makes every write wait for a flush. ``advise`` forecasts the
adoption taking a guest that flushes after each write (the bound:
``core.what_if``, "Adopting instead"). This measures both guests.

``qemu-storage-daemon`` opens a 256 MiB image of this machine's disk as a
``cache=none`` disk does (``cache.direct=on``, ``aio=threads``) and exports it over
NBD; ``adopted`` is the same switched as adopt switches it (QMP ``blockdev-reopen``,
``cache.direct`` false); ``writethrough`` the same with the export's writethrough
on (a flush after each write). fio (nbd engine) does 4 KiB random I/O at queue depth 1,
80 % reads, with ``--fsync 0`` (no flush) and ``--fsync 1`` (a flush after each
write), in the order none, adopted, writethrough, writethrough, adopted, none. Before them, a
``none`` run of its own (not counted) runs ``vmdisktouch advise IMAGE --cache none`` on
the image while fio runs: its ``adopted`` forecast (reads a second then over now).

    .venv/bin/python benchmarks/bench_adopt_writes.py [--seconds 12] [--advise-seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_adopt_aio import Qmp  # noqa: E402
from benchmarks.report import provenance  # noqa: E402
from tests.support.common import require_tool, stop_process  # noqa: E402
from tests.support.images import evict  # noqa: E402

MiB = 1 << 20
SIZE = 256 * MiB
ORDER = ("none", "adopted", "writethrough", "writethrough", "adopted", "none")


def serve(work: str, image: str, mode: str) -> tuple[subprocess.Popen, str]:
    """qemu-storage-daemon exporting ``image`` as ``mode`` opens it; (process, NBD URI)."""
    sock, qmp_sock = os.path.join(work, f"{mode}.nbd"), os.path.join(work, f"{mode}.qmp")
    for p in (sock, qmp_sock):
        if os.path.exists(p):
            os.unlink(p)
    node = {"driver": "file", "filename": image, "node-name": "f0", "cache": {"direct": True},
            "aio": "threads"}
    wt = "on" if mode == "writethrough" else "off"
    q = subprocess.Popen(
        [require_tool("qemu-storage-daemon"), "--blockdev", json.dumps(node),
         "--blockdev", json.dumps({"driver": "raw", "node-name": "d0", "file": "f0"}),
         "--nbd-server", f"addr.type=unix,addr.path={sock}",
         "--export", f"type=nbd,id=e0,node-name=d0,name=disk,writable=on,writethrough={wt}",
         "--chardev", f"socket,id=qmp,path={qmp_sock},server=on,wait=off",
         "--monitor", "chardev=qmp"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not (os.path.exists(qmp_sock) and os.path.exists(sock)):
        if q.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"qemu-storage-daemon: {q.stderr.read().decode()[-300:]}")
        time.sleep(0.05)
    if mode != "none":
        m = Qmp(qmp_sock)
        m.run("blockdev-reopen", options=[{**node, "cache": {"direct": False}}])
        m.close()
    return q, f"nbd+unix:///disk?socket={sock}"


def fio(uri: str, seconds: float, fsync: int) -> subprocess.Popen:
    return subprocess.Popen(
        [require_tool("fio"), "--name=g", "--ioengine=nbd", f"--uri={uri}", "--rw=randrw",
         "--rwmixread=80", "--bs=4k", "--iodepth=1", f"--size={SIZE}", "--norandommap",
         "--time_based", f"--runtime={seconds:g}", f"--fsync={fsync}",
         "--output-format=json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def reads_per_second(p: subprocess.Popen) -> float:
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"fio: {err.strip()[-300:]}")
    return json.loads(out[out.index("{"):])["jobs"][0]["read"]["iops"]


def advise(image: str, seconds: float) -> dict:
    r = subprocess.run([sys.executable, "-m", "vmdisktouch", "advise", image, "--cache", "none",
                        "--duration", f"{seconds:g}", "--json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=seconds + 300)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"advise: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)["disks"][0]["advice"]


def one(work: str, image: str, mode: str, fsync: int, args, with_advice: bool) -> dict:
    q, uri = serve(work, image, mode)
    try:
        evict(image)
        reads_per_second(fio(uri, 4, fsync))                      # warm the page cache
        p = fio(uri, args.advise_seconds + 10 if with_advice else args.seconds, fsync)
        advice = advise(image, args.advise_seconds) if with_advice else None
        return {"mode": mode, "reads": reads_per_second(p), "advice": advice}
    finally:
        stop_process(q)


def forecast(advice: dict) -> float | None:
    a = (advice or {}).get("adopted") or {}
    now, then = (a.get("now") or {}).get("reads_per_second"), (a.get("then") or {}).get(
        "reads_per_second")
    return then / now if now and then else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=12)
    ap.add_argument("--advise-seconds", type=float, default=20)
    args = ap.parse_args()
    work = tempfile.mkdtemp(dir="/var/tmp", prefix="vdt-adopt-writes-")
    try:
        image = os.path.join(work, "d.img")
        with open(image, "wb") as f:
            for _ in range(SIZE // MiB):
                f.write(os.urandom(MiB))
        rows = []
        for fsync in (0, 1):
            advice = one(work, image, "none", fsync, args, with_advice=True)["advice"]
            runs = [one(work, image, mode, fsync, args, with_advice=False) for mode in ORDER]
            for r in runs:
                print(f"fsync={fsync} {r['mode']:12} {r['reads']:9,.0f} reads/s", flush=True)
            by = {m: statistics.mean(r["reads"] for r in runs if r["mode"] == m) for m in ORDER}
            rows.append((fsync, by, forecast(advice), advice))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(provenance())
    print("| guest | none reads/s | adopted | writethrough | adopted / none | "
          "advise's adopted forecast | its verdict |")
    print("|---|---|---|---|---|---|---|")
    for fsync, by, fc, advice in rows:
        a = (advice or {}).get("adopted") or {}
        print(f"| {'a flush after each write' if fsync else 'no flush'} | {by['none']:,.0f} | "
              f"{by['adopted']:,.0f} | {by['writethrough']:,.0f} | "
              f"{by['adopted'] / by['none']:.2f} x | "
              f"{'-' if fc is None else f'{fc:.2f} x'} | {a.get('verdict', '-')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
