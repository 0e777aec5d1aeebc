"""libvirt_disks' pure part: domain XML -> Disk records and their eligibility (no libvirt)."""

from __future__ import annotations

import os

import pytest

from vmdisktouch.adapters.libvirt import libvirt_disks as ld
from vmdisktouch.unitname import unit_name

XML = """<domain type='kvm' id='3'>
  <name>web1</name>
  <uuid>8f0e8d4c-7a5e-4d8a-9a0b-2f3f3a1c9e11</uuid>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writethrough' io='threads'/>
      <source file='/var/lib/libvirt/images/web1.img' index='1'/>
      <backingStore/>
      <target dev='vda' bus='virtio'/>
      <alias name='virtio-disk0'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='/var/lib/libvirt/images/web1-data.qcow2'/>
      <backingStore type='file'>
        <format type='qcow2'/>
        <source file='/var/lib/libvirt/images/base.qcow2'/>
        <backingStore/>
      </backingStore>
      <target dev='vdb' bus='virtio'/>
    </disk>
    <disk type='block' device='disk'>
      <driver name='qemu' type='raw' cache='none' io='native'/>
      <source dev='/dev/vg0/web1-db'/>
      <target dev='vdc' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='directsync'/>
      <source file='/srv/images/web1-log.img'/>
      <target dev='vdd' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <!-- libvirt >= 6 refuses io=native with a buffered cache; older XML may still have it -->
      <driver name='qemu' type='raw' cache='writeback' io='native'/>
      <source file='/srv/images/web1-aio.img'/>
      <target dev='vde' bus='virtio'/>
    </disk>
    <disk type='block' device='disk'>
      <driver name='qemu' type='raw' cache='unsafe' io='io_uring'/>
      <source dev='/dev/vg0/web1-scratch'/>
      <target dev='vdf' bus='virtio'/>
    </disk>
    <disk type='network' device='disk'>
      <driver name='qemu' type='raw' cache='writeback'/>
      <source protocol='rbd' name='pool/web1-ceph'><host name='mon1' port='6789'/></source>
      <target dev='vdg' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='/srv/iso/debian 12.iso'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <target dev='sdb' bus='sata'/>
      <readonly/>
    </disk>
    <disk type='block' device='lun'>
      <driver name='qemu' type='raw'/>
      <source dev='/dev/sdx'/>
      <target dev='sdc' bus='scsi'/>
    </disk>
    <disk type='volume' device='disk'>
      <driver name='qemu' type='raw'/>
      <source pool='default' volume='web1-vol.img'/>
      <target dev='vdh' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='default' io='default'/>
      <source file='/srv/images/web1-default.img'/>
      <target dev='vdi' bus='virtio'/>
    </disk>
    <interface type='network'><source network='default'/></interface>
  </devices>
</domain>
"""


@pytest.fixture(scope="module")
def disks():
    return {d.target: d for d in ld.parse_domain_xml(XML, state="running", active=True)}


def test_every_disk_is_listed_with_domain_and_state(disks):
    assert sorted(disks) == ["sda", "sdb", "sdc", "vda", "vdb", "vdc", "vdd", "vde", "vdf",
                             "vdg", "vdh", "vdi"]
    for d in disks.values():
        assert (d.domain, d.state, d.active) == ("web1", "running", True)
        assert d.uuid == "8f0e8d4c-7a5e-4d8a-9a0b-2f3f3a1c9e11"


def test_writethrough_raw_file_is_eligible(disks):
    d = disks["vda"]
    assert (d.type, d.source, d.format, d.cache, d.io) == (
        "file", "/var/lib/libvirt/images/web1.img", "raw", "writethrough", "threads")
    assert not d.cache_default and not d.io_default
    assert d.eligible, d.reason
    assert "cache=writethrough" in d.reason
    assert d.unit == unit_name("/var/lib/libvirt/images/web1.img") == \
        "vmdisktouch@var-lib-libvirt-images-web1.img.service"
    assert d.backing == []


def test_absent_cache_and_io_are_qemus_defaults_writeback_and_threads(disks):
    for target in ("vdb", "vdi"):   # no attribute, and an explicit 'default'
        d = disks[target]
        assert (d.cache, d.cache_default, d.io, d.io_default) == \
            ("writeback", True, "threads", True), target
        assert d.eligible
        assert "QEMU default" in d.reason


def test_qcow2_is_eligible_with_the_host_offset_caveat_and_backing_files(disks):
    d = disks["vdb"]
    assert d.format == "qcow2" and d.eligible
    assert "offsets are host-file offsets" in d.reason
    assert d.backing == ["/var/lib/libvirt/images/base.qcow2"]
    assert "/var/lib/libvirt/images/base.qcow2" in d.reason


@pytest.mark.parametrize("target, words", [
    ("vdc", ["cache=none", "io=native"]),
    ("vdd", ["cache=directsync"]),
    ("vde", ["io=native"]),
])
def test_o_direct_disks_are_ineligible(disks, target, words):
    d = disks[target]
    assert not d.eligible
    for w in words:
        assert w in d.reason
    assert "O_DIRECT" in d.reason
    assert "bypasses the host page cache" in d.reason
    assert "collide with direct writes" in d.reason
    assert d.unit is not None   # still named, for --force


def test_block_device_unsafe_io_uring_is_eligible(disks):
    d = disks["vdf"]
    assert (d.type, d.source, d.cache, d.io) == ("block", "/dev/vg0/web1-scratch", "unsafe",
                                                 "io_uring")
    assert d.eligible
    assert d.unit == "vmdisktouch@dev-vg0-web1\\x2dscratch.service"


@pytest.mark.parametrize("target, kind", [("vdg", "network"), ("vdh", "volume")])
def test_non_local_disks_are_ineligible(disks, target, kind):
    d = disks[target]
    assert d.type == kind and d.source is None and d.unit is None
    assert not d.eligible
    assert d.reason == f"not a local file or block device (type={kind})"


def test_cdrom_with_media_is_not_eligible_read_only_nor_an_empty_drive(disks):
    iso, empty = disks["sda"], disks["sdb"]
    assert iso.device == "cdrom" and iso.readonly and not iso.eligible
    assert iso.reason.startswith("read-only cdrom") and iso.code == "read_only"
    assert iso.unit == unit_name("/srv/iso/debian 12.iso")
    assert empty.source is None and not empty.eligible
    assert empty.reason == "no source (empty drive)"


def test_scsi_lun_passthrough_is_ineligible(disks):
    d = disks["sdc"]
    assert d.device == "lun" and not d.eligible and "SG_IO" in d.reason


def test_json_has_the_documented_keys(disks):
    obj = disks["vda"].to_json()
    for key in ("domain", "state", "target", "source", "type", "format", "cache", "io",
                "eligible", "reason", "unit"):
        assert key in obj
    assert obj["eligible"] is True


def test_without_libvirt_state_is_unknown():
    d = ld.parse_domain_xml(XML)[0]
    assert (d.state, d.active) == ("unknown", None)


def test_a_path_too_long_for_a_unit_name_gets_no_unit():
    long = "/srv/" + "x" * 300 + ".img"
    xml = (f"<domain><name>d</name><devices><disk type='file' device='disk'>"
           f"<source file='{long}'/><target dev='vda'/></disk></devices></domain>")
    (d,) = ld.parse_domain_xml(xml)
    assert d.unit is None and d.eligible


@pytest.mark.parametrize("text", ["<network><name>x</name></network>", "not xml <"])
def test_bad_xml_is_a_one_line_error(text):
    with pytest.raises(ld.LibvirtError) as e:
        ld.parse_domain_xml(text)
    assert "\n" not in str(e.value)


def test_same_file_by_realpath_inode_and_device(tmp_path):
    img = tmp_path / "a.img"
    img.write_bytes(b"x" * 4096)
    link = tmp_path / "link.img"
    link.symlink_to(img)
    hard = tmp_path / "hard.img"
    os.link(img, hard)
    other = tmp_path / "b.img"
    other.write_bytes(b"x" * 4096)
    assert ld.same_file(str(img), str(link))
    assert ld.same_file(str(img), str(hard))            # different path, same inode
    assert not ld.same_file(str(img), str(other))
    assert not ld.same_file(str(img), str(tmp_path / "missing.img"))
    assert ld.same_file(str(tmp_path / "gone"), str(tmp_path / "." / "gone"))  # by name
