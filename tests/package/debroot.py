"""A clean Debian 12 root for the package tier: made by mmdebstrap from the machine's
apt sources, entered with chroot, compared file by file before and after.

Theory of operation
-------------------
The root is a directory tree, nothing more. Each command runs in a mount namespace
of its own (``unshare --mount --propagation private``) that mounts /proc and binds
/dev/pts, then chroots: the mounts vanish with the command, whatever happens to the
test, so no mount outlives it and removing the tree can never reach the host's /proc
or /dev. mmdebstrap, as root, makes the root's /dev nodes itself. A command sees a
clean environment (Debian's PATH, no PYTHONPATH, no pyenv), so ``python3`` is the
root's /usr/bin/python3.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))
# What the root holds besides Debian's minbase (Essential: yes and apt): systemd for
# systemd-analyze and systemctl, man-db for the units' Documentation=man:vmdisktouch(1),
# bash-completion to load the completion as an operator's shell does.
BASE_PACKAGES = ("systemd", "man-db", "bash-completion")
# Not compared before and after: apt's and dpkg's bookkeeping, caches, logs and /tmp
# (the tests' scratch files), and the mount points, empty outside a command.
NOT_COMPARED = ("/var/lib/apt", "/var/lib/dpkg", "/var/cache", "/var/log", "/tmp",
                "/proc", "/dev/pts")
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
       "HOME": "/root", "LC_ALL": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive"}


@dataclasses.dataclass(frozen=True)
class Source:
    """One apt source entry: a URI, one suite, its components and its options."""

    uri: str
    suite: str
    components: tuple[str, ...]
    options: tuple[tuple[str, str], ...] = ()

    def line(self) -> str:
        """The one-line form, which mmdebstrap and every apt read."""
        opts = " ".join(f"{k}={v}" for k, v in self.options)
        return " ".join(["deb", *([f"[{opts}]"] if opts else []), self.uri, self.suite,
                         *self.components])


def parse_one_line(text: str) -> list[Source]:
    """The ``deb`` entries of a sources.list: ``deb [opt=v ...] URI SUITE COMP...``."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)\s*(.*)$", line)
        if not m:
            continue
        opts = tuple(tuple(o.split("=", 1)) for o in (m.group(1) or "").split() if "=" in o)
        out.append(Source(m.group(2), m.group(3), tuple(m.group(4).split()), opts))
    return out


def parse_deb822(text: str) -> list[Source]:
    """The ``deb`` entries of a .sources file (sources.list(5), deb822 style): one entry
    per URI and suite; Enabled: no, an inline key and deb-src stanzas left out."""
    out = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for raw in stanza.splitlines():
            if raw.startswith("#"):
                continue
            if raw[:1] in (" ", "\t") and key:
                fields[key] += "\n" + raw.strip()
            elif ":" in raw:
                key, _, value = raw.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        opts = []
        if fields.get("signed-by") and "\n" not in fields["signed-by"]:
            opts.append(("signed-by", fields["signed-by"]))
        if fields.get("architectures"):
            opts.append(("arch", ",".join(fields["architectures"].split())))
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                out.append(Source(uri, suite, tuple(fields.get("components", "").split()),
                                  tuple(opts)))
    return out


def machine_sources(paths=SOURCES) -> list[Source]:
    """Every ``deb`` entry the machine's apt reads: sources.list, then sources.list.d's
    *.list and *.sources (other names, such as *.disabled, apt ignores too)."""
    out: list[Source] = []
    for p in paths:
        files = sorted(p.iterdir()) if p.is_dir() else [p] if p.is_file() else []
        for f in files:
            if f.suffix == ".sources":
                out += parse_deb822(f.read_text())
            elif f.suffix == ".list":
                out += parse_one_line(f.read_text())
    return out


def debian12_sources(sources: list[Source]) -> str:
    """The entries for Debian 12 (bookworm and bookworm-*: updates, security), as
    one-line text. The machine may carry others (scripts/install-py39.sh adds a
    bullseye source for python3.9), which a clean Debian 12 root must not have."""
    keep = [s for s in sources if s.suite == SUITE or s.suite.startswith(SUITE + "-")]
    assert keep, f"no {SUITE} entry in the machine's apt sources ({', '.join(map(str, SOURCES))})"
    return "".join(s.line() + "\n" for s in keep)


def apt_proxy_options() -> list[str]:
    """mmdebstrap's --aptopt for the machine's apt proxy, if it has one: mmdebstrap
    runs apt with a configuration of its own, which does not read /etc/apt/apt.conf.d."""
    out = []
    for key in ("Acquire::http::Proxy", "Acquire::https::Proxy"):
        value = subprocess.run(["apt-config", "dump", "--format", "%v", key],
                               capture_output=True, text=True).stdout.strip()
        if value:
            out.append(f'--aptopt={key} "{value}"')
    return out


def mmdebstrap(target: Path, packages=BASE_PACKAGES, timeout: float = 900) -> None:
    """A minbase Debian 12 root at ``target`` from the machine's sources, apt's lists kept
    (later ``apt-get install`` in it needs no update)."""
    sources = debian12_sources(machine_sources())
    cmd = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(packages),
           "--skip=cleanup/apt/lists", *apt_proxy_options(), SUITE, str(target), "-"]
    out = subprocess.run(cmd, input=sources, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"mmdebstrap failed ({out.returncode}):\n{out.stderr[-3000:]}"


def mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` in this mount namespace."""
    prefix = str(path.resolve())
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return points


def remove_tree(path: Path) -> None:
    """Remove a root, refusing while anything is mounted in it (rm -rf would go through a
    bind mount into the host's files)."""
    if not path.exists():
        return
    mounted = mounts_under(path)
    assert not mounted, f"not removing {path}: still mounted there: {mounted}"
    subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], check=True)


def scratch_dir(prefix: str) -> Path:
    """A new directory under /var/tmp, on disk (a root with its Recommends is 1.6 GB) and
    with a short path (an AF_UNIX socket path is at most 107 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))


_ENTER = ('mount -t proc proc "$0/proc" && mount --bind /dev/pts "$0/dev/pts" '
          '&& exec chroot "$0" "$@"')


class Root:
    """A Debian root directory and the way to run commands in it."""

    def __init__(self, path: Path):
        self.path = path

    def argv(self, *argv: str) -> list[str]:
        """The host command line that runs ``argv`` in the root (see the module's top)."""
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _ENTER,
                str(self.path), *argv]

    def run(self, *argv: str, check: bool = True, timeout: float = 120,
            env: dict | None = None, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` in the root (``env`` added to ENV); with ``check``, a failure
        shows its output."""
        out = subprocess.run(self.argv(*argv), capture_output=True, text=True,
                             env={**ENV, **(env or {})}, timeout=timeout, **kw)
        if check:
            assert out.returncode == 0, (f"{' '.join(argv)} exited {out.returncode}:\n"
                                         f"{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
        return out

    def popen(self, *argv: str, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` in the root. unshare, sh and chroot each exec the next, so the
        process is the command itself: a signal sent to it reaches the command."""
        return subprocess.Popen(self.argv(*argv), env={**ENV, **(env or {})}, **kw)

    def host(self, path: str) -> Path:
        """The host's path of the root's absolute ``path``."""
        return self.path / path.lstrip("/")

    def files(self) -> dict[str, str]:
        """Every path in the root but those in NOT_COMPARED, each with its kind (a
        symlink's target, 'dir' or 'file')."""
        out = {}
        top = str(self.path)
        for dirpath, dirnames, filenames in os.walk(top):
            rel = dirpath[len(top):] or "/"
            dirnames[:] = [d for d in dirnames
                           if not _ignored(os.path.join(rel, d))]
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                path = os.path.join(rel, name)
                if _ignored(path):
                    continue
                out[path] = ("-> " + os.readlink(full) if os.path.islink(full)
                             else "dir" if os.path.isdir(full) else "file")
        return out


def _ignored(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in NOT_COMPARED)


def copy_tree(src: Path, dst: Path) -> None:
    """A copy of a root (``cp -a``: devices, owners, links and all)."""
    subprocess.run(["cp", "-a", "--", str(src), str(dst)], check=True)


def deb_field(deb: Path, field: str) -> str:
    """A field of a .deb's control file."""
    return subprocess.run(["dpkg-deb", "-f", str(deb), field], check=True,
                          capture_output=True, text=True).stdout.strip()


def require_root() -> None:
    """The tier needs root (mmdebstrap's root mode, chroot, mount): it fails, never skips."""
    assert os.geteuid() == 0, "tests/package needs root (mmdebstrap, chroot): run as root"
    for tool in ("mmdebstrap", "unshare", "chroot", "dpkg-deb", "apt-config"):
        assert shutil.which(tool), f"{tool} is not installed: run `make test`, which installs it"
