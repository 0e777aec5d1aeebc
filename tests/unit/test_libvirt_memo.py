"""One domain's metadata never blinds the listing of the others (issue 40): metadata that
does not parse costs only its summary; a domain whose XML cannot be read keeps its last
known disks, said once; an unchanged XML is not parsed again (``libvirt_disks.Memo``)."""

from __future__ import annotations

from vmdisktouch.adapters.libvirt import libvirt_disks as ld

libvirt = ld.import_libvirt()

XML = """<domain type='kvm'><name>{name}</name><uuid>{uuid}</uuid>
  <metadata>{meta}</metadata>
  <devices><disk type='file' device='disk'><driver name='qemu' type='raw'/>
    <source file='/img/{name}.raw'/><target dev='vda' bus='virtio'/></disk></devices>
</domain>"""
HEAT = ('<vmdisktouch:heat xmlns:vmdisktouch="http://vmdisktouch.org/xmlns/heat/1" '
        'version="1">{inner}</vmdisktouch:heat>')
BAD = HEAT.format(inner="<vmdisktouch:foo:bar/>")        # as libvirt 9.0 writes <foo:bar/>


class Dom:
    def __init__(self, name, meta="", fail=None):
        self._name, self.meta, self.fail, self.reads = name, meta, fail, 0

    def name(self):
        return self._name

    def UUIDString(self):
        return f"00000000-0000-0000-0000-{abs(hash(self._name)) % 10**12:012d}"

    def state(self):
        return [1, 1]

    def isActive(self):
        return 1

    def XMLDesc(self, _flags):
        self.reads += 1
        if self.fail:
            raise libvirt.libvirtError(self.fail)
        return XML.format(name=self._name, uuid=self.UUIDString(), meta=self.meta)


class Conn:
    def __init__(self, *doms):
        self.doms = list(doms)

    def listAllDomains(self, _flags):
        return self.doms


def listing(conn, memo):
    return {(d.domain, d.target): d for d in ld.list_disks(conn, memo=memo, with_units=False)}


def test_metadata_that_does_not_parse_costs_only_its_summary():
    said = []
    memo = ld.Memo(say=lambda *a: said.append(a[0] % a[1:]))
    got = listing(Conn(Dom("good"), Dom("bad", BAD)), memo)
    assert set(got) == {("good", "vda"), ("bad", "vda")}
    bad = got["bad", "vda"]
    assert bad.source == "/img/bad.raw" and bad.eligible
    assert isinstance(bad.carried, str) and "not well-formed" in bad.carried
    assert got["good", "vda"].problem is None and got["good", "vda"].carried is None
    listing(Conn(Dom("good"), Dom("bad", BAD)), memo)
    assert len(said) == 1 and said[0].startswith("libvirt: bad: its metadata is not well")


def test_xml_that_cannot_be_parsed_at_all_costs_that_domain_only():
    memo = ld.Memo(say=lambda *a: None)
    broken = Dom("broken")
    broken.XMLDesc = lambda _f: "<domain><name>broken</oops></domain>"
    got = listing(Conn(Dom("good"), broken), memo)
    assert set(got) == {("good", "vda")}
    assert "cannot parse domain XML" in memo.problems["broken"][0]


def test_an_unreadable_xml_keeps_the_last_known_disks_and_is_said_once():
    said = []
    memo = ld.Memo(say=lambda *a: said.append(a[0] % a[1:]))
    big = Dom("big")
    conn = Conn(Dom("good"), big)
    assert ("big", "vda") in listing(conn, memo)
    big.fail = "Unable to encode message payload"
    for _ in range(3):
        got = listing(conn, memo)
        assert got["big", "vda"].source == "/img/big.raw"
        assert "cannot read its XML: Unable to encode" in got["big", "vda"].problem
    assert said == ["libvirt: big: cannot read its XML: Unable to encode message payload; "
                    "keeping its last known disks"]
    assert memo.problems == {"big": ("cannot read its XML: Unable to encode message payload",
                                     "running")}
    big.fail = None
    assert listing(conn, memo)["big", "vda"].problem is None and memo.problems == {}


def test_a_fresh_listing_of_an_unreadable_domain_names_it():
    memo = ld.Memo(say=lambda *a: None)
    got = listing(Conn(Dom("good"), Dom("big", fail="Unable to encode message payload")), memo)
    assert set(got) == {("good", "vda")} and "big" in memo.problems


def test_an_unchanged_xml_is_parsed_once(monkeypatch):
    calls = []
    real = ld.parse_domain_xml
    monkeypatch.setattr(ld, "parse_domain_xml", lambda *a, **k: calls.append(1) or real(*a, **k))
    memo = ld.Memo(say=lambda *a: None)
    dom = Dom("big", HEAT.format(inner="<x/>" * 1000))
    conn = Conn(dom)
    for _ in range(5):
        assert listing(conn, memo)["big", "vda"].state == "running"
    assert len(calls) == 1 and dom.reads == 5
    dom.meta = ""
    listing(conn, memo)
    assert len(calls) == 2


def test_a_gone_domain_is_forgotten():
    memo = ld.Memo(say=lambda *a: None)
    listing(Conn(Dom("a"), Dom("b")), memo)
    listing(Conn(Dom("a")), memo)
    assert len(memo.parsed) == 1


def test_without_a_memo_the_processes_own_is_kept():
    ld.list_disks(Conn(Dom("x", BAD)), with_units=False)
    assert [d[1][0].domain for d in ld.MEMO.parsed.values()] == ["x"]


# -- issue 54: with events followed, a domain's XML is read when it may have changed ----------

class Run(Dom):
    """A domain with an ID (new at each start), as ``listAllDomains`` gives it."""

    def __init__(self, name, meta="", fail=None, id_=1):
        super().__init__(name, meta, fail)
        self.id = id_

    def ID(self):
        return self.id


def reads(*doms):
    return [d.reads for d in doms]


def test_with_events_the_xml_is_read_at_arrival_and_when_told_only():
    now = [0.0]
    memo = ld.Memo(say=lambda *a: None, events=True, clock=lambda: now[0])
    a, b = Run("a", HEAT.format(inner="<x/>" * 1000)), Run("b")
    conn = Conn(a, b)
    for _ in range(5):
        got = listing(conn, memo)
        assert got["a", "vda"].state == "running" and ("b", "vda") in got
    assert reads(a, b) == [1, 1]                       # at arrival only
    memo.stale(a.UUIDString())                         # an event named a
    listing(conn, memo)
    assert reads(a, b) == [2, 1]
    memo.stale()                                       # a reconnection
    listing(conn, memo)
    assert reads(a, b) == [3, 2]
    b.id = 7                                           # stopped and started between listings
    listing(conn, memo)
    assert reads(a, b) == [3, 3]
    c = Run("c")                                       # a domain that arrives
    conn.doms.append(c)
    listing(conn, memo)
    assert reads(a, b, c) == [3, 3, 1]
    now[0] += ld.Memo.REFRESH                          # the safety net
    listing(conn, memo)
    assert reads(a, b, c) == [4, 4, 2]


def test_with_events_an_unreadable_xml_is_tried_each_listing_and_said_once():
    said = []
    memo = ld.Memo(say=lambda *a: said.append(a[0] % a[1:]), events=True)
    big = Run("big")
    conn = Conn(big)
    listing(conn, memo)
    big.fail = "Unable to encode message payload"
    memo.stale(big.UUIDString())
    for _ in range(3):
        got = listing(conn, memo)
        assert got["big", "vda"].problem.startswith("cannot read its XML")   # kept
        assert "big" in memo.problems
    assert big.reads == 4 and len(said) == 1
    big.fail = None
    assert listing(conn, memo)["big", "vda"].problem is None and big.reads == 5
    listing(conn, memo)
    assert big.reads == 5 and memo.problems == {}


def test_with_events_a_problem_in_the_xml_is_listed_each_time_without_reading_it():
    memo = ld.Memo(say=lambda *a: None, events=True)
    bad = Run("bad", BAD)
    for _ in range(3):
        got = listing(Conn(bad), memo)
        assert "not well-formed" in got["bad", "vda"].problem and "bad" in memo.problems
    assert bad.reads == 1
