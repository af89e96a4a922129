"""OpenTelemetry metrics and traces of the request path (extra ``asyncsubs[otel]``).

With ``opentelemetry-api`` importable, every client records through the global meter and tracer
providers, or through the providers given to it; ``AdminClient(telemetry=False)`` records
nothing. While neither global provider is set (no SDK configured, the API's stand-ins in place),
a client on the global providers skips its calls' recording, which would go nowhere (4% of a
light request's CPU at 20 stores, docs/benchmarks-method.md); an SDK set later records from the
next call. Without the API, or switched off, the client holds :class:`Telemetry`, whose hooks
do nothing.

What is recorded, by the HTTP semantic conventions where they say, else under ``asyncsubs.*``:

- a span per logical call (``asyncsubs.request {method}`` for ``client.request``, ``asyncsubs.page
  {path}`` for each page of a list), kind INTERNAL, with a CLIENT span per attempt below it
  (named by the method; ``http.request.resend_count`` on retries). An attempt's span and its
  ``http.client.request.duration`` run from the limiter's start to the parsed response: the time
  queued in the limiter is ``asyncsubs.limiter.wait.duration`` and the gap before the span.
- metrics with ``asyncsubs.store`` and ``asyncsubs.pool``: the limiter wait, 429 answers,
  retries, requests in flight, and each pool's interval and margin (observable gauges).

Attributes never carry the token or a query: ``url.full`` is the URL without its query.
"""

from __future__ import annotations

import asyncio
import math
import threading
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NamedTuple
from urllib.parse import urlsplit

from ._protocol import Request
from ._version import __version__
from .errors import ConfigError, RateLimitError

try:
    from opentelemetry import context, metrics, trace
    from opentelemetry.metrics import _internal as metrics_globals
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError:  # the extra is not installed: the client records nothing
    AVAILABLE = False
else:
    AVAILABLE = True

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

    from ._limiter import StoreLimiter

__all__ = ["AVAILABLE", "Call", "Exchange", "Telemetry", "telemetry_for"]

SCOPE: Final = "asyncsubs"
STORE: Final = "asyncsubs.store"
POOL: Final = "asyncsubs.pool"
#: The methods the semantic conventions know; any other is reported as ``_OTHER``.
KNOWN_METHODS: Final = frozenset(
    {"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"}
)
#: The buckets the semantic conventions advise for ``http.client.request.duration``.
DURATION_BUCKETS: Final = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1,
    2.5,
    5,
    7.5,
    10,
)
#: Limiter waits run from nothing to a Retry-After of minutes (``max_retry_after``: 120 s).
WAIT_BUCKETS: Final = (0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


def error_type(exc: BaseException) -> str:
    """``error.type`` of a failure without an error status: the exception's qualified name."""
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}"


class Exchange:
    """One attempt: ``with call.attempt(n) as exchange``, around the limiter and the response.

    ``sending()`` marks the limiter's start, ``received(status)`` the answer. This base class is
    what a client without telemetry holds: every hook does nothing."""

    __slots__ = ()

    def __enter__(self) -> Exchange:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def sending(self) -> None:
        """The limiter let the request start."""

    def received(self, status: int) -> None:
        """The server answered with ``status``."""


class Call:
    """One logical call (a request, a page of a list) and its attempts: ``with``; records
    nothing in this base class."""

    __slots__ = ()

    def __enter__(self) -> Call:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def attempt(self, number: int) -> Exchange:
        """Attempt ``number`` (from 1) of this call."""
        return _NO_EXCHANGE


_NO_EXCHANGE: Final = Exchange()
_NO_CALL: Final = Call()


class Telemetry:
    """What a client records; this base class records nothing (no API, or switched off)."""

    __slots__ = ()

    def call(self, kind: str, request: Request, pool: str) -> Call:
        """A logical call: ``kind`` is ``"request"`` or ``"page"``."""
        return _NO_CALL

    def observe(self, limiter: StoreLimiter) -> None:
        """Report ``limiter``'s pools through the observable gauges while it lives."""


_OFF: Final = Telemetry()


def telemetry_for(
    base_url: str,
    store: str,
    *,
    enabled: object,
    meter_provider: MeterProvider | None,
    tracer_provider: TracerProvider | None,
) -> Telemetry:
    """The telemetry of a client; ConfigError for providers it cannot use."""
    if not isinstance(enabled, bool):
        raise ConfigError(f"telemetry must be True or False, got {enabled!r}")
    given = meter_provider is not None or tracer_provider is not None
    if not enabled:
        if given:
            raise ConfigError("meter_provider/tracer_provider were given with telemetry=False")
        return _OFF
    if not AVAILABLE:
        if given:
            raise ConfigError(
                "meter_provider/tracer_provider need OpenTelemetry: pip install 'asyncsubs[otel]'"
            )
        return _OFF
    if meter_provider is not None and not isinstance(meter_provider, metrics.MeterProvider):
        raise ConfigError(
            f"meter_provider must be an opentelemetry MeterProvider, got {meter_provider!r}"
        )
    if tracer_provider is not None and not isinstance(tracer_provider, trace.TracerProvider):
        raise ConfigError(
            f"tracer_provider must be an opentelemetry TracerProvider, got {tracer_provider!r}"
        )
    global_providers = meter_provider is None and tracer_provider is None
    instruments = _instruments(meter_provider)
    return _Recording(instruments, tracer_provider, base_url, store, global_providers)


def _configured() -> bool:
    """Whether the application set a global tracer or meter provider; until then the API's
    stand-ins drop every span and measurement. The API's own globals are read: its getters read
    the environment each time (2 us of the 12 that skipping saves), and a provider named by an
    environment variable is set by the first getter call (the client's ``get_tracer`` and
    ``get_meter`` make one)."""
    return (
        getattr(trace, "_TRACER_PROVIDER", True) is not None
        or getattr(metrics_globals, "_METER_PROVIDER", True) is not None
    )  # an API without them: always configured, never a measurement lost


# -- recording ----------------------------------------------------------------------------------


class _Pool(NamedTuple):
    """What the gauges observe of one pool of one store."""

    in_flight: int
    interval: float
    margin: float
    rate: float
    page_size: int


class _Instruments:
    """The instruments of one meter provider, and what its observable instruments report: the
    limiters' pools and the requests in flight. One per provider: the SDK refuses a second
    instrument of a name (and would lose its callbacks)."""

    def __init__(self, provider: MeterProvider | None) -> None:
        meter = metrics.get_meter(SCOPE, __version__, meter_provider=provider)
        self.duration = meter.create_histogram(
            "http.client.request.duration",
            unit="s",
            description="Duration of HTTP client requests.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        )
        self.wait = meter.create_histogram(
            "asyncsubs.limiter.wait.duration",
            unit="s",
            description="Time a request attempt waited in the rate limiter before it started.",
            explicit_bucket_boundaries_advisory=WAIT_BUCKETS,
        )
        self.rate_limited = meter.create_counter(
            "asyncsubs.rate_limited",
            unit="{response}",
            description="Answers that said the rate limit was hit (429).",
        )
        self.retries = meter.create_counter(
            "asyncsubs.retries", unit="{attempt}", description="Attempts that were retries."
        )
        # Observed from the limiters: a request holds its place there from start to answer.
        meter.create_observable_up_down_counter(
            "asyncsubs.requests.in_flight",
            callbacks=[self._in_flight],
            unit="{request}",
            description="Requests started by the limiter and not yet answered.",
        )
        # Each pool's pace, from its limiters' statistics.
        gauges = (
            (
                "asyncsubs.limiter.interval",
                self._intervals,
                "s",
                "Seconds between two request starts the pool paces at now.",
            ),
            (
                "asyncsubs.limiter.margin",
                self._margins,
                "1",
                "The fraction by which the pool's pacing stays below its rate now.",
            ),
            (
                "asyncsubs.limiter.rate",
                self._rates,
                "{request}/s",
                "Requests per second the pool paces at (configured, announced or learned).",
            ),
            (
                "asyncsubs.page_size",
                self._page_sizes,
                "{record}",
                "The largest page the server serves, as a page_size='max' pull learned.",
            ),
        )
        for name, callback, unit, description in gauges:
            meter.create_observable_gauge(
                name, callbacks=[callback], unit=unit, description=description
            )
        # Observed in the SDK's export thread while event loops (maybe several) add limiters.
        self._lock = threading.Lock()
        self._limiters: weakref.WeakSet[StoreLimiter] = weakref.WeakSet()

    def observe(self, limiter: StoreLimiter) -> None:
        with self._lock:
            self._limiters.add(limiter)

    def _pools(self) -> list[tuple[dict[str, Any], _Pool]]:
        """Per store and pool, over the event loops (threads) that bound the store, one limiter
        each: requests in flight (the sum), interval, margin, rate and page size (the widest,
        the lowest rate), as the metrics API asks for one observation per attributes."""
        with self._lock:
            limiters = list(self._limiters)
        merged: dict[tuple[str, str], _Pool] = {}
        for limiter in limiters:
            for name, pool in limiter.stats().pools.items():
                seen = merged.get((limiter.store, name), _Pool(0, 0.0, 0.0, math.inf, 0))
                merged[limiter.store, name] = _Pool(
                    seen.in_flight + pool.in_flight,
                    max(seen.interval, pool.interval),
                    max(seen.margin, pool.margin),
                    min(seen.rate, pool.rate or math.inf),
                    max(seen.page_size, pool.page_size or 0),
                )
        return [({STORE: s, POOL: p}, pool) for (s, p), pool in merged.items()]

    def _in_flight(self, options: CallbackOptions) -> Iterable[Observation]:
        return [metrics.Observation(p.in_flight, attrs) for attrs, p in self._pools()]

    def _intervals(self, options: CallbackOptions) -> Iterable[Observation]:
        # A pool that has not paced a request yet has no interval to report.
        pools = self._pools()
        return [metrics.Observation(p.interval, attrs) for attrs, p in pools if p.interval > 0]

    def _margins(self, options: CallbackOptions) -> Iterable[Observation]:
        pools = self._pools()
        return [metrics.Observation(p.margin, attrs) for attrs, p in pools if p.interval > 0]

    def _rates(self, options: CallbackOptions) -> Iterable[Observation]:
        pools = self._pools()
        return [metrics.Observation(p.rate, attrs) for attrs, p in pools if p.rate < math.inf]

    def _page_sizes(self, options: CallbackOptions) -> Iterable[Observation]:
        pools = self._pools()
        return [metrics.Observation(p.page_size, attrs) for attrs, p in pools if p.page_size]


_lock = threading.Lock()
_global: _Instruments | None = None
_by_provider: weakref.WeakKeyDictionary[MeterProvider, _Instruments] = weakref.WeakKeyDictionary()


def _instruments(provider: MeterProvider | None) -> _Instruments:
    """The instruments of ``provider`` (None: the global one, through its proxy until an SDK is
    configured), created once."""
    global _global
    with _lock:
        if provider is None:
            if _global is None:
                _global = _Instruments(None)
            return _global
        found = _by_provider.get(provider)
        if found is None:
            found = _by_provider[provider] = _Instruments(provider)
        return found


class _Recording(Telemetry):
    __slots__ = ("_attributes", "global_providers", "instruments", "server", "store", "tracer")

    def __init__(
        self,
        instruments: _Instruments,
        tracer_provider: TracerProvider | None,
        base_url: str,
        store: str,
        global_providers: bool,
    ) -> None:
        parts = urlsplit(base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        self.instruments = instruments
        self.tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
        self.store = store
        self.server: dict[str, Any] = {"server.address": parts.hostname, "server.port": port}
        self._attributes: dict[tuple[object, ...], dict[str, Any]] = {}
        self.global_providers = global_providers

    def call(self, kind: str, request: Request, pool: str) -> Call:
        if self.global_providers and not _configured():
            return _NO_CALL
        return _RecordingCall(self, kind, request, pool)

    def observe(self, limiter: StoreLimiter) -> None:
        self.instruments.observe(limiter)

    def attributes(self, *key: Any) -> dict[str, Any]:
        """The attributes of ``(pool, method, status, error)`` (trailing Nones may be left
        out), built once: metrics are recorded with the same dict each time."""
        found = self._attributes.get(key)
        if found is None:
            pool, method, status, error = (*key, None, None, None)[:4]
            found = {STORE: self.store, POOL: pool}
            if method is not None:
                found = {"http.request.method": method, **self.server, **found}
            if status is not None:
                found["http.response.status_code"] = status
            if error is not None:
                found["error.type"] = error
            self._attributes[key] = found
        return found


class _RecordingCall(Call):
    __slots__ = ("_span", "_token", "kind", "method", "pool", "request", "telemetry")

    def __init__(self, telemetry: _Recording, kind: str, request: Request, pool: str) -> None:
        self.telemetry = telemetry
        self.kind = kind
        self.request = request
        self.pool = pool
        method = request.method
        self.method = method if method in KNOWN_METHODS else "_OTHER"
        self._span: Span | None = None

    def __enter__(self) -> Call:
        request = self.request
        if self.kind == "page":
            name = f"asyncsubs.page {request.path}"
        else:
            name = f"asyncsubs.request {request.method}"
        span = self.telemetry.tracer.start_span(name, kind=SpanKind.INTERNAL)
        # Without an SDK this is the invalid span: no attributes, context or attempt spans
        # then, so that a client nobody traces pays next to nothing.
        if span.get_span_context().is_valid:
            if span.is_recording():
                span.set_attributes(self.telemetry.attributes(self.pool))
                span.set_attribute("http.request.method", self.method)
            self._span = span
            self._token = context.attach(trace.set_span_in_context(span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        span = self._span
        if span is None:
            return
        try:
            if exc is not None:
                status = getattr(exc, "status", None)
                answered = isinstance(status, int) and status >= 400
                span.set_attribute("error.type", str(status) if answered else error_type(exc))
                # asyncsubs' messages never carry the token, and its errors chain nothing
                # that does (see _transport.send).
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        finally:
            span.end()
            context.detach(self._token)

    def attempt(self, number: int) -> Exchange:
        return _RecordingExchange(self, number)


class _RecordingExchange(Exchange):
    __slots__ = ("_loop", "_queued", "_sent", "_span", "_status", "_token", "call", "number")

    def __init__(self, call: _RecordingCall, number: int) -> None:
        self.call = call
        self.number = number
        self._sent: float | None = None
        self._span: Span | None = None
        self._status: int | None = None

    def __enter__(self) -> Exchange:
        # The loop's clock, as the limiter's: a test's fake clock moves both.
        self._loop = asyncio.get_running_loop()
        self._queued = self._loop.time()
        if self.number > 1:
            call = self.call
            call.telemetry.instruments.retries.add(1, call.telemetry.attributes(call.pool))
        return self

    def sending(self) -> None:
        call = self.call
        telemetry = call.telemetry
        instruments = telemetry.instruments
        self._sent = now = self._loop.time()
        instruments.wait.record(now - self._queued, telemetry.attributes(call.pool))
        if call._span is None:  # not tracing
            return
        attributes = {
            "http.request.method": call.method,
            **telemetry.server,
            "url.full": call.request.url.partition("?")[0],
            **telemetry.attributes(call.pool),
        }
        if self.number > 1:
            attributes["http.request.resend_count"] = self.number - 1
        name = call.method if call.method != "_OTHER" else "HTTP"
        span = telemetry.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        self._span = span
        self._token = context.attach(trace.set_span_in_context(span))

    def received(self, status: int) -> None:
        self._status = status

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._sent is None:  # it never started: failed in the limiter, or cancelled there
            return
        call = self.call
        telemetry = call.telemetry
        instruments = telemetry.instruments
        status = self._status
        failed = None
        if status is not None and status >= 400:
            failed = str(status)
        elif exc is not None:
            failed = error_type(exc)
        if isinstance(exc, RateLimitError):  # a 429, or a rate-limit code in a 200
            instruments.rate_limited.add(1, telemetry.attributes(call.pool))
        attributes = telemetry.attributes(call.pool, call.method, status, failed)
        instruments.duration.record(self._loop.time() - self._sent, attributes)
        span = self._span
        if span is None:
            return
        try:
            if status is not None:
                span.set_attribute("http.response.status_code", status)
            if failed is not None:
                span.set_attribute("error.type", failed)
                # A description only when the status code does not say it all.
                shown = None if status is not None and status >= 400 else f"{exc}"
                span.set_status(Status(StatusCode.ERROR, shown))
        finally:
            span.end()
            context.detach(self._token)
