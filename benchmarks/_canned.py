"""A server that is never the bottleneck: one canned page of records, a fresh cursor each time.

It runs in its own process on a bare ``asyncio.Protocol`` (uvloop when installed), answers every
request on a keep-alive connection with the same ``records``-record page of realistic
subscription records (from the fake server's data) and ``hasNextPage: true`` with a new
``nextCursor``, so a client paginates through it for as long as it likes. The request line and
headers are not even parsed beyond finding their end: this server measures the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from asyncsubs.testing._data import StoreData

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"


def page_prefix(records: int) -> bytes:
    """The page body up to the cursor value: envelope, records, and ``"nextCursor":"c``."""
    counts = {"subscriptions": records, "customers": 0, "orders": 0}
    data = StoreData(seed=0, store="canned", counts=counts)["subscriptions"]
    joined = b",".join(data.encoded_at(i) for i in range(records))
    return (
        b'{"success":true,"message":"OK","code":"SUCCESS","data":['
        + joined
        + b'],"pageInfo":{"hasNextPage":true,"nextCursor":"c'
    )


class _Protocol(asyncio.Protocol):
    prefix = b""
    served = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport  # uvloop's transports are not asyncio.Transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:  # GETs: no body
            self.buffer = self.buffer[end + 4 :]
            _Protocol.served += 1
            body = _Protocol.prefix + str(_Protocol.served).encode() + b'"}}'
            self.transport.write(_HEAD % len(body) + body)


def _child(conn: Connection, records: int, use_uvloop: bool) -> None:
    _Protocol.prefix = page_prefix(records)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Protocol, "127.0.0.1", 0)
        conn.send(server.sockets[0].getsockname()[1])
        conn.close()
        async with server:
            await server.serve_forever()

    if use_uvloop:
        with contextlib.suppress(ImportError):
            import uvloop

            uvloop.run(main())
            return
    asyncio.run(main())


@contextlib.contextmanager
def canned_server(records: int = 100, *, use_uvloop: bool = True) -> Iterator[dict[str, Any]]:
    """Start the canned server in a spawned process; yields ``{"base_url", "pid"}``."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child, args=(sender, records, use_uvloop), name="canned-page-server", daemon=True
    )
    process.start()
    sender.close()
    try:
        if not receiver.poll(30):
            raise RuntimeError("canned server did not start within 30 s")
        port = receiver.recv()
        yield {"base_url": f"http://127.0.0.1:{port}", "pid": process.pid}
    finally:
        receiver.close()
        process.kill()
        process.join(5)
