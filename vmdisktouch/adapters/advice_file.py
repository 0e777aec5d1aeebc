"""The last report of ``vmdisktouch advise``, kept for the host's other views.

``advise`` writes its report to ``advice_path()`` (``--save``: ``ADVICE_NAME`` in the
runtime directory, ``/run/vmdisktouch`` or ``$VMDISKTOUCH_RUNTIME_DIR``); ``discover``
shows each disk's advice from it in its ADVICE column, and the host PNG marks
the disks it does not serve that would gain. Each disk is found by
``domain/target`` under libvirt, else by its image path.
"""

from __future__ import annotations

import json
import os
import time

from vmdisktouch.adapters import outputs, runtime_dir
from vmdisktouch.core.advice import not_enough
from vmdisktouch.core.what_if import Forecast
from vmdisktouch.sizes import format_size

ADVISE_HINT = "vmdisktouch advise --libvirt"
ADVICE_NAME = "advise.json"     # the last ``advise`` report, in the runtime directory
ADVICE_FILE = "/run/vmdisktouch/" + ADVICE_NAME   # where it is by default (the help's words)


def advice_path() -> str:
    """Where ``advise`` keeps its last report: in the runtime directory, where ``status``
    and adopt's records are (``$VMDISKTOUCH_RUNTIME_DIR`` moves them all)."""
    return os.path.join(runtime_dir.runtime_dir(), ADVICE_NAME)


def is_report(doc) -> bool:
    """Whether the JSON document ``doc`` is an ``advise`` report: an object with the
    fields of one (``outputs.ADVISE_FIELDS``, as ``--save`` checks a file it replaces) and
    a list of ``disks``, and no status file's ``host`` or ``path`` (``status`` leaves it
    out of the daemons it lists)."""
    return (isinstance(doc, dict) and "host" not in doc and "path" not in doc
            and all(k in doc for k in outputs.ADVISE_FIELDS)
            and isinstance(doc.get("disks"), list))


def load_advice(path: str) -> dict | None:
    """The last ``advise`` report (``advice_path``), None when there is none or it
    cannot be read: ``{"when": ..., "disks": {key: advice}}``, each disk under its path
    and its ``domain/target``."""
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        disks = {}
        for d in report["disks"]:
            disks[d["path"]] = d["advice"]
            if d.get("domain"):
                disks[f"{d['domain']}/{d['target']}"] = d["advice"]
        return {"when": float(report["when"]), "disks": disks}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def advice_of(advice: dict | None, domain: str | None = None, target: str | None = None,
              path: str | None = None) -> dict | None:
    """A disk's advice in the last report (``load_advice``), by ``domain/target``, else by
    its image ``path``."""
    if not advice:
        return None
    return advice["disks"].get(f"{domain}/{target}") or advice["disks"].get(path or "")


def advice_cell(a: dict | None) -> str:
    """The ADVICE column: the size advised and what it buys, in a few words."""
    if a is None:
        return "-"
    v = a.get("verdict")
    if v in ("hold", "no_latency"):
        cell = f"{format_size(a['bytes'])}: {a['hit_ratio']:.0%} from memory"
        more = a.get("more_reads_per_second") or 0
        return cell + (f", +{more:,.0f} reads/s" if more >= 1 else "")
    if v == "not_enough":
        return not_enough(a.get("evidence"))
    return {"uniform": "none: reads uniform", "no_reuse": "none: no re-reads",
            "no_reads": "not read", "no_gain": "none: no gain"}.get(v, v or "-")


def advice_line(advice: dict | None, now: float) -> str:
    """Where the ADVICE column comes from, or how to get one."""
    if advice is None:
        return f"ADVICE: none yet: run {ADVISE_HINT} (it watches 60 s and changes nothing)"
    age = max(0.0, now - advice["when"])
    ago = f"{age / 60:.0f} min" if age < 2 * 3600 else f"{age / 3600:.0f} h"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(advice["when"]))
    return (f"ADVICE: from {ADVISE_HINT}, {ago} ago ({when}): what holding each disk with "
            "cache=writethrough would buy")


def sentence(f: Forecast, image_bytes: int) -> str:
    """The advice in words: the size, and what it would buy, or why no size helps."""
    if f.verdict == "no_reads":
        return "no read in the window: nothing to advise (watch while it works)"
    if f.verdict == "not_enough":
        e = f.evidence
        return (f"{not_enough(e)} (no size: {e['re_reads']:,} pages read again in "
                f"{e['window_seconds']:g} s, where an advice needs "
                f"{e['minimum']['re_reads']:,} in {e['minimum']['window_seconds']:g} s)")
    if f.verdict == "no_reuse":
        return "no size helps: no page was read twice in the window"
    held = (f"with {format_size(f.bytes)} held" if f.buffered
            else f"adopted with {format_size(f.bytes)} held" if f.adopt
            else f"with cache=writethrough and {format_size(f.bytes)} held")
    share = f"about {f.hit_ratio:.0%} of reads from memory"
    if f.verdict == "no_latency":
        return f"{held}: {share} (the miss latency was not measured)"
    if f.verdict == "no_gain":
        return (f"no gain: {held}, {share}, but {f.reason}: "
                f"{_rates(f)}")
    us = f.saved_per_read * 1e6
    gain = share + (f", about {us:,.0f} µs saved per read" if abs(us) >= 10 else
                    f", about {us:.1f} µs saved per read")
    if f.depth:
        gain += f", about {f.more_reads_per_second:,.0f} reads/s more at this queue depth"
        if f.queue_bound:
            gain += " (the device is queue-bound now: the misses left would not queue)"
        if f.write_cost is None:
            gain += ", the writes' extra wait not measured (a block device)"
        elif f.write_cost > 0:
            gain += f", writes {f.write_cost * 1e6:,.0f} µs slower each"
    if f.verdict == "uniform":
        return (f"no size below the image helps: reads are uniform (the whole "
                f"{format_size(image_bytes)}: {gain})")
    return f"{held}: {gain}"


def _rates(f: Forecast) -> str:
    """Reads/s, writes/s and the mean I/O time now and with the size held ("to", not an
    arrow: the table goes to terminals and pictures in Latin-1 too, as "µs" does)."""
    a, b = f.now, f.then
    if a is None or b is None:
        return ""
    t = (f", mean I/O {a.io_time * 1e6:,.0f} to {b.io_time * 1e6:,.0f} µs"
         if a.io_time and b.io_time else "")
    return (f"{a.reads:,.0f} to {b.reads:,.0f} reads/s, {a.writes:,.0f} to {b.writes:,.0f} "
            f"writes/s{t}")
