"""The host overview PNG: every disk in one picture, who got the budget and why.

Layout, top to bottom (``WIDTH`` pixels wide, at least ``MIN_WIDTH``; a
band per disk up to ``TOP_BANDS`` + 1 disks, then the top bands and one
summary band, so the height never passes that of ``TOP_BANDS`` + 1 disks,
``UNSERVED_ROWS`` disks not served and the curves, ``picture_height``: 1056
px, 840 with no disk not served, however many disks):

* a header: the sum held of the budget and the number of disks; the time
  (as the block map's header, ``figure.header_lines``) and the free memory
  above the floor (MemAvailable less ``min_free``: what the host can still
  give before the floor stops the holds);
* the *budget bar*, as wide as the picture and standing for the whole
  budget: each disk's held bytes are a segment in the disk's colour, in the
  daemon's order, 1 px apart; what is not held is grey (``UNUSED``);
* one *band* per disk, in the daemon's order:

  - left: the disk's *swatch* (its colour) and its name, ``domain/target``
    under libvirt, else the image path (shortened from the left); below, the
    image's size and, when it holds less than it wants, why
    (``report.CODES`` in a word or two, ``REASONS``);
  - middle: the *allocation bar*, scaled to the budget (its full width is
    the budget, the same scale for every disk, so the bars compare): solid
    in the disk's colour, what it holds; dim in the disk's colour, what it
    *wants* (all its candidate regions would take); a white outline, its
    *share* (what the selection gave it plus the free budget it could still
    take); below, the three in numbers;
  - right: the *image strip*, the whole image squeezed into the strip, each
    column a slice of its blocks, in the block map's colours and meanings
    (``render``): sky blue where the daemon holds blocks (brighter = more of
    the slice), else bluish green as bright as the share cached, else black.
    The strip's width grows with the log of the image size relative to the
    largest image in the picture: the largest gets the whole column, each
    halving takes a tenth of it off, and an image 1/1024 of the largest or
    smaller gets ``MIN_STRIP`` pixels (a 196 KiB image next to a 1 GiB one
    is a short strip, never as wide); the size is printed on the left.
* when a disk has a miss-ratio curve (the trace source), a *curves* panel:
  every disk's curve (``core.mrc``: the share of its reads an LRU cache of
  each size would serve) as a line in the disk's colour, over one log axis
  of sizes from the smallest point of any curve to the largest image
  (labelled at round sizes, the powers of 4: 1M, 4M, 16M, ...), hit
  ratio from 0 to 100 % up; a dot on each line where the disk holds now, a
  ring in its colour at its share of the budget. Where the disk's share of
  reads from memory was measured (``report.reads_from_memory``, the one
  definition status and the metrics use), its line is drawn through it: the
  dot at the measured share, and the line elsewhere that share plus what the
  curve adds or takes away from what is held, so the line at one GiB more
  than the dot is status's "+1G" (an LRU curve counts every first read a
  miss, and alone sat below what the page cache measured).
  Where a line still climbs past its dot, more memory would pay there; where
  it is flat, it would not;
* a legend of all these marks.

A host of many disks. Up to ``TOP_BANDS`` + 1 disks (13) the picture is as
above: every disk a band, in the daemon's order. Past that it draws the
``TOP_BANDS`` (12) disks holding most as bands (by held bytes, then wanted,
then the daemon's order), in that rank, and the rest as one *summary band*
(``top_and_rest``, ``summary_lines``): a grey swatch (``OTHERS``, no disk's
colour), "88 more disks" and, below, how many of them are adopted or have
no share yet; their allocation bar with held, share and wanted summed, on
the budget's scale as every bar; right, where a band has its image strip,
how many are limited and by what (the reasons the bands would show:
"60 limited: 18 by its weight, 14 by its cap, ..."; the total first, so a
line cut short still counts them) and, when that takes one line,
"88 more disks: hold X of Y share, want Z". The budget bar draws the bands'
segments in their colours, in their rank, then the others' held bytes as
one ``OTHERS`` segment. The curves panel draws only the bands' curves, and
its title says so ("curves of the 12 disks holding most"). The disks not
served list at most ``UNSERVED_ROWS`` rows: past that, those that would
gain first, and the last row says how many more ``discover`` lists. Only
the bands take a colour from the book (below), so twelve disks never need
one past ``palette(12)``: they stay at least 23 apart. A 100-disk example,
docs/img/host-100-example.png, is drawn by ``python -m tools.host_example``
from a made-up host (no daemon).

Colours. The block map's four colours keep their meaning here: sky blue is
held and bluish green cached (only in the image strips); vermillion
(rewritten) and yellow (thrashing) are not used. A disk's own colour is a
separate swatch, from ``PALETTE``: six colours of the colour-blind-safe
families that are none of those four: Okabe-Ito's orange, blue and reddish
purple (Okabe and Ito made the eight to stay apart for red-green
colour-blind eyes, vermillion and yellow included), and Paul Tol's light
pink and bright red and purple. Each is at least 20 CIEDE2000 from the
block map's four for normal vision and at least 10 under simulated
protanopia and deuteranopia (Machado 2009), the six at least 14 (12) from
each other, and bright enough on the dark background; the closest calls
are orange (22 from yellow and from vermillion) and bright red (10 from
bluish green for red-green colour-blind eyes). Left out: Tol's cyans,
light blue, teal, mint and greens (near sky blue or bluish green), olive,
sand, pear and pale yellow (near yellow or vermillion), the greys (near
the free budget's grey or the share's white outline).

Every disk of a picture has a colour of its own. The six above come
first; a host with more disks takes more by one rule (``palette``): each
next colour is the candidate farthest in CIE Lab from every colour taken
so far (a farthest-point sequence over the sRGB cube in steps of 8), among
those bright enough on the dark background (L* 50 to 82), coloured
(chroma 30 to 90) and at least 25 from the block map's four colours and
the picture's greys and white. The sequence is fixed, so the 7th colour is
the same on every host: the first 24 stay at least 23 apart (Delta E 1976,
2.3 is just noticeable; the six are the closest pair), 40 at least 22, 100
at least 14: each further one is as far from the others as the cube allows.
Past the six they are told apart by normal vision only.

A disk keeps its colour while it stays in the picture (``ColourBook``, one
per daemon; past ``TOP_BANDS`` + 1 disks, while it stays a band): it never
follows the disk's position, so a domain that
restarts, and moves to the end of the list, keeps it. A disk new to the
picture takes the colour its name picks, ``blake2b(key) % 6`` with ``key``
= ``domain/target`` when known, else the image path (``disk_key``; a fixed
hash, not Python's salted ``hash``, so the same in every process), or the
next of the six that no disk of the picture has, and once the six are
taken the first free colour past them. A disk that leaves and comes back
gets its old colour again unless another disk has taken it meanwhile.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from vmdisktouch.adapters.pictures import render
from vmdisktouch.adapters.pictures.figure import DIM, LINE, PAD, TEXT, load_font
from vmdisktouch.sizes import format_size

WIDTH = 1024
MIN_WIDTH = 760             # the legend's longest line fits
LABEL = 250                 # x of the allocation bars (the name column is left of it)
GAP = 20                    # between the allocation bar and the image strip
HEAD = PAD + 2 * LINE + 4   # y of the budget bar (below the two header lines)
BAR = 18                    # the budget bar's height
TOP = HEAD + BAR + 6 + LINE + 2   # y of the first band (below the column titles)
BAND = 2 * LINE + 6         # pixels per disk band
ROW = 12                    # an allocation bar's height
SWATCH = 12
LEGEND = 5                  # lines of legend
CHART = 120                 # the curves panel's plot height
CURVES = LINE + 4 + CHART + LINE + PAD   # the panel: title, plot, size labels
MIN_STRIP = 12              # the narrowest image strip
STRIP_RANGE = 10            # doublings below the largest image that reach MIN_STRIP
BG = tuple(int(x) for x in render.PADDING)
UNUSED = (70, 70, 70)       # the budget not held
TRACK = (40, 40, 40)        # an allocation bar's background (the budget)
FRAME = (90, 90, 90)        # around an image strip
SHARE = (255, 255, 255)     # the share's outline
NEUTRAL = (200, 200, 200)   # the legend's stand-in for a disk's colour
WOULD_GAIN = (255, 255, 255)  # the triangle of a disk not served that would gain
OTHERS = (160, 160, 160)    # the disks past the top bands, summed: one grey, no disk's colour
# Twelve bands and the summary keep the picture with its curves at 840 px, one screen, and
# twelve disks never need a colour past palette(12), whose colours stay at least 23 apart.
TOP_BANDS = 12
UNSERVED_ROWS = 12          # the most rows of disks not served (past it, one line counts them)
# Okabe-Ito orange, blue, reddish purple; Tol light pink, bright red, bright purple
PALETTE = [(230, 159, 0), (0, 114, 178), (204, 121, 167), (255, 170, 187),
           (238, 102, 119), (170, 51, 119)]
# what a disk's colour must stay away from: the block map's four, greys, white, the background
RESERVED = [render.HELD, render.CACHED, render.REWRITTEN, render.THRASHING, UNUSED, TRACK, BG,
            SHARE, NEUTRAL, OTHERS]
REASONS = {"domain_off": "domain off", "no_evidence": "no reads yet",
           "below_threshold": "the threshold", "budget": "budget", "cap": "its cap",
           "weight": "its weight", "curve": "its curve share", "floor": "the memory floor",
           "cgroup": "its cgroup",
           "lock_limit": "the lock limit", "not_loaded": "a load error"}


@dataclass(frozen=True)
class DiskBand:
    name: str                   # the image path
    held_bytes: int
    resident: np.ndarray        # per block: the fraction cached
    held: np.ndarray            # per block: held (bool)
    domain: str | None = None   # its libvirt domain and target, when known
    target: str | None = None
    size_bytes: int = 0         # the image's size
    share_bytes: int | None = None   # its share of the budget (None: no selection yet)
    wanted_bytes: int | None = None  # all it would hold (candidates, within its curve's wants)
    limited_by: str | None = None    # why it holds less than it wants (daemon.reasons)
    curve: list | None = None        # [[bytes, hit ratio], ...] (core.mrc); None: none
    from_memory: dict | None = None  # its share of reads from memory (``report.reads_from_memory``)
    adopted: bool = False            # a cache=none disk ``vmdisktouch adopt`` switched
    adopted_gain: float | None = None   # its I/O measured since, as fast as before by


@dataclass(frozen=True)
class Unserved:
    """A disk of a running domain the host service does not serve: why, and what holding it
    would buy by the last ``vmdisktouch advise`` (None: no advice, or none that gains)."""
    key: str                    # domain/target
    reason: str
    gain: str | None = None


def unserved_rows(skipped: list[dict] | None, advice: dict | None) -> list[Unserved]:
    """A row per disk of the report's ``skipped`` (ineligible, excluded, out of scope), in
    its order, with its reason; what it would gain where the last ``advise`` report
    (``advice_file.load_advice``) says it would."""
    from vmdisktouch.adapters import advice_file
    out = []
    for s in skipped or ():
        a = advice_file.advice_of(advice, s["domain"], s["target"])
        gains = a is not None and a.get("verdict") == "hold"
        out.append(Unserved(f"{s['domain']}/{s['target']}", s["reason"],
                            advice_file.advice_cell(a) if gains else None))
    return out


def disk_key(d: DiskBand) -> str:
    """The disk's identity: ``domain/target`` under libvirt, else the image path."""
    return f"{d.domain}/{d.target}" if d.domain else d.name


def cie_lab(rgb) -> np.ndarray:
    """sRGB colours (..., 3) as CIE L*a*b* (D65), where distance is what eyes see."""
    c = np.asarray(rgb, np.float64) / 255
    c = np.where(c > 0.04045, ((c + 0.055) / 1.055) ** 2.4, c / 12.92)
    xyz = c @ np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                        [0.0193, 0.1192, 0.9505]]).T / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.stack([116 * f[..., 1] - 16, 500 * (f[..., 0] - f[..., 1]),
                     200 * (f[..., 1] - f[..., 2])], axis=-1)


@functools.lru_cache(maxsize=None)
def palette(n: int) -> tuple[tuple[int, int, int], ...]:
    """The first ``n`` (at least 6) disk colours: ``PALETTE``, then each next the candidate
    farthest from all before it (the module's theory), so any n stay as far apart as they
    can."""
    out = [tuple(c) for c in PALETTE]
    steps = list(range(0, 256, 8)) + [255]
    cand = np.array(list(itertools.product(steps, repeat=3)))
    lab = cie_lab(cand)
    chroma = np.hypot(lab[:, 1], lab[:, 2])
    near = np.linalg.norm(lab[:, None] - cie_lab(RESERVED)[None], axis=-1).min(axis=1)
    ok = (lab[:, 0] >= 50) & (lab[:, 0] <= 82) & (chroma >= 30) & (chroma <= 90) & (near >= 25)
    cand, lab = cand[ok], lab[ok]
    far = np.linalg.norm(lab[:, None] - cie_lab(out)[None], axis=-1).min(axis=1)
    while len(out) < n:
        j = int(far.argmax())
        out.append(tuple(int(v) for v in cand[j]))
        far = np.minimum(far, np.linalg.norm(lab - lab[j], axis=-1))
    return tuple(out)


class ColourBook:
    """Each disk's colour by its key: distinct within a picture, kept while the disk stays
    in it, and given back when it returns if still free (the module's theory)."""

    def __init__(self) -> None:
        self.given: dict[str, int] = {}          # key -> index into ``palette``

    def colours(self, keys: list[str]) -> list[tuple[int, int, int]]:
        """The colour of each of ``keys`` (the picture's disks), in their order."""
        present = sorted(set(keys))
        owner: dict[int, str] = {}
        for k in present:                        # kept, where no disk took it first
            i = self.given.get(k)
            if i is not None and i not in owner:
                owner[i] = k
        placed = set(owner.values())
        for k in present:
            if k in placed:
                continue
            h = int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8).digest(), "big")
            first = [(h + j) % len(PALETTE) for j in range(len(PALETTE))]
            owner[next(i for i in itertools.chain(first, itertools.count(len(PALETTE)))
                       if i not in owner)] = k
        index = {k: i for i, k in owner.items()}
        left = {i: k for k, i in self.given.items() if k not in index and i not in owner}
        self.given = {**{k: i for i, k in left.items()}, **index}
        pal = palette(max(owner, default=0) + 1)
        return [pal[index[k]] for k in keys]


def colours(disks: list[DiskBand], book: ColourBook | None = None) -> list[tuple[int, int, int]]:
    """Each disk's colour from ``book`` (a new one: a picture of its own)."""
    return (book or ColourBook()).colours([disk_key(d) for d in disks])


def band_top(k: int) -> int:
    """The y of band ``k``'s top."""
    return TOP + k * BAND


def swatch_box(k: int) -> tuple[int, int, int, int]:
    """Band ``k``'s swatch (x0, y0, x1, y1), inclusive."""
    y = band_top(k) + 2
    return PAD, y, PAD + SWATCH - 1, y + SWATCH - 1


def columns_x(width: int) -> tuple[int, int, int]:
    """(the allocation bar's width, the image strip's x, the strip's widest)."""
    alloc = int((width - LABEL - PAD) * 0.44)
    strip_x = LABEL + alloc + GAP
    return alloc, strip_x, max(MIN_STRIP, width - PAD - strip_x)


def strip_width(size: int, largest: int, span: int) -> int:
    """The image strip's width: ``span`` for the largest image, a tenth of it less per
    halving, at least ``MIN_STRIP``."""
    if size <= 0 or largest <= 0:
        return MIN_STRIP
    frac = 1 + math.log2(min(size, largest) / largest) / STRIP_RANGE
    return max(MIN_STRIP, int(round(span * frac)))


def short_size(n: int) -> str:
    return format_size(n)


def _columns(values: np.ndarray, width: int) -> np.ndarray:
    """``values`` (per block) as ``width`` column means (a block spans columns when the
    image has fewer blocks than columns)."""
    n = values.size
    if not n:
        return np.zeros(width, dtype=np.float32)
    if n < width:
        return values[np.arange(width) * n // width].astype(np.float32)
    col = np.arange(n) * width // n
    sums = np.bincount(col, weights=values.astype(np.float64), minlength=width)
    return (sums / np.bincount(col, minlength=width)).astype(np.float32)


def _strip(d: DiskBand, w: int, h: int) -> Image.Image:
    """The image strip: held sky blue (half to full), else cached bluish green."""
    held = _columns(d.held.astype(np.float32), w)
    cached = _columns(np.clip(d.resident, 0, 1), w)
    rgb = cached[:, None] * np.array(render.CACHED, np.float32)
    on = held > 0
    rgb[on] = (0.5 + 0.5 * held[on])[:, None] * np.array(render.HELD, np.float32)
    row = rgb.round().clip(0, 255).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(np.repeat(row[None], h, axis=0)))


def fill_box(img: Image.Image, box, colour) -> None:
    """``box`` (inclusive) in ``colour``."""
    x0, y0, x1, y1 = (int(v) for v in box)
    if x1 < x0 or y1 < y0:
        return
    a = np.empty((y1 - y0 + 1, x1 - x0 + 1, 3), np.uint8)
    a[:] = colour
    img.paste(Image.fromarray(a), (x0, y0))


def _dim(colour) -> tuple[int, int, int]:
    return tuple(int(round(0.4 * c + 0.6 * b)) for c, b in zip(colour, BG))


def fit_text(draw, text: str, room: float, font, left: bool = True) -> str:
    """``text`` shortened from the left ("...tail"), or the right, to fit ``room`` px."""
    if draw.textlength(text, font=font) <= room:
        return text
    while text and draw.textlength("..." + text, font=font) > room:
        text = text[1:] if left else text[:-1]
    return "..." + text if left else text + "..."


def _px(n: int | None, budget: int, w: int) -> int:
    """Bytes as pixels of a ``w``-wide bar that is the budget (at least 1 when > 0)."""
    if not n or budget <= 0:
        return 0
    return max(1, int(round(w * min(n, budget) / budget)))


def header(disks: list[DiskBand], budget: int, when: float | None,
           above_floor: int | None) -> list[str]:
    held = sum(d.held_bytes for d in disks)
    pct = f" ({held / budget:.0%})" if budget else ""
    first = (f"host: held {short_size(held)} of {short_size(budget)} budget{pct}, "
             f"{len(disks)} disk{'' if len(disks) == 1 else 's'}")
    parts = []
    if when is not None:
        parts.append(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)))
    free = "unknown" if above_floor is None else short_size(above_floor)
    parts.append(f"free memory above the floor (MemAvailable - min_free): {free}")
    return [first, "  ".join(parts)]


def top_and_rest(disks: list[DiskBand]) -> tuple[list[DiskBand], list[DiskBand]]:
    """The disks drawn as bands and those the summary band sums: all of them, in the
    daemon's order, up to ``TOP_BANDS`` + 1 disks (a summary of one disk would be a band
    as tall); past that, the ``TOP_BANDS`` disks holding most (then wanting most, then
    first in the daemon's order), in that rank, and the rest in the daemon's order."""
    if len(disks) <= TOP_BANDS + 1:
        return list(disks), []
    rank = sorted(range(len(disks)),
                  key=lambda k: (-disks[k].held_bytes, -(disks[k].wanted_bytes or 0)))
    return [disks[k] for k in rank[:TOP_BANDS]], [disks[k] for k in sorted(rank[TOP_BANDS:])]


def summary_lines(rest: list[DiskBand]) -> tuple[str, str, str, str]:
    """The summary band's words for ``rest``: its name ("88 more disks"), its sums
    ("hold X of Y share, want Z"), and what the bands would show, counted, so that no disk
    needing a look vanishes into the sums: how many hold less than they want and by which
    reason (``REASONS``; "" when none: "60 limited: 18 by its weight, ..."), and how many
    are adopted or have no share yet (the first words, "" when none)."""
    n = len(rest)
    name = f"{n} more disk{'' if n == 1 else 's'}"
    summed = _summed(rest)
    sums = f"hold {short_size(summed.held_bytes)}"
    if summed.share_bytes is not None:
        sums += f" of {short_size(summed.share_bytes)} share"
    if summed.wanted_bytes is not None:
        sums += f", want {short_size(summed.wanted_bytes)}"
    why: dict[str, int] = {}
    for d in rest:
        if d.limited_by:
            word = REASONS.get(d.limited_by, d.limited_by)
            why[word] = why.get(word, 0) + 1
    limited = ", ".join(f"{k} by {w}" for w, k in sorted(why.items(), key=lambda i: (-i[1], i[0])))
    if len(why) == 1:
        limited = f"{sum(why.values())} limited by {next(iter(why))}"
    elif limited:
        limited = f"{sum(why.values())} limited: {limited}"
    adopted = sum(1 for d in rest if d.adopted)
    bare = sum(1 for d in rest if d.share_bytes is None)
    flags = ", ".join([f"{adopted} adopted"] * bool(adopted)
                      + [f"{bare} no share yet"] * bool(bare))
    return name, sums, limited, flags


def _two_lines(draw, text: str, room: float, font) -> list[str]:
    """``text`` in at most two lines of ``room`` px, broken after a comma; the second
    shortened with "..." when it does not fit."""
    if draw.textlength(text, font=font) <= room:
        return [text]
    cut = [i + 1 for i, c in enumerate(text) if c == ","]
    first = max((i for i in cut if draw.textlength(text[:i], font=font) <= room), default=None)
    if first is None:
        return [fit_text(draw, text, room, font, False)]
    return [text[:first], fit_text(draw, text[first:].strip(), room, font, False)]


def _summed(rest: list[DiskBand]) -> DiskBand:
    """The disks of ``rest`` as one band: held, share and wanted summed (a share or a want
    when any of them has one)."""
    shares = [d.share_bytes for d in rest if d.share_bytes is not None]
    wanted = [d.wanted_bytes for d in rest if d.wanted_bytes is not None]
    return DiskBand("", sum(d.held_bytes for d in rest), np.zeros(0), np.zeros(0, bool),
                    size_bytes=sum(d.size_bytes for d in rest),
                    share_bytes=sum(shares) if shares else None,
                    wanted_bytes=sum(wanted) if wanted else None)


def picture_height(n_disks: int, n_unserved: int = 0, curves: bool = False) -> int:
    """The picture's height for ``n_disks`` disks, ``n_unserved`` not served, with or
    without the curves panel: at most that of ``TOP_BANDS`` + 1 disks and
    ``UNSERVED_ROWS`` disks not served, however many there are."""
    bands = min(n_disks, TOP_BANDS + 1)
    return (band_top(bands) + unserved_height(n_unserved) + (CURVES if curves else 0) + PAD
            + LEGEND * LINE + PAD)


def unserved_height(n_unserved: int) -> int:
    """The height of the list of ``n_unserved`` disks not served: a title and at most
    ``UNSERVED_ROWS`` rows (0 with none)."""
    return (min(n_unserved, UNSERVED_ROWS) + 1) * LINE + PAD if n_unserved else 0


def host_overview_image(disks: list[DiskBand], budget: int, width: int = WIDTH, *,
                        when: float | None = None, above_floor: int | None = None,
                        unserved: list[Unserved] = (),
                        book: ColourBook | None = None) -> Image.Image:
    """The overview of ``disks`` under ``budget`` bytes at time ``when``, with
    ``above_floor`` bytes of MemAvailable above the free-memory floor, and the
    ``unserved`` disks listed below them; the colours from ``book`` (the daemon's, so a
    disk keeps its colour from frame to frame). Past ``TOP_BANDS`` + 1 disks, the top
    ones as bands and the rest summed in one (``top_and_rest``; the module's theory)."""
    font = load_font()
    width = max(MIN_WIDTH, width)
    top, rest = top_and_rest(disks)
    bands = len(top) + (1 if rest else 0)
    curves = [d for d in top if d.curve and len(d.curve) >= 2]
    panel = CURVES if curves else 0
    others = unserved_height(len(unserved))
    img = Image.new("RGB", (width, picture_height(len(disks), len(unserved), bool(curves))), BG)
    draw = ImageDraw.Draw(img)
    for k, line in enumerate(header(disks, budget, when, above_floor)):
        draw.text((PAD, PAD + k * LINE), line, fill=TEXT if k == 0 else DIM, font=font)
    marks = colours(top, book)          # only the bands take a colour: the first ones, apart
    _budget_bar(img, [d.held_bytes for d in top] + [sum(d.held_bytes for d in rest)],
                marks + [OTHERS], budget, width)
    alloc_w, strip_x, span = columns_x(width)
    y = HEAD + BAR + 6
    for x, room, title in ((PAD, LABEL - PAD - 8, "disk: image size, why it holds less"),
                           (LABEL, alloc_w, "held / share / wanted of the budget"),
                           (strip_x, span, "the image: held, cached blocks")):
        draw.text((x, y), fit_text(draw, title, room, font, False), fill=DIM, font=font)
    largest = max((d.size_bytes for d in top), default=0)
    for k, (d, colour) in enumerate(zip(top, marks)):
        y = band_top(k)
        fill_box(img, swatch_box(k), colour)
        x = PAD + SWATCH + 6
        draw.text((x, y), fit_text(draw, disk_key(d), LABEL - x - 8, font), fill=TEXT, font=font)
        info = f"{short_size(d.size_bytes)} image" + (", adopted" if d.adopted else "")
        if d.adopted and d.adopted_gain:
            info += f", I/O {d.adopted_gain:.1f}x"
        if d.limited_by:
            info += f", limited by {REASONS.get(d.limited_by, d.limited_by)}"
        draw.text((x, y + LINE), fit_text(draw, info, LABEL - x - 8, font, False), fill=DIM,
                  font=font)
        _allocation(img, draw, font, d, colour, budget, (LABEL, y + 2, alloc_w))
        w = strip_width(d.size_bytes, largest, span)
        draw.rectangle([strip_x - 1, y, strip_x + w, y + 2 * LINE - 1], outline=FRAME)
        img.paste(_strip(d, w, 2 * LINE - 2), (strip_x, y + 1))
        draw.line([PAD, y + BAND - 3, width - PAD, y + BAND - 3], fill=(36, 36, 36))
    if rest:
        _summary(img, draw, font, rest, budget, band_top(len(top)), width)
    if unserved:
        _unserved(img, draw, font, unserved, band_top(bands), width)
    if curves:
        title = CURVES_TITLE if not rest else (
            f"curves of the {len(top)} disks holding most: " + CURVES_TITLE.split(": ", 1)[1])
        curves_panel(img, draw, font, top, marks, band_top(bands) + others, width, title)
    _legend(img, draw, font, band_top(bands) + others + panel + PAD, width,
            len(top) if rest else None)
    return img


def _summary(img, draw, font, rest: list[DiskBand], budget: int, y: int, width: int) -> None:
    """The summary band at ``y``: a grey swatch (``OTHERS``), how many disks, and how many
    are adopted or have no share yet; their allocation bar summed (held, share, wanted); in
    the image column, how many are limited and by what (``summary_lines``)."""
    name, sums, limited, flags = summary_lines(rest)
    alloc_w, strip_x, _ = columns_x(width)
    fill_box(img, (PAD, y + 2, PAD + SWATCH - 1, y + 1 + SWATCH), OTHERS)
    x = PAD + SWATCH + 6
    draw.text((x, y), fit_text(draw, name, LABEL - x - 8, font, False), fill=TEXT, font=font)
    size = f"{short_size(sum(d.size_bytes for d in rest))} of images"
    draw.text((x, y + LINE), fit_text(draw, f"{flags}, {size}" if flags else f"{size}, summed",
                                      LABEL - x - 8, font, False),
              fill=TEXT if flags else DIM, font=font)
    _allocation(img, draw, font, _summed(rest), OTHERS, budget, (LABEL, y + 2, alloc_w))
    room = width - PAD - strip_x
    lines = [(t, TEXT) for t in (_two_lines(draw, limited, room, font) if limited else [])]
    if len(lines) < 2:            # room for the sums in words above the reasons
        lines.insert(0, (f"{name}: {sums}", DIM))
    for j, (line, colour) in enumerate(lines):
        draw.text((strip_x, y + j * LINE), fit_text(draw, line, room, font, False),
                  fill=colour, font=font)
    draw.line([PAD, y + BAND - 3, width - PAD, y + BAND - 3], fill=(36, 36, 36))


def _unserved(img, draw, font, unserved: list[Unserved], y: int, width: int) -> None:
    """A line per disk not served: its name and why; a disk that would gain (``gain``) in
    the text colour with a triangle (``WOULD_GAIN``) and what it would gain, the others
    dim. Past ``UNSERVED_ROWS``, those that would gain first, then the others in order,
    and the last row counts those left out."""
    n = len(unserved)
    gains = sum(1 for u in unserved if u.gain)
    draw.text((PAD, y), fit_text(draw, f"not served: {n} disk{'' if n == 1 else 's'}"
                                 + (f", {gains} would gain (by vmdisktouch advise)" if gains
                                    else ""), width - 2 * PAD, font, False),
              fill=DIM, font=font)
    rows = list(unserved)
    if n > UNSERVED_ROWS:
        rows = ([u for u in unserved if u.gain] + [u for u in unserved if not u.gain])
        rows = rows[:UNSERVED_ROWS - 1]
    for k, u in enumerate(rows):
        yy = y + (k + 1) * LINE
        x = PAD + SWATCH + 6
        if u.gain:
            draw.polygon([(PAD, yy + SWATCH), (PAD + SWATCH - 1, yy + SWATCH),
                          (PAD + (SWATCH - 1) / 2, yy + 2)], fill=WOULD_GAIN)
        text = f"{u.key}: {u.reason}" + (f"; would gain {u.gain}" if u.gain else "")
        draw.text((x, yy), fit_text(draw, text, width - x - PAD, font, False),
                  fill=TEXT if u.gain else DIM, font=font)
    if len(rows) < n:
        left = n - len(rows)
        draw.text((PAD + SWATCH + 6, y + UNSERVED_ROWS * LINE),
                  f"and {left} more (vmdisktouch discover lists every disk)", fill=DIM,
                  font=font)


CURVES_TITLE = ("what memory buys: the share of each disk's reads from memory at each size "
                "(its curve, through the share measured now); dot: held now, ring: its share")


def curves_panel(img, draw, font, disks: list[DiskBand], marks, y: int, width: int,
                 title: str = CURVES_TITLE) -> None:
    """The curves panel at ``y``: each disk's curve over one log axis of sizes, a dot
    where it holds now, a ring at its share (see the module's theory)."""
    draw.text((PAD, y), fit_text(draw, title, width - 2 * PAD, font, False), fill=DIM, font=font)
    x0, x1 = PAD + 44, width - PAD - 1
    top, bottom = y + LINE + 4, y + LINE + 4 + CHART - 1
    fill_box(img, (x0, top, x1, bottom), TRACK)
    points = [(float(b), float(h)) for d in disks for b, h in (d.curve or ()) if b > 0]
    lo = min(b for b, _ in points)
    hi = max([b for b, _ in points] + [d.size_bytes for d in disks if d.curve])
    span = max(math.log2(hi / lo), 1e-9)

    def at(size: float, ratio: float) -> tuple[float, float]:
        f = math.log2(min(max(size, lo), hi) / lo) / span
        return x0 + f * (x1 - x0), bottom - min(max(ratio, 0.0), 1.0) * (bottom - top)

    for r in (0.0, 0.5, 1.0):
        yy = at(lo, r)[1]
        draw.line([x0, yy, x1, yy], fill=(60, 60, 60))
        draw.text((PAD, yy - LINE // 2), f"{r:.0%}", fill=DIM, font=font)
    size, last_x = 4.0 ** math.ceil(math.log(lo, 4) - 1e-9), -1e9
    while size <= hi * 1.001:                      # round sizes: the powers of 4 (1M, 4M, ...)
        xx = at(size, 0)[0]
        label = short_size(int(size))
        if xx - last_x >= draw.textlength(label, font=font) + 12:
            draw.line([xx, bottom, xx, bottom + 3], fill=DIM)
            w = draw.textlength(label, font=font)
            draw.text((min(max(xx - w / 2, x0), x1 - w), bottom + 4), label, fill=DIM,
                      font=font)
            last_x = xx
        size *= 4
    for d, colour in zip(disks, marks):
        curve = anchored(d)
        pts = [at(b, h) for b, h in curve if b > 0]
        if len(pts) < 2:
            continue
        draw.line(pts, fill=colour, width=2, joint="curve")
        if d.share_bytes:
            sx, sy = at(d.share_bytes, _hit_at(curve, d.share_bytes))
            draw.ellipse([sx - 6, sy - 6, sx + 6, sy + 6], outline=colour, width=2)
        if d.held_bytes > 0:
            hx, hy = at(d.held_bytes, _hit_at(curve, d.held_bytes))
            draw.ellipse([hx - 4, hy - 4, hx + 4, hy + 4], fill=colour, outline=SHARE)


def anchored(d: DiskBand) -> list:
    """Disk ``d``'s curve as the panel draws it: through its measured share of reads from
    memory at what it holds (``d.from_memory``), each point moved by the same amount, at
    most 1; as it is without a measured share (see the module's theory)."""
    pts = [(b, h) for b, h in (d.curve or ()) if b > 0]
    now = (d.from_memory or {}).get("now")
    if len(pts) < 2 or now is None:
        return pts
    shift = float(now) - _hit_at(pts, max(d.held_bytes, 1))
    return [(b, min(1.0, max(0.0, h + shift))) for b, h in pts]


def _hit_at(curve: list, size: int) -> float:
    """The curve's hit ratio at ``size`` bytes, interpolated in log size."""
    pts = [(b, h) for b, h in curve if b > 0]
    xs = np.log2([b for b, _ in pts])
    return float(np.interp(math.log2(max(size, 1)), xs, [h for _, h in pts]))


def _budget_bar(img, held: list[int], marks, budget: int, width: int) -> None:
    """Each of ``held`` (bytes: a disk's, or the summed others') as a segment in its
    colour, 1 px apart; the rest grey."""
    fill_box(img, (PAD, HEAD, width - PAD - 1, HEAD + BAR - 1), UNUSED)
    w = width - 2 * PAD
    x = float(PAD)
    for n, colour in zip(held, marks):
        dx = w * min(n, budget) / budget if budget > 0 else 0.0
        if dx > 0:
            x1 = min(width - PAD - 1, max(int(x), int(x + dx) - 2))
            fill_box(img, (int(x), HEAD, x1, HEAD + BAR - 1), colour)
            fill_box(img, (x1 + 1, HEAD, x1 + 1, HEAD + BAR - 1), BG)
        x += dx


def _allocation(img, draw, font, d: DiskBand, colour, budget, at) -> None:
    """The allocation bar at ``at`` = (x, y, width), scaled to the budget: wanted dim,
    held solid, the share outlined; the numbers below."""
    x, y, w = at
    fill_box(img, (x, y, x + w - 1, y + ROW - 1), TRACK)
    wanted = _px(d.wanted_bytes, budget, w)
    fill_box(img, (x, y, x + wanted - 1, y + ROW - 1), _dim(colour))
    fill_box(img, (x, y, x + _px(d.held_bytes, budget, w) - 1, y + ROW - 1), colour)
    if d.share_bytes is not None:
        share = _px(d.share_bytes, budget, w)
        draw.rectangle([x, y - 1, x + max(1, share) - 1, y + ROW], outline=SHARE)
    if d.wanted_bytes and d.wanted_bytes > budget > 0:       # wants more than the budget
        draw.polygon([(x + w + 1, y), (x + w + 6, y + ROW // 2), (x + w + 1, y + ROW - 1)],
                     fill=_dim(colour))
    text = f"held {short_size(d.held_bytes)}"
    text += ", no share yet" if d.share_bytes is None else f", share {short_size(d.share_bytes)}"
    if d.wanted_bytes is not None:
        text += f", wants {short_size(d.wanted_bytes)}"
    draw.text((x, y - 2 + LINE), fit_text(draw, text, w, font, False), fill=DIM, font=font)


def _legend(img, draw, font, y: int, width: int, top: int | None = None) -> None:
    """What every mark means, a line per picture part; the summary band's grey when the
    picture draws only the ``top`` disks holding most as bands."""
    def entries(yy: int, items) -> None:
        x = PAD
        for kind, colour, label in items:
            box = (x, yy + 2, x + SWATCH - 1, yy + 1 + SWATCH)
            if kind == "outline":
                fill_box(img, box, TRACK)
                draw.rectangle(box, outline=colour)
            elif kind:
                fill_box(img, box, colour)
                if kind != "plain":
                    draw.rectangle(box, outline=DIM)
            if kind:
                x += SWATCH + 6
            draw.text((x, yy), label, fill=TEXT if kind else DIM, font=font)
            x += int(draw.textlength(label, font=font)) + 16

    entries(y, [("solid", NEUTRAL, "held, in the disk's colour (each bar is the budget)"),
                ("plain", _dim(NEUTRAL), "wanted: all it would hold"),
                ("outline", SHARE, "share: given + free budget it could take")])
    entries(y + LINE, [("plain", UNUSED, "top bar: budget not held")]
            + ([("plain", OTHERS, f"the disks past the {top} holding most, summed")]
               if top is not None else []))
    entries(y + 2 * LINE, [("solid", render.HELD, "image: held blocks"),
                           ("solid", render.CACHED, "cached (brighter = more)"),
                           ("solid", render.UNCACHED, "not cached"),
                           (None, None, "(the block map's colours)")])
    entries(y + 3 * LINE, [(None, None, "each disk its own colour, first from its name "
                            "(domain/target, else the path), kept while it stays")])
    entries(y + 4 * LINE, [(None, None, "an image strip's width grows with the log of the "
                            "image's size: the largest is the widest")])
