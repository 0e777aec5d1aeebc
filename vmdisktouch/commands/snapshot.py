"""``vmdisktouch snapshot``: a one-shot page-cache residency report.

For each PATH (a raw or qcow2 image file, a sparse file, or a block device
such as an LVM volume or a loop device) the image is opened read-only
(``image.open_image``), scanned once (``residency.scan``) and reported:

* by default as a vmtouch-like summary (resident pages / total pages, bytes,
  percent, scan time);
* with ``--json`` as a JSON array, one object per image that could be read;
* with ``--png FILE`` also as a block map (``render.residency_image``),
  written atomically.

The formatting functions (``build_record``, ``format_summary``,
``format_json``) are pure: they take values and return dicts and strings.
``main`` is the only function here that opens files, reads the clock or
prints. A bad PATH gives one ``vmdisktouch: <message>`` line on stderr; the
other PATHs are still reported, and the exit status is that of the first
PATH that failed (docs/exit-codes.md): 66 for an image that is missing,
unusable, or whose residency this process cannot see (below), 78 for a
``--png`` that cannot be written, 1 for a scan that failed.

The map's settings (``--block-size``, ``--blocks-per-pixel``, ``--width``,
``--scale``) are the settings of ``run`` of the same names, checked by the
same parsers (``settings.parse_value``): a bad value is exit 78 naming the
option, as ``run`` says it, never a different bound or code here.

Not the owner, and no write access: refused, never a number. Since Linux
5.2 (mm/mincore.c, ``can_do_mincore``) ``mincore`` answers "resident" for
every page of a file the caller neither owns (nor has CAP_FOWNER for) nor
may open for writing, and ``cachestat`` refuses such a file (EPERM), so a
scan would report 100 % whatever is cached (``residency.residency_hidden``).
A note under such a number would still leave the number in a script's
``--json``; a report with no number would be a success that says nothing.
So the PATH is refused (66, one line saying why and what to do: run as its
owner or as root), like any other image this process cannot use.

Nothing is ever written to an image: it is opened ``O_RDONLY`` (plus
``O_NOATIME``), mapped ``PROT_READ`` only for ``mincore``, and never read
through the mapping.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from vmdisktouch.config import settings
from vmdisktouch.system.observe import residency
from vmdisktouch.errors import ConfigError, ImageError, UsageError, VmdtError
from vmdisktouch.system.image import open_image
from vmdisktouch.sizes import counted, format_size

QCOW2_NOTE = ("qcow2 image: offsets are host-file offsets, not guest offsets "
              "(the qcow2 layer maps guest blocks to clusters of the file)")
HIDDEN = ("cannot see its residency: Linux reports every page of a file as cached to a "
          "process that neither owns it nor may write it (mincore(2)); run as its owner "
          "or as root")
LABEL_WIDTH = 16

EXIT_OK = 0


# ---------------------------------------------------------------------------
# Argument parsing


# The map's settings: ``run``'s settings of the same names, parsed as ``run`` parses them.
MAP_SETTINGS = ("block_size", "blocks_per_pixel", "width", "scale")


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="disk image: raw or qcow2 file, sparse file, or block device")
    parser.add_argument("--json", action="store_true",
                        help="print a JSON array with one object per image that could be read "
                             "(keys: path, size_bytes, page_size, total_pages, resident_pages, "
                             "block_size, scan_seconds, resident_ranges, kind, format, "
                             "used_cachestat, partial_view (always false: an image whose residency "
                             "the kernel hides from this process is refused), note)")
    parser.add_argument("--png", metavar="FILE",
                        help="also write the block map of the image as a PNG, replaced "
                             "atomically, with a header, an offset axis and a legend (green "
                             "brightness = fraction of the pixel's pages cached, black = "
                             "none, grey checkerboard = a hole of a sparse file). Needs "
                             "exactly one PATH: one map per file, no naming rule to guess")
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument("--blocks-per-pixel", metavar="N",
                        help="blocks covered by each pixel of the PNG")
    layout.add_argument("--width", metavar="W",
                        help="map pixels per row of the PNG; blocks per pixel chosen to fit")
    parser.add_argument("--scale", metavar="K",
                        help="draw each map pixel as a K x K square (default: the smallest "
                             "factor that makes the map at least 512 pixels wide)")
    parser.add_argument("--block-size", metavar="SIZE",
                        help="bytes per block of the map, a multiple of the page size "
                             "(default 1M; see residency.py for why)")


# ---------------------------------------------------------------------------
# Pure formatting


def build_record(*, path: str, kind: str, fmt: str, res: residency.Residency,
                 scan_seconds: float) -> dict:
    """The JSON object describing one image's residency."""
    notes = []
    if fmt == "qcow2":
        notes.append(QCOW2_NOTE)
    return {
        "path": path,
        "size_bytes": res.size_bytes,
        "page_size": res.page_size,
        "total_pages": res.total_pages,
        "resident_pages": res.resident_pages,
        "block_size": res.block_size,
        "scan_seconds": round(scan_seconds, 6),
        "resident_ranges": [[int(o), int(n)] for o, n in (res.ranges or [])],
        "kind": kind,
        "format": fmt,
        "used_cachestat": res.used_cachestat,
        "partial_view": res.partial_view,
        "note": "; ".join(notes) or None,
    }


def _percent(part: int, whole: int) -> str:
    if whole == 0:
        return "0%"
    pct = 100.0 * part / whole
    return f"{pct:.3g}%"


def format_summary(record: dict) -> str:
    """vmtouch-like lines for one image (no trailing newline)."""
    def line(label: str, value: str) -> str:
        return f"{label + ':':>{LABEL_WIDTH}} {value}"

    res_pages, total_pages = record["resident_pages"], record["total_pages"]
    res_bytes = min(res_pages * record["page_size"], record["size_bytes"])
    kind = "block device" if record["kind"] == "block" else "file"
    lines = [
        line("Image", record["path"]),
        line("Type", f"{kind}, {record['format']}"),
        line("Resident Pages",
             f"{res_pages}/{total_pages}  {format_size(res_bytes)}/"
             f"{format_size(record['size_bytes'])}  {_percent(res_pages, total_pages)}"),
        line("Elapsed", f"{record['scan_seconds']:.6f} seconds"),
    ]
    if record.get("note"):
        lines.extend(line("Note", n) for n in record["note"].split("; "))
    return "\n".join(lines)


def format_json(records: list[dict]) -> str:
    """A JSON array, indented, with one ``[offset, length]`` range per line."""
    objs = []
    for rec in records:
        head = dict(rec)
        ranges = head.pop("resident_ranges")
        body = json.dumps(head, indent=2).split("\n")          # "{", '  "k": v', ..., "}"
        if ranges:
            rtext = ("[\n" + ",\n".join(f"    [{o}, {n}]" for o, n in ranges) + "\n  ]")
        else:
            rtext = "[]"
        body[-2] += ","
        body[-1:] = [f'  "resident_ranges": {rtext}', "}"]
        objs.append("\n".join("  " + ln for ln in "\n".join(body).split("\n")))
    if not objs:
        return "[]\n"
    return "[\n" + ",\n".join(objs) + "\n]\n"


def format_png_line(path: str, width: int, height: int, blocks_per_pixel: int) -> str:
    return (f"{'Map:':>{LABEL_WIDTH}} {path} ({width}x{height} pixels, "
            f"{counted(blocks_per_pixel, 'block')} per pixel)")


# ---------------------------------------------------------------------------
# Wiring


def _scan_one(path: str, block_size: int, want_ranges: bool, want_holes: bool = False):
    """(record, residency, holes per block or None) of one image; an ``ImageError`` when
    the kernel hides its residency from this process (the module docstring)."""
    with open_image(path) as img:
        if residency.residency_hidden(img.fd):
            raise ImageError(f"{path}: {HIDDEN}")
        t0 = time.perf_counter()
        res = residency.scan(img.fd, img.size, block_size, want_ranges=want_ranges)
        seconds = time.perf_counter() - t0
        holes = None
        if want_holes and img.is_regular:
            from vmdisktouch.core.runs import runs_to_mask
            holes = ~runs_to_mask(img.data_runs((0, res.nblocks), block_size), res.nblocks)
        return build_record(path=path, kind=img.kind, fmt=img.format, res=res,
                            scan_seconds=seconds), res, holes


def _write_png(path: str, res: residency.Residency, holes, record: dict, args) -> str:
    import dataclasses

    from vmdisktouch.adapters.pictures import figure, render  # PIL is only needed here
    from vmdisktouch.adapters.atomic import write_png

    layout = render.Layout.fit(res.nblocks, blocks_per_pixel=args.blocks_per_pixel,
                               width=args.width)
    layout = dataclasses.replace(layout, scale=figure.fit_scale(layout.width, args.scale))
    grid = render.block_map_image(res.fraction(), None, None, layout, hole_mask=holes)
    header = figure.header_lines(
        record["path"], time.time(), resident=record["resident_pages"] * record["page_size"],
        size=record["size_bytes"], blocks_per_pixel=layout.blocks_per_pixel,
        block_size=res.block_size, what="page cache")
    legend = [x for x in figure.MAP_LEGEND if x[1] in (render.CACHED, render.UNCACHED)
              or (x[1] == render.HOLE[0] and holes is not None)]
    image = figure.compose(grid, layout, res.block_size, header, legend=legend).image
    try:
        write_png(path, image)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write PNG: {exc.strerror or exc}") from None
    return format_png_line(path, image.width, image.height, layout.blocks_per_pixel)


def _check_png_path(png: str, image_path: str) -> None:
    """Refuse a ``--png`` that is the image itself, or anything but a PNG or a new file."""
    from vmdisktouch.adapters import outputs
    image = outputs.Protected.of_path(image_path, f"the disk image {image_path}")
    problem = outputs.path_problem(png, "map_png", [image] if image else [])
    if problem:
        raise ConfigError(f"refusing --png {png}: {problem}")


def map_settings(args) -> None:
    """Parse the map's flags in place as ``run`` parses its settings; ConfigError (78)."""
    for key in MAP_SETTINGS:
        setting = settings.BY_KEY[key]
        raw = getattr(args, key)
        setattr(args, key, setting.default if raw is None
                else settings.parse_value(setting, raw, f"option {setting.flag}"))


def main(args) -> int:
    if args.png is not None and len(args.paths) != 1:
        raise UsageError(f"--png needs exactly one PATH (got {len(args.paths)})")
    map_settings(args)
    if args.png is not None:
        _check_png_path(args.png, args.paths[0])
    records: list[dict] = []
    status = EXIT_OK
    for path in args.paths:
        try:
            record, res, holes = _scan_one(path, args.block_size, want_ranges=args.json,
                                           want_holes=args.png is not None)
            png_line = (_write_png(args.png, res, holes, record, args)
                        if args.png is not None else None)
        except VmdtError as exc:
            print(f"vmdisktouch: {exc}", file=sys.stderr, flush=True)
            status = status or exc.exit_code          # the first failure's
            continue
        records.append(record)
        if not args.json:
            text = format_summary(record) + (f"\n{png_line}" if png_line else "")
            sep = "\n" if len(records) > 1 else ""
            sys.stdout.write(sep + text + "\n")
            sys.stdout.flush()
    if args.json:
        sys.stdout.write(format_json(records))
    return status
