"""Why ``adopt`` refuses ``io='native'``: an adopted disk's hits wait behind its misses.

QEMU cannot change a node's ``aio`` on a reopen, so a ``cache=none`` disk opened with
``aio=native`` (Linux AIO) keeps it once adopted, on a descriptor without O_DIRECT. Linux
AIO on buffered I/O is synchronous: ``io_submit`` of a read that misses the page cache
returns only once the device has answered, inside QEMU's event loop, and every other
request of the disk waits for it. ``aio=threads`` hands each read to a worker.

For each mode: ``qemu-storage-daemon`` opens a 1 GiB image (this machine's disk) as a
``cache=none`` disk does (``cache.direct=on``, ``aio=MODE``), exports it over NBD, and is
switched as adopt switches it (QMP ``blockdev-reopen``, ``cache.direct`` false, read
back), in a 160 MiB memory group so that the reads of the rest keep missing. A 64 MiB
hot range is read into the page cache. Then fio (nbd engine) reads the
hot range, 4 KiB random at queue depth 1 (all hits), alone and beside a second fio
reading the other 960 MiB, 4 KiB random at queue depth 4 (misses). The figure is the hit
reader's mean latency beside the misses over its latency alone, per mode, side by side.

    .venv/bin/python benchmarks/bench_adopt_aio.py [--seconds 15] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.report import provenance  # noqa: E402
from tests.support.blockdev import loop_device, read_throttle  # noqa: E402
from tests.support.cgroup import MemoryCgroup  # noqa: E402
from tests.support.common import require_tool, stop_process  # noqa: E402
from tests.support.images import evict  # noqa: E402

MiB = 1 << 20
SIZE, HOT = 1024 * MiB, 64 * MiB
LIMIT = 160 * MiB      # QEMU's memory group: the hot range stays cached, the misses stay misses


class Qmp:
    """A QMP connection: one command at a time, its ``return`` or an error."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.f = self.sock.makefile("rw")
        json.loads(self.f.readline())                      # the greeting
        self.run("qmp_capabilities")

    def run(self, command: str, **arguments):
        self.f.write(json.dumps({"execute": command, "arguments": arguments}) + "\n")
        self.f.flush()
        while True:
            reply = json.loads(self.f.readline())
            if "event" in reply:
                continue
            if "error" in reply:
                raise RuntimeError(f"{command}: {reply['error']['desc']}")
            return reply["return"]

    def close(self):
        self.sock.close()


def fio(uri: str, name: str, *, offset: int, size: int, depth: int, seconds: float,
        rw: str = "randread") -> subprocess.Popen:
    return subprocess.Popen(
        [require_tool("fio"), f"--name={name}", "--ioengine=nbd", f"--uri={uri}",
         f"--rw={rw}", "--bs=4k", f"--iodepth={depth}", f"--offset={offset}",
         f"--size={size}", *(["--time_based", f"--runtime={seconds:g}"] if seconds else []),
         "--norandommap", "--output-format=json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p: subprocess.Popen) -> tuple[float, float]:
    """(reads/s, mean latency µs) of a finished fio."""
    out, err = p.communicate(timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"fio: {err.strip()[-300:]}")
    job = json.loads(out[out.index("{"):])["jobs"][0]["read"]
    return job["iops"], job["clat_ns"]["mean"] / 1000


def one_mode(work: str, image: str, aio: str, seconds: float, cg: MemoryCgroup) -> dict:
    sock, qmp_sock = os.path.join(work, f"{aio}.nbd"), os.path.join(work, f"{aio}.qmp")
    uri = f"nbd+unix:///disk?socket={sock}"
    driver = "host_device" if image.startswith("/dev/") else "file"
    file_node = {"driver": driver, "filename": image, "node-name": "file0",
                 "cache": {"direct": True}, "aio": aio}
    qsd = cg.popen(
        [require_tool("qemu-storage-daemon"), "--blockdev", json.dumps(file_node),
         "--blockdev", json.dumps({"driver": "raw", "node-name": "disk0", "file": "file0"}),
         "--nbd-server", f"addr.type=unix,addr.path={sock}",
         "--export", "type=nbd,id=e0,node-name=disk0,name=disk,writable=off",
         "--chardev", f"socket,id=qmp,path={qmp_sock},server=on,wait=off",
         "--monitor", "chardev=qmp"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not (os.path.exists(qmp_sock) and os.path.exists(sock)):
            if qsd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"qemu-storage-daemon: {qsd.stderr.read().decode()[-300:]}")
            time.sleep(0.05)
        qmp = Qmp(qmp_sock)
        qmp.run("blockdev-reopen", options=[{**file_node, "cache": {"direct": False}}])
        nodes = {n["node-name"]: n for n in qmp.run("query-named-block-nodes", flat=True)}
        assert nodes["file0"]["cache"]["direct"] is False, nodes["file0"]
        qmp.close()
        evict(image)
        result(fio(uri, "warm", offset=0, size=HOT, depth=1, seconds=0, rw="read"))
        alone = result(fio(uri, "hits", offset=0, size=HOT, depth=1, seconds=seconds))
        evict_rest = os.open(image, os.O_RDONLY)
        os.posix_fadvise(evict_rest, HOT, 0, os.POSIX_FADV_DONTNEED)
        os.close(evict_rest)
        miss = fio(uri, "misses", offset=HOT, size=SIZE - HOT, depth=4, seconds=seconds + 2)
        time.sleep(1)
        beside = result(fio(uri, "hits", offset=0, size=HOT, depth=1, seconds=seconds))
        misses = result(miss)
        return {"aio": aio, "alone_iops": alone[0], "alone_us": alone[1],
                "beside_iops": beside[0], "beside_us": beside[1],
                "miss_iops": misses[0], "miss_us": misses[1]}
    finally:
        stop_process(qsd)


def rounds(work: str, image: str, args) -> list[dict]:
    rows = []
    for _ in range(args.rounds):
        for aio in args.modes + args.modes[::-1]:
            with MemoryCgroup("adopt-aio", LIMIT) as cg:
                rows.append(one_mode(work, image, aio, args.seconds, cg))
            r = rows[-1]
            print(f"{aio:8} hits alone {r['alone_iops']:8,.0f}/s {r['alone_us']:7.1f} µs | "
                  f"beside misses {r['beside_iops']:8,.0f}/s {r['beside_us']:7.1f} µs | "
                  f"misses {r['miss_iops']:6,.0f}/s {r['miss_us']:7.1f} µs", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2, help="each an A B B A of the two modes")
    ap.add_argument("--dir", default="/var/tmp", help="where the image goes (this disk)")
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["native", "threads"],
                    help="the aio modes, A B B A (default native,threads; io_uring too)")
    ap.add_argument("--throttle", type=int, default=0, metavar="READS",
                    help="a slow device instead: the image on a loop device whose reads are "
                         "held to READS a second (a blkio throttle), as a loaded array")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="vdt-adopt-aio-", dir=args.dir)
    try:
        image = os.path.join(work, "disk.img")
        with open(image, "wb") as f:                      # data, not holes: reads hit the disk
            for _ in range(SIZE // MiB):
                f.write(os.urandom(MiB))
        evict(image)
        with contextlib.ExitStack() as stack:
            if args.throttle:
                image = stack.enter_context(loop_device(image, direct_io=True))
                stack.enter_context(read_throttle(image, args.throttle))
            rows = rounds(work, image, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(provenance())
    print("| aio | hits alone: reads/s, µs | hits beside misses: reads/s, µs | "
          "hit latency beside ÷ alone | misses: reads/s, µs |")
    print("|---|---|---|---|---|")
    for aio in args.modes:
        mine = [r for r in rows if r["aio"] == aio]
        m = lambda k: statistics.median(r[k] for r in mine)   # noqa: E731
        print(f"| {aio} | {m('alone_iops'):,.0f}, {m('alone_us'):.1f} | "
              f"{m('beside_iops'):,.0f}, {m('beside_us'):.1f} | "
              f"**{statistics.median(r['beside_us'] / r['alone_us'] for r in mine):.1f} ×** | "
              f"{m('miss_iops'):,.0f}, {m('miss_us'):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
