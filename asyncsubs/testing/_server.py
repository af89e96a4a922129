"""``FakeAdminServer``: a real aiohttp server on loopback implementing the admin interface.

Request pipeline (one catch-all route, so every answer uses the service's error envelope):

0. ``inbound_delay`` (an auth step or proxy queue in front of the limiter), the end of a stall
   (``stalls``) if one is under way, then the stamp
1. path outside ``/admin/{version}/`` -> 404 NOT_FOUND
2. ``X-Service-Token`` missing/unknown -> 401 UNAUTHORIZED; forbidden path prefix -> 403
3. a matching scripted response (``enqueue``/``redirect``) is sent as is (no rate limiting)
4. fault draw; a 429-without-Retry-After fault answers here without consuming budget
5. rate limit of the request's pool, at the stamp -> 429 RATE_LIMITED + Retry-After (nothing
   consumed); with ``ServerRateLimits(headers=...)`` every answer of the pool announces it
6. other faults, or normal handling (list/get/action)

Latency is added to every answer (after the stamp: a page's time to build). Times come from
the event loop clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import attrs
import orjson
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from .._protocol import DEFAULT_VERSION
from ._cursor import CursorCodec, InvalidCursor, Position
from ._data import RESOURCES, SUBSCRIPTION_STATUSES
from ._faults import (
    FAULT_KINDS,
    FaultPicker,
    Faults,
    ScriptedResponse,
    ScriptQueue,
    encode_body,
)
from ._limits import ServerRateLimits, StoreStats, retry_after_header
from ._mutations import Mutator
from ._store import (
    DEFAULT_RECORDS,
    ChangedSince,
    FakeStore,
    FakeStoreConfig,
    ListOrder,
    OverMax,
    SubscriptionAction,
    TransitionError,
    parse_timestamp,
)
from ._webhook_sender import WebhookSender

__all__ = [
    "DEFAULT_INCREMENTAL_PARAM",
    "FakeAdminServer",
    "Latency",
    "RequestRecord",
]

TOKEN_HEADER: Final = "X-Service-Token"
#: The incremental filter of list endpoints: records whose ``updatedAt`` is at or after it.
DEFAULT_INCREMENTAL_PARAM: Final = "updatedAtMin"

#: Fixed seconds, or (min, max) drawn uniformly from the server's seeded RNG.
Latency = float | tuple[float, float] | None

_JSON: Final = "application/json"
_ACTIONS: Final[Mapping[str, SubscriptionAction]] = {
    "pause": "pause",
    "resume": "resume",
    "cancel": "cancel",
}
_OK_PREFIX: Final = b'{"success":true,"message":"OK","code":"SUCCESS","data":'
_HTML_502: Final = (
    b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n"
    b"</body>\r\n</html>\r\n"
)
_UNAUTHORIZED_MESSAGE: Final = (
    "Missing or invalid X-Service-Token. Generate an API token in the admin portal under "
    "Settings > API Tokens."
)


def _headers_repr(headers: Mapping[str, str]) -> str:
    shown = {k: "***" if k.lower() == TOKEN_HEADER.lower() else v for k, v in headers.items()}
    return repr(shown)


@attrs.frozen
class RequestRecord:
    """One request as the fake server saw it."""

    method: str
    #: Full request path, e.g. ``/admin/2026-04/subscriptions``.
    path: str
    query: Mapping[str, str]
    #: Case-insensitive; its repr shows the token as ``***`` (a failed assertion prints it).
    headers: Mapping[str, str] = attrs.field(repr=_headers_repr)
    #: The authenticated store, or None (401, 404 outside the versioned base).
    store: str | None
    status: int
    #: Event-loop time of the rate-limit stamp (arrival, plus any ``inbound_delay``).
    time: float
    body: bytes = b""
    pool: str | None = None
    #: Injected fault kind, ``"scripted"`` for an enqueued answer, or None.
    fault: str | None = None


@attrs.define
class _Context:
    arrival: float
    delay: float
    delayed: bool = False
    status: int = 0
    store: FakeStore | None = None
    pool: str | None = None
    fault: str | None = None
    body: bytes = b""
    rate_headers: Mapping[str, str] | None = None


def _validate_latency(latency: Latency, name: str = "latency") -> Latency:
    if latency is None:
        return None
    if isinstance(latency, tuple):
        low, high = latency
        if not all(map(_seconds, latency)) or not low <= high:
            raise ValueError(f"{name} range must be 0 <= min <= max, got {latency!r}")
        return (float(low), float(high))
    if not _seconds(latency):
        raise ValueError(f"{name} must be seconds >= 0, a (min, max) tuple or None: {latency!r}")
    return float(latency)


def _seconds(value: object) -> bool:
    """A finite number of seconds >= 0 (an infinite one would never answer)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return 0 <= float(value) < math.inf
    except OverflowError:  # an int past a float's range
        return False


def _validate_stalls(stalls: tuple[float, float] | None) -> tuple[float, float] | None:
    if stalls is None:
        return None
    numbers = isinstance(stalls, tuple) and len(stalls) == 2
    numbers = numbers and all(type(x) in (int, float) for x in stalls)
    if not numbers or not 0 < stalls[1] < stalls[0] < float("inf"):
        raise ValueError(f"stalls must be (every, length) seconds, 0 < length < every: {stalls!r}")
    return (float(stalls[0]), float(stalls[1]))


def _store_configs(stores: int | Iterable[FakeStoreConfig | str]) -> list[FakeStoreConfig]:
    if isinstance(stores, bool):
        raise TypeError("stores must be a count or store configs/names")
    if isinstance(stores, int):
        if stores < 1:
            raise ValueError("stores must be >= 1")
        return [FakeStoreConfig(f"store-{i}") for i in range(1, stores + 1)]
    if isinstance(stores, str):  # iterated, "acme" would be four stores: a, c, m, e
        raise TypeError(f"stores must be a count or a list of configs/names, got {stores!r}")
    configs = [s if isinstance(s, FakeStoreConfig) else FakeStoreConfig(s) for s in stores]
    if not configs:
        raise ValueError("at least one store is needed")
    return configs


class FakeAdminServer:
    """The admin interface on ``127.0.0.1:<random port>``, for tests, benchmarks and demos.

    ::

        async with FakeAdminServer(stores=[FakeStoreConfig("acme", records=1000)]) as server:
            server.base_url                      # http://127.0.0.1:PORT
            server.store("acme").token           # its X-Service-Token
            server.records("acme", "subscriptions")
            server.stats("acme").pool("global").accepted

    Configuration (keyword-only):

    - ``stores``: a count (stores ``store-1``.. with derived tokens) or configs/names.
    - ``seed``: drives data, tokens, cursor signing key and latency draws.
    - ``version``: the path version served (other versions get 404).
    - ``records``: default records per resource for stores that do not set their own.
    - ``latency``: seconds added to every answer, fixed or ``(min, max)``.
    - ``inbound_delay``: seconds between a request's arrival and its rate-limit stamp, fixed
      or ``(min, max)``: the auth step, database lookup or proxy queue that real servers have
      in front of their limiter, which makes requests sent evenly reach it unevenly.
    - ``stalls``: ``(every, length)`` seconds: every ``every`` s of the loop clock the server
      stamps nothing for ``length`` s, then stamps what arrived meanwhile at once (a collector
      pause, or a process descheduled on a busy host); None for none.
    - ``rate_limits``: default per-store limits; None disables limiting.
    - ``faults``: injected faults (``Faults``); None for none.
    - ``default_page_size``/``max_page_size``: pageSize when absent / the largest page served;
      ``over_max`` says what a larger pageSize gets: ``"clamp"`` (a page of ``max_page_size``
      records) or ``"reject"`` (a 400 whose message does not name the maximum, as a server
      need not). A store's ``FakeStoreConfig`` may set its own maximum and rule.
    - ``request_log_size``/``keep_starts``: bounds of the request log and per-pool start log.
    - ``cursor_secret``: HMAC key for cursors (derived from ``seed`` by default, so a restarted
      server accepts old cursors).
    - ``control_endpoints``: serve ``GET /_fake/stats`` and ``POST /_fake/reset-stats``
      (unauthenticated, outside ``/admin/``) for ``RemoteFakeServer``.
    - ``incremental_param``/``incremental_field``: list endpoints given
      ``?updatedAtMin=<ISO-8601>`` return only records whose ``updatedAt`` is at or after it
      (inclusive, whole seconds), still in id order with valid cursors; None turns it off.
    - ``list_order``: ``"id"`` (lists in id order) or ``"changed"`` (by ``incremental_field``,
      then id, as a server that lists by modification time: a record changed while a pull is
      in progress moves behind the cursor's position and is served again, its old version
      first).
    - ``before_page``: called with the store and the resource before each list page is built:
      a test's way to change records while a pull is in progress.

    ``faults``, ``latency``, ``inbound_delay`` and rate limits (``set_rate_limits``) can be
    changed while running.
    Records change over time with ``mutator(store)``, and changes are sent as signed webhooks
    with ``deliver_webhooks(url, secret)``; both stop when the server closes.
    """

    def __init__(
        self,
        *,
        stores: int | Iterable[FakeStoreConfig | str] = 2,
        seed: int = 0,
        version: str = DEFAULT_VERSION,
        records: int | Mapping[str, int] = DEFAULT_RECORDS,
        latency: Latency = None,
        inbound_delay: Latency = None,
        stalls: tuple[float, float] | None = None,
        rate_limits: ServerRateLimits | None = ServerRateLimits(),  # noqa: B008 - frozen
        faults: Faults | None = None,
        default_page_size: int = 50,
        max_page_size: int = 250,
        over_max: OverMax = "clamp",
        request_log_size: int = 10_000,
        keep_starts: int = 10_000,
        cursor_secret: bytes | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        control_endpoints: bool = True,
        incremental_param: str | None = DEFAULT_INCREMENTAL_PARAM,
        incremental_field: str = "updatedAt",
        list_order: ListOrder = "id",
        before_page: Callable[[FakeStore, str], object] | None = None,
    ) -> None:
        sizes = (default_page_size, max_page_size)
        if not all(type(size) is int for size in sizes) or not 1 <= sizes[0] <= sizes[1]:
            raise ValueError(
                f"need whole numbers 1 <= default_page_size <= max_page_size, got {sizes!r}"
            )
        if over_max not in ("clamp", "reject"):
            raise ValueError(f"over_max must be 'clamp' or 'reject', got {over_max!r}")
        if list_order not in ("id", "changed"):
            raise ValueError(f"list_order must be 'id' or 'changed', got {list_order!r}")
        self.over_max: OverMax = over_max
        self.list_order: ListOrder = list_order
        self.before_page = before_page
        self.seed = seed
        self.version = version.strip("/")
        self.default_page_size = default_page_size
        self.max_page_size = max_page_size
        self.host = host
        self.port = port
        self.control_endpoints = control_endpoints
        self.incremental_param = incremental_param
        self.incremental_field = incremental_field
        self._mutators: list[Mutator] = []
        self._senders: list[WebhookSender] = []
        self._default_records: dict[str, int] = dict.fromkeys(RESOURCES, DEFAULT_RECORDS)
        self._default_records.update(FakeStoreConfig("_", records=records).records or {})
        self._default_limits = rate_limits or ServerRateLimits.disabled()
        self._keep_starts = keep_starts
        self._stores: dict[str, FakeStore] = {}
        self._by_token: dict[str, FakeStore] = {}
        for config in _store_configs(stores):
            self.add_store(config)
        secret = cursor_secret or hashlib.sha256(f"asyncsubs-fake-cursor|{seed}".encode()).digest()
        self._cursors = CursorCodec(secret)
        self._latency = _validate_latency(latency)
        self._latency_rng = random.Random(seed)
        self._inbound_delay = _validate_latency(inbound_delay, "inbound_delay")
        self._inbound_rng = random.Random(seed + 1)
        self._stalls = _validate_stalls(stalls)
        self._picker = FaultPicker(faults)
        self._scripts = ScriptQueue()
        self._log: deque[RequestRecord] = deque(maxlen=max(1, request_log_size))
        self._request_ids = 0
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None

    def __repr__(self) -> str:
        where = self.base_url if self.started else "not started"
        return f"<FakeAdminServer {where} stores={list(self._stores)}>"

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self, *, host: str | None = None, port: int | None = None) -> None:
        """Bind and serve (port 0: a free port, see ``port``/``base_url`` afterwards)."""
        if self._runner is not None:
            raise RuntimeError("FakeAdminServer is already started")
        app = web.Application(client_max_size=16 * 1024 * 1024)
        if self.control_endpoints:
            app.router.add_get("/_fake/stats", self._control_stats)
            app.router.add_post("/_fake/reset-stats", self._control_reset)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # No access log (benchmarks push thousands of requests per second); handlers are
        # cancelled when the client goes away, so "slow" faults do not outlive client timeouts.
        runner = web.AppRunner(
            app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, host or self.host, self.port if port is None else port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._closing = asyncio.Event()
        self.host, self.port = runner.addresses[0][:2]

    async def aclose(self) -> None:
        """Stop serving; in-flight "slow" answers are cut short. Safe to call twice."""
        # Changes and deliveries stop first: nothing is sent for a server that is gone.
        for mutator in self._mutators:
            await mutator.stop()
        senders, self._senders = self._senders, []
        for sender in senders:
            await sender.aclose()
        runner, self._runner = self._runner, None
        if runner is None:
            return
        if self._closing is not None:
            self._closing.set()
        await runner.cleanup()

    async def __aenter__(self) -> FakeAdminServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def started(self) -> bool:
        return self._runner is not None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (the client appends ``/admin/{version}/``)."""
        if self._runner is None:
            raise RuntimeError("FakeAdminServer is not started")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def api_url(self) -> str:
        """``base_url`` + ``/admin/{version}/``."""
        return f"{self.base_url}/admin/{self.version}/"

    # --- stores and data ----------------------------------------------------------------------

    def add_store(self, config: FakeStoreConfig | str) -> FakeStore:
        if isinstance(config, str):
            config = FakeStoreConfig(config)
        if config.name in self._stores:
            raise ValueError(f"duplicate store name {config.name!r}")
        store = FakeStore(
            config,
            seed=self.seed,
            default_records=self._default_records,
            rate_limits=config.rate_limits or self._default_limits,
            keep_starts=self._keep_starts,
        )
        if store.token in self._by_token:
            raise ValueError(f"store {config.name!r} reuses the token of another store")
        self._stores[store.name] = store
        self._by_token[store.token] = store
        return store

    def store(self, name: str) -> FakeStore:
        try:
            return self._stores[name]
        except KeyError:
            raise KeyError(f"no store {name!r}; have {sorted(self._stores)}") from None

    @property
    def stores(self) -> Mapping[str, FakeStore]:
        return MappingProxyType(self._stores)

    @property
    def tokens(self) -> dict[str, str]:
        """Store name -> token."""
        return {name: store.token for name, store in self._stores.items()}

    def records(
        self, store: str, resource: str, *, status: str | None = None
    ) -> list[dict[str, Any]]:
        """Copies of the records exactly as served, in server order."""
        return self.store(store).records(resource, status=status)

    def record(self, store: str, resource: str, record_id: int) -> dict[str, Any] | None:
        return self.store(store).get(resource, record_id)

    def make_records(self) -> None:
        """Make every store's records now, and exempt them from the cyclic garbage collector.

        Made lazily, the first requests to each store would wait for their records (stamped up
        to a second late with 20 stores, a delay no real server has); full collections walking
        hundreds of thousands of them would stall the server's loop for tens of milliseconds.
        ``gc.freeze()`` holds for the whole process: call it where the server has one to itself.
        """
        for _ in self._making_records():
            pass

    def _making_records(self) -> Iterator[None]:
        """``make_records`` a record at a time, yielding after each: a caller in the event loop
        gives it a turn now and then (``testing._process``: a signal is handled meanwhile)."""
        for store in self._stores.values():
            for resource in RESOURCES:
                records = store.data[resource]
                for position in range(len(records)):
                    records.encoded_at(position)
                    yield
        gc.collect()
        gc.freeze()

    # --- records over time, webhooks ----------------------------------------------------------

    def mutator(self, store: str, **options: Any) -> Mutator:
        """A ``Mutator`` changing ``store``'s records (``seed`` defaults to the server's);
        ``await m.run(steps=N)`` or ``m.start(interval=s)``. Stopped when the server closes."""
        options.setdefault("seed", self.seed)
        mutator = Mutator(self.store(store), **options)
        self._mutators.append(mutator)
        return mutator

    async def deliver_webhooks(
        self, url: str, secret: str | bytes, *, stores: Iterable[str] | None = None, **options: Any
    ) -> WebhookSender:
        """Send every change of ``stores`` (default: all) as a signed webhook to ``url``.

        ``options`` go to ``WebhookSender`` (``drop_fraction=0.1``, ``seed``, ``max_attempts``,
        ``encoding``, ...). Returns the started sender; closed when the server closes."""
        options.setdefault("seed", self.seed)
        names = list(self._stores) if stores is None else list(stores)
        sender = WebhookSender(url, secret, stores=[self.store(n) for n in names], **options)
        await sender.start()
        self._senders.append(sender)
        return sender

    # --- limits, counters, log ----------------------------------------------------------------

    def set_rate_limits(self, limits: ServerRateLimits | None, *, store: str | None = None) -> None:
        """Change the limits of one store or all of them (None disables limiting)."""
        limits = limits or ServerRateLimits.disabled()
        targets = [self.store(store)] if store is not None else list(self._stores.values())
        for target in targets:
            target.set_rate_limits(limits)
        if store is None:
            self._default_limits = limits

    def stats(self, store: str) -> StoreStats:
        return self.store(store).stats()

    def reset_stats(self, store: str | None = None) -> None:
        targets = [self.store(store)] if store is not None else list(self._stores.values())
        for target in targets:
            target.reset_stats()

    @property
    def fault_counts(self) -> dict[str, int]:
        """Injected faults by kind, over all stores."""
        totals = dict.fromkeys(FAULT_KINDS, 0)
        for store in self._stores.values():
            for kind, count in store.counters.faults.items():
                totals[kind] = totals.get(kind, 0) + count
        return totals

    @property
    def requests(self) -> list[RequestRecord]:
        """The most recent requests (up to ``request_log_size``), oldest first."""
        return list(self._log)

    def clear_requests(self) -> None:
        self._log.clear()

    @property
    def faults(self) -> Faults | None:
        return self._picker.faults

    @faults.setter
    def faults(self, faults: Faults | None) -> None:
        # A new config restarts the RNG from its seed, so runs stay reproducible.
        self._picker = FaultPicker(faults)

    @property
    def latency(self) -> Latency:
        return self._latency

    @latency.setter
    def latency(self, latency: Latency) -> None:
        self._latency = _validate_latency(latency)

    @property
    def inbound_delay(self) -> Latency:
        return self._inbound_delay

    @inbound_delay.setter
    def inbound_delay(self, delay: Latency) -> None:
        self._inbound_delay = _validate_latency(delay, "inbound_delay")

    # --- scripted answers ---------------------------------------------------------------------

    def enqueue(
        self,
        status: int,
        body: bytes | str | Mapping[str, Any] | list[Any] | None = None,
        headers: Mapping[str, str] | None = None,
        path: str | None = None,
        times: int | None = 1,
        *,
        method: str | None = None,
        store: str | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests (after auth) with exactly this response.

        ``body``: bytes/str sent as is, dict/list JSON-encoded, None empty. Content-Type is
        ``application/json`` unless ``headers`` sets one. ``path`` is relative to
        ``/admin/{version}/`` (the full path works too) and matched exactly; None matches all.
        ``times=None`` keeps answering until ``clear_scripted()``.
        """
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ValueError(f"status must be an HTTP status, 100-599, got {status!r}")
        if store is not None and store not in self._stores:  # it would never match
            raise ValueError(f"no store {store!r} (stores: {', '.join(self._stores)})")
        header_items = dict(headers or {})
        if body is not None and not any(k.lower() == "content-type" for k in header_items):
            header_items["Content-Type"] = _JSON
        response = ScriptedResponse(
            status=status,
            body=encode_body(body),
            headers=tuple(header_items.items()),
            path=None if path is None else self._relative(path),
            method=None if method is None else method.upper(),
            store=store,
        )
        self._scripts.add(response, times)

    def redirect(
        self,
        path: str | None,
        location: str,
        *,
        status: int = 307,
        times: int | None = 1,
        method: str | None = None,
        store: str | None = None,
    ) -> None:
        """Answer matching requests with a redirect to ``location`` (see ``enqueue``)."""
        self.enqueue(
            status,
            None,
            {"Location": location},
            path,
            times,
            method=method,
            store=store,
        )

    def clear_scripted(self) -> None:
        self._scripts.clear()

    def _relative(self, path: str) -> str:
        prefix = f"/admin/{self.version}/"
        if path.startswith(prefix):
            path = path[len(prefix) :]
        return path.strip("/")

    # --- HTTP ---------------------------------------------------------------------------------

    def _draw_latency(self) -> float:
        latency = self._latency
        if latency is None:
            return 0.0
        if isinstance(latency, tuple):
            return self._latency_rng.uniform(*latency)
        return latency

    async def _delay(self, ctx: _Context) -> None:
        if not ctx.delayed:
            ctx.delayed = True
            if ctx.delay > 0:
                await asyncio.sleep(ctx.delay)

    async def _interruptible_sleep(self, seconds: float) -> None:
        # Ends early when the server closes, so aclose() never waits out a "slow" fault.
        if seconds <= 0:
            return
        if self._closing is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing.wait(), seconds)

    def _response(
        self,
        ctx: _Context,
        status: int,
        body: bytes,
        *,
        content_type: str | None = _JSON,
        headers: Mapping[str, str] | Iterable[tuple[str, str]] | None = None,
    ) -> web.Response:
        ctx.status = status
        self._request_ids += 1
        response = web.Response(status=status, body=body, headers=CIMultiDict(headers or ()))
        if ctx.rate_headers:
            response.headers.update(ctx.rate_headers)
        if content_type is not None:
            response.content_type = content_type
        response.headers["X-Request-Id"] = f"fake-{self._request_ids}"
        return response

    def _error(
        self,
        ctx: _Context,
        status: int,
        code: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> web.Response:
        body = orjson.dumps({"success": False, "message": message, "code": code, "data": None})
        return self._response(ctx, status, body, headers=headers)

    def _ok(self, ctx: _Context, data: bytes) -> web.Response:
        return self._response(ctx, 200, _OK_PREFIX + data + b"}")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        inbound = self._inbound_delay
        if inbound:
            seconds = self._inbound_rng.uniform(*inbound) if isinstance(inbound, tuple) else inbound
            if seconds > 0:
                await asyncio.sleep(seconds)
        loop = asyncio.get_running_loop()
        if self._stalls is not None:
            every, length = self._stalls
            if (into := loop.time() % every) < length:
                await asyncio.sleep(length - into)
        arrival = loop.time()
        ctx = _Context(arrival=arrival, delay=self._draw_latency())
        try:
            response = await self._process(request, ctx)
            await self._delay(ctx)
            return response
        finally:
            if ctx.store is not None:
                ctx.store.counters.end(ctx.status)
            self._log.append(
                RequestRecord(
                    method=request.method,
                    path=request.path,
                    query=dict(request.query),
                    headers=CIMultiDictProxy(CIMultiDict(request.headers)),
                    store=None if ctx.store is None else ctx.store.name,
                    status=ctx.status,
                    time=arrival,
                    body=ctx.body,
                    pool=ctx.pool,
                    fault=ctx.fault,
                )
            )

    async def _process(self, request: web.Request, ctx: _Context) -> web.StreamResponse:
        prefix = f"/admin/{self.version}/"
        if not request.path.startswith(prefix):
            return self._error(ctx, 404, "NOT_FOUND", f"No route for {request.path}")
        path = request.path[len(prefix) :].strip("/")
        method = request.method

        store = self._by_token.get(request.headers.get(TOKEN_HEADER, ""))
        if store is None:
            return self._error(ctx, 401, "UNAUTHORIZED", _UNAUTHORIZED_MESSAGE)
        ctx.store = store
        store.counters.begin()
        if store.is_forbidden(path):
            message = f"This token lacks access to {path!r} (scope or entitlement missing)"
            return self._error(ctx, 403, "FORBIDDEN", message)

        scripted = self._scripts.take(method, path, store.name)
        if scripted is not None:
            ctx.fault = "scripted"
            store.counters.scripted += 1
            return self._response(
                ctx, scripted.status, scripted.body, content_type=None, headers=scripted.headers
            )

        ctx.pool = pool = store.windows.limits.pool_for(method, path)
        fault = self._picker.draw(path)
        if fault == "rate_limit_no_retry_after":
            ctx.fault = fault
            store.counters.fault(fault)
            return self._error(ctx, 429, "RATE_LIMITED", "Rate limit exceeded")
        wait = store.windows.acquire(pool, ctx.arrival)
        ctx.rate_headers = store.windows.headers(pool, ctx.arrival)
        if wait is not None:
            store.counters.rejected(pool)
            as_float = store.windows.limits.retry_after_float
            retry_after = retry_after_header(wait, as_float=as_float)
            message = f"Rate limit exceeded for the {pool} pool; retry after {retry_after} s"
            return self._error(
                ctx, 429, "RATE_LIMITED", message, headers={"Retry-After": retry_after}
            )
        store.counters.accepted(pool, ctx.arrival)

        if fault is not None:
            ctx.fault = fault
            store.counters.fault(fault)
        if fault == "error_500":
            return self._error(ctx, 500, "INTERNAL_ERROR", "Internal server error")
        if fault == "html_502":
            return self._response(ctx, 502, _HTML_502, content_type="text/html")
        if fault == "slow":
            assert self.faults is not None
            await self._interruptible_sleep(self.faults.slow_seconds)

        response = await self._route(request, ctx, store, method, path)
        if fault == "truncate":
            full = response.body if isinstance(response.body, bytes) else b""
            cut = full[: len(full) // 2]
            return self._response(ctx, response.status, cut, headers=_plain(response.headers))
        if fault == "reset":
            return await self._reset(request, ctx, response)
        return response

    async def _reset(
        self, request: web.Request, ctx: _Context, full: web.Response
    ) -> web.StreamResponse:
        # Status line, headers (announcing the full length) and half the body, then the
        # connection is closed: the client sees a payload error, not a clean answer.
        await self._delay(ctx)
        body = full.body if isinstance(full.body, bytes) else b""
        response = web.StreamResponse(status=full.status, headers=_plain(full.headers))
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        if request.transport is not None:
            request.transport.close()
        return response

    async def _route(
        self, request: web.Request, ctx: _Context, store: FakeStore, method: str, path: str
    ) -> web.Response:
        parts = path.split("/")
        resource = parts[0]
        if resource not in RESOURCES or len(parts) > 3:
            return self._error(ctx, 404, "NOT_FOUND", f"No route for {method} {path or '/'}")
        if len(parts) == 3:
            if resource != "subscriptions" or parts[2] not in _ACTIONS:
                return self._error(ctx, 404, "NOT_FOUND", f"No route for {method} {path}")
            if method != "POST":
                return self._not_allowed(ctx, "POST")
            return await self._action(request, ctx, store, parts[1], _ACTIONS[parts[2]])
        if method != "GET":
            return self._not_allowed(ctx, "GET")
        if len(parts) == 2:
            return self._get(ctx, store, resource, parts[1])
        return self._list(request, ctx, store, resource)

    def _not_allowed(self, ctx: _Context, allow: str) -> web.Response:
        return self._error(ctx, 405, "METHOD_NOT_ALLOWED", f"Use {allow}", headers={"Allow": allow})

    def _list(
        self, request: web.Request, ctx: _Context, store: FakeStore, resource: str
    ) -> web.Response:
        query = request.query
        raw_size = query.get("pageSize")
        largest = store.config.max_page_size or self.max_page_size
        if raw_size is None:
            size = min(self.default_page_size, largest)
        elif raw_size.isascii() and raw_size.isdigit() and (digits := raw_size.lstrip("0")):
            # As a number however many digits: int() refuses more than 4,300 of them.
            size = int(digits) if len(digits) <= 12 else 10**12
            if size > largest and (store.config.over_max or self.over_max) == "reject":
                return self._error(ctx, 400, "BAD_REQUEST", "pageSize is too large")
            size = min(size, largest)
        else:
            message = f"pageSize must be an integer >= 1 (max {largest}), got {raw_size[:40]!r}"
            return self._error(ctx, 400, "BAD_REQUEST", message)

        after: Position | None = None
        cursor = query.get("afterCursor")
        if cursor is not None:
            try:
                after = self._cursors.decode(cursor, store.name, resource)
                if isinstance(after, tuple) != (self.list_order == "changed"):
                    raise InvalidCursor("cursor of another list order")
            except InvalidCursor as exc:
                message = f"afterCursor is not valid for this list ({exc}); restart without it"
                return self._error(ctx, 400, "INVALID_CURSOR", message)

        statuses = None
        raw_status = query.get("status")
        if resource == "subscriptions" and raw_status is not None:
            statuses = frozenset(s.strip().upper() for s in raw_status.split(","))
            if not statuses <= set(SUBSCRIPTION_STATUSES):
                message = f"status must be one of {', '.join(SUBSCRIPTION_STATUSES)}"
                return self._error(ctx, 400, "BAD_REQUEST", message)

        changed_since = None
        raw_since = None if self.incremental_param is None else query.get(self.incremental_param)
        if raw_since is not None:
            since = parse_timestamp(raw_since)
            if since is None:
                message = (
                    f"{self.incremental_param} must be an ISO-8601 timestamp, got {raw_since!r}"
                )
                return self._error(ctx, 400, "BAD_REQUEST", message)
            changed_since = ChangedSince(since)

        if self.before_page is not None:
            self.before_page(store, resource)
        parts, last, has_next = store.page(
            resource,
            after=after,
            size=size,
            statuses=statuses,
            changed_since=changed_since,
            change_field=self.incremental_field,
            order=self.list_order,
        )
        next_cursor = None
        if has_next and last is not None:
            next_cursor = self._cursors.encode(store.name, resource, last)
        page_info = orjson.dumps(
            {"hasNextPage": next_cursor is not None, "nextCursor": next_cursor}
        )
        body = b"[" + b",".join(parts) + b'],"pageInfo":' + page_info
        return self._ok(ctx, body)

    def _get(self, ctx: _Context, store: FakeStore, resource: str, raw_id: str) -> web.Response:
        encoded = None
        if raw_id.isascii() and raw_id.isdigit() and len(raw_id) < 19:
            encoded = store.data[resource].get_encoded(int(raw_id))
        if encoded is None:
            return self._error(ctx, 404, "NOT_FOUND", f"No {resource} record with id {raw_id}")
        return self._ok(ctx, encoded)

    async def _action(
        self,
        request: web.Request,
        ctx: _Context,
        store: FakeStore,
        raw_id: str,
        action: SubscriptionAction,
    ) -> web.Response:
        ctx.body = raw = await request.read()
        try:
            body = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError:
            return self._error(ctx, 400, "BAD_REQUEST", "Request body is not valid JSON")
        if not isinstance(body, dict):
            return self._error(ctx, 400, "BAD_REQUEST", "Request body must be a JSON object")
        record = None
        if raw_id.isascii() and raw_id.isdigit() and len(raw_id) < 19:
            try:
                record = store.apply_action(int(raw_id), action, body)
            except TransitionError as exc:
                return self._error(ctx, 422, "INVALID_STATE", str(exc))
        if record is None:
            return self._error(ctx, 404, "NOT_FOUND", f"No subscriptions record with id {raw_id}")
        return self._ok(ctx, orjson.dumps(record))

    # --- control endpoints (for a server running in another process) -------------------------

    async def _control_stats(self, request: web.Request) -> web.Response:
        data = {name: store.stats().to_dict() for name, store in self._stores.items()}
        return web.Response(body=orjson.dumps(data), content_type=_JSON)

    async def _control_reset(self, request: web.Request) -> web.Response:
        self.reset_stats(request.query.get("store"))
        return web.Response(body=b"{}", content_type=_JSON)


def _plain(headers: Mapping[str, str]) -> Sequence[tuple[str, str]]:
    # Headers of a built response, minus those aiohttp recomputes for the new body.
    skip = {"content-length", "content-type"}
    items = [(k, v) for k, v in headers.items() if k.lower() not in skip]
    content_type = headers.get("Content-Type")
    if content_type is not None:
        items.append(("Content-Type", content_type))
    return items
