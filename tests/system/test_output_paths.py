"""An output path is replaced only when it holds what the daemon itself writes there."""

import json
import os

from vmdisktouch.adapters import outputs


def problem(path):
    return outputs.path_problem(str(path), "status", [], probe_dir=False)


def test_a_status_file_the_daemon_wrote_is_accepted(tmp_path):
    disk = tmp_path / "disk.json"
    disk.write_text(json.dumps({"path": "/x.img", "pid": 1, "version": "0.1.0", "cycle": 3}))
    host = tmp_path / "host.json"
    host.write_text(json.dumps({"host": {"pid": 1, "version": "0.1.0"}, "disks": []}))
    empty = tmp_path / "empty.json"
    empty.write_bytes(b"")
    assert [problem(p) for p in (disk, host, empty)] == [None, None, None]


def test_a_file_that_only_starts_with_a_brace_is_refused(tmp_path):
    image = tmp_path / "other-vm.img"                  # an image whose first byte is '{'
    image.write_bytes(b"{" + os.urandom(64 << 10))
    config = tmp_path / "app.json"                      # another program's JSON
    config.write_text(json.dumps({"listen": ":80", "workers": 4}))
    array = tmp_path / "list.json"
    array.write_text("[1, 2]")
    for p in (image, config, array):
        got = problem(p)
        assert got and "is not a file vmdisktouch writes" in got, (p, got)


def test_the_status_directory_must_be_closed_to_other_users(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    got = outputs.path_problem(str(shared / "s.json"), "status", [])
    assert got and "not closed to other users" in got and "0777" in got
    assert outputs.path_problem(str(shared / "map.png"), "map_png", []) is None


def test_an_output_directory_that_is_a_symlink_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    for key, name in (("status", "s.json"), ("map_png", "map.png")):
        got = outputs.path_problem(str(tmp_path / "link" / name), key, [])
        assert got and "is a symbolic link" in got, got


def test_a_png_is_removed_only_when_it_is_one_the_daemon_writes(tmp_path):
    """A disk no longer served takes its PNG along; a file of another kind at that path,
    a link, or the image itself stays."""
    out = outputs.Outputs([])
    png = tmp_path / "vm.map.png"
    assert out.write("map_png", str(png), b"\x89PNG\r\n\x1a\n" + b"x" * 100)
    out.remove("map_png", str(png))
    assert not png.exists()
    png.write_text("an operator's notes")
    out.remove("map_png", str(png))
    assert png.read_text() == "an operator's notes"
    image = tmp_path / "vm.raw"
    image.write_bytes(b"\x89PNG\r\n\x1a\n")
    link = tmp_path / "link.png"
    link.symlink_to(image)
    out.remove("map_png", str(link))
    assert link.is_symlink()
    out = outputs.Outputs([outputs.Protected.of_path(str(image), "the disk image")])
    out.remove("map_png", str(image))
    assert image.exists()
    out.remove("map_png", str(tmp_path / "gone" / "x.png"))      # no directory: nothing
