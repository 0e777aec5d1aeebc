"""discover's table with the units' states (systemd answers only where it runs as init)."""

from vmdisktouch.adapters.discover import HOST_UNIT, format_table, is_empty_drive
from vmdisktouch.adapters.libvirt_disks import Disk


def disk(target, source, eligible=True, device="disk", unit="vmdisktouch@x.service"):
    return Disk(domain="web", state="running", active=True, target=target, device=device,
                source=source, type="file", format="raw", cache="writethrough",
                cache_default=False, io="threads", io_default=False, readonly=False,
                eligible=eligible, reason="buffered I/O", unit=unit if eligible else None)


def test_the_unit_state_replaces_the_enable_hint_once_it_runs():
    a = disk("vda", "/img/a.raw", unit="vmdisktouch@a.service")
    b = disk("vdb", "/img/b.raw", unit="vmdisktouch@b.service")
    out = format_table([a, b], {"vmdisktouch@a.service": ("enabled", "active"),
                                "vmdisktouch@b.service": ("disabled", "inactive"),
                                HOST_UNIT: ("disabled", "inactive")}, empty=2)
    lines = out.splitlines()
    ia = next(i for i, ln in enumerate(lines) if ln.endswith("/img/a.raw"))
    ib = next(i for i, ln in enumerate(lines) if ln.endswith("/img/b.raw"))
    assert lines[ia + 2].strip() == "unit: vmdisktouch@a.service (enabled, active)"
    assert "enable:" not in lines[ia + 3]
    assert lines[ib + 2].strip() == "unit: vmdisktouch@b.service (disabled, inactive)"
    assert lines[ib + 3].strip() == "enable: systemctl enable --now 'vmdisktouch@b.service'"
    assert f"host service {HOST_UNIT}: disabled, inactive" in out
    assert "2 empty removable drives (no medium) not listed" in out


def test_without_systemd_the_enable_hint_stays():
    out = format_table([disk("vda", "/img/a.raw")])
    assert "enable: systemctl enable --now 'vmdisktouch@x.service'" in out
    assert "unit:" not in out and "host service" not in out


def test_an_empty_cdrom_is_noise_a_network_disk_is_not():
    assert is_empty_drive(disk("sda", None, eligible=False, device="cdrom"))
    assert not is_empty_drive(disk("sda", "/iso/debian.iso", eligible=False, device="cdrom"))
    net = disk("vdc", None, eligible=False)
    assert not is_empty_drive(net)
