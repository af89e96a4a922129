"""Hostile servers for tests: one that answers with raw bytes (HTTP or not), one that speaks TLS
with a certificate nobody trusts; a check that a secret appears nowhere in an exception, and one
that an exception prints and serialises however it is reported."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pickle
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import trustme
from aiohttp import web
from app_server import serving

from asyncsubs.errors import AsyncSubsError


class WireServer:
    """A TCP server on loopback that answers each request with ``answer(request_bytes)`` (any
    bytes at all), written at once, then closes the connection (or leaves it hanging open when
    the answer is None)."""

    def __init__(self, answer: Callable[[bytes], bytes | None]) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._hanging: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            request = head + await reader.readexactly(length)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        self.requests.append(request)
        answer = self.answer(request)
        if answer is None:
            self._hanging.add(writer)
            return
        with contextlib.suppress(ConnectionError):
            writer.write(answer)
            await writer.drain()
        writer.close()

    async def __aenter__(self) -> WireServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        for writer in self._hanging:
            writer.close()
        self._server.close()
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def untrusted_tls_server() -> AsyncIterator[tuple[str, trustme.CA]]:
    """An https:// base URL on loopback whose certificate (for 127.0.0.1) is signed by a CA no
    client trusts unless told to; and that CA."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)

    async def answer(_: web.Request) -> web.Response:
        return web.json_response({"success": True})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    async with serving(app, ssl_context=context) as origin:
        yield origin, ca


def places_holding(exc: BaseException, secret: str) -> list[str]:
    """Where in ``exc``'s whole chain (``__cause__``, ``__context__``, ``args``, attributes,
    ``str`` and ``repr``) ``secret`` appears; empty when nowhere."""
    found: list[str] = []
    seen: set[int] = set()
    chain: list[tuple[str, BaseException]] = [("exc", exc)]
    while chain:
        where, current = chain.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        texts: dict[str, Any] = {"str": str(current), "repr": repr(current), "args": current.args}
        texts.update(vars(current))
        for name, value in texts.items():
            if secret in (value if isinstance(value, str) else repr(value)):
                found.append(f"{where}.{name} of {type(current).__name__}")
        for link in ("__cause__", "__context__"):
            linked = getattr(current, link)
            if linked is not None:
                chain.append((f"{where}.{link}", linked))
    return found


def assert_printable(exc: BaseException) -> None:
    """``exc`` and every exception chained to it, and each of their attributes, survive what a
    logger or an error tracker does with them: ``str``, ``repr``, ``repr(vars(...))`` and
    ``json.dumps(..., default=str)``; and an asyncsubs error a pickle round trip that keeps
    every attribute."""
    seen: set[int] = set()
    chain: list[BaseException] = [exc]
    while chain:
        current = chain.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        str(current)
        repr(current)
        attributes = vars(current)
        repr(attributes)
        json.dumps(attributes, default=str)
        json.dumps([str(current), list(current.args)], default=str)
        if isinstance(current, AsyncSubsError):
            copy = pickle.loads(pickle.dumps(current))
            assert type(copy) is type(current)
            assert (copy.args, vars(copy)) == (current.args, attributes)
        chain.extend(e for e in (current.__cause__, current.__context__) if e is not None)
