"""The Debian 12 system the VM tier boots: a root made by mmdebstrap from the machine's
apt sources, turned into a raw ext4 disk image, with the root's own kernel and initrd
beside it, cached so a second run skips the build.

Theory of operation
-------------------
The root holds systemd (as init), the Debian kernel, qemu-guest-agent (the test drives
the guest through it: guest-exec over virtio-serial), libvirtd with QEMU (for a nested
TCG domain) and every Depends and Recommends of the package under test, read from the
.deb itself. The .deb is not in the root: it comes on a second, small disk at each boot
(``payload_image``), so a change of the code rebuilds a 4 MB disk, not the 1 GB root,
while a change of its dependencies changes the package list and so the cache key.

The cache key is a hash of the package list, the apt sources and this module's own text
(the recipe: what is written into the root). A built image lives in
``CACHE/<key>/`` (root.img, vmlinuz, initrd.img), renamed into place whole, so an
interrupted build leaves nothing that looks finished. The VM never writes it: each boot
runs on a qcow2 overlay of its own.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from tests.package import debroot

CACHE = Path(os.environ.get("VMDT_VM_CACHE", "/var/cache/vmdisktouch-tests/vm"))
# What the guest needs besides the package's own dependencies: systemd as PID 1 (with
# udev and dbus), the kernel, the agent the test talks to, libvirt with QEMU for a
# nested domain, curl to scrape the metrics socket.
GUEST_PACKAGES = ("systemd", "systemd-sysv", "udev", "dbus", "linux-image-amd64",
                  "initramfs-tools", "kmod", "qemu-guest-agent", "curl",
                  "libvirt-daemon-system", "libvirt-daemon-driver-qemu", "libvirt-clients",
                  "qemu-system-x86")
ROOT_SIZE = "4G"  # sparse; the root's files take about 1.1 GB
# Units that only cost boot time or add noise in a throw-away guest.
MASKED = ("apt-daily.timer", "apt-daily-upgrade.timer", "dpkg-db-backup.timer",
          "e2scrub_all.timer", "e2scrub_reap.service", "fstrim.timer", "logrotate.timer",
          "man-db.timer", "libvirt-guests.service", "systemd-networkd-wait-online.service")
GUEST_FILES = {
    "/etc/fstab": ("/dev/vda / ext4 rw,errors=remount-ro 0 1\n"
                   "LABEL=vmdt-payload /mnt/payload ext4 ro,nofail 0 0\n"),
    "/etc/hostname": "vmdt-guest\n",
    "/etc/hosts": "127.0.0.1 localhost\n127.0.1.1 vmdt-guest\n",
    # The serial console logs in as root without a password (for a person debugging a
    # failed run: the console goes to a file the test keeps).
    "/etc/systemd/system/serial-getty@ttyS0.service.d/autologin.conf":
        "[Service]\nExecStart=\nExecStart=-/sbin/agetty --autologin root --keep-baud "
        "115200,57600,38400,9600 %I $TERM\n",
    # The journal is kept in /run (volatile), as on a host without /var/log/journal.
    "/etc/systemd/journald.conf.d/vmdt.conf": "[Journal]\nStorage=volatile\n",
}


def deb_dependencies(deb: Path) -> list[str]:
    """The package names of a .deb's Depends and Recommends, alternatives and versions
    dropped (the first of ``a | b`` is the one apt picks)."""
    names = []
    for field in ("Depends", "Recommends"):
        for item in debroot.deb_field(deb, field).split(","):
            first = item.split("|")[0].strip()
            name = re.split(r"[\s(:]", first, maxsplit=1)[0]
            if name:
                names.append(name)
    return names


def package_list(deb: Path) -> list[str]:
    """Everything installed in the guest's root, sorted and unique."""
    return sorted(set(GUEST_PACKAGES) | set(deb_dependencies(deb)))


def cache_key(packages: list[str], sources: str) -> str:
    """The hash naming a built image: the package list, the sources and the recipe."""
    h = hashlib.sha256()
    h.update("\n".join(packages).encode())
    h.update(sources.encode())
    h.update(Path(__file__).read_bytes())
    return h.hexdigest()[:16]


class GuestImage:
    """A built image: the root disk and the kernel and initrd that boot it."""

    def __init__(self, path: Path):
        self.path = path
        self.root = path / "root.img"
        self.kernel = path / "vmlinuz"
        self.initrd = path / "initrd.img"

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.root, self.kernel, self.initrd))


def configure(root: Path) -> None:
    """Write the guest's configuration into the root's tree (GUEST_FILES, MASKED)."""
    for path, text in GUEST_FILES.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    for unit in MASKED:
        link = root / "etc/systemd/system" / unit
        link.unlink(missing_ok=True)
        link.symlink_to("/dev/null")
    # No default network: it needs dnsmasq, and the nested domain has no NIC.
    for p in (root / "etc/libvirt/qemu/networks/autostart").glob("*.xml"):
        p.unlink()
    # The console's root login needs an empty password, not a locked one.
    subprocess.run(["chroot", str(root), "passwd", "-d", "root"], check=True,
                   capture_output=True)


def build(target: GuestImage, packages: list[str], log=print) -> None:
    """mmdebstrap a root with ``packages``, configure it and make its disk image."""
    debroot.require_root()
    for tool in ("mkfs.ext4", "qemu-img"):
        assert shutil.which(tool), f"{tool} is missing: run `make test`, which installs it"
    work = Path(str(target.path) + ".building")
    debroot.remove_tree(work)
    work.mkdir(parents=True)
    try:
        started = time.monotonic()
        root = work / "tree"
        debroot.mmdebstrap(root, packages=packages, timeout=1800)
        configure(root)
        kernels = sorted((root / "boot").glob("vmlinuz-*"))
        initrds = sorted((root / "boot").glob("initrd.img-*"))
        assert kernels and initrds, f"no kernel or initrd in the root's /boot: {kernels} {initrds}"
        shutil.copy(kernels[-1], work / "vmlinuz")
        shutil.copy(initrds[-1], work / "initrd.img")
        out = subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "vmdt-root", "-d", str(root),
                              str(work / "root.img"), ROOT_SIZE],
                             capture_output=True, text=True)
        assert out.returncode == 0, f"mkfs.ext4 -d failed: {out.stderr[-2000:]}"
        debroot.remove_tree(root)
        debroot.remove_tree(target.path)
        work.rename(target.path)
        log(f"vm: built the guest image {target.path} in {time.monotonic() - started:.0f} s")
    finally:
        debroot.remove_tree(work)


def cached_image(deb: Path, log=print) -> GuestImage:
    """The guest image for this .deb's dependencies: from the cache, or built into it."""
    packages = package_list(deb)
    sources = debroot.debian12_sources(debroot.machine_sources())
    image = GuestImage(CACHE / cache_key(packages, sources))
    if image.complete():
        log(f"vm: the guest image is cached: {image.path}")
    else:
        build(image, packages, log)
    return image


def payload_image(files: list[Path], target: Path) -> Path:
    """A small ext4 disk holding ``files`` at its top (the .debs and the test's helpers);
    the guest mounts it read-only."""
    tree = Path(str(target) + ".d")
    debroot.remove_tree(tree)
    tree.mkdir()
    try:
        size = 0
        for f in files:
            shutil.copy(f, tree / f.name)
            size += f.stat().st_size
        mib = max(16, (size >> 20) * 2 + 8)
        out = subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "vmdt-payload", "-d", str(tree),
                              str(target), f"{mib}M"], capture_output=True, text=True)
        assert out.returncode == 0, f"mkfs.ext4 -d (payload) failed: {out.stderr[-2000:]}"
    finally:
        debroot.remove_tree(tree)
    return target
