"""Shared by the benchmarks: write a reading into its page under docs/benchmarks/.

docs/benchmarks.md holds the current-figures table (one row per benchmark, kept by
hand) and the index of the pages; each benchmark script has a page,
``docs/benchmarks/<page>.md`` (``page_of``): a title, the scenario once
(``## Scenario``), ``## Latest reading`` (the newest reading of each of its
sections, newest first) and ``## History`` (the readings newer ones replaced, newest
first). A reading is delimited by ``<a id="name"></a>`` and the HTML comments
``<!-- BEGIN name -->`` / ``<!-- END name -->``; the text after its END (a reading
by hand) belongs to it until the next reading starts. ``update_section`` puts a new
reading of section ``name`` first under "Latest reading" and moves the previous one,
with its reading by hand, to the top of "History". Every reading starts with the
date, the machine and the command that produced it.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
DOC = os.path.join(DOCS, "benchmarks.md")      # the current-figures table and the index
PAGES_DIR = "benchmarks"                        # the pages, under DOCS

# page (docs/benchmarks/<page>.md) -> its title, for a page written the first time
PAGE_TITLES = {
    "scan": "Residency scan: `vmdisktouch snapshot` vs `vmtouch` vs `fincore`",
    "hotzone": "I/O under memory pressure: the hot-zone benchmark",
    "daemon-cost": "Daemon cost: `vmdisktouch run` from 1 GiB to 1 TiB",
    "params": "Parameter study: one setting at a time on the hot-zone scenario",
    "write-amplification": "Write amplification: large folios and the guest's small writes",
    "cgroup": "A memory-limited VM group: cgroup-aware holding",
    "source-cost": "Access sources: the daemon's CPU",
    "readonly-hold": "A read-only hot zone held continuously: trace vs mincore",
    "trace-overhead": "Trace source: the cost of its tracefs instance on the guest's I/O",
    "refault": "Refaults: a hot set twice the budget, an LRU that thrashes",
    "host-cost": "Many disks, one process: CPU and memory",
    "warm-restart": "Warm restart: the heat saved and restored",
    "host-budget": "One host budget against split budgets",
    "follow-live": "Following libvirt live",
    "metrics-conns": "Metrics listener under a connection flood",
    "carry-heat": "Heat carried in the domain's metadata",
    "libvirt-stall": "libvirt never blocks the loop",
    "side-by-side": "Side by side with the commit before: several benchmarks, one change",
    "busy-cost": "A busy disk: the daemon's CPU per event rate",
    "curve-accuracy": "The miss-ratio curve against the kernel",
    "advise": "`vmdisktouch advise`: advice for disks the daemon does not serve",
}
# sections whose page is not the longest page name they start with
SECTION_PAGES = {"cold-start": "hotzone", "budget-per-byte": "hotzone",
                 "redesign": "side-by-side", "one-runtime": "side-by-side",
                 "curve-exact": "curve-accuracy", "curve-exact-golden": "curve-accuracy",
                 "curve-exact-requests": "curve-accuracy", "host-of-a-hundred": "host-cost",
                 "host-of-a-hundred-rev": "host-cost"}

LATEST, HISTORY = "## Latest reading", "## History"


def page_of(name: str) -> str:
    """The page of section ``name``: hotzone-move-rounds -> hotzone, refault-holder-limit
    -> refault, source-cost-curve -> source-cost, ...; an unknown name is its own page."""
    if name in SECTION_PAGES:
        return SECTION_PAGES[name]
    for page in sorted(PAGE_TITLES, key=len, reverse=True):
        if name == page or name.startswith(page + "-"):
            return page
    return name


def page_path(name: str, docs: str = DOCS) -> str:
    return os.path.join(docs, PAGES_DIR, page_of(name) + ".md")


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return (f"{platform.node()}: Linux {platform.release()}, {os.cpu_count()} CPUs ({cpu}), "
            f"{mem / 2**30:.0f} GiB RAM")


def provenance(command: str | None = None) -> str:
    command = command or "python " + " ".join(sys.argv)
    today = datetime.date.today().isoformat()
    return f"Measured {today} on {machine()}.\nCommand: `{command}`\n"


# -- the markdown of a reading, as its page holds it --------------------------------------

def demote(markdown: str) -> str:
    """Every heading one level down (``## T`` -> ``### T``), code blocks left alone."""
    out, fenced = [], False
    for line in markdown.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,5} ", line):
            line = "#" + line
        out.append(line)
    return "\n".join(out)


def relink(markdown: str) -> str:
    """Relative links written for docs/ (``img/x.png``, ``algorithm.md``) made relative
    to docs/benchmarks/; anchors (``#x``), absolute and ``../`` links unchanged."""
    return re.sub(r"\]\((?!#|[a-z]+:|/|\.\./)([^)\s]+)\)", r"](../\1)", markdown)


def _norm(text: str) -> str:
    return " ".join(text.split())


def scenario_of(page_text: str) -> str:
    """The text of the page's ``## Scenario`` section ('' without one)."""
    m = re.search(r"^## Scenario\n(.*?)(?=^## |\Z)", page_text, re.S | re.M)
    return m.group(1) if m else ""


def covered(paragraph: str, scenario: str) -> bool:
    """Whether every clause of ``paragraph`` is said, word for word, by ``scenario``."""
    if len(paragraph) < 60 or not scenario:
        return False
    body = _norm(scenario)
    text = _norm(paragraph).removeprefix("Scenario: ")
    parts = [p.rstrip(";.") for p in re.split(r"(?<=[;.])\s+", text)]
    return all(p in body for p in parts if len(p) > 2)


def drop_scenario(markdown: str, scenario: str) -> str:
    """The paragraphs the page's scenario already says replaced by a pointer to it, so
    that a page describes its scenario once; a run whose scenario differs keeps its own."""
    paras = markdown.split("\n\n")
    out = []
    for p in paras:
        if not p.lstrip().startswith(("|", "#", "<", "!", "-", "*", "```")) \
                and covered(p.strip(), scenario):
            p = "Scenario: [as described above](#scenario)."
        out.append(p)
    return "\n\n".join(out)


def entry(name: str, markdown: str, scenario: str = "") -> str:
    md = drop_scenario(relink(demote(markdown.strip("\n"))), scenario)
    return f'<a id="{name}"></a>\n\n<!-- BEGIN {name} -->\n{md.rstrip()}\n<!-- END {name} -->\n'


# -- the page ------------------------------------------------------------------------------

_START = re.compile(r'^<a id="([^"]+)"></a>\n\n<!-- BEGIN \1 -->', re.M)


def split_entries(region: str) -> tuple[str, list[tuple[str, str]]]:
    """A page's section -> (its text before the first reading, [(name, text), ...])."""
    starts = list(_START.finditer(region))
    if not starts:
        return region, []
    head = region[:starts[0].start()]
    entries = []
    for m, nxt in zip(starts, starts[1:] + [None]):
        entries.append((m.group(1), region[m.start():nxt.start() if nxt else len(region)]))
    return head, entries


def to_history(name: str, text: str, taken: set[str]) -> str:
    """A replaced reading as History holds it: anchor ``name-DATE``, no BEGIN/END (so the
    script's next write cannot match it), its date in its heading."""
    m = re.search(r"Measured (\d{4}-\d{2}-\d{2})", text)
    date = m.group(1) if m else datetime.date.today().isoformat()
    anchor, k = f"{name}-{date}", 2
    while anchor in taken:
        anchor, k = f"{name}-{date}-{k}", k + 1
    text = text.replace(f'<a id="{name}"></a>', f'<a id="{anchor}"></a>', 1)
    text = re.sub(rf"^<!-- (BEGIN|END) {re.escape(name)} -->\n", "", text, flags=re.M)
    text = re.sub(r"^(### .*)$", lambda h: f"{h.group(1)} ({date})", text, count=1, flags=re.M)
    return text.rstrip("\n") + "\n\n"


def skeleton(page: str) -> str:
    title = PAGE_TITLES.get(page, page)
    return (f"# {title}\n\n[All benchmarks](../benchmarks.md)\n\n"
            f"{LATEST}\n\n{HISTORY}\n\nReadings that a newer one of the same section "
            "replaced, newest first.\n")


def update_section(name: str, markdown: str, docs: str = DOCS) -> str:
    """Put ``markdown`` (a reading of section ``name``, starting with its ``## title``)
    first under "Latest reading" of its page, the previous reading of ``name`` moved to
    the top of "History"; returns the page's path relative to the checkout's root.
    The current-figures row of docs/benchmarks.md is not touched: its headline figure
    is chosen by hand."""
    path = page_path(name, docs)
    page = page_of(name)
    text = open(path).read() if os.path.exists(path) else skeleton(page)
    if LATEST not in text:
        text = text.rstrip("\n") + f"\n\n{LATEST}\n"
    if HISTORY not in text:
        text = text.rstrip("\n") + f"\n\n{HISTORY}\n"
    before, rest = text.split(LATEST + "\n", 1)
    latest, after = rest.split(HISTORY + "\n", 1)
    head, entries = split_entries(latest)
    old = [t for n, t in entries if n == name]
    entries = [(n, t) for n, t in entries if n != name]
    new = entry(name, markdown, scenario_of(text))
    latest = head.rstrip("\n") + "\n\n" + "".join(
        t.rstrip("\n") + "\n\n" for t in [new] + [t for _, t in entries])
    if old:
        moved = re.compile(r'^<a id="([^"]+)"></a>', re.M)
        taken = set(moved.findall(text))
        # History's readings have no BEGIN/END: split at their anchors instead
        first = moved.search(after)
        hhead, hbody = (after[:first.start()], after[first.start():]) if first else (after, "")
        after = hhead.replace(" None yet.", "").rstrip("\n") + "\n\n" + to_history(name, old[0], taken) + hbody
    text = before + LATEST + "\n\n" + latest.lstrip("\n") + HISTORY + "\n\n" + after.lstrip("\n")
    text = re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    rel = os.path.relpath(path, os.path.dirname(docs))
    print(f"wrote the {name} reading into {rel} (its row in docs/benchmarks.md's current "
          "figures is kept by hand)", flush=True)
    return rel


def chart_font(size: int = 14):
    """Pillow's default font at ``size`` (older Pillow: its fixed-size bitmap font)."""
    from PIL import ImageFont
    try:
        return ImageFont.load_default(size=size)
    except TypeError:
        return ImageFont.load_default()
