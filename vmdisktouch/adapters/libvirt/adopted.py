"""Which disks ``vmdisktouch adopt`` switched to the page cache: one record per disk.

A record (``RECORDS`` in the runtime directory, ``UUID-TARGET.json``) says that the
disk of that domain's run (libvirt's domain ID, new at each start) was adopted, and
since when. It is a hint, not the truth: QEMU's own ``cache.direct`` decides
(``adopt``), and a record whose run is over (the domain stopped, or started again
with O_DIRECT) stands for nothing. ``list_disks`` marks a running domain's disk
adopted by it, so the host service, ``discover`` and ``run PATH`` see it through the
page cache although libvirt still says ``cache=none``; ``release --all`` asks the
domains it names. A record lives in ``/run``: a reboot ends every QEMU with it.

The domain carries its adopted targets too, in its live XML's metadata (``mark``:
``<adopted><disk target="vda"/></adopted>`` in ``MARK_NS``, the persistent definition
untouched), which libvirt sends with a migration and keeps in a save: the host service
of the host it arrives on adopts those disks again once the domain runs there, with
its own checks, drop and timing (``daemon.adoption``). A release removes the target.
"""

from __future__ import annotations

import glob
import json
import os
import time
import xml.etree.ElementTree as ET

from vmdisktouch.adapters import atomic, runtime_dir

RECORDS = "adopted"            # under the runtime directory
MARK_NS = "http://vmdisktouch.org/xmlns/adopted/1"
MARK_KEY = "vmdisktouch-adopted"


def records_dir() -> str:
    return os.path.join(runtime_dir.runtime_dir(), RECORDS)


def _record_path(uuid: str, target: str) -> str:
    return os.path.join(records_dir(), f"{uuid}-{target}.json")


def record(node, baseline: list | None = None, advised_gain: float | None = None) -> None:
    """Remember that ``node`` (``adopt.Node``) is adopted; ``since``, the ``baseline``
    (``core.never_slower`` windows timed before the switch) and the gain advise forecast
    are kept from an earlier record of the same run."""
    os.makedirs(records_dir(), mode=0o755, exist_ok=True)
    path = _record_path(node.uuid, node.target)
    since = time.time()
    baseline_json = None if baseline is None else [w.to_json() for w in baseline]
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("domain_id") == node.domain_id:
            since = float(old.get("since", since))
            baseline_json = old.get("baseline") if baseline is None else baseline_json
            advised_gain = old.get("advised_gain") if advised_gain is None else advised_gain
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    atomic.write_json(path, {"domain": node.domain, "uuid": node.uuid,
                             "target": node.target, "path": node.path, "node": node.name,
                             "domain_id": node.domain_id, "since": since,
                             "baseline": baseline_json, "advised_gain": advised_gain})


def baseline_of(doc: dict) -> list | None:
    """The windows a record's disk was timed over before its switch
    (``core.never_slower.Window``), None when it was not timed or the record is damaged."""
    from vmdisktouch.core.never_slower import Window
    try:
        return [Window.from_json(w) for w in doc["baseline"]] if doc.get("baseline") else None
    except (KeyError, TypeError, ValueError):
        return None


HELD_BACK = ".released"      # a disk released for good: not adopted again by [adopt]


def hold_back(node, why: str | None = None) -> None:
    """``node`` was released by the operator (``vmdisktouch release``), or by the host
    service because it got slower (``why``): ``[adopt]`` does not take it again in this
    run of its domain, until the operator adopts it (``let_go``)."""
    os.makedirs(records_dir(), mode=0o755, exist_ok=True)
    atomic.write_json(_record_path(node.uuid, node.target) + HELD_BACK,
                      {"domain": node.domain, "target": node.target,
                       "domain_id": node.domain_id, "since": time.time(), "why": why})


def held_back(node) -> str | None:
    """Why ``node`` was released for this run of its domain (``hold_back``): the service's
    reason, or "by the operator"; None when it was not."""
    try:
        with open(_record_path(node.uuid, node.target) + HELD_BACK, encoding="utf-8") as f:
            mark = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(mark, dict) or mark.get("domain_id") != node.domain_id:
        return None
    return str(mark.get("why") or "by the operator")


def let_go(uuid: str, target: str) -> None:
    """The operator adopted the disk: ``[adopt]`` may take it again (``hold_back``)."""
    try:
        os.unlink(_record_path(uuid, target) + HELD_BACK)
    except FileNotFoundError:
        pass


def forget(uuid: str, target: str) -> None:
    try:
        os.unlink(_record_path(uuid, target))
    except FileNotFoundError:
        pass


def records() -> list[dict]:
    """Every adoption recorded, oldest first (an unreadable record is skipped)."""
    out = []
    for path in glob.glob(os.path.join(records_dir(), "*.json")):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and {"domain", "uuid", "target"} <= doc.keys():
            out.append(doc)
    return sorted(out, key=lambda d: d.get("since", 0))


def by_disk() -> dict[tuple[str, str], dict]:
    """The records by ``(uuid, target)``."""
    return {(d["uuid"], d["target"]): d for d in records()}


def marked(root: ET.Element) -> frozenset[str]:
    """The targets a domain's live XML (parsed) carries as adopted (``mark``)."""
    elem = root.find(f"./metadata/{{{MARK_NS}}}adopted")
    if elem is None:
        return frozenset()
    return frozenset(d.get("target") for d in elem if d.tag == f"{{{MARK_NS}}}disk"
                     and d.get("target"))

