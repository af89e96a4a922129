"""Serving webhooks on an open port: per-request deadlines, idle timeout, a connection cap and a
cap on the bytes of bodies being read.

aiohttp's server has an idle (keep-alive) timeout but no deadline for a request's headers or
body, and no cap on connections: a client sending one byte a second, or thousands of clients
each holding a connection, would hold memory and sockets for as long as they like. Each
connection here goes through ``GuardedConnection``, a thin protocol in front of aiohttp's, that
closes the connection when a request is not read in full within ``read_timeout`` seconds and
refuses connections beyond ``max_connections``. The receiver reserves each body's bytes from
the listener's shared budget while it reads them (``BodyBudget``), so the memory bodies take is
bounded by ``max_buffered_bytes`` whatever the number of connections.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final, cast

import attrs
from aiohttp import web

from .._config import positive_int, positive_number

__all__ = ["BodyBudget", "GuardedConnection", "Listener", "ListenerLimits", "guarded"]

_READ_BUFSIZE: Final = 64 * 1024
_REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


class _ServerLog(logging.LoggerAdapter[logging.Logger]):
    """aiohttp's server log, at DEBUG in the package's: a request it cannot parse (a bad header,
    chunk size or encoding) is answered 400 by aiohttp and logged there with its traceback, and
    anyone who reaches the port can send a thousand of them."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        super().log(logging.DEBUG, msg, *args, **kwargs)


_SERVER_LOG: Final = _ServerLog(logging.getLogger("asyncsubs.webhooks.http"))


@attrs.frozen
class ListenerLimits:
    """What one listening port lets clients hold (defaults suit a port open to the internet).

    - ``read_timeout``: seconds a client has to send a whole request, headers and body, from
      connecting (or from its previous answer on a kept-alive connection); then it is closed.
    - ``idle_timeout``: seconds a kept-alive connection may sit idle between requests.
    - ``max_connections``: open connections at once; more are answered 503 and closed.
    - ``max_buffered_bytes``: bytes of request bodies being read at once over all
      connections; a body that would go above it is answered 503 (``Retry-After``).
    """

    read_timeout: float = attrs.field(default=10.0, kw_only=True)
    idle_timeout: float = attrs.field(default=15.0, kw_only=True)
    max_connections: int = attrs.field(default=256, kw_only=True)
    max_buffered_bytes: int = attrs.field(default=32 * 1024 * 1024, kw_only=True)

    def __attrs_post_init__(self) -> None:
        positive_number("read_timeout", self.read_timeout)
        positive_number("idle_timeout", self.idle_timeout)
        positive_int("max_connections", self.max_connections)
        positive_int("max_buffered_bytes", self.max_buffered_bytes)


class BodyBudget:
    """Bytes of request bodies held by all connections of one listener."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> bool:
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def give(self, size: int) -> None:
        self.used -= size


class GuardedConnection(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind a deadline and the connection count."""

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.budget = listener.budget
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's is not an asyncio.Transport subclass, so no isinstance).
        transport = cast(asyncio.Transport, transport)
        listener = self.listener
        if listener.connections >= listener.limits.max_connections:
            transport.write(_REFUSED)
            transport.close()
            listener.refused += 1
            return
        listener.connections += 1
        self._transport = transport
        self.request_pending(listener.limits.read_timeout)
        self._inner = listener.server()
        self._inner.connection_made(transport)

    def request_pending(self, seconds: float) -> None:
        """A request must arrive in full within ``seconds``."""
        self.request_read()
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire)

    def request_read(self) -> None:
        """The request is read: its handler answers without a deadline."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def answered(self) -> None:
        """The next request on this connection may come after an idle pause, then must be
        read within the read timeout."""
        limits = self.listener.limits
        if self._transport is not None and not self._transport.is_closing():
            self.request_pending(limits.idle_timeout + limits.read_timeout)

    def _expire(self) -> None:
        self._deadline = None
        if self._transport is not None:
            self.listener.timed_out += 1
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._inner is None else self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.request_read()
        if self._inner is not None:
            self.listener.connections -= 1
            inner, self._inner, self._transport = self._inner, None, None
            inner.connection_lost(exc)


def guarded(request: web.BaseRequest) -> GuardedConnection | None:
    """The guard of the request's connection, when it came through a ``Listener``."""
    transport = request.transport
    protocol = None if transport is None else transport.get_protocol()
    return protocol if isinstance(protocol, GuardedConnection) else None


class Listener:
    """An aiohttp application served on ``host:port`` under ``ListenerLimits``: what
    ``WebhookReceiver.listen`` uses, for serving several receivers (``receiver.attach(app,
    path)``) on one port::

        listener = Listener(app, ListenerLimits())
        host, port = await listener.start("0.0.0.0", 8080)   # runs the app's on_startup
        ...
        await listener.aclose()                             # and its on_cleanup
    """

    def __init__(self, app: web.Application, limits: ListenerLimits) -> None:
        self.limits = limits
        self.budget = BodyBudget(limits.max_buffered_bytes)
        self.connections = 0
        #: Connections refused by the cap, and closed because a request was not read in time.
        self.refused = 0
        self.timed_out = 0
        self._runner = web.AppRunner(
            app,
            access_log=None,
            logger=_SERVER_LOG,
            shutdown_timeout=5.0,
            keepalive_timeout=limits.idle_timeout,
            # aiohttp buffers up to about twice this per connection ahead of the handler.
            read_bufsize=_READ_BUFSIZE,
        )
        self._server: asyncio.Server | None = None

    def server(self) -> asyncio.Protocol:
        factory = self._runner.server
        assert factory is not None
        return factory()

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; returns the bound (host, port). OSError when the address cannot be bound."""
        await self._runner.setup()
        try:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(lambda: GuardedConnection(self), host, port)
        except BaseException:
            await self._runner.cleanup()
            raise
        bound = self._server.sockets[0].getsockname()
        return str(bound[0]), int(bound[1])

    async def aclose(self) -> None:
        """Stop accepting, answer the requests in progress, close the connections."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self._runner.cleanup()
        if server is not None:
            await server.wait_closed()
