"""``vmdisktouch advise`` run while the test traces the same image's direct reads itself."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.support.common import ROOT
from vmdisktouch.core.mrc import MissRatioCurve
from vmdisktouch.system.image import open_image
from vmdisktouch.system.trace.direct_io import DirectIOTracer

PAGE = 4096


def advise_traced(image: str, *argv) -> tuple[subprocess.CompletedProcess, MissRatioCurve, int]:
    """``vmdisktouch advise ARGV`` while this process traces ``image``'s direct reads too
    (drained every 0.2 s): (its result, the exact LRU curve over those reads, every page,
    no sampling; the events this tracer lost). ARGV names what advise watches: ``image``,
    or ``--libvirt``."""
    exact = MissRatioCurve(rate=1.0, max_pages=None, half_life=0.0, steady=True)
    lost = 0
    with open_image(image) as img, \
            DirectIOTracer(img, name=f"vmdisktouch@test-exact-{os.getpid()}",
                           buffer_kb=8192) as tr:
        p = subprocess.Popen([sys.executable, "-m", "vmdisktouch", "advise",
                              *map(str, argv)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            while True:
                done = p.poll() is not None
                ev = tr.drain()
                lost += ev.lost
                exact.feed(ev.offset[~ev.write] // PAGE)
                if done:
                    break
                time.sleep(0.2)
            out, err = p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), exact, lost
