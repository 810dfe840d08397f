#!/usr/bin/env python3
"""A TCP proxy that adds network latency, for kernels without the netem qdisc.

Every chunk is forwarded ``--delay-ms`` after it arrived, in both directions, so a request and
its response see a round trip of twice the delay. A new connection's first upstream bytes wait
one extra round trip, like a TCP handshake would. ``--rate-mbit`` optionally caps the total
bandwidth of each direction.

    python bench/latproxy.py --listen 127.0.0.1:17480 --upstream 127.0.0.1:7480 --delay-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections import deque

_READ = 1 << 18
_MAX_QUEUED = 8 << 20  # bytes held per direction before we stop reading (flow control)


class Pacer:
    """A shared token bucket: bytes leave no faster than ``bytes_per_s``."""

    def __init__(self, bytes_per_s: float) -> None:
        self.rate = bytes_per_s
        self.free_at = 0.0

    async def take(self, nbytes: int) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.free_at = max(now, self.free_at) + nbytes / self.rate
        if self.free_at - now > 0.001:
            await asyncio.sleep(self.free_at - now)


async def relay(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay: float, first_extra: float, pacer: Pacer | None
) -> None:
    """Copy src to dst, releasing each chunk ``delay`` seconds after it was read."""
    loop = asyncio.get_running_loop()
    queue: deque[tuple[float, bytes | None]] = deque()
    queued = 0
    wake = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def writer() -> None:
        nonlocal queued
        while True:
            while not queue:
                wake.clear()
                await wake.wait()
            due, data = queue.popleft()
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            if data is None:
                if dst.can_write_eof():
                    dst.write_eof()
                return
            dst.write(data)
            await dst.drain()
            queued -= len(data)
            if queued < _MAX_QUEUED:
                room.set()

    task = asyncio.create_task(writer())
    extra = first_extra
    try:
        while True:
            data = await src.read(_READ)
            if not data:
                break
            if pacer is not None:
                await pacer.take(len(data))
            await room.wait()
            queue.append((loop.time() + delay + extra, data))
            extra = 0.0
            queued += len(data)
            if queued >= _MAX_QUEUED:
                room.clear()
            wake.set()
    except (ConnectionError, OSError):
        pass
    queue.append((loop.time() + delay, None))
    wake.set()
    try:
        await task
    except (ConnectionError, OSError):
        pass


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def serve(args: argparse.Namespace) -> None:
    up_host, up_port = args.upstream.rsplit(":", 1)
    host, port = args.listen.rsplit(":", 1)
    delay = args.delay_ms / 1000
    rate = args.rate_mbit * 125_000
    pacers = (Pacer(rate), Pacer(rate)) if rate else (None, None)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(up_host, int(up_port))
        except OSError:
            client_w.close()
            return
        _nodelay(client_w)
        _nodelay(server_w)
        await asyncio.gather(
            relay(client_r, server_w, delay, 2 * delay, pacers[0]), relay(server_r, client_w, delay, 0.0, pacers[1])
        )
        for writer in (client_w, server_w):
            writer.close()

    server = await asyncio.start_server(handle, host, int(port), backlog=2048)
    print(f"latproxy: {args.listen} -> {args.upstream}, RTT {2 * args.delay_ms:g} ms", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept connections on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="one-way delay (RTT is twice this)")
    parser.add_argument("--rate-mbit", type=float, default=0.0, help="bandwidth cap per direction, 0 = none")
    try:
        asyncio.run(serve(parser.parse_args()))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
