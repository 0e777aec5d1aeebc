"""One verdict per disk (issue 45, part 3): whether vmdisktouch serves a libvirt disk, and
why, comes from ``libvirt_disks.assess`` alone; ``discover`` (the disk's ``eligible`` and
``reason``), the host service (``libvirt_watch.wanted``) and the per-disk check
(``libvirt_watch.require_eligible``) say the same for every kind of disk."""

from __future__ import annotations

import pytest

from vmdisktouch.adapters.libvirt import libvirt_disks as ld
from vmdisktouch.adapters.libvirt import libvirt_watch as lw

# target -> (disk XML, served?, a word of the reason)
KINDS = {
    "vda": ("<disk type='file' device='disk'><driver name='qemu' type='raw' "
            "cache='writethrough' io='threads'/><source file='/i/wt.img'/>", True,
            "cache=writethrough"),
    "vdb": ("<disk type='file' device='disk'><driver name='qemu' type='raw' cache='none'/>"
            "<source file='/i/none.img'/>", False, "O_DIRECT"),
    "vdc": ("<disk type='file' device='disk'><driver name='qemu' type='raw' "
            "cache='directsync'/><source file='/i/ds.img'/>", False, "O_DIRECT"),
    "vdd": ("<disk type='file' device='disk'><driver name='qemu' type='raw' cache='writeback' "
            "io='native'/><source file='/i/native.img'/>", False, "io=native"),
    "vde": ("<disk type='block' device='disk'><driver name='qemu' type='raw' "
            "cache='writethrough'/><source dev='/dev/vg/lv'/>", True, "buffered"),
    "vdf": ("<disk type='file' device='disk'><driver name='qemu' type='raw' "
            "cache='writethrough'/><source file='/i/ro.img'/><readonly/>", False, "read-only"),
    "vdg": ("<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>"
            "<source file='/i/q.qcow2'/>", True, "host-file offsets"),
    "vdh": ("<disk type='network' device='disk'><driver name='qemu' type='raw'/>"
            "<source protocol='rbd' name='p/x'/>", False, "not a local file"),
    "sda": ("<disk type='file' device='cdrom'><driver name='qemu' type='raw'/>"
            "<source file='/i/debian.iso'/><readonly/>", False, "read-only"),
    "sdb": ("<disk type='block' device='lun'><driver name='qemu' type='raw'/>"
            "<source dev='/dev/sdx'/>", False, "SG_IO"),
    "fda": ("<disk type='file' device='floppy'><driver name='qemu' type='raw'/>"
            "<source file='/i/boot.img'/>", False, "read-only"),
}


def domain(kinds=KINDS) -> str:
    devs = "".join(f"{xml}<target dev='{t}'/></disk>" for t, (xml, _, _) in kinds.items())
    return f"<domain type='kvm'><name>web</name><devices>{devs}</devices></domain>"


@pytest.fixture(scope="module")
def disks():
    return ld.parse_domain_xml(domain(), state="running", active=True, with_units=False)


@pytest.mark.parametrize("target", sorted(KINDS))
def test_each_kind_of_disk_has_one_verdict_with_its_reason(disks, target):
    d = next(x for x in disks if x.target == target)
    _, served, word = KINDS[target]
    assert d.eligible is served and word in d.reason, (d.eligible, d.reason)


def test_discover_the_host_service_and_the_per_disk_check_agree(disks):
    w = lw.wanted(disks)
    for d in disks:
        key = (d.domain, d.target)
        assert (d.source in w.serve) is d.eligible, (d.target, d.reason, w.skipped.get(key))
        if not d.eligible:
            assert w.skipped[key] == (d.code, d.reason), d.target
            with pytest.raises(lw.IneligibleDiskError, match=d.reason[:20].replace("(", ".")):
                lw.require_eligible([d], d.source or "-")
        else:
            assert key not in w.skipped
            lw.require_eligible([d], d.source)
