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


def test_the_advice_column_comes_from_the_last_advise_report_by_domain_target_or_path(
        tmp_path):
    import json
    from vmdisktouch.adapters.advice_file import load_advice
    report = {"when": 1_700_000_000.0, "disks": [
        {"path": "/img/a.raw", "domain": "web", "target": "vda",
         "advice": {"verdict": "hold", "bytes": 1536 << 20, "hit_ratio": 0.88,
                    "more_reads_per_second": 2900.0}},
        {"path": "/img/b.raw",
         "advice": {"verdict": "uniform", "bytes": 8 << 30, "hit_ratio": 0.1,
                    "more_reads_per_second": 10.0}}]}
    saved = tmp_path / "advise.json"
    saved.write_text(json.dumps(report))
    advice = load_advice(str(saved))
    a, b, c = (disk("vda", "/img/a.raw", eligible=False), disk("vdb", "/img/b.raw"),
               disk("vdc", "/img/c.raw"))
    out = format_table([a, b, c], advice=advice, now=1_700_000_600.0)
    lines = out.splitlines()
    head = next(ln for ln in lines if ln.startswith("DOMAIN"))
    assert head.split()[-2:] == ["ADVICE", "SOURCE"]
    row = {ln.split()[-1]: ln for ln in lines if ln.startswith("web ")}
    assert "1.5G: 88% from memory, +2,900 reads/s" in row["/img/a.raw"]
    assert "none: reads uniform" in row["/img/b.raw"]
    assert row["/img/c.raw"].split()[-2] == "-"
    assert "ADVICE: from vmdisktouch advise --libvirt, 10 min ago" in out


def test_without_an_advise_report_discover_says_how_to_get_one(tmp_path):
    from vmdisktouch.adapters.advice_file import load_advice
    assert load_advice(str(tmp_path / "none.json")) is None
    (tmp_path / "bad.json").write_text("{")
    assert load_advice(str(tmp_path / "bad.json")) is None
    out = format_table([disk("vda", "/img/a.raw")])
    assert "ADVICE: none yet: run vmdisktouch advise --libvirt" in out


def test_a_disk_the_host_service_s_scope_leaves_out_says_why_under_its_reason():
    a, b = disk("vda", "/img/a.raw"), disk("vdb", "/img/b.raw")
    why = "excluded by [scope] exclude 'web' (/etc/vmdisktouch/host.toml)"
    lines = format_table([a, b], scope={("web", "vdb"): why}).splitlines()
    ib = next(i for i, ln in enumerate(lines) if ln.endswith("/img/b.raw"))
    assert lines[ib + 1].strip() == "why: buffered I/O"
    assert lines[ib + 2].strip() == f"host service: out of scope: {why}"
    assert sum("out of scope" in ln for ln in lines) == 1
