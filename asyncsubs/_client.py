"""AdminClient: configuration, the per-request path (limiter -> transport -> protocol), retries."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import urlsplit

import aiohttp

from ._config import Limits, RetryPolicy, check_binding, positive_int, positive_number
from ._discovery import Learned, export_learned, import_learned
from ._limiter import DEFAULT_LIMITER, Limiter, Slot, StoreLimiter
from ._models import Customer, Order, Subscription
from ._page_size import PageSizeSearch, page_size_search
from ._pagination import ListEndpoint
from ._protocol import (
    DEFAULT_VERSION,
    USER_AGENT,
    PageEnvelope,
    RawResponse,
    Request,
    Response,
    build_request,
    check_token,
    clean_path,
    parse_page,
    parse_response,
    request_headers,
    versioned_base,
    without_secret,
)
from ._retry import RetryEvent, cancellations, pause_after_429, retry_delay, waiting_enabled
from ._server_limits import parse_server_limit
from ._stats import LimiterStats, PoolStats
from ._telemetry import Call, telemetry_for
from ._transport import AiohttpTransport, ConnectingTransport, Transport
from .errors import (
    APIError,
    AsyncSubsError,
    ConfigError,
    ProtocolError,
    RateLimitError,
    TransportError,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["AdminClient"]

T = TypeVar("T")
log = logging.getLogger("asyncsubs.retry")

TOKEN_ENV: Final = "ASYNCSUBS_TOKEN"
BASE_URL_ENV: Final = "ASYNCSUBS_BASE_URL"
DEFAULT_MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024


def store_fingerprint(base: str, token: str) -> str:
    """Default store identity: a one-way hash (the token cannot be recovered from it) of the token
    and the service's address, its host in lower case and without ``/admin/{version}/``: one
    budget whichever interface version a client speaks."""
    parts = urlsplit(base)
    path = re.sub(r"/admin/[^/]*/?$", "", parts.path).rstrip("/")
    address = f"{parts.scheme}://{parts.netloc.lower()}{path}"
    return "store-" + hashlib.sha256(f"{address}\0{token}".encode()).hexdigest()[:16]


def _takes_on_connected(transport: Transport) -> bool:
    """Whether ``transport.send`` takes ``on_connected`` (see ``ConnectingTransport``)."""
    try:
        return "on_connected" in inspect.signature(transport.send).parameters
    except (TypeError, ValueError):  # no signature to read: send it nothing more
        return False


class AdminClient:
    """Client for one store's admin interface.

    Every keyword is optional except ``token`` and ``base_url`` (which may come from
    ``ASYNCSUBS_TOKEN`` / ``ASYNCSUBS_BASE_URL``). See README.md for the full guide.
    ``telemetry=False`` turns OpenTelemetry off; ``meter_provider``/``tracer_provider`` replace
    the global providers (see :mod:`asyncsubs._telemetry` and README, "Observability").
    ``on_retry`` is called with a ``RetryEvent`` before each retry of a failed attempt, in the
    task that made the request (keep it short: the retry waits for it; what it raises ends the
    request).
    """

    def __init__(
        self,
        *,
        token: str | None = None,
        base_url: str | None = None,
        store: str | None = None,
        version: str = DEFAULT_VERSION,
        limits: Limits | None = None,
        retry: RetryPolicy | None = None,
        timeout: float = 30.0,
        session: aiohttp.ClientSession | None = None,
        limiter: Limiter | None = None,
        allow_insecure: bool = False,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        transport: Transport | None = None,
        user_agent: str | None = None,
        telemetry: bool = True,
        meter_provider: MeterProvider | None = None,
        tracer_provider: TracerProvider | None = None,
        on_retry: Callable[[RetryEvent], object] | None = None,
        learned: Mapping[str, Any] | None = None,
    ) -> None:
        token = os.environ.get(TOKEN_ENV) if token is None else token
        base_url = os.environ.get(BASE_URL_ENV) if base_url is None else base_url
        self._token = check_token(token)
        self._base = versioned_base(base_url or "", version, allow_insecure=allow_insecure)
        if store is None:
            store = store_fingerprint(self._base, self._token)
        self.store: Final = store
        self.version: Final = version
        self.limits: Final = Limits() if limits is None else limits
        check_binding(store, self.limits)
        self.retry: Final = RetryPolicy() if retry is None else retry
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, got {type(retry).__name__}")
        self.timeout: Final = positive_number("timeout (seconds)", timeout)
        if session is not None and not isinstance(session, aiohttp.ClientSession):
            raise ConfigError("session must be an aiohttp.ClientSession")
        positive_int("max_response_bytes", max_response_bytes)
        if limiter is not None and not isinstance(limiter, Limiter):
            message = "limiter must be a Limiter, like asyncsubs.redis.RedisLimiter(url)"
            raise ConfigError(f"{message}, got {type(limiter).__name__}")
        if transport is not None and not all(
            callable(getattr(transport, name, None)) for name in ("send", "aclose")
        ):
            raise ConfigError(
                f"transport must have send() and aclose(), got {type(transport).__name__}"
            )
        if user_agent is not None and (
            not isinstance(user_agent, str) or not user_agent.isprintable()
        ):
            raise ConfigError("user_agent must be printable text (no CR, LF or other controls)")
        if on_retry is not None and not callable(on_retry):
            raise ConfigError(f"on_retry must be callable, got {type(on_retry).__name__}")
        if transport is None:
            transport = AiohttpTransport(session, max_response_bytes=max_response_bytes)
        self._transport = transport
        #: The transport again, when it says when a request gets its connection.
        self._connecting: ConnectingTransport | None = None
        if _takes_on_connected(transport):
            self._connecting = transport  # type: ignore[assignment]
        self._on_retry = on_retry
        self._limiter = limiter
        self._store_limiter: StoreLimiter | None = None
        # What an earlier client learned (export_learned()), given to the limiter on first use,
        # aged by the time until then.
        self._learned = (
            None if learned is None else import_learned(learned, self._base, store, time.time())
        )
        self._learned_at = time.monotonic()
        self._user_agent = USER_AGENT if user_agent is None else f"{user_agent} {USER_AGENT}"
        self._headers = request_headers(self._token, self._user_agent)
        self._telemetry = telemetry_for(
            self._base,
            store,
            enabled=telemetry,
            meter_provider=meter_provider,
            tracer_provider=tracer_provider,
        )
        self._closed = False
        # The event loop of the first request: the session, the limiter's futures and timers
        # belong to it, and another loop would meet them with RuntimeErrors.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.subscriptions: Final[ListEndpoint[Subscription]] = ListEndpoint(
            self._get_page, "subscriptions", Subscription, self._page_sizes
        )
        self.customers: Final[ListEndpoint[Customer]] = ListEndpoint(
            self._get_page, "customers", Customer, self._page_sizes
        )
        self.orders: Final[ListEndpoint[Order]] = ListEndpoint(
            self._get_page, "orders", Order, self._page_sizes
        )

    def __repr__(self) -> str:
        return f"<AdminClient store={self.store!r} base={self._base!r}>"

    @property
    def base_url(self) -> str:
        """The versioned base: ``{base_url}/admin/{version}/``."""
        return self._base

    @property
    def fingerprint(self) -> str:
        """A one-way fingerprint of the base URL and the token (the token cannot be recovered
        from it), the default ``store``: what a file may keep to tell one store's data from
        another's behind the same URL."""
        return store_fingerprint(self._base, self._token)

    def list_endpoint(self, path: str, *, model: type[Any] = dict) -> ListEndpoint[Any]:
        """Another list endpoint with the same pagination contract; records are dicts unless
        ``model`` says otherwise."""
        return ListEndpoint(self._get_page, clean_path(path), model, self._page_sizes)

    # -- lifecycle -----------------------------------------------------------------------------

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _is_closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        """Close the client's own HTTP session (a session passed in is left open). A request
        still waiting then ends in ConfigError; none opens a new session."""
        self._closed = True
        await self._transport.aclose()

    # -- requests ------------------------------------------------------------------------------

    @property
    def stats(self) -> LimiterStats:
        """Requests, 429s, retries and time spent waiting, per pool of this client's store
        (shared by every client of the store in this event loop). Outside an event loop, before
        the client's first request, every counter is zero."""
        if self._store_limiter is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # nothing bound, and binding needs the loop: nothing counted
                return LimiterStats(
                    store=self.store,
                    pools=MappingProxyType({name: PoolStats() for name in self.limits.pools}),
                    max_in_flight=self.limits.max_in_flight,
                )
        return self._bound_limiter().stats()

    def _bound_limiter(self) -> StoreLimiter:
        if self._store_limiter is None:
            limiter = DEFAULT_LIMITER if self._limiter is None else self._limiter
            self._store_limiter = limiter.bind(self.store, self.limits)
            self._telemetry.observe(self._store_limiter)
            # Each key's page size reported from the start (imported, adopted), as pulled.
            self._store_limiter.learning.everywhere(PageSizeSearch)
            if self._learned is not None:
                self._store_limiter.learning.restore(self._imported())
        return self._store_limiter

    def export_learned(self) -> dict[str, Any]:
        """What this client's store learned of the server (discovered rates, page sizes), as
        JSON-ready data: pass it as ``AdminClient(learned=...)`` to a later client of the same
        store and base URL, which then starts from it (README, "Discovery")."""
        bound = self._store_limiter
        records = self._imported() if bound is None else bound.learning.learned()
        return export_learned(self._base, self.store, records, time.time())

    def _imported(self) -> dict[str, Learned]:
        """The records imported, aged by the time since."""
        elapsed = time.monotonic() - self._learned_at
        return {key: record.aged(elapsed) for key, record in (self._learned or {}).items()}

    async def _page_sizes(self, path: str) -> PageSizeSearch:
        learning = self._bound_limiter().learning
        heavy = self.limits.pool_for("GET", path) != "global"
        return await page_size_search(learning, path, heavy=heavy)

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
    ) -> Response:
        """Send any request (rate-limited and retried per policy); return the parsed answer."""
        if not isinstance(method, str) or not (method.isascii() and method.isalpha()):
            raise ConfigError(f"method must be an HTTP method name like 'GET', got {method!r}")
        if params is not None and not isinstance(params, Mapping):
            raise ConfigError(f"params must be a mapping, got {type(params).__name__}")
        path = clean_path(path)
        return await self._call("request", method.upper(), path, params, json, parse_response)

    async def _get_page(self, path: str, params: Mapping[str, Any]) -> PageEnvelope:
        return await self._call("page", "GET", path, params, None, parse_page)

    async def _call(
        self,
        kind: str,
        method: str,
        path: str,
        params: Mapping[str, Any] | None,
        json: Any,
        parse: Callable[[str, str, RawResponse], T],
    ) -> T:
        """The request path, and its one retry loop: attempts until one succeeds or the
        policy (``_retry.retry_delay``) gives up, which re-raises the last error with
        ``attempts`` set on it. ``kind`` ("request", "page") names the call's span."""
        if self._closed:
            raise ConfigError("the client is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None:
                raise ConfigError(
                    "this AdminClient is bound to the event loop of its first request; create "
                    "one client per event loop (or thread): the clients of a store share its "
                    "budget across the event loops of a process"
                )
            self._loop = loop
        request = build_request(
            self._base,
            self._token,
            method,
            path,
            params=params,
            json=json,
            user_agent=self._user_agent,
            headers=self._headers,
        )
        limiter = self._bound_limiter()
        pool = self.limits.pool_for(method, path)
        started = time.monotonic()
        attempt = 1
        cancelling = cancellations()
        with self._telemetry.call(kind, request, pool) as call:
            while True:
                try:
                    return await self._attempt(request, limiter, pool, parse, attempt, call)
                except AsyncSubsError as exc:  # anything else (cancellation) is never retried
                    if cancellations() > cancelling:  # one a library below made a failure
                        raise asyncio.CancelledError from None
                    exc.attempts = attempt
                    if self._closed:  # aclose() ran meanwhile: not retried
                        if isinstance(exc, TransportError):  # what was on the wire, cut
                            message = "the client was closed while this request was in flight"
                            message += " (the server may have received it)"
                            where = f"{request.method} {request.path}"
                            raise ConfigError(f"{where}: {message}") from exc
                        raise
                    elapsed = time.monotonic() - started
                    delay = retry_delay(self.retry, request, exc, attempt, elapsed)
                    if delay is None:
                        raise
                    log.debug(
                        "%s %s: attempt %d failed (%s); retrying in %.3fs",
                        request.method,
                        request.path,
                        attempt,
                        type(exc).__name__,
                        delay,
                    )
                    failed = exc
                if self._on_retry is not None:  # outside the except: what it raises is its own
                    self._on_retry(
                        RetryEvent(request.method, request.path, attempt, failed, delay, pool)
                    )
                if delay > 0:
                    await asyncio.sleep(delay)
                attempt += 1
                limiter.record_retry(pool)

    async def _attempt(
        self,
        request: Request,
        limiter: StoreLimiter,
        pool: str,
        parse: Callable[[str, str, RawResponse], T],
        number: int,
        call: Call,
    ) -> T:
        """Attempt ``number`` (from 1): a paced start, the transport, the protocol."""
        with call.attempt(number) as exchange:
            try:
                max_wait, closed = self.retry.max_retry_after, self._is_closed
                async with limiter.slot(pool, max_wait=max_wait, closed=closed) as slot:
                    if self._closed:  # aclose() ran while this request waited: no new session
                        raise ConfigError("the client was closed while this request waited")
                    exchange.sending()
                    if self._connecting is not None:
                        raw = await self._connecting.send(
                            request, timeout=self.timeout, on_connected=slot.sending
                        )
                    else:
                        raw = await self._transport.send(request, timeout=self.timeout)
            except RateLimitError as exc:  # the limiter's: a pause longer than max_retry_after
                exc.method, exc.path = request.method, request.path
                exc.args = (f"{request.method} {request.path}: {exc} (not sent)",)
                raise
            exchange.received(raw.status)
            try:
                result = parse(request.method, request.path, raw)
            except AsyncSubsError as exc:
                error = exc
            else:
                self._heed_limits(limiter, slot, raw, None, number)
                return result
            if (clean := without_secret(raw, self._token)) is not None:
                error = self._error_without_token(request, parse, clean)
            self._heed_limits(limiter, slot, raw, error, number)
            raise error  # outside the handler: no chain keeps an error that held the token

    @staticmethod
    def _error_without_token(
        request: Request, parse: Callable[[str, str, RawResponse], object], clean: RawResponse
    ) -> AsyncSubsError:
        """The error of an answer that echoed the token, built again from it without the token."""
        try:
            parse(request.method, request.path, clean)
        except AsyncSubsError as exc:
            return exc
        message = "an answer that holds the client's token (not shown) and cannot be read"
        return ProtocolError(f"{request.method} {request.path}: HTTP {clean.status}: {message}")

    def _heed_limits(
        self,
        limiter: StoreLimiter,
        slot: Slot,
        raw: RawResponse,
        error: AsyncSubsError | None,
        attempt: int,
    ) -> None:
        """What a response tells the limiter; the one place a 429 is handled.

        The whole pool waits out the server's Retry-After (a backoff when it sent none); a
        request that would wait longer than ``max_retry_after`` fails fast in the limiter."""
        retry_after = error.retry_after if isinstance(error, APIError) else None
        server_limit = parse_server_limit(raw.headers)
        if server_limit is not None:
            # A Retry-After rules; the testing switch is read only when none are left.
            hold = retry_after is None and (server_limit.remaining != 0 or waiting_enabled())
            limiter.server_limit(slot.pool, server_limit, hold=hold)
        if isinstance(error, RateLimitError):
            limiter.rate_limited(slot, pause_after_429(self.retry, retry_after, attempt))
