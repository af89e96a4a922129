"""The aiohttp layer: send a ``Request``, return a ``RawResponse``. Kept thin on purpose.

``Transport`` is the test seam (as in httpx): anything with ``send`` and ``aclose`` can stand in
for the network. Redirects are never followed, so the token never reaches another origin. A
transport whose ``send`` also takes ``on_connected`` (``ConnectingTransport``, as
``AiohttpTransport`` does) is handed, with each request, what to call the moment that request
gets its connection: the limiter counts the request's start from then.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final, Protocol

import aiohttp
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from ._protocol import TOKEN_HEADER, RawResponse, Request, redacted
from .errors import ProtocolError, TransportError, excerpt

__all__ = ["AiohttpTransport", "ConnectingTransport", "Transport"]

#: The ``on_connected`` of the request ``AiohttpTransport.send`` is sending, for its connector:
#: set and reset by ``send`` in the request's own task. aiohttp hands a connector nothing of a
#: request's own but its traces, which would cost every request a round of awaited signals.
_on_connected: ContextVar[Callable[[], None] | None] = ContextVar("on_connected", default=None)


class _Connector(aiohttp.TCPConnector):
    """Calls the request's ``on_connected`` as it hands out a connection. A session passed in
    does not, and its connects and queueing delay starts unseen (hence ``limit=0`` there too)."""

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        connection = await super().connect(req, traces, timeout)
        if (callback := _on_connected.get()) is not None:
            callback()
        return connection


class Transport(Protocol):
    """Sends requests."""

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        """Send one request; raise TransportError or ProtocolError, nothing else."""
        ...

    async def aclose(self) -> None: ...


class ConnectingTransport(Transport, Protocol):
    """A transport that says when a request goes out: it calls ``on_connected`` the moment the
    request has its connection (after any connect, or a wait for a free connection)."""

    async def send(
        self,
        request: Request,
        *,
        timeout: float,
        on_connected: Callable[[], None] | None = None,
    ) -> RawResponse: ...


#: OpenSSL's reasons for a handshake answered by something that does not speak TLS.
_NOT_TLS_REASONS: Final = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"}
)


def _transport_error(exc: aiohttp.ClientError, request: Request) -> TransportError:
    """The TransportError for an aiohttp failure: a description of it, never the exception
    itself (see ``send``). Failures another attempt cannot fix are marked not transient."""
    where = f"{request.method} {request.path}"
    kwargs: dict[str, Any] = {"method": request.method, "path": request.path}
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert_error = exc.certificate_error
        why = getattr(cert_error, "verify_message", None) or type(cert_error).__name__
        return TransportError(
            f"{where}: the server's TLS certificate failed verification ({why}); check the host "
            "in base_url, or trust the server's CA: session=aiohttp.ClientSession(connector="
            "aiohttp.TCPConnector(ssl=an_ssl_context_with_it))",
            maybe_processed=False,
            transient=False,
            **kwargs,
        )
    if isinstance(exc, aiohttp.ClientConnectorError):
        # The connection was never made: the server cannot have seen the request.
        os_error = exc.os_error
        if isinstance(os_error, ssl.SSLError) and not isinstance(
            os_error, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError
        ):
            reason = os_error.reason or type(os_error).__name__
            hint = (
                "the server does not speak TLS there: is base_url https:// for a plain-http "
                "port? (use the https port, or http:// where allowed)"
                if reason in _NOT_TLS_REASONS
                else "check base_url's scheme and port"
            )
            return TransportError(
                f"{where}: TLS handshake failed ({reason}); {hint}",
                maybe_processed=False,
                transient=False,
                **kwargs,
            )
        return TransportError(
            f"{where}: cannot connect: {exc.strerror or type(exc).__name__}",
            maybe_processed=False,
            **kwargs,
        )
    if isinstance(exc, aiohttp.InvalidURL):
        return TransportError(
            f"{where}: aiohttp refuses the URL as invalid; check base_url's host",
            maybe_processed=False,
            transient=False,
            **kwargs,
        )
    # A ClientResponseError's str() holds no header of ours (its repr and args do); the message
    # is aiohttp's description of what the server sent, which may quote the token echoed back.
    detail = exc.message if isinstance(exc, aiohttp.ClientResponseError) else str(exc)
    if token := request.headers.get(TOKEN_HEADER):
        detail = redacted(detail, token)
    return TransportError(
        f"{where}: connection failed: {type(exc).__name__}: {excerpt(detail)}", **kwargs
    )


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
                raise TransportError(
                    "the aiohttp session passed to the client is closed", transient=False
                )
            # Concurrency is capped per store by the limiter, not by the connector.
            connector = _Connector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def send(
        self,
        request: Request,
        *,
        timeout: float,
        on_connected: Callable[[], None] | None = None,
    ) -> RawResponse:
        """Send ``request``; with a session of its own, call ``on_connected`` once the request
        has its connection."""
        reset = _on_connected.set(on_connected)
        try:
            return await self._send(request, timeout)
        finally:
            _on_connected.reset(reset)

    async def _send(self, request: Request, timeout: float) -> RawResponse:
        session = self._get_session()
        client_timeout = self._timeout
        if client_timeout is None or client_timeout.total != timeout:
            client_timeout = self._timeout = aiohttp.ClientTimeout(total=timeout)
        failure: TransportError
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
                # A HEAD's Content-Length is that of the body a GET would get; none follows.
                body = b"" if request.method == "HEAD" else await self._read_body(resp, request)
                headers = {k.lower(): v for k, v in resp.headers.items()}
                if len(headers) < len(resp.headers):  # a field in several lines (RFC 9110 5.3)
                    headers = {k: ", ".join(resp.headers.getall(k)) for k in headers}
                return RawResponse(status=resp.status, headers=headers, body=body)
        except TimeoutError:
            failure = TransportError(
                f"{request.method} {request.path}: no complete response within {timeout:g}s",
                method=request.method,
                path=request.path,
            )
        except aiohttp.ClientError as exc:
            failure = _transport_error(exc, request)
        # Raised here, not in the except clauses, so that the aiohttp exception is not even
        # its __context__: aiohttp's exceptions carry the request, token header and all.
        raise failure

    async def _read_body(self, resp: aiohttp.ClientResponse, request: Request) -> bytes:
        # Content-Length counts the bytes on the wire, before decompression (a 255 KB gzip body
        # may inflate to 256 MiB), so the decoded bytes are counted as they arrive; aiohttp
        # inflates in bounded steps.
        length = resp.content_length
        if length is not None and length > self._max_bytes:
            raise self._too_large(resp, request, length)
        chunks: list[bytes] = []
        total = 0
        # Not `async for chunk in iter_any()`: its iterator ends each body with a raised
        # StopAsyncIteration and one more read, ~5 us a request in a paced loop (see
        # docs/benchmarks-method.md). A small body is whole and at EOF after one readany().
        content = resp.content
        while not content.at_eof():
            chunk = await content.readany()
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
