"""The host service's scope (issue 45, part 3): ``[scope]`` include/exclude by domain-name
glob and by the label in a domain's metadata, exclude winning; ``[domain.NAME] exclude``
in the same verdict; bad values one line and exit 78; labels read from the domain XML."""

from __future__ import annotations

import pytest

from vmdisktouch.adapters.libvirt import libvirt_disks as ld
from vmdisktouch.commands import cli
from vmdisktouch.config import file as configfile
from vmdisktouch.config import overrides
from vmdisktouch.errors import ConfigError


def rules(scope=None, domain=None) -> overrides.Rules:
    return overrides.Rules(overrides.parse(domain, "host.toml"),
                           overrides.parse_scope(scope, "host.toml"))


def why(r, name, labels=(), target="vda"):
    out = r.out_of_scope(name, target, labels)
    return None if out is None else out[0]


def test_no_scope_serves_every_domain():
    assert why(rules(), "anything") is None


def test_exclude_by_glob_and_by_label():
    r = rules({"exclude": ["test-*"], "exclude_labels": ["tenant-b"]})
    assert why(r, "test-1") == "excluded"
    assert "'test-*'" in r.out_of_scope("test-1", "vda", ())[1]
    assert why(r, "web-1", ("tenant-b",)) == "excluded"
    assert "tenant-b" in r.out_of_scope("web-1", "vda", ("x", "tenant-b"))[1]
    assert why(r, "web-1", ("tenant-a",)) is None


def test_include_by_glob_or_label_leaves_the_rest_out():
    r = rules({"include": ["web-*"], "include_labels": ["vmdt-*"]})
    assert why(r, "web-1") is None
    assert why(r, "db-1", ("vmdt-hot",)) is None
    assert why(r, "db-1") == "not_included"
    assert "[scope] include" in r.out_of_scope("db-1", "vda", ())[1]


def test_exclude_wins_over_include():
    r = rules({"include": ["web-*"], "exclude": ["web-test*"], "exclude_labels": ["off"]})
    assert why(r, "web-test1") == "excluded"
    assert why(r, "web-1", ("off",)) == "excluded"
    assert why(r, "web-1") is None


def test_a_domain_s_or_a_disk_s_exclude_is_the_same_verdict():
    r = rules({"include": ["*"]}, {"db": {"vdb": {"exclude": True}}, "tmp": {"exclude": True}})
    assert r.out_of_scope("db", "vdb", ()) == ("excluded", "excluded by the config file")
    assert why(r, "db", target="vda") is None and why(r, "tmp") == "excluded"


def test_globs_match_the_whole_name_case_sensitively():
    r = rules({"exclude": ["web"]})
    assert why(r, "web") == "excluded" and why(r, "web-1") is None and why(r, "WEB") is None


@pytest.mark.parametrize("data,words", [
    ({"include": "web-*"}, ["[scope]", "include", "list"]),
    ({"exclude": ["ok", 3]}, ["[scope]", "exclude", "3"]),
    ({"exclude_labels": [""]}, ["exclude_labels", "empty"]),
    ([1], ["scope", "table"]),
])
def test_a_bad_value_is_one_line_naming_the_file_and_the_key(data, words):
    with pytest.raises(ConfigError) as err:
        overrides.parse_scope(data, "host.toml")
    msg = str(err.value)
    assert msg.startswith("host.toml: ") and "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_the_config_file_checks_the_scope_exit_78_and_warns_of_a_mistyped_key(
        tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('max_hold = "1G"\n[scope]\nexclude = "test-*"\n')
    assert cli.main(["config", "--check", str(bad)]) == 78
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "[scope]" in err and "exclude" in err, err
    good = tmp_path / "host.toml"
    good.write_text('max_hold = "1G"\n[scope]\ninclude = ["web-*"]\nexlude = ["x"]\n')
    values, warnings = configfile.load(str(good))
    assert warnings == ["%s: [scope]: unknown key 'exlude' (did you mean 'exclude'?); "
                        "ignored" % good]
    assert configfile.load_rules(str(good)).scope.include == ("web-*",)


LABELLED = """<domain type='kvm'><name>web-1</name><metadata>
  <vmdt:label xmlns:vmdt="%s">tenant-b  shared</vmdt:label>
  <other:x xmlns:other="http://example.com/x">not ours</other:x>
</metadata><devices><disk type='file' device='disk'><driver name='qemu' type='raw'/>
<source file='/i/a.img'/><target dev='vda'/></disk></devices></domain>""" % ld.LABEL_NS


def test_a_domain_s_labels_are_read_from_its_metadata():
    d, = ld.parse_domain_xml(LABELLED, with_units=False)
    assert d.labels == ("tenant-b", "shared")
    d, = ld.parse_domain_xml(LABELLED.replace(ld.LABEL_NS, "http://example.com/y"),
                             with_units=False)
    assert d.labels == ()


# -- issue 54, break 3: the lists compiled once, capped --------------------------------------

GLOBS = ["web-*", "db-[0-9]?", "exact", "*-test", "[!a-z]*", "a?c", "we*", "x[*]y", "[]]"]
NAMES = ["web-1", "db-12", "db-1", "exact", "exactly", "db-test", "9lives", "abc", "aXc",
         "we", "x*y", "xay", "]", "", "WEB-1", "é-test", "line\nbreak-test"]


def test_the_compiled_globs_agree_with_fnmatchcase_and_name_the_first_pattern():
    import fnmatch
    g = overrides.Globs(GLOBS)
    for name in NAMES:
        want = next((p for p in GLOBS if fnmatch.fnmatchcase(name, p)), None)
        assert g.first((name,)) == want, name
    # the first in the list's order among several names, literal or glob
    assert overrides.Globs(["b", "a*"]).first(("a1", "b")) == "b"
    assert overrides.Globs(["a*", "b"]).first(("b", "a1")) == "a*"
    assert overrides.Globs([]).first(("x",)) is None and not overrides.Globs([])


def test_a_match_is_memoised_and_never_compiles_a_glob_again(monkeypatch):
    import fnmatch
    g = overrides.Globs([f"x{i}-*" for i in range(overrides.MAX_SCOPE_PATTERNS - 1)] + ["web-*"])
    monkeypatch.setattr(fnmatch, "fnmatchcase", lambda *a: pytest.fail("fnmatch called"))
    monkeypatch.setattr(fnmatch, "translate", lambda *a: pytest.fail("compiled again"))
    assert g.first(("web-1",)) == "web-*"
    calls = []
    real = g._regex
    g._regex = type("Counting", (), {"match": lambda self, n: calls.append(n) or real.match(n)})()
    for _ in range(100):
        assert g.first(("web-1",)) == "web-*" and g.first(("db",)) is None
    assert calls == ["db"]                 # web-1 was memoised before; db once


def test_the_memo_is_bounded():
    g = overrides.Globs(["a*"])
    for i in range(overrides.MEMO_NAMES * 2 + 5):
        g.first((f"a{i}",))
    assert len(g._memo) <= overrides.MEMO_NAMES


def test_a_scope_compiled_from_tuples_and_equal_to_them():
    s = overrides.Scope(include=("web-*",))
    assert isinstance(s.include, overrides.Globs) and s.include == ("web-*",)
    r = overrides.Rules({}, s)
    assert why(r, "web-1") is None and why(r, "db") == "not_included"


@pytest.mark.parametrize("key", overrides.SCOPE_KEYS)
def test_a_list_over_the_cap_is_one_line_naming_the_key_and_the_cap(key):
    n = overrides.MAX_SCOPE_PATTERNS
    overrides.parse_scope({key: [f"g{i}*" for i in range(n)]}, "host.toml")     # at the cap
    with pytest.raises(ConfigError) as err:
        overrides.parse_scope({key: [f"g{i}*" for i in range(n + 1)]}, "host.toml")
    msg = str(err.value)
    assert msg.startswith("host.toml: [scope]: ") and "\n" not in msg
    assert key in msg and f"{n + 1} patterns" in msg and f"more than {n}" in msg, msg


def test_config_check_refuses_60000_globs(tmp_path, capsys):
    big = tmp_path / "big.toml"
    big.write_text('max_hold = "1G"\n[scope]\ninclude = [%s]\n'
                   % ", ".join(f'"web-{i:05d}-*"' for i in range(60_000)))
    assert cli.main(["config", "--check", str(big)]) == 78
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "include has 60000 patterns" in err, err
