"""The metrics page is rendered once per published cycle (issue 40: back-to-back scrapes
rendered it each time, 99 % of a core), and a scrape after a publish shows the new cycle."""

from __future__ import annotations

import gzip
import types

from tests.unit.test_metrics_collector import disk_status, host
from vmdisktouch.adapters.metrics.metrics import Metrics
from vmdisktouch.adapters.outputs import Outputs

GZ = "GET /metrics HTTP/1.1\r\nAccept-Encoding: gzip\r\n"


def counted() -> tuple[Metrics, list]:
    m = Metrics(types.SimpleNamespace(metrics_file=None, metrics_listen=None), Outputs([]))
    calls, real = [], m.pc.generate_latest
    m.pc = types.SimpleNamespace(**{k: getattr(m.pc, k) for k in ("CONTENT_TYPE_LATEST",)},
                                 generate_latest=lambda reg: calls.append(1) or real(reg))
    return m, calls


def test_scrapes_between_two_cycles_render_the_page_once():
    m, calls = counted()
    m.publish(host([disk_status("/a", held=1 << 20)]))
    bodies = [m.render("GET /metrics HTTP/1.1\r\n")[0] for _ in range(50)]
    packed = [m.render(GZ) for _ in range(50)]
    assert len(calls) == 1
    assert len(set(bodies)) == 1 and b'vmdisktouch_held_bytes{disk="/a"' in bodies[0]
    assert all(gzip.decompress(b) == bodies[0] and "Content-Encoding: gzip" in h
               for b, h in packed)


def test_a_published_cycle_is_in_the_next_scrape():
    m, calls = counted()
    m.publish(host([disk_status("/a", held=1 << 20)]))
    first = m.render(GZ)[0]
    m.publish(host([disk_status("/a", held=3 << 20)]))
    body = m.render("GET / HTTP/1.1\r\n")[0]
    assert len(calls) == 2
    assert b"3.145728e+06" in body and b"1.048576e+06" not in body
    assert gzip.decompress(m.render(GZ)[0]) == body != gzip.decompress(first)
