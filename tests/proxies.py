"""A counting, fault-injecting HTTP proxy for tests: put it between a client and a test server.

Usage::

    from proxies import FaultProxy

    with FaultProxy(moto_server.url) as proxy:       # listens on a free 127.0.0.1 port
        store = open_store("s3://bucket/data", StoreConfig(endpoint_url=proxy.url))
        proxy.add_fault("slowdown", first=2)          # the next 2 matching requests get 503 SlowDown
        proxy.add_fault("reset", rate=0.2, seed=1)    # then 20% of requests: connection reset
        proxy.add_fault("truncate", first=1, method="GET")  # one response cut in half mid-body
        ...
        assert proxy.count("GET", where=lambda r: not r.query) == 0   # no object GET was made
        proxy.clear_faults(); proxy.reset_counts()

The API:

- ``FaultProxy(upstream_url)``: a context manager (or ``start()`` / ``stop()``). ``proxy.url`` is
  ``http://127.0.0.1:PORT``; point the client's endpoint (``StoreConfig.endpoint_url``,
  ``AWS_ENDPOINT_URL``, ``STORAGE_EMULATOR_HOST``) at it. ``stop()`` closes open client
  connections too.
- ``proxy.requests``: every request seen, as :class:`Seen` records ``(method, path, query, fault,
  headers)`` (path without the query string, query as the raw string, fault the injected kind
  or None, headers as sent by the client, case-insensitive: ``seen.headers.get("Range")``).
  Faulted requests are recorded too.
- ``proxy.count(method=None, path_prefix=None, where=None, faulted=None)``: how many recorded
  requests match. ``proxy.counts``: a Counter of ``(method, path)``.
  ``proxy.reset_counts()`` forgets them.
- ``proxy.add_fault(kind, first=N | rate=P, method=None, path_prefix=None, seed=0, after=0,
  then=None)``: add a rule. ``after=K`` lets the first K matching requests that reach the rule
  through untouched (e.g. "fail the second chunk, not the first").
  Kinds:

  * ``"slowdown"``: answer 503 with an S3 ``SlowDown`` XML error body (request never forwarded);
  * ``"429"``: answer 429 Too Many Requests with a JSON error body (GCS style);
  * ``"403"``: answer 403 Forbidden with a JSON error body (GCS style), like a bucket the
    credentials may not read (the test servers never refuse anyone);
  * ``"reset"``: read the request, then abort the connection with a TCP RST (never forwarded);
  * ``"truncate"``: forward, then send the status, headers and full Content-Length but only the
    first half of the body, and close the connection. Only responses with a body of 2 bytes or
    more are eligible; other responses pass through and don't consume the rule;
  * ``"corrupt"``: forward, then flip one bit of the body's first byte (size and headers intact),
    like a network or store that corrupts data. Only responses with a body are eligible;
  * ``"norange"``: forward without the ``Range`` header, like a server that ignores ranges
    (200 with the whole object). Only requests with a Range header are eligible.
  * ``"droptoken"``: an S3 ListObjectsV2 request is forwarded asking for 2 keys, and the answer
    (truncated) comes back without its ``NextContinuationToken``, like a broken server. Only
    ``?list-type=2`` requests are eligible.

  ``first=N`` fires on the next N matching requests; ``rate=P`` fires on a fraction P of them
  (seeded, so runs are repeatable); ``rate=1.0`` is a persistent failure. Rules are tried in the
  order added; the first that fires wins. ``proxy.injected`` is a Counter of faults per kind.
  ``then=callable`` runs (in the proxy's thread) each time the rule fires, before the client
  can see the fault end, so before any retry: e.g. replace the object between a cut body and
  the request that resumes it.
- ``proxy.clear_faults()`` removes every rule.
- ``FaultProxy(upstream_url, latency=0.02)`` holds every forwarded request that long before
  sending it upstream (a round trip to a distant store; concurrent requests overlap, as
  bench/latproxy.py does for benchmarks). ``proxy.body_bytes`` counts the response body bytes
  relayed, by path; ``proxy.peak_in_flight`` is the most requests forwarded at once (both reset
  by ``reset_counts()``).
- ``gate = proxy.gather(N, method="GET", timeout=10.0)``: the next N matching requests are held
  until all N are in the proxy at once (or ``timeout`` passes), then forwarded together.
  ``gate.together`` is the most requests that were held at the same moment: N when the client
  sent them concurrently, 1 when it sent them one after another. ``path_suffix=".tar"`` holds only
  requests whose path ends so (others pass).

The Host header is forwarded unchanged, so S3 signatures stay valid and servers that build
absolute URLs (GCS resumable-upload sessions) point them back at the proxy.
"""

from __future__ import annotations

import http.client
import random
import re
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

FAULT_KINDS = ("slowdown", "429", "403", "reset", "truncate", "norange", "droptoken", "corrupt")
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "expect",
}
_CHUNK = 256 * 1024
_SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message>"
    b"<RequestId>lading-fault-proxy</RequestId></Error>"
)
_TOO_MANY_BODY = b'{"error": {"code": 429, "message": "rate limit exceeded (lading fault proxy)"}}'
_FORBIDDEN_BODY = b'{"error": {"code": 403, "message": "forbidden (lading fault proxy)"}}'


class Headers(dict):
    """Request headers with case-insensitive lookup (names stored lower-case)."""

    def __init__(self, items: object = ()) -> None:
        super().__init__((str(k).lower(), v) for k, v in dict(items).items())  # type: ignore[call-overload]

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        """Case-insensitive get."""
        return super().get(name.lower(), default)


@dataclass(frozen=True)
class Seen:
    """One request the proxy received."""

    method: str
    path: str
    query: str
    fault: str | None = None
    headers: Headers = field(default_factory=Headers, compare=False)


@dataclass
class FaultRule:
    """Inject ``kind`` into the first ``first`` matching requests, or a fraction ``rate`` of them."""

    kind: str
    first: int | None = None
    rate: float | None = None
    method: str | None = None
    path_prefix: str | None = None
    seed: int = 0
    after: int = 0
    then: Callable[[], None] | None = None
    fired: int = 0
    passed: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; use one of {FAULT_KINDS}")
        if (self.first is None) == (self.rate is None):
            raise ValueError("give exactly one of first=N or rate=P")
        self._rng.seed(self.seed)

    def matches(self, method: str, path: str) -> bool:
        """Whether this rule applies to the request at all (before deciding to fire)."""
        if self.method is not None and method.upper() != self.method.upper():
            return False
        return self.path_prefix is None or path.startswith(self.path_prefix)

    def fire(self) -> bool:
        """Decide (and record) whether this matching request gets the fault."""
        if self.passed < self.after:
            self.passed += 1
            return False
        if self.first is not None:
            if self.fired >= self.first:
                return False
        elif self._rng.random() >= (self.rate or 0.0):
            return False
        self.fired += 1
        return True


class Gate:
    """Holds matching requests until ``count`` of them are in the proxy at once (see ``gather``)."""

    def __init__(self, count: int, method: str | None, timeout: float, path_suffix: str | None = None) -> None:
        self.count, self.method, self.timeout, self.path_suffix = count, method, timeout, path_suffix
        self.admitted = 0  # requests this gate took (at most ``count``)
        self.waiting = 0
        self.together = 0
        self._cond = threading.Condition()

    def take(self, method: str, path: str = "") -> bool:
        """Whether this request is one the gate holds."""
        with self._cond:
            if self.admitted >= self.count or (self.method is not None and method.upper() != self.method.upper()):
                return False
            if self.path_suffix is not None and not path.endswith(self.path_suffix):
                return False
            self.admitted += 1
            return True

    def hold(self) -> None:
        """Wait until ``count`` requests wait here, or the timeout."""
        with self._cond:
            self.waiting += 1
            self.together = max(self.together, self.waiting)
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.together >= self.count, timeout=self.timeout)
            self.waiting -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    proxy: "FaultProxy"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 120

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        """Stay quiet; tests inspect ``proxy.requests`` instead."""

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)

    def _handle(self) -> None:
        proxy = self.server.proxy
        body = self._read_body()
        parsed = urllib.parse.urlsplit(self.path)
        path, query = parsed.path, parsed.query
        rule = proxy._pre_fault(self.command, path)
        if rule is not None:
            proxy._record(Seen(self.command, path, query, rule.kind, Headers(self.headers.items())))
            if rule.then is not None:
                rule.then()
            self._inject(rule.kind)
            return
        gate = proxy._gate
        if gate is not None and gate.take(self.command, path):
            gate.hold()
        headers = self._forward_headers(body)
        dropped = None
        range_names = [name for name in headers if name.lower() == "range"]
        if range_names and proxy._pick(self.command, path, ("norange",)) is not None:
            for name in range_names:  # like a server that ignores Range: 200, the whole object
                del headers[name]
            dropped = "norange"
        target = self.path
        if "list-type=2" in query and proxy._pick(self.command, path, ("droptoken",)) is not None:
            pairs = [(k, v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True) if k != "max-keys"]
            target = path + "?" + urllib.parse.urlencode(pairs + [("max-keys", "2")])
            dropped = "droptoken"
        proxy._in_flight(+1)
        try:
            if proxy.latency:
                time.sleep(proxy.latency)
            try:
                upstream = proxy._open_upstream()
                upstream.request(self.command, target, body=body, headers=headers)
                response = upstream.getresponse()
            except OSError as err:
                proxy._record(Seen(self.command, path, query, None, Headers(self.headers.items())))
                self._send_simple(502, f"upstream failed: {err}".encode(), "text/plain")
                return
            try:
                self._relay(response, path, query, dropped)
            finally:
                upstream.close()
        finally:
            proxy._in_flight(-1)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = _handle

    def _read_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _forward_headers(self, body: bytes | None) -> dict[str, str]:
        headers = {name: value for name, value in self.headers.items() if name.lower() not in _HOP_BY_HOP}
        headers.pop("Content-Length", None)
        if body is not None or self.command in ("PUT", "POST", "PATCH"):
            headers["Content-Length"] = str(len(body or b""))
        headers["Connection"] = "close"
        return headers

    def _relay(self, response: http.client.HTTPResponse, path: str, query: str, fault: str | None) -> None:
        proxy = self.server.proxy
        length_header = response.getheader("Content-Length")
        has_body = self.command != "HEAD" and response.status not in (204, 304) and response.status >= 200
        corrupt = has_body and proxy._pick(self.command, path, ("corrupt",)) is not None
        if corrupt:
            fault = "corrupt"
        if has_body and (length_header is None or fault in ("droptoken", "corrupt")):
            payload: bytes | None = response.read()  # chunked or close-delimited: buffer it
            if fault == "droptoken":
                payload = re.sub(rb"<NextContinuationToken>.*?</NextContinuationToken>", b"", payload)
            if fault == "corrupt" and payload:
                payload = bytes([payload[0] ^ 1]) + payload[1:]
            length = len(payload)
        else:
            payload = None
            length = int(length_header or 0) if has_body else 0
        rule = proxy._post_fault(self.command, path) if has_body and length >= 2 else None
        truncate = rule is not None
        proxy._record(Seen(self.command, path, query, "truncate" if truncate else fault, Headers(self.headers.items())))
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        if has_body or length_header is not None:
            self.send_header("Content-Length", str(length if has_body else length_header))
        if truncate:
            self.send_header("Connection", "close")
        self.end_headers()
        if not has_body:
            return
        limit = length // 2 if truncate else length
        sent = 0
        while sent < limit:
            chunk = payload[sent : sent + _CHUNK] if payload is not None else response.read(min(_CHUNK, limit - sent))
            if not chunk:
                break
            chunk = chunk[: limit - sent]
            self.wfile.write(chunk)
            sent += len(chunk)
            proxy._sent(path, len(chunk))
        if truncate:
            self.wfile.flush()
            if rule is not None and rule.then is not None:
                rule.then()  # the client still waits for the rest of the body: no retry yet
            self.close_connection = True

    def _inject(self, fault: str) -> None:
        if fault == "reset":
            self._abort()
        elif fault == "slowdown":
            self._send_simple(503, _SLOWDOWN_BODY, "application/xml", reason="Slow Down")
        elif fault == "403":
            self._send_simple(403, _FORBIDDEN_BODY, "application/json", reason="Forbidden")
        else:
            self._send_simple(429, _TOO_MANY_BODY, "application/json", reason="Too Many Requests")

    def _send_simple(self, status: int, body: bytes, content_type: str, reason: str | None = None) -> None:
        self.send_response(status, reason)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _abort(self) -> None:
        """Close the connection with SO_LINGER 0, so the peer gets a TCP RST."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()  # drop the makefile reference so close() really closes the socket now
        self.connection.close()


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 that counts requests and injects faults on demand."""

    def __init__(self, upstream_url: str, latency: float = 0.0) -> None:
        parsed = urllib.parse.urlsplit(upstream_url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"FaultProxy needs an http:// upstream, got {upstream_url!r}")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 80
        self.requests: list[Seen] = []
        self.injected: Counter[str] = Counter()
        self.latency = latency
        self.body_bytes: Counter[str] = Counter()
        self.peak_in_flight = 0
        self._forwarding = 0
        self._rules: list[FaultRule] = []
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._gate: Gate | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` of the running proxy."""
        if self._server is None:
            raise RuntimeError("FaultProxy is not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> "FaultProxy":
        """Listen on a free port and serve in a background thread."""
        server = _Server(("127.0.0.1", 0), _Handler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close client connections and the listening socket."""
        if self._server is None:
            return
        self._server.shutdown()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_fault(
        self,
        kind: str,
        *,
        first: int | None = None,
        rate: float | None = None,
        method: str | None = None,
        path_prefix: str | None = None,
        seed: int = 0,
        after: int = 0,
        then: Callable[[], None] | None = None,
    ) -> FaultRule:
        """Add a fault rule (see the module docstring) and return it (``rule.fired`` counts hits)."""
        rule = FaultRule(
            kind, first=first, rate=rate, method=method, path_prefix=path_prefix, seed=seed, after=after, then=then
        )
        with self._lock:
            self._rules.append(rule)
        return rule

    def gather(
        self, count: int, method: str | None = "GET", timeout: float = 10.0, path_suffix: str | None = None
    ) -> Gate:
        """Hold the next ``count`` matching requests until they are all in (see the module docstring)."""
        self._gate = Gate(count, method, timeout, path_suffix)
        return self._gate

    def clear_faults(self) -> None:
        """Remove every fault rule; requests pass through unchanged from now on."""
        with self._lock:
            self._rules.clear()

    def reset_counts(self) -> None:
        """Forget recorded requests and injected-fault counts."""
        with self._lock:
            self.requests.clear()
            self.injected.clear()
            self.body_bytes.clear()
            self.peak_in_flight = self._forwarding

    @property
    def counts(self) -> Counter[tuple[str, str]]:
        """Requests seen, by ``(method, path)``."""
        with self._lock:
            return Counter((seen.method, seen.path) for seen in self.requests)

    def count(
        self,
        method: str | None = None,
        path_prefix: str | None = None,
        where: Callable[[Seen], bool] | None = None,
        faulted: bool | None = None,
    ) -> int:
        """How many recorded requests match every given filter."""
        with self._lock:
            seen = list(self.requests)
        return sum(
            1
            for item in seen
            if (method is None or item.method == method.upper())
            and (path_prefix is None or item.path.startswith(path_prefix))
            and (faulted is None or (item.fault is not None) == faulted)
            and (where is None or where(item))
        )

    # -- used by the handler ------------------------------------------------------------------

    def _open_upstream(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=120)

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.requests.append(seen)
            if seen.fault is not None:
                self.injected[seen.fault] += 1

    def _pick(self, method: str, path: str, kinds: tuple[str, ...]) -> FaultRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.kind in kinds and rule.matches(method, path) and rule.fire():
                    return rule
        return None

    def _pre_fault(self, method: str, path: str) -> FaultRule | None:
        return self._pick(method, path, ("slowdown", "429", "403", "reset"))

    def _post_fault(self, method: str, path: str) -> FaultRule | None:
        return self._pick(method, path, ("truncate",))

    def _in_flight(self, change: int) -> None:
        with self._lock:
            self._forwarding += change
            self.peak_in_flight = max(self.peak_in_flight, self._forwarding)

    def _sent(self, path: str, nbytes: int) -> None:
        with self._lock:
            self.body_bytes[path] += nbytes

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
