"""The lean HTTP/1.1 client under the fast S3 path, against a tiny scripted server: framing
moto never produces (chunked bodies, close-delimited bodies, idle keep-alive closes)."""

from __future__ import annotations

import socket
import threading

import pytest

from lading.stores.s3.wire import Connection, Pool, WireError


class ScriptedServer:
    """Accepts connections; answers each request with the next canned response."""

    def __init__(self, responses: list[bytes], close_after_each: bool = False) -> None:
        self.responses = list(responses)
        self.close_after_each = close_after_each
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.responses:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                while self.responses:
                    data = b""
                    while b"\r\n\r\n" not in data:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    if not data:
                        break
                    self.requests.append(data)
                    conn.sendall(self.responses.pop(0))
                    if self.close_after_each:
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server_factory():
    servers: list[ScriptedServer] = []

    def make(responses: list[bytes], **kwargs) -> ScriptedServer:
        server = ScriptedServer(responses, **kwargs)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def _get(conn: Connection) -> tuple[int, bytes]:
    conn.send(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n")
    head = conn.read_head()
    return head.status, conn.read_all(head)


def test_content_length_chunked_and_keep_alive_on_one_connection(server_factory):
    server = server_factory([
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: \"e\"\r\n\r\nhello",
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\n<Err\r\n3\r\nor>\r\n0\r\nX-T: 1\r\n\r\n",
        b"HTTP/1.1 206 Partial Content\r\ncontent-length: 3\r\n\r\nabc",
    ])
    conn = Connection("127.0.0.1", server.port, timeout=5)
    assert _get(conn) == (200, b"hello")
    assert _get(conn) == (404, b"<Error>")
    assert _get(conn) == (206, b"abc")
    assert server.connections == 1


def test_close_delimited_body_and_connection_close(server_factory):
    server = server_factory([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"], close_after_each=True)
    conn = Connection("127.0.0.1", server.port, timeout=5)
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    head = conn.read_head()
    assert not head.keep_alive
    assert conn.read_all(head) == b"until the end"


def test_truncated_body_raises_wire_error(server_factory):
    server = server_factory([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"], close_after_each=True)
    conn = Connection("127.0.0.1", server.port, timeout=5)
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    head = conn.read_head()
    with pytest.raises(WireError, match="cut short"):
        conn.read_all(head)


def test_garbage_status_line_raises_wire_error(server_factory):
    server = server_factory([b"SSH-2.0-OpenSSH\r\n\r\n"], close_after_each=True)
    conn = Connection("127.0.0.1", server.port, timeout=5)
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(WireError, match="malformed status line"):
        conn.read_head()


def test_idle_connection_closed_by_server_is_detected_on_reuse(server_factory):
    server = server_factory([b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na",
                             b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb"], close_after_each=True)
    pool = Pool("127.0.0.1", server.port, 5, None)
    first = pool.get()
    assert _get(first) == (200, b"a")
    pool.put(first)
    reused = pool.get()
    assert reused is first
    from lading.stores.s3.wire import ClosedBeforeResponse

    with pytest.raises((ClosedBeforeResponse, ConnectionError)):  # EOF or RST, by timing
        _get(reused)  # the server closed it after the first answer
    reused.close()
    assert _get(pool.get()) == (200, b"b")
    assert server.connections == 2


def _get_into(conn: Connection, into: memoryview) -> tuple[int, list[memoryview]]:
    pieces: list[memoryview] = []
    conn.send(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n")
    head = conn.read_head()
    return conn.read_body(head, pieces.append, into=into), pieces


def _assert_in_place(pieces: list[memoryview], buffer: bytearray, body: bytes) -> None:
    """Each piece is the next slice of ``buffer`` and together they are the body."""
    position = 0
    for piece in pieces:
        assert piece.obj is buffer
        assert bytes(piece) == body[position:position + len(piece)]
        position += len(piece)
    assert position == len(body)


def test_body_received_straight_into_the_callers_buffer(server_factory):
    body = bytes(range(256)) * 3000  # 768,000 bytes: several receives, part arriving with the head
    server = server_factory([b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
                             b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nxyz"])
    conn = Connection("127.0.0.1", server.port, timeout=5)
    buffer = bytearray(b"\xee" * (len(body) + 10))
    got, pieces = _get_into(conn, memoryview(buffer))
    assert got == len(body) and len(pieces) > 1
    _assert_in_place(pieces, buffer, body)
    assert buffer[:len(body)] == body and buffer[len(body):] == b"\xee" * 10  # nothing written past the body
    second = bytearray(3)
    assert _get_into(conn, memoryview(second))[0] == 3 and second == b"xyz"  # keep-alive framing intact


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello world",
], ids=["chunked", "close-delimited"])
def test_other_framings_are_placed_in_the_callers_buffer(server_factory, response):
    server = server_factory([response], close_after_each=True)
    buffer = bytearray(16)
    got, pieces = _get_into(Connection("127.0.0.1", server.port, timeout=5), memoryview(buffer)[2:])
    assert got == 11 and buffer[2:13] == b"hello world"
    _assert_in_place(pieces, buffer, b"hello world")


@pytest.mark.parametrize("response", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
], ids=["content-length", "chunked"])
def test_body_longer_than_the_callers_buffer_is_refused(server_factory, response):
    server = server_factory([response], close_after_each=True)
    buffer = bytearray(8)
    with pytest.raises(WireError, match="larger than"):
        _get_into(Connection("127.0.0.1", server.port, timeout=5), memoryview(buffer))


def test_truncated_body_into_the_callers_buffer_raises_wire_error(server_factory):
    server = server_factory([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this"], close_after_each=True)
    with pytest.raises(WireError, match="cut short"):
        _get_into(Connection("127.0.0.1", server.port, timeout=5), memoryview(bytearray(100)))
