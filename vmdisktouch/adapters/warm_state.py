"""Warm restart: the heat map and held regions of an image, saved and restored across runs.

Theory of operation
-------------------
After a restart (an upgrade, a crash, a host reboot) the daemon would start
cold: it needs some cycles of evidence before it holds anything, and the
guest pays for them. So the daemon saves, every ``state_save_interval`` and
when it stops, each image's heat (both components) and held regions in
``state_dir`` (the units: /var/lib/vmdisktouch), one file per image named
after its identity, replaced atomically (``atomic.write_bytes``): a SIGKILL
leaves the last save. At start it restores the heat, decayed by the time
the daemon was away (``exp(-decay * seconds)``, wall clock), so the first
cycle's selection takes the regions that were hot, which the holder loads
paced and above the free-memory floor as it loads any region, before the
guest asks for them; the saved heat then goes on decaying from where it
stopped.

The file is an ``.npz`` (numpy's zip of arrays, no pickles): ``meta`` (JSON:
format version, the image's identity, size and block size, the wall time of
the save), ``heat_resident``, ``heat_rewritten`` and ``held`` (runs of
blocks). A file that is missing is a cold start (one line); one that is
corrupt, of another version, for another image (another device and inode,
or device number for a block device: a replaced image is never restored),
of another size or block size, or from the future, is ignored with one
line saying why. Nothing here ever stops the daemon: warm state is an
optimisation.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import stat
import zipfile
from dataclasses import dataclass

import numpy as np

from vmdisktouch.adapters import atomic
from vmdisktouch.sizes import format_size

log = logging.getLogger("vmdisktouch")

VERSION = 1


@dataclass(frozen=True)
class Saved:
    heat_resident: np.ndarray
    heat_rewritten: np.ndarray
    held: list[tuple[int, int]]
    saved_at: float                  # wall clock, seconds


def identity(image) -> dict:
    st = os.fstat(image.fd)
    if stat.S_ISBLK(st.st_mode):
        return {"kind": "block", "rdev": [os.major(st.st_rdev), os.minor(st.st_rdev)]}
    return {"kind": "file", "dev": [os.major(st.st_dev), os.minor(st.st_dev)],
            "ino": st.st_ino}


def state_path(directory: str, image) -> str:
    ident = identity(image)
    if ident["kind"] == "block":
        name = "blk-{}:{}.state.npz".format(*ident["rdev"])
    else:
        name = "file-{}:{}-{}.state.npz".format(*ident["dev"], ident["ino"])
    return os.path.join(directory, name)


def save(directory: str, image, block_size: int, heat_resident: np.ndarray,
         heat_rewritten: np.ndarray, held: list[tuple[int, int]], now_wall: float) -> str:
    """Write the state of ``image`` (atomically); returns the path. OSError on failure."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    meta = {"version": VERSION, "identity": identity(image), "path": image.path,
            "size": int(image.size), "block_size": int(block_size), "saved_at": now_wall}
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                        heat_resident=np.asarray(heat_resident, dtype=np.float32),
                        heat_rewritten=np.asarray(heat_rewritten, dtype=np.float32),
                        held=np.asarray(held, dtype=np.int64).reshape(-1, 2))
    path = state_path(directory, image)
    atomic.write_bytes(path, buf.getvalue(), 0o600)
    return path


def load(directory: str, image, block_size: int, now_wall: float) -> Saved | None:
    """The saved state of ``image``, or None (one log line saying why)."""
    path = state_path(directory, image)
    try:
        saved, why = _read(path, image, block_size, now_wall)
    except FileNotFoundError:
        log.info("%s: no saved state in %s: a cold start", image.path, directory)
        return None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
        saved, why = None, f"unreadable ({exc.__class__.__name__}: {exc})"
    if saved is None:
        log.warning("%s: ignoring the saved state %s: %s; a cold start", image.path, path, why)
    return saved


def _read(path: str, image, block_size: int, now_wall: float):
    with open(path, "rb") as f:
        data = f.read(1 << 31)
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        if meta.get("version") != VERSION:
            return None, f"format version {meta.get('version')!r}, not {VERSION}"
        if meta.get("identity") != identity(image):
            return None, (f"it is of another image ({meta.get('path')}, "
                          f"{meta.get('identity')}): replaced since")
        if meta.get("size") != image.size:
            return None, f"the image was {meta.get('size')} bytes, now {image.size}"
        if meta.get("block_size") != block_size:
            return None, f"block size {meta.get('block_size')}, now {block_size}"
        saved_at = float(meta["saved_at"])
        if not math.isfinite(saved_at) or saved_at > now_wall + 60:
            return None, f"saved in the future ({saved_at:.0f})"
        n = image.block_count(block_size)
        hr = np.asarray(z["heat_resident"], dtype=np.float32)
        hw = np.asarray(z["heat_rewritten"], dtype=np.float32)
        held = np.asarray(z["held"], dtype=np.int64).reshape(-1, 2)
    if hr.shape != (n,) or hw.shape != (n,):
        return None, f"its maps have {hr.size} blocks, not {n}"
    if not (np.isfinite(hr).all() and np.isfinite(hw).all()) or (hr < 0).any() or (hw < 0).any():
        return None, "its heat is not finite and non-negative"
    runs = [(int(a), int(b)) for a, b in held if 0 <= a < b <= n]
    return Saved(hr, hw, runs, saved_at), None


class Keeper:
    """The daemon's side: restore at start, save every ``interval`` s and at stop."""

    def __init__(self, directory: str, interval: float, clock, wall):
        self.directory = directory
        self.interval = interval
        self.clock = clock               # monotonic: when to save
        self.wall = wall                 # wall clock: how long the daemon was away
        self.last = clock()
        self.failing = False

    def restore(self, watcher) -> bool:
        now = self.wall()
        saved = load(self.directory, watcher.image, watcher.block_size, now)
        if saved is None:
            return False
        away = max(0.0, now - saved.saved_at)
        watcher.restore(saved, away)
        held = sum(b - a for a, b in saved.held) * watcher.block_size
        log.info("%s: restored the heat saved %.0f s ago (%d blocks above the threshold "
                 "now; %s were held then)", watcher.image.path, away,
                 int((watcher.policy.state.total >= watcher.config.threshold).sum()),
                 format_size(held))
        return True

    def maybe_save(self, watcher) -> None:
        if self.clock() - self.last >= self.interval:
            self.save(watcher)

    def save(self, watcher) -> None:
        self.last = self.clock()
        hr, hw, held = watcher.warm_state()
        try:
            path = save(self.directory, watcher.image, watcher.block_size, hr, hw, held,
                        self.wall())
        except OSError as exc:
            if not self.failing:
                log.warning("%s: cannot save the warm-restart state in %s: %s",
                            watcher.image.path, self.directory, exc.strerror or exc)
            self.failing = True
        else:
            if self.failing:
                log.info("%s: saved the warm-restart state again (%s)", watcher.image.path,
                         path)
            self.failing = False
