"""The machine's apt sources read as apt reads them (both formats), and only Debian 12's
kept for the clean root: pure, no root needed."""

from __future__ import annotations

from tests.package.debroot import (Source, debian12_sources, machine_sources,
                                   parse_deb822, parse_one_line)

DEB822 = """\
Types: deb deb-src
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Architectures: amd64

Types: deb
URIs: http://mirror.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main

Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By:
 -----BEGIN PGP PUBLIC KEY BLOCK-----
 .
 mQINBF...
 -----END PGP PUBLIC KEY BLOCK-----
"""

ONE_LINE = """\
# a comment
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main non-free-firmware
deb-src http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bullseye main  # scripts/install-py39.sh's
deb http://security.debian.org/debian-security bookworm-security main
"""


def test_deb822_stanzas_become_one_entry_per_uri_and_suite():
    keyring = (("signed-by", "/usr/share/keyrings/debian-archive-keyring.gpg"),)
    assert parse_deb822(DEB822) == [
        Source("http://deb.debian.org/debian", "bookworm", ("main", "contrib"), keyring),
        Source("http://deb.debian.org/debian", "bookworm-updates", ("main", "contrib"), keyring),
        Source("http://deb.debian.org/debian-security", "bookworm-security", ("main",),
               (("arch", "amd64"),)),
        # an inline key cannot go on one line: the entry stays, verified by the keyring
        Source("http://deb.debian.org/debian", "bookworm-backports", ("main",)),
    ]


def test_one_line_entries_with_options_and_comments():
    assert parse_one_line(ONE_LINE) == [
        Source("http://deb.debian.org/debian", "bookworm", ("main", "non-free-firmware"),
               (("signed-by", "/usr/share/keyrings/debian-archive-keyring.gpg"),)),
        Source("http://deb.debian.org/debian", "bullseye", ("main",)),
        Source("http://security.debian.org/debian-security", "bookworm-security", ("main",)),
    ]


def test_only_debian12_suites_are_kept_written_one_per_line():
    text = debian12_sources(parse_one_line(ONE_LINE))
    assert text == (
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
        "http://deb.debian.org/debian bookworm main non-free-firmware\n"
        "deb http://security.debian.org/debian-security bookworm-security main\n")
    assert parse_one_line(text) == [s for s in parse_one_line(ONE_LINE)
                                    if s.suite != "bullseye"]


def test_files_apt_ignores_are_ignored(tmp_path):
    (tmp_path / "sources.list").write_text("deb http://a/debian bookworm main\n")
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(DEB822)
    (d / "old.list.disabled-by-farm").write_text("deb http://b/debian bookworm main\n")
    (d / "extra.list").write_text("deb http://c/debian bookworm main\n")
    uris = [s.uri for s in machine_sources((tmp_path / "sources.list", d))]
    assert "http://b/debian" not in uris
    assert uris[0] == "http://a/debian" and "http://c/debian" in uris
    assert "http://deb.debian.org/debian-security" in uris
