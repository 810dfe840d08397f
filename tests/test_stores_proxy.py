"""The test proxy itself (tests/proxies.py): counting and each fault kind, over raw HTTP to moto."""

from __future__ import annotations

import http.client
import urllib.parse

import pytest
from proxies import FaultProxy

_AUTH = (
    "AWS4-HMAC-SHA256 Credential=testing/20261121/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=" + "0" * 64
)


def _request(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    parsed = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
    try:
        # moto doesn't check signatures, but treats a request without credentials as anonymous
        conn.request(method, path, body=body, headers={"Authorization": _AUTH})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.fixture
def proxy(s3_env):
    with FaultProxy(s3_env["AWS_ENDPOINT_URL"]) as running:
        assert _request(running.url, "PUT", "/proxy-bucket")[0] == 200
        assert _request(running.url, "PUT", "/proxy-bucket/obj", b"0123456789" * 100)[0] == 200
        running.reset_counts()
        yield running


def test_counts_by_method_and_path(proxy):
    assert _request(proxy.url, "GET", "/proxy-bucket/obj") == (200, b"0123456789" * 100)
    assert _request(proxy.url, "HEAD", "/proxy-bucket/obj")[0] == 200
    assert _request(proxy.url, "GET", "/proxy-bucket?list-type=2")[0] == 200
    assert proxy.counts[("GET", "/proxy-bucket/obj")] == 1
    assert proxy.count("GET") == 2
    assert proxy.count("GET", where=lambda seen: not seen.query) == 1
    assert proxy.count("HEAD", path_prefix="/proxy-bucket/") == 1
    proxy.reset_counts()
    assert proxy.count() == 0


def test_first_n_slowdown_then_pass_through(proxy):
    proxy.add_fault("slowdown", first=2, method="GET")
    for _ in range(2):
        status, body = _request(proxy.url, "GET", "/proxy-bucket/obj")
        assert status == 503 and b"<Code>SlowDown</Code>" in body
    assert _request(proxy.url, "HEAD", "/proxy-bucket/obj")[0] == 200  # other methods unaffected
    assert _request(proxy.url, "GET", "/proxy-bucket/obj")[0] == 200
    assert proxy.injected["slowdown"] == 2
    assert proxy.count(faulted=True) == 2


def test_429_fault(proxy):
    proxy.add_fault("429", first=1)
    assert _request(proxy.url, "GET", "/proxy-bucket/obj")[0] == 429


def test_403_fault(proxy):
    proxy.add_fault("403", first=1)
    assert _request(proxy.url, "GET", "/proxy-bucket/obj")[0] == 403
    assert _request(proxy.url, "GET", "/proxy-bucket/obj")[0] == 200


def test_then_runs_before_the_client_sees_the_fault_end(proxy, s3_env):
    calls: list[int] = []

    def replace() -> None:  # straight to moto, while the client waits for the rest of the body
        calls.append(_request(s3_env["AWS_ENDPOINT_URL"], "PUT", "/proxy-bucket/obj", b"new")[0])

    proxy.add_fault("truncate", first=1, then=replace)
    with pytest.raises(http.client.IncompleteRead) as caught:
        _request(proxy.url, "GET", "/proxy-bucket/obj")
    assert calls == [200] and caught.value.partial == (b"0123456789" * 100)[:500]
    assert _request(proxy.url, "GET", "/proxy-bucket/obj")[1] == b"new"


def test_reset_is_a_connection_error(proxy):
    proxy.add_fault("reset", first=1)
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        _request(proxy.url, "GET", "/proxy-bucket/obj")
    assert _request(proxy.url, "GET", "/proxy-bucket/obj")[0] == 200


def test_truncate_sends_half_the_body(proxy):
    proxy.add_fault("truncate", first=1)
    assert _request(proxy.url, "HEAD", "/proxy-bucket/obj")[0] == 200  # no body: not eligible
    with pytest.raises(http.client.IncompleteRead) as caught:
        _request(proxy.url, "GET", "/proxy-bucket/obj")
    assert len(caught.value.partial) == 500
    assert _request(proxy.url, "GET", "/proxy-bucket/obj")[1] == b"0123456789" * 100


def test_rate_is_seeded_and_persistent_at_one(proxy):
    proxy.add_fault("slowdown", rate=1.0)
    statuses = {_request(proxy.url, "GET", "/proxy-bucket/obj")[0] for _ in range(5)}
    assert statuses == {503}
    proxy.clear_faults()
    rule = proxy.add_fault("slowdown", rate=0.5, seed=3)
    results = [_request(proxy.url, "GET", "/proxy-bucket/obj")[0] for _ in range(40)]
    assert 5 < results.count(503) < 35
    assert results.count(503) == rule.fired


def test_bad_rules_are_refused(proxy):
    with pytest.raises(ValueError):
        proxy.add_fault("explode", first=1)
    with pytest.raises(ValueError):
        proxy.add_fault("reset")


def test_after_lets_the_first_requests_through(proxy):
    proxy.add_fault("slowdown", first=1, after=2, method="GET")
    statuses = [_request(proxy.url, "GET", "/proxy-bucket/obj")[0] for _ in range(4)]
    assert statuses == [200, 200, 503, 200]


def test_norange_forwards_without_the_range_header(proxy):
    parsed = urllib.parse.urlsplit(proxy.url)
    proxy.add_fault("norange", first=1)
    for expected_status, expected_len in ((200, 1000), (206, 10)):
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
        conn.request("GET", "/proxy-bucket/obj", headers={"Authorization": _AUTH, "Range": "bytes=0-9"})
        response = conn.getresponse()
        assert (response.status, len(response.read())) == (expected_status, expected_len)
        conn.close()
    assert [seen.fault for seen in proxy.requests] == ["norange", None]
