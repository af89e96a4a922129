"""The aiohttp layer: send a ``Request``, return a ``RawResponse``. Kept thin on purpose.

``Transport`` is the test seam (as in httpx): anything with ``send`` and ``aclose`` can stand in
for the network. Redirects are never followed, so the token never reaches another origin.
"""

from __future__ import annotations

from typing import Protocol

import aiohttp

from ._protocol import RawResponse, Request
from .errors import ProtocolError, TransportError

__all__ = ["AiohttpTransport", "Transport"]

_CHUNK = 1 << 16


class Transport(Protocol):
    """Sends requests."""

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        """Send one request; raise TransportError or ProtocolError, nothing else."""
        ...

    async def aclose(self) -> None: ...


class AiohttpTransport:
    """Sends requests with an aiohttp ClientSession.

    A session passed in is shared and never closed here; otherwise one is created on first use
    and closed by ``aclose``. Bodies larger than ``max_response_bytes`` are refused without
    being read into memory whole.
    """

    def __init__(
        self, session: aiohttp.ClientSession | None = None, *, max_response_bytes: int
    ) -> None:
        self._session = session
        self._owns_session = session is None
        self._max_bytes = max_response_bytes
        self._timeout: aiohttp.ClientTimeout | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            if not self._owns_session:
                raise TransportError("the aiohttp session passed to the client is closed")
            # Concurrency is capped per store by the limiter, not by the connector.
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        session = self._get_session()
        client_timeout = self._timeout
        if client_timeout is None or client_timeout.total != timeout:
            client_timeout = self._timeout = aiohttp.ClientTimeout(total=timeout)
        try:
            async with session.request(
                request.method,
                request.url,
                headers=request.headers,
                data=request.body,
                allow_redirects=False,
                raise_for_status=False,
                timeout=client_timeout,
            ) as resp:
                body = await self._read_body(resp, request)
                headers = {k.lower(): v for k, v in resp.headers.items()}
                return RawResponse(status=resp.status, headers=headers, body=body)
        except TimeoutError:
            where = f"{request.method} {request.path}"
            raise TransportError(
                f"{where}: no complete response within {timeout:g}s",
                method=request.method,
                path=request.path,
            ) from None
        except aiohttp.ClientConnectorError as exc:
            where = f"{request.method} {request.path}"
            # The connection was never made: the server cannot have seen the request.
            raise TransportError(
                f"{where}: cannot connect: {exc.strerror or type(exc).__name__}",
                method=request.method,
                path=request.path,
                maybe_processed=False,
            ) from exc
        except aiohttp.ClientError as exc:
            where = f"{request.method} {request.path}"
            raise TransportError(
                f"{where}: connection failed: {type(exc).__name__}",
                method=request.method,
                path=request.path,
            ) from exc

    async def _read_body(self, resp: aiohttp.ClientResponse, request: Request) -> bytes:
        length = resp.content_length
        if length is not None and length <= self._max_bytes:
            return await resp.read()
        if length is not None:
            raise self._too_large(resp, request, length)
        chunks: list[bytes] = []
        total = 0
        async for chunk in resp.content.iter_chunked(_CHUNK):
            total += len(chunk)
            if total > self._max_bytes:
                raise self._too_large(resp, request, total)
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(
        self, resp: aiohttp.ClientResponse, request: Request, size: int
    ) -> ProtocolError:
        resp.close()  # drop the connection rather than drain the rest
        method, path = request.method, request.path
        return ProtocolError(
            f"{method} {path}: response body of {size}+ bytes exceeds"
            f" max_response_bytes={self._max_bytes}",
            method=method,
            path=path,
            status=resp.status,
        )

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None
