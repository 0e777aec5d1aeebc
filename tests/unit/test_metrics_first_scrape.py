"""A scrape before the daemon's first cycle fails (503, so Prometheus records the target
down) instead of answering 200 with HELP and TYPE lines and no sample (issue 45, part 3:
the first scrape through the socket unit did); once a cycle is published it has samples."""

from __future__ import annotations

import socket
import types
import urllib.error
import urllib.request

import pytest

from tests.unit.test_metrics_collector import disk_status, host
from vmdisktouch.adapters.metrics.metrics import Metrics
from vmdisktouch.adapters.outputs import Outputs


@pytest.fixture
def served():
    """``Metrics`` serving a listening loopback socket as systemd passes one."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    m = Metrics(types.SimpleNamespace(metrics_file=None, metrics_listen=None), Outputs([]),
                sock)
    yield m, f"http://127.0.0.1:{m.server.port}/metrics"
    m.close()


def get(url: str, method: str = "GET") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method),
                                    timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def sampled(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("vmdisktouch_")]


def test_a_scrape_before_the_first_cycle_is_503_then_the_samples(served):
    m, url = served
    code, body = get(url)
    assert (code, sampled(body)) == (503, []), body
    assert get(url, "HEAD")[0] == 503
    m.publish(host([disk_status("/a", held=1 << 20)]))
    code, body = get(url)
    assert code == 200
    assert any(line.startswith('vmdisktouch_held_bytes{disk="/a"') for line in sampled(body))
