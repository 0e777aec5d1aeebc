"""discover's table with the units' states (systemd answers only where it runs as init)."""

from vmdisktouch.commands.discover_table import HOST_UNIT, format_table, is_empty_drive
from vmdisktouch.adapters.libvirt.libvirt_disks import Disk

HOST_HINT = ("recommended: set max_hold in /etc/vmdisktouch/host.toml, then systemctl enable "
             "--now vmdisktouch.service")


def disk(target, source, eligible=True, device="disk", unit="vmdisktouch@x.service"):
    return Disk(domain="web", state="running", active=True, target=target, device=device,
                source=source, type="file", format="raw", cache="writethrough",
                cache_default=False, io="threads", io_default=False, readonly=False,
                eligible=eligible, reason="buffered I/O", unit=unit if eligible else None)


def test_the_host_service_is_recommended_first_per_disk_units_are_the_alternative():
    a = disk("vda", "/img/a.raw", unit="vmdisktouch@a.service")
    b = disk("vdb", "/img/b.raw", unit="vmdisktouch@b.service")
    out = format_table([a, b], {"vmdisktouch@a.service": ("enabled", "active"),
                                "vmdisktouch@b.service": ("disabled", "inactive"),
                                HOST_UNIT: ("disabled", "inactive")}, empty=2)
    lines = out.splitlines()
    assert lines[0] == HOST_HINT + "  (now disabled, inactive)"
    assert lines[1] == "" and lines[2].split()[0] == "DOMAIN"
    ia = next(i for i, ln in enumerate(lines) if ln.endswith("/img/a.raw"))
    ib = next(i for i, ln in enumerate(lines) if ln.endswith("/img/b.raw"))
    assert lines[ia + 2].strip() == "per-disk unit: vmdisktouch@a.service (enabled, active)"
    assert lines[ib + 2].strip() == "per-disk unit: vmdisktouch@b.service (disabled, inactive)"
    # no per-disk enable command under each disk: one footnote names the alternative
    assert "enable --now 'vmdisktouch@" not in out
    (note,) = [ln for ln in lines if ln.startswith("per-disk unit: the alternative")]
    assert "a disk outside libvirt" in note and "systemctl enable --now 'UNIT'" in note
    assert lines.index(note) > ib
    assert "2 empty removable drives (no medium) not listed" in out


def test_a_running_host_service_is_shown_instead_of_the_hint():
    out = format_table([disk("vda", "/img/a.raw")],
                       {HOST_UNIT: ("enabled", "active"),
                        "vmdisktouch@x.service": ("disabled", "inactive")})
    first = out.splitlines()[0]
    assert first.startswith(f"host service {HOST_UNIT}: enabled, active")
    assert "every eligible disk of every running domain" in first
    assert "recommended:" not in out


def test_without_systemd_the_host_hint_comes_first_and_the_unit_name_stays():
    out = format_table([disk("vda", "/img/a.raw")])
    lines = out.splitlines()
    assert lines[0] == HOST_HINT
    assert "    per-disk unit: vmdisktouch@x.service" in lines
    assert f"host service {HOST_UNIT}:" not in out and "(now" not in out


def test_no_eligible_disk_no_recommendation():
    out = format_table([disk("vda", "/img/a.raw", eligible=False)],
                       {HOST_UNIT: ("disabled", "inactive")})
    assert out.splitlines()[0].split()[0] == "DOMAIN"
    assert "recommended" not in out and "per-disk unit" not in out
    assert "why not: buffered I/O" in out


def test_an_empty_cdrom_is_noise_a_network_disk_is_not():
    assert is_empty_drive(disk("sda", None, eligible=False, device="cdrom"))
    assert not is_empty_drive(disk("sda", "/iso/debian.iso", eligible=False, device="cdrom"))
    net = disk("vdc", None, eligible=False)
    assert not is_empty_drive(net)
