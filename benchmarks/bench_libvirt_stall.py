"""The loop's longest gap while libvirt does not answer, side by side with an older commit.

Runs tests/e2e/test_libvirt_stall.py (a private libvirtd SIGSTOPped for 6 s
under a ``run --libvirt`` host service with 1 s cycles and a 3 s watchdog;
then a QEMU monitor held 15 s by ``qemu-io "sleep 15000"``) with ``pytest -s``
on this checkout, and on a ``git worktree`` of ``--compare-rev`` (default
d05ed3f, before issue 40's worker thread) with the same test files copied in
(the older code fails the test: its figures are still printed), and prints
each figure of both and their ratio. The worktree is removed at the end.

    .venv/bin/python benchmarks/bench_libvirt_stall.py [--compare-rev d05ed3f]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("tests/support/private_libvirt.py", "tests/e2e/test_libvirt_stall.py")
STALL = re.compile(r"libvirtd stopped ([\d.]+) s: longest status gap ([\d.]+) s, longest "
                   r"watchdog gap ([\d.]+) s, least VmLck (\d+); released ([\d.]+) s")
JOB = re.compile(r"monitor job: longest status gap ([\d.]+) s, watchdog gap ([\d.]+) s, "
                 r"SIGTERM took ([\d.]+) s")


def run(tree: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                        "tests/e2e/test_libvirt_stall.py"], cwd=tree, capture_output=True,
                       text=True, timeout=900)
    out, fig = r.stdout + r.stderr, {"passed": r.returncode == 0}
    if m := STALL.search(out):
        fig.update(stall_gap=float(m[2]), stall_ping=float(m[3]), vmlck=int(m[4]),
                   released=float(m[5]))
    if m := JOB.search(out):
        fig.update(job_gap=float(m[1]), job_ping=float(m[2]), job_sigterm=float(m[3]))
    return fig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare-rev", default="d05ed3f")
    args = ap.parse_args()
    old = tempfile.mkdtemp(prefix="vdt-stall-old-")
    os.rmdir(old)
    subprocess.run(["git", "worktree", "add", "-q", "--detach", old, args.compare_rev],
                   cwd=ROOT, check=True)
    try:
        for f in FILES:
            shutil.copy(os.path.join(ROOT, f), os.path.join(old, f))
        now, then = run(ROOT), run(old)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", old], cwd=ROOT)
    print(f"{'figure':<34} {'current':>9} {args.compare_rev:>9} {'ratio':>7}")
    for key in ("stall_gap", "stall_ping", "released", "job_gap", "job_ping", "job_sigterm"):
        a, b = now.get(key), then.get(key)
        ratio = f"{a / b:.2f}" if a is not None and b else "-"
        print(f"{key + ' (s)':<34} {a if a is not None else '-':>9} "
              f"{b if b is not None else '-':>9} {ratio:>7}")
    print(f"test passed: current {now['passed']}, {args.compare_rev} {then['passed']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
