"""``vmdisktouch run``: the daemon for one disk image.

The loop is ``while not stop.wait(timeout): tick()``; SIGTERM and SIGINT only
set the stop event, so a cycle is never cut in half. On the way out every
hold is released. The image vanishing or being replaced ends the daemon with
a non-zero status (systemd notices); any other per-cycle failure is logged
and the next cycle tries again.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from vmdisktouch import settings
from vmdisktouch.errors import ImageGoneError, LockLimitError, VmdtError
from vmdisktouch.image import open_image

log = logging.getLogger("vmdisktouch")

# After this many consecutive failed cycles the daemon gives up (exit 1).
ERROR_THRESHOLD = 10


class _JournalFormatter(logging.Formatter):
    """Under systemd: no timestamps, syslog priority prefixes (sd-daemon(3))."""

    PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4,
                logging.ERROR: 3, logging.CRITICAL: 2}

    def format(self, record):
        return f"<{self.PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def setup_logging(debug: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournalFormatter("%(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("vmdisktouch")
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    root.propagate = False


def set_argparser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="disk image: raw/qcow2 file or block device")
    settings.add_arguments(parser)


def main(args) -> int:
    setup_logging(getattr(args, "debug", False))
    config = settings.resolve(vars(args))
    from vmdisktouch.daemon import DiskWatcher  # numpy/scipy only once arguments are good

    stop = threading.Event()

    def on_signal(signum, _frame):
        log.info("received %s; releasing holds and exiting", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)

    with open_image(args.path) as image:
        if image.format == "qcow2":
            log.warning("%s is qcow2: blocks are host-file offsets, not guest offsets",
                        image.path)
        watcher = DiskWatcher(image, config, sleep=stop.wait)
        try:
            return _loop(watcher, config, stop)
        finally:
            watcher.close()
            log.info("released all holds")


def _loop(watcher, config, stop: threading.Event) -> int:
    failures = 0
    timeout = 0.0
    while not stop.wait(timeout):
        started = watcher.clock()
        try:
            watcher.tick()
            failures = 0
        except (ImageGoneError, LockLimitError):
            raise
        except VmdtError as exc:
            failures += 1
            log.error("cycle failed (%d/%d): %s", failures, ERROR_THRESHOLD, exc)
            if failures >= ERROR_THRESHOLD:
                raise
        timeout = max(0.0, config.interval - (watcher.clock() - started))
    return 0
