"""Minimal HTTP/1.1 client connections for the lean S3 path (:mod:`lading.stores.s3.fast`).

``http.client`` parses every response's headers with the ``email`` package and wraps the
socket in buffered file objects: about a third of the CPU of a small GET. This module does
only what S3 GET/HEAD/LIST need: one request at a time per keep-alive connection,
Content-Length or chunked bodies, streamed into a callback without extra copies.

Failures are raised as :class:`WireError` (an OSError), which the caller translates.
"""

from __future__ import annotations

import queue
import socket
from dataclasses import dataclass
from typing import Callable

_HEAD_LIMIT = 64 << 10
_BODY_CHUNK = 1 << 18
_INTO_CHUNK = 1 << 20  # receives straight into a caller's buffer: fewer, larger calls


class WireError(OSError):
    """The connection failed or the server broke HTTP framing (retryable)."""


class ClosedBeforeResponse(WireError):
    """A reused keep-alive connection was closed by the server before answering."""


@dataclass
class Head:
    """A response's status line and headers (names lower-case)."""

    status: int
    headers: dict[str, str]

    @property
    def keep_alive(self) -> bool:
        """Whether the connection may be reused after the body is read."""
        return self.headers.get("connection", "").lower() != "close"


class Connection:
    """One keep-alive connection to ``host:port`` (TLS when ``tls`` is an SSLContext)."""

    def __init__(self, host: str, port: int, timeout: float, tls: object | None = None) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.tls = tls
        self.sock: socket.socket | None = None
        self.reused = False
        self._pending = b""  # bytes read past the response head: the start of the body
        self._buffer: memoryview | None = None

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_hostname=self.host)  # type: ignore[attr-defined]
        return sock

    def send(self, data: bytes) -> None:
        """Send one request (connecting first if needed)."""
        if self.sock is None:
            self.sock = self._connect()
            self.reused = False
        else:
            self.reused = True
        self.sock.sendall(data)

    def read_head(self) -> Head:
        """Read the status line and headers."""
        assert self.sock is not None
        data = b""
        while True:
            end = data.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(data) > _HEAD_LIMIT:
                raise WireError("response headers too large")
            chunk = self.sock.recv(_BODY_CHUNK)
            if not chunk:
                if not data and self.reused:
                    raise ClosedBeforeResponse("keep-alive connection closed by the server")
                raise WireError("connection closed before the response headers")
            data += chunk
        self._pending = data[end + 4:]
        lines = data[:end].decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError) as err:
            raise WireError(f"malformed status line {lines[0][:80]!r}") from err
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return Head(status, headers)

    def read_body(self, head: Head, sink: Callable[[memoryview], None], method: str = "GET",
                  into: memoryview | None = None) -> int:
        """Deliver the body to ``sink``; return its length. Short bodies raise WireError.

        With ``into`` (a writable byte view), the body is placed in ``into`` from its start:
        a Content-Length body is received straight into it (one copy fewer per byte), and
        each view ``sink`` gets is the slice of ``into`` just filled. A body longer than
        ``into`` raises WireError.
        """
        if method == "HEAD" or head.status in (204, 304) or 100 <= head.status < 200:
            return 0
        chunked = head.headers.get("transfer-encoding", "").lower() == "chunked"
        length = head.headers.get("content-length")
        if into is not None and (chunked or length is None):
            sink = _placing_in(into, sink)
        if chunked:
            return self._read_chunked(sink)
        if length is None:
            return self._read_to_close(sink)
        if into is not None:
            return self._receive_into(int(length), into, sink)
        return self._read_exactly(int(length), sink)

    def read_all(self, head: Head, method: str = "GET") -> bytes:
        """The whole body as bytes (listings, error documents)."""
        parts: list[bytes] = []
        self.read_body(head, lambda view: parts.append(bytes(view)), method)
        return b"".join(parts)

    def _read_exactly(self, length: int, sink: Callable[[memoryview], None]) -> int:
        assert self.sock is not None
        got = 0
        if self._pending:
            first, self._pending = self._pending[:length], self._pending[length:]
            if first:
                sink(memoryview(first))
                got = len(first)
        if got < length:
            if self._buffer is None:
                self._buffer = memoryview(bytearray(_BODY_CHUNK))  # reused: sinks copy what they keep
            view = self._buffer
            while got < length:
                n = self.sock.recv_into(view, min(len(view), length - got))
                if not n:
                    raise WireError(f"response body cut short ({got} of {length} bytes)")
                sink(view[:n])
                got += n
        return got

    def _receive_into(self, length: int, into: memoryview, sink: Callable[[memoryview], None]) -> int:
        assert self.sock is not None
        if length > len(into):
            raise WireError(f"response body of {length} bytes is larger than the {len(into)} bytes asked for")
        got = 0
        if self._pending:
            first, self._pending = self._pending[:length], self._pending[length:]
            got = len(first)
            if got:
                into[:got] = first
                sink(into[:got])
        while got < length:
            n = self.sock.recv_into(into[got:], min(_INTO_CHUNK, length - got))
            if not n:
                raise WireError(f"response body cut short ({got} of {length} bytes)")
            sink(into[got:got + n])
            got += n
        return got

    def _read_to_close(self, sink: Callable[[memoryview], None]) -> int:
        assert self.sock is not None
        got = len(self._pending)
        if self._pending:
            sink(memoryview(self._pending))
            self._pending = b""
        while chunk := self.sock.recv(_BODY_CHUNK):
            sink(memoryview(chunk))
            got += len(chunk)
        self.close()
        return got

    def _fill(self, need: int) -> None:
        assert self.sock is not None
        while len(self._pending) < need:
            chunk = self.sock.recv(_BODY_CHUNK)
            if not chunk:
                raise WireError("connection closed inside a chunked body")
            self._pending += chunk

    def _line(self) -> bytes:
        assert self.sock is not None
        while (end := self._pending.find(b"\r\n")) < 0:
            self._fill(len(self._pending) + 1)
        line, self._pending = self._pending[:end], self._pending[end + 2:]
        return line

    def _read_chunked(self, sink: Callable[[memoryview], None]) -> int:
        got = 0
        while True:
            try:
                size = int(self._line().split(b";", 1)[0], 16)
            except ValueError as err:
                raise WireError("malformed chunked encoding") from err
            if size == 0:
                while self._line():  # trailers, then the empty line
                    pass
                return got
            self._fill(size + 2)
            sink(memoryview(self._pending[:size]))
            got += size
            self._pending = self._pending[size + 2:]

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None
                self._pending = b""


def _placing_in(into: memoryview, sink: Callable[[memoryview], None]) -> Callable[[memoryview], None]:
    """A sink that copies each piece to the next place in ``into``, then passes that slice on."""
    filled = 0

    def place(piece: memoryview) -> None:
        nonlocal filled
        end = filled + len(piece)
        if end > len(into):
            raise WireError(f"response body larger than the {len(into)} bytes asked for")
        into[filled:end] = piece
        sink(into[filled:end])
        filled = end

    return place


class Pool:
    """Idle keep-alive connections to one endpoint, most recently used first."""

    def __init__(self, host: str, port: int, timeout: float, tls: object | None) -> None:
        self._args = (host, port, timeout, tls)
        self._idle: queue.LifoQueue[Connection] = queue.LifoQueue()

    def get(self) -> Connection:
        """An idle connection, or a new (not yet connected) one."""
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return Connection(*self._args)

    def put(self, conn: Connection) -> None:
        """Return a connection whose response was fully read."""
        if conn.sock is not None:
            self._idle.put(conn)

    def close(self) -> None:
        """Close every idle connection."""
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
