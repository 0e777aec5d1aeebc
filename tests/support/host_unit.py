"""systemd/vmdisktouch.service, the host unit, made from the per-disk template.

The host unit runs ``vmdisktouch run --libvirt`` (every eligible disk of every
running libvirt domain, one budget from /etc/vmdisktouch/host.toml) with
exactly the per-disk unit's sandbox, so the sandbox has one source: this
script copies ``systemd/vmdisktouch@.service`` and changes only the header,
the description, the mount dependency, the instance environment and the
command line. tests/e2e/test_unit.py checks that the shipped file is what
this prints:

    python -m tests.support.host_unit > systemd/vmdisktouch.service
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "systemd" / "vmdisktouch@.service"

HEADER = """\
# vmdisktouch.service: keep the hot parts of every libvirt VM's disks in the
# page cache, under one host budget.
#
# Made from vmdisktouch@.service by `python -m tests.support.host_unit` (the same
# sandbox); edit the template, then regenerate this file.
#
# It serves every eligible disk (buffered I/O: not cache=none/directsync,
# not io=native; not read-only, not a CD-ROM) of every running domain of
# qemu:///system, follows domains as they start, stop and migrate and disks
# as they are plugged and unplugged, and ranks the hot regions of all of
# them in one priority queue under max_hold. Settings:
# /etc/vmdisktouch/host.toml (see examples/host.toml; max_hold is required).
# The per-disk template vmdisktouch@.service remains for a single disk
# outside libvirt; the two never serve the same image (a per-image lock in
# /run/vmdisktouch/locks: the second one leaves it out with one line).
#
# Install: the Debian package installs it (with ExecStart rewritten to
# /usr/bin/vmdisktouch), not enabled. By hand: copy this file to
# /etc/systemd/system/ and run `systemctl daemon-reload`; ExecStart expects
# the console script at /usr/local/bin/vmdisktouch (see vmdisktouch@.service
# and examples/DEPLOY.md). Then set max_hold in /etc/vmdisktouch/host.toml
# and `systemctl enable --now vmdisktouch.service`.
"""

EXEC = ("ExecStart=:/usr/local/bin/vmdisktouch run --libvirt --config "
        "/etc/vmdisktouch/host.toml --status /run/vmdisktouch/host.json --host-png "
        "/run/vmdisktouch/host.png --map-png "
        "/run/vmdisktouch/{disk}.map.png --heat-png /run/vmdisktouch/{disk}.heat.png "
        "--state-dir /var/lib/vmdisktouch")


def host_unit(template: str) -> str:
    lines = template.splitlines()
    start = lines.index("[Unit]")
    out = HEADER.splitlines() + [""]
    for line in lines[start:]:
        if line.startswith("Description="):
            line = ("Description=vmdisktouch: keep the hot parts of every libvirt VM's disks "
                    "in the page cache")
        elif line.startswith("RequiresMountsFor="):
            out[-1:] = [] if out[-1].startswith("# The image's file system") else out[-1:]
            continue
        elif line.startswith("Environment=VMDISKTOUCH_INSTANCE="):
            continue
        elif line.startswith("ExecStart="):
            while out and out[-1].startswith("#"):
                out.pop()
            out += ["# The ':' prefix turns off $VARIABLE expansion. One status file and one",
                    "# host PNG (every disk, who got the budget and why) for the host; a map",
                    "# and a heat PNG per disk, {disk} being the image's escaped path (as in",
                    "# vmdisktouch@<instance>.service)."]
            line = EXEC
        elif line.startswith("After="):
            line = "After=local-fs.target remote-fs.target libvirtd.service virtqemud.service"
        line = line.replace("vmdisktouch@%i", "vmdisktouch@<escaped image path>")
        out.append(line.replace("%i.json (status), %i.map.png and %i.heat.png,",
                                "host.json (status), host.png, <disk>.map.png and\n"
                                "# <disk>.heat.png,"))
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(host_unit(TEMPLATE.read_text()))
