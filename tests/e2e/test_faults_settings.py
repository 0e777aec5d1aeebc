"""Fault table, issue 31 (weak 8, weak 9): settings that make the daemon useless, and the cap.

Weak 8: a value past a setting's floor or ceiling (``config/settings.py``:
each bound defined once with the setting, with why) is refused at start,
exit 78, in one line naming the flag, or the file and the key; a threshold
no heat can reach (at or above ``amp_resident + amp_rewritten``) likewise.
Before, ``--decay 1e-320`` was accepted and nothing was ever held.

Weak 9: a guest in a memory-limited cgroup keeps its zone mapped, so the
recharge's drop cannot take the pages and the reload finds them still the
guest's: they are ceded. The status of that cycle showed the figures from
before the cede (the group over its cap, "back under by the next sample");
now every status shows the group within its cap. The group's unevictable
stays within the bound of ``core/charges.py``'s docstring. See
``tests/support/faultkit.py`` and ``docs/faults.md``.
"""

from __future__ import annotations

import sys
import time

import pytest

from tests.support.faultkit import EX_CONFIG, MiB, Untouched, assert_refused, fault, rows_of, vmdt
from tests.support.faultkit import image  # noqa: F401 - the rows' fixture
from tests.support.pagecache import GUEST_MAPPER
from tests.support.common import WorkloadError

RUN = ("--uri", "", "--min-free", "0", "--interval", "0.2")
START = "the daemon refuses to start; the image is untouched; nothing is held"
W8, W9 = "31 weak 8", "31 weak 9"


def run(image, *args):
    # a daemon that starts (the old code) runs until the timeout: a failure
    return vmdt("run", image, *RUN, *args, timeout=20)


def config(tmp_path, text: str) -> str:
    path = tmp_path / "vm.toml"
    path.write_text(text)
    return str(path)


def one_line(r, needle: str) -> None:
    assert_refused(r, EX_CONFIG, needle)
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


# -- weak 8: floors and ceilings ----------------------------------------------------

BELOW_FLOOR = [
    ("decay-1e-320", ["--decay", "1e-320"], "option --decay: bad value '1e-320' for decay "
     "(expected a number: must be >= 0.0001)"),
    ("threshold-1e-320", ["--threshold", "1e-320"], "option --threshold: bad value"),
    ("checksum-share-1e-320", ["--checksum-share", "1e-320"], "option --checksum-share: bad"),
    ("amplitudes-zero", ["--amp-resident", "0", "--amp-rewritten", "0"],
     "option --amp-resident: threshold 0.05 is not below amp_resident + amp_rewritten = 0"),
]
for _id, _args, _needle in BELOW_FLOOR:
    fault(f"flag-{_id}", f"`run IMG --max-hold 8M {' '.join(_args)}`", START,
          f"exit 78, one line: `{_needle}`", W8)(
        lambda tmp_path, image, args=_args, needle=_needle: one_line(
            run(image, "--max-hold", "8M", *args), needle))


@fault("config-decay-1e-320", "`decay = 1e-320` in the config file", START,
       "exit 78, one line: `FILE: key decay: bad value 1e-320 for decay`", W8)
def _(tmp_path, image):
    cfg = config(tmp_path, 'max_hold = "8M"\ndecay = 1e-320\n')
    one_line(run(image, "--config", cfg), f"{cfg}: key decay: bad value 1e-320 for decay")


@fault("config-threshold-unreachable", "`threshold = 3` in the config file (amp_resident + "
       "amp_rewritten = 2: no block ever reaches it)", START,
       "exit 78, one line: `FILE: key threshold: threshold 3 is not below amp_resident + "
       "amp_rewritten = 2 ... nothing could ever be held`", W8)
def _(tmp_path, image):
    cfg = config(tmp_path, 'max_hold = "8M"\nthreshold = 3\n')
    one_line(run(image, "--config", cfg), f"{cfg}: key threshold: threshold 3 is not below")


@fault("config-check-decay-1e-320", "`vmdisktouch config --check FILE`, FILE with "
       "`decay = 1e-320`", "refused as `run` would", "exit 78, one line: `FILE: key decay`", W8)
def _(tmp_path, image):
    cfg = config(tmp_path, 'max_hold = "8M"\ndecay = 1e-320\n')
    r = vmdt("config", "--check", cfg)
    assert r.returncode == EX_CONFIG and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert r.stderr.strip().splitlines() == [
        f"vmdisktouch: {cfg}: key decay: bad value 1e-320 for decay (expected a number: "
        "must be >= 0.0001)"], r.stderr


# -- weak 9: the status and the cap --------------------------------------------------

MAPPER = GUEST_MAPPER
LIMIT, MAX_HOLD = 128 * MiB, 32 * MiB


@fault("cgroup-guest-keeps-zone-mapped", "a guest in a 128 MiB memory cgroup (v1) keeps a "
       "16 MiB zone of the image mapped and touched: the recharge's drop cannot take its "
       "pages, the reload finds them still the guest's, they are ceded",
       "the group is never shown over its cap; it keeps at most its cap locked once the "
       "cycle is over, and no more than cap + max_hold within one",
       "every status: held_bytes <= cap_bytes for the group (before: the cede's cycle showed "
       "20M against 12.8M); unevictable <= cap at some point of the last cycle, <= cap + "
       "max_hold at every sample; no OOM kill", W9)
def _(tmp_path, image):
    from tests.support.cgroup import MemoryCgroup
    from tests.support.daemon_proc import DaemonProc
    cap = int(0.1 * LIMIT)
    try:
        cg = MemoryCgroup("faults-w9", LIMIT).create()
    except WorkloadError as exc:
        pytest.skip(str(exc))
    try:
        cg.popen([sys.executable, "-c", MAPPER, str(image), str(8 * MiB), str(16 * MiB)])
        time.sleep(1.5)                                  # the zone is the guest's cache now
        d = DaemonProc(tmp_path, image, "--max-hold", "32M", "--uri", "", "--min-free", "0",
                       "--interval", "0.5", "--decay", "1", "--access-source", "mincore")
        try:
            shown, worst = {}, 0
            end = time.monotonic() + 6
            while time.monotonic() < end:
                worst = max(worst, cg.unevictable_bytes())
                st = d.read_status()
                for g in (st or {}).get("charges", {}).get("groups", []):
                    if g["group"].rstrip("/").endswith(cg.name):
                        shown[st["cycle"]] = (g["held_bytes"], g["cap_bytes"])
                time.sleep(0.02)
            last_cycle = []                              # 0.5 s: one cycle of samples
            for _ in range(25):
                last_cycle.append(cg.unevictable_bytes())
                time.sleep(0.02)
            steady = min(last_cycle)
            out = d.output()
        finally:
            assert d.stop() == 0, d.output()[-2000:]
        assert "stays its own cache" in out, out[-2000:]        # the cede happened
        ceded_in = int(out.split("stays its own cache", 1)[1].split("cycle ", 1)[1]
                       .split(":", 1)[0])
        assert ceded_in in shown, (ceded_in, sorted(shown))     # its status was seen
        over = {c: v for c, v in shown.items() if v[0] > v[1]}
        assert not over, {c: (h / MiB, k / MiB) for c, (h, k) in over.items()}
        assert steady <= cap and worst <= cap + MAX_HOLD, (steady / MiB, worst / MiB)
        assert cg.oom_kills() == 0
        assert "Traceback" not in out
    finally:
        cg.cleanup()


# -- the table's own tests ----------------------------------------------------------------

ROWS = rows_of(__name__)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("row", ROWS, ids=[f.id for f in ROWS])
def test_settings_fault(row, tmp_path, image):
    kept = Untouched(image)
    row.check(tmp_path, image)
    kept.check()
