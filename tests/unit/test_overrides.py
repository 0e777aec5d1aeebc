"""overrides: the host service's [domain.NAME] and [domain.NAME.TARGET] tables."""

from __future__ import annotations

import pytest

from vmdisktouch.config import file as configfile
from vmdisktouch.config import overrides
from vmdisktouch.errors import ConfigError

GiB = 1 << 30


def test_a_disk_takes_its_domain_s_keys_then_its_own():
    o = overrides.parse({"db": {"weight": 2, "cap": "4G", "vdb": {"cap": "1G"}},
                         "scratch": {"exclude": True}}, "host.toml")
    assert overrides.for_disk(o, "db", "vda") == overrides.Override(2.0, 4 * GiB, False)
    assert overrides.for_disk(o, "db", "vdb") == overrides.Override(2.0, GiB, False)
    assert overrides.for_disk(o, "scratch", "vda").exclude
    assert overrides.for_disk(o, "other", "vda") == overrides.Override()


@pytest.mark.parametrize("data,words", [
    ({"db": {"weight": 0}}, ["[domain.db]", "weight", "0.01"]),
    ({"db": {"weight": True}}, ["weight"]),
    ({"db": {"vda": {"cap": "lots"}}}, ["[domain.db.vda]", "cap"]),
    ({"db": {"exclude": "yes"}}, ["exclude", "true or false"]),
    ({"db": 3}, ["[domain.db]", "table"]),
    ([1], ["domain", "table"]),
])
def test_a_bad_value_names_the_file_and_the_key(data, words):
    with pytest.raises(ConfigError) as err:
        overrides.parse(data, "host.toml")
    msg = str(err.value)
    assert msg.startswith("host.toml: ") and "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_a_mistyped_key_is_a_warning_as_at_the_top_of_the_file(tmp_path):
    """Issue 34: `wieght` in [domain.db] is treated as `min_fre` at the top: a warning
    naming the table and the key, the key ignored, the rest of the table kept."""
    warnings: list[str] = []
    o = overrides.parse({"db": {"wieght": 2, "cap": "1G", "vdb": {"exlude": True}}},
                        "host.toml", warnings)
    assert o[("db", None)] == {"cap": GiB} and o[("db", "vdb")] == {}
    assert sorted(warnings) == [
        "host.toml: [domain.db.vdb]: unknown key 'exlude' (did you mean 'exclude'?); ignored",
        "host.toml: [domain.db]: unknown key 'wieght' (did you mean 'weight'?); ignored"]
    path = tmp_path / "host.toml"
    path.write_text('max_hold = "1G"\nmin_fre = "2G"\n[domain.db]\nwieght = 2\n')
    values, warnings = configfile.load(str(path))
    assert values == {"max_hold": "1G"} and len(warnings) == 2
    assert "unknown key 'min_fre'" in warnings[0] and "[domain.db]: unknown key 'wieght'" \
        in warnings[1]
    many = {f"d{i}": {"wieght": 1} for i in range(9)}
    warnings = []
    overrides.parse(many, "host.toml", warnings)
    assert len(warnings) == 6 and warnings[-1] == (
        "host.toml: unknown keys in 4 more [domain...] tables; ignored")


def test_the_config_file_checks_them_and_does_not_call_them_unknown(tmp_path):
    good = tmp_path / "host.toml"
    good.write_text('max_hold = "1G"\n[domain.db]\nweight = 2.0\n[domain.db.vdb]\ncap = "2G"\n')
    values, warnings = configfile.load(str(good))
    assert warnings == [] and values == {"max_hold": "1G"}
    assert configfile.load_rules(str(good)).per[("db", "vdb")] == {"cap": 2 * GiB}
    bad = tmp_path / "bad.toml"
    bad.write_text('max_hold = "1G"\n[domain.db]\nexclude = 1\n')
    with pytest.raises(ConfigError, match="exclude"):
        configfile.load(str(bad))
