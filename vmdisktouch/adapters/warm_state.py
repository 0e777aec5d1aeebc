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
line saying why. A heat that is finite but more than reads can make
(``3e38`` kept 8 MiB held unread for 15 minutes) is capped where every
loaded heat is, the summary a domain carries included (``heat.cap_loaded``,
in ``Watcher.restore``), with one line. Nothing here ever stops the daemon:
warm state is an optimisation.

What a local user or a stray file can plant there. The state
directory must be closed to other users (``files.open_dir(private=True)``:
root's or the daemon's user's, as every directory above it, none writable
by group or others, never reached through a symlink it ends in); one that
is not refuses the start (exit 78, as an output path would: a setup
error), and is made 0700 when missing. A state file is opened
``O_NONBLOCK | O_NOFOLLOW`` relative to that directory and must be a
regular file (``fstat``): a FIFO hung the start in ``open`` for good, deaf
to SIGTERM, and a symlink to ``/dev/zero`` or ``/etc/shadow`` was read. What
is read and what is unpacked are bounded by what this image's state can
be: ``limits(n)`` for ``n`` blocks (each heat map 4 bytes a block, the held
runs at most one per two blocks, the meta 64 KiB), checked against the
file's size, each member's unpacked size in the zip's directory and the
bytes actually unpacked (read ``limit + 1`` at most), and each ``.npy``
header's shape against its bytes, so no array is allocated before its data
is there (a 1 GiB sparse file cost 1.09 GB of memory, a 1.9 MB zip bomb
1.98 GB and 9.4 s). Such a file is ignored with one line.

The identity is the device and inode (a block device: its device number)
and, since an inode number is reused (``rm img; cp other img`` got the same
one back on ext4 and restored the other image's heat), the inode's
generation (``FS_IOC_GETVERSION``: ext4, XFS, btrfs give a new one to a new
file), or where the file system has none (tmpfs, NFS, a block device) a
fingerprint of the image's first 4 KiB: a guest that rewrote them between
the save and the start starts cold, which costs a warm-up, never wrong heat.
"""

from __future__ import annotations

import errno
import hashlib
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
from vmdisktouch.errors import ConfigError, VmdtError, file_kind
from vmdisktouch.sizes import format_size
from vmdisktouch.system import files

log = logging.getLogger("vmdisktouch")

VERSION = 2                      # 2: the identity has the generation or the fingerprint
META_BYTES = 64 << 10            # the meta's JSON is far smaller
SLACK = 64 << 10                 # the zip's and the .npy headers
FINGERPRINT_BYTES = 4096
PACKED = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)   # bzip2 and lzma unpack unbounded
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


class Refused(ValueError):
    """A state file that is not one this daemon could have written for this image."""


@dataclass(frozen=True)
class Saved:
    heat_resident: np.ndarray
    heat_rewritten: np.ndarray
    held: list[tuple[int, int]]
    saved_at: float                  # wall clock, seconds


def identity(image) -> dict:
    st = os.fstat(image.fd)
    if stat.S_ISBLK(st.st_mode):
        ident = {"kind": "block", "rdev": [os.major(st.st_rdev), os.minor(st.st_rdev)]}
    else:
        ident = {"kind": "file", "dev": [os.major(st.st_dev), os.minor(st.st_dev)],
                 "ino": st.st_ino}
        generation = files.inode_generation(image.fd)
        if generation is not None:
            ident["generation"] = generation
            return ident
    ident["fingerprint"] = _fingerprint(image)
    return ident


def _fingerprint(image) -> str | None:
    try:
        head = files.pread(image.fd, FINGERPRINT_BYTES, 0)
    except VmdtError:
        return None
    return hashlib.blake2b(head, digest_size=8).hexdigest()


def state_name(image) -> str:
    st = os.fstat(image.fd)
    if stat.S_ISBLK(st.st_mode):
        return f"blk-{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}.state.npz"
    return f"file-{os.major(st.st_dev)}:{os.minor(st.st_dev)}-{st.st_ino}.state.npz"


def state_path(directory: str, image) -> str:
    return os.path.join(directory, state_name(image))


def check_directory(directory: str) -> None:
    """Refuse (``ConfigError``) a state directory others could plant files in; make it
    (0700) when it is missing."""
    try:
        os.close(files.open_dir(directory, private=True, create=0o700))
    except OSError as exc:
        raise ConfigError(f"refusing --state-dir {directory}: "
                          f"{exc.strerror or exc}") from None


def limits(n: int) -> dict[str, int]:
    """The most bytes each member of the state of an image of ``n`` blocks unpacks to."""
    return {"meta": META_BYTES, "heat_resident": 4 * n + SLACK,
            "heat_rewritten": 4 * n + SLACK, "held": 16 * (n // 2 + 1) + SLACK}


def file_limit(n: int) -> int:
    """The largest state file of an image of ``n`` blocks (deflate never grows much)."""
    total = sum(limits(n).values())
    return total + total // 64 + SLACK


def save(directory: str, image, block_size: int, heat_resident: np.ndarray,
         heat_rewritten: np.ndarray, held: list[tuple[int, int]], now_wall: float) -> str:
    """Write the state of ``image`` (atomically); returns the path. OSError on failure."""
    os.close(files.open_dir(directory, private=True, create=0o700))
    meta = {"version": VERSION, "identity": identity(image), "path": image.path,
            "size": int(image.size), "block_size": int(block_size), "saved_at": now_wall}
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
                        heat_resident=np.asarray(heat_resident, dtype=np.float32),
                        heat_rewritten=np.asarray(heat_rewritten, dtype=np.float32),
                        held=np.asarray(held, dtype=np.int64).reshape(-1, 2))
    path = state_path(directory, image)
    atomic.write_bytes(path, buf.getvalue(), 0o600, private=True)
    return path


def load(directory: str, image, block_size: int, now_wall: float) -> Saved | None:
    """The saved state of ``image``, or None (one log line saying why)."""
    path = state_path(directory, image)
    try:
        saved, why = _read(directory, image, block_size, now_wall)
    except FileNotFoundError:
        log.info("%s: no saved state in %s: a cold start", image.path, directory)
        return None
    except Refused as exc:
        saved, why = None, str(exc)
    except (OSError, ValueError, KeyError, TypeError, RecursionError, zipfile.BadZipFile,
            EOFError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        saved, why = None, f"unreadable ({exc.__class__.__name__}: {why})"
    if saved is None:
        why = "".join(c if c.isprintable() else "?" for c in str(why))[:600]
        log.warning("%s: ignoring the saved state %s: %s; a cold start", image.path, path, why)
    return saved


def _read(directory: str, image, block_size: int, now_wall: float):
    n = image.block_count(block_size)
    z = _members(_read_file(directory, state_name(image), file_limit(n)), n)
    meta = json.loads(bytes(z["meta"]).decode())
    if not isinstance(meta, dict):
        return None, "its meta is not a JSON object"
    if meta.get("version") != VERSION:
        return None, f"format version {_shown(meta.get('version'))}, not {VERSION}"
    ident = identity(image)
    if meta.get("identity") != ident:
        return None, (f"it is of another image ({_shown(meta.get('path'))}, "
                      f"{_shown(meta.get('identity'))}, not {ident}): replaced since")
    if meta.get("size") != image.size:
        return None, f"the image was {_shown(meta.get('size'))} bytes, now {image.size}"
    if meta.get("block_size") != block_size:
        return None, f"block size {_shown(meta.get('block_size'))}, now {block_size}"
    saved_at = float(meta["saved_at"])
    if not math.isfinite(saved_at) or saved_at > now_wall + 60:
        return None, f"saved in the future ({saved_at:.0f})"
    hr = np.asarray(z["heat_resident"], dtype=np.float32)
    hw = np.asarray(z["heat_rewritten"], dtype=np.float32)
    held = np.asarray(z["held"], dtype=np.int64).reshape(-1, 2)
    if hr.shape != (n,) or hw.shape != (n,):
        return None, f"its maps have {hr.size} blocks, not {n}"
    if not (np.isfinite(hr).all() and np.isfinite(hw).all()) or (hr < 0).any() or (hw < 0).any():
        return None, "its heat is not finite and non-negative"
    runs = [(int(a), int(b)) for a, b in held if 0 <= a < b <= n]
    return Saved(hr, hw, runs, saved_at), None


def _shown(value, most: int = 200) -> str:
    """A value read from the file, for a log line: escaped (``repr``) and bounded."""
    text = repr(value)
    return text if len(text) <= most else text[:most] + "…"


def _read_file(directory: str, name: str, limit: int) -> bytes:
    """The file's bytes: a regular file, not reached through a link, at most ``limit``."""
    dfd = files.open_dir(directory, private=True)
    try:
        fd = os.open(name, OPEN_FLAGS, dir_fd=dfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused("it is a symbolic link") from None
        raise
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"it is {file_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise Refused(f"it is {st.st_size} bytes, more than the {limit} the state of "
                          "this image can be")
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > limit:
        raise Refused(f"it grew past the {limit} bytes the state of this image can be")
    return b"".join(chunks)


def _members(data: bytes, n: int) -> dict[str, np.ndarray]:
    """The ``.npz``'s arrays, each unpacked only up to what this image's state needs."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = {i.filename: i for i in z.infolist()}
        for key, limit in limits(n).items():
            info = infos.get(key + ".npy")
            if info is None:
                raise Refused(f"it has no {key}")
            if info.compress_type not in PACKED or info.flag_bits & 0x1:   # 0x1: encrypted
                raise Refused(f"its {key} is packed in a way vmdisktouch never writes")
            if info.file_size > limit:
                raise Refused(f"its {key} unpacks to {info.file_size} bytes, more than the "
                              f"{limit} the state of this image can be")
            with z.open(info) as f:
                raw = f.read(limit + 1)
            if len(raw) > limit:
                raise Refused(f"its {key} unpacks to more than {limit} bytes")
            out[key] = _npy(raw, key)
    return out


def _npy(raw: bytes, key: str) -> np.ndarray:
    """One ``.npy``: the header's shape must match its bytes (nothing allocated first)."""
    f = io.BytesIO(raw)
    version = np.lib.format.read_magic(f)
    header = {(1, 0): np.lib.format.read_array_header_1_0,
              (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if header is None:
        raise Refused(f"its {key} is .npy version {version}")
    shape, fortran, dtype = header(f)
    body = raw[f.tell():]
    if dtype.kind not in "fiu" or math.prod(shape) * dtype.itemsize != len(body):
        raise Refused(f"its {key} is not the array its header says")
    return np.frombuffer(body, dtype=dtype).reshape(shape, order="F" if fortran else "C")


class Keeper:
    """The daemon's side: restore at start, save every ``interval`` s and at stop."""

    def __init__(self, directory: str, interval: float, clock, wall):
        self.directory = directory
        self.interval = interval
        self.clock = clock               # monotonic: when to save
        self.wall = wall                 # wall clock: how long the daemon was away
        self.last = clock()
        self.failing = False

    def restore(self, watcher, saved: Saved | None) -> float | None:
        """Start ``watcher`` from ``saved``, its state ``load`` read when it was opened;
        the wall time of that save (None: none)."""
        now = self.wall()
        if saved is None:
            return None
        away = max(0.0, now - saved.saved_at)
        watcher.restore(saved, away)
        held = sum(b - a for a, b in saved.held) * watcher.block_size
        log.info("%s: restored the heat saved %.0f s ago (%d blocks above the threshold "
                 "now; %s were held then)", watcher.image.path, away,
                 int((watcher.policy.state.total >= watcher.config.threshold).sum()),
                 format_size(held))
        return saved.saved_at

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
