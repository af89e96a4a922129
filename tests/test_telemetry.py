"""OpenTelemetry: spans and metrics read back through the SDK's in-memory reader and exporter."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from asyncsubs import AdminClient, ConfigError, Limits, Rate, RetryPolicy, errors
from asyncsubs import _telemetry as telemetry
from asyncsubs._protocol import RawResponse, Request
from asyncsubs.limiting import Limiter
from asyncsubs.testing import FakeAdminServer

MakeClient = Callable[..., AdminClient]


class Otel:
    """An SDK meter and tracer provider whose output the test reads back."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def providers(self) -> dict[str, Any]:
        return {"meter_provider": self.meter_provider, "tracer_provider": self.tracer_provider}

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> its data points (the reader's cumulative view)."""
        data = self.reader.get_metrics_data()
        found: dict[str, list[Any]] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    sdk = Otel()
    yield sdk
    sdk.meter_provider.shutdown()
    sdk.tracer_provider.shutdown()


def by_attributes(points: list[Any], **match: Any) -> list[Any]:
    keyed = {k.replace("__", "."): v for k, v in match.items()}
    return [p for p in points if all(p.attributes.get(k) == v for k, v in keyed.items())]


async def test_a_list_iteration_page_spans_attempt_spans_and_metrics(
    server: FakeAdminServer, make_client: MakeClient, otel: Otel
) -> None:
    server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "1"})
    async with make_client(**otel.providers()) as client:
        records = [r async for r in client.orders.list(page_size=250)]
    assert len(records) == 1000

    spans = otel.spans
    pages = [s for s in spans if s.name == "asyncsubs.page orders"]
    attempts = [s for s in spans if s.name == "GET"]
    assert len(pages) == 4
    assert len(attempts) == 5
    assert len(spans) == 9
    assert {s.kind for s in pages} == {SpanKind.INTERNAL}
    assert {s.kind for s in attempts} == {SpanKind.CLIENT}
    page_ids = {s.context.span_id for s in pages}
    assert all(a.parent is not None and a.parent.span_id in page_ids for a in attempts)
    assert all(p.parent is None for p in pages)  # each page a span of its own, not nested

    limited, retried = attempts[0], attempts[1]
    assert limited.attributes["http.response.status_code"] == 429
    assert limited.attributes["error.type"] == "429"
    assert limited.status.status_code is StatusCode.ERROR
    assert "http.request.resend_count" not in limited.attributes
    assert retried.attributes["http.request.resend_count"] == 1
    assert retried.parent == limited.parent  # both attempts of the first page
    assert retried.status.status_code is StatusCode.UNSET
    assert dict(retried.attributes) == {
        "http.request.method": "GET",
        "server.address": "127.0.0.1",
        "server.port": server.port,
        "url.full": f"{server.base_url}/admin/2026-04/orders",
        "asyncsubs.store": "acme",
        "asyncsubs.pool": "orders",
        "http.request.resend_count": 1,
        "http.response.status_code": 200,
    }
    assert dict(pages[0].attributes) == {
        "asyncsubs.store": "acme",
        "asyncsubs.pool": "orders",
        "http.request.method": "GET",
    }

    points = otel.metrics()
    pool = {"asyncsubs__store": "acme", "asyncsubs__pool": "orders"}
    duration = points["http.client.request.duration"]
    ok = by_attributes(duration, http__response__status_code=200, **pool)
    assert [p.count for p in ok] == [4]
    (rejected,) = by_attributes(duration, http__response__status_code=429, **pool)
    assert rejected.count == 1
    assert dict(rejected.attributes) == {
        "http.request.method": "GET",
        "server.address": "127.0.0.1",
        "server.port": server.port,
        "asyncsubs.store": "acme",
        "asyncsubs.pool": "orders",
        "http.response.status_code": 429,
        "error.type": "429",
    }
    assert list(rejected.explicit_bounds) == list(telemetry.DURATION_BUCKETS)
    assert [p.count for p in by_attributes(points["asyncsubs.limiter.wait.duration"], **pool)] == [
        5
    ]
    assert [p.value for p in by_attributes(points["asyncsubs.rate_limited"], **pool)] == [1]
    assert [p.value for p in by_attributes(points["asyncsubs.retries"], **pool)] == [1]
    assert [p.value for p in by_attributes(points["asyncsubs.requests.in_flight"], **pool)] == [0]
    stats = client.stats.pools["orders"]
    (interval,) = by_attributes(points["asyncsubs.limiter.interval"], **pool)
    (margin,) = by_attributes(points["asyncsubs.limiter.margin"], **pool)
    assert (interval.value, margin.value) == (stats.interval, stats.margin)
    assert interval.value > 0
    # Pools that never paced a request report nothing yet.
    assert {p.attributes["asyncsubs.pool"] for p in points["asyncsubs.limiter.interval"]} == {
        "orders"
    }


@pytest.fixture
async def clock() -> AsyncIterator[list[float]]:
    """The running loop's ``time()`` (``clock[0]``), jumped by the selector to the next timer."""
    loop = asyncio.get_running_loop()
    selector = getattr(loop, "_selector", None)
    if selector is None:  # pragma: no cover - only selector loops are used here
        pytest.skip("the virtual clock needs a selector event loop")
    now = [1000.0]
    real_select = selector.select

    def select(timeout: float | None = None) -> Any:
        events = real_select(0)
        if not events and timeout is not None and timeout > 0:
            scheduled = loop._scheduled  # type: ignore[attr-defined]
            now[0] = max(now[0] + timeout, scheduled[0].when() if scheduled else 0.0)
        return events

    loop.time = lambda: now[0]  # type: ignore[method-assign]
    selector.select = select
    try:
        yield now
    finally:
        del loop.time, selector.select


class Slow:
    """A transport whose every answer takes 0.2 s (of the loop's clock)."""

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        await asyncio.sleep(0.2)
        return RawResponse(200, {}, b'{"success": true, "code": "SUCCESS", "data": {}}')

    async def aclose(self) -> None:
        pass


async def test_limiter_waits_and_request_durations_are_measured(
    clock: list[float], otel: Otel
) -> None:
    # Two starts a second, no margin: three requests at once start at 0, 0.5 and 1.0 s.
    limits = Limits(global_rate=Rate(2, per=1.0), heavy={}, safety_margin=0, max_margin=0)
    async with AdminClient(
        token="t",
        base_url="https://subs.example",
        store="shop",
        limits=limits,
        transport=Slow(),
        limiter=Limiter(),
        **otel.providers(),
    ) as client:
        calls = [asyncio.ensure_future(client.request("GET", "subscriptions/1")) for _ in range(3)]
        await asyncio.sleep(0.1)  # the first is answering, the others wait for their start
        (in_flight,) = otel.metrics()["asyncsubs.requests.in_flight"]
        assert in_flight.value == 1
        await asyncio.gather(*calls)
    points = otel.metrics()
    (wait,) = points["asyncsubs.limiter.wait.duration"]
    assert (wait.count, wait.sum, wait.max) == (3, pytest.approx(1.5), pytest.approx(1.0))
    (duration,) = points["http.client.request.duration"]
    assert (duration.count, duration.sum) == (3, pytest.approx(0.6))
    assert (duration.attributes["server.address"], duration.attributes["server.port"]) == (
        "subs.example",
        443,
    )
    (interval,) = points["asyncsubs.limiter.interval"]
    (margin,) = points["asyncsubs.limiter.margin"]
    assert (interval.value, margin.value) == (pytest.approx(0.5), 0)
    assert dict(interval.attributes) == {"asyncsubs.store": "shop", "asyncsubs.pool": "global"}


async def test_requests_and_their_failures(
    server: FakeAdminServer, make_client: MakeClient, otel: Otel
) -> None:
    sub_id = server.records("acme", "subscriptions")[0]["id"]
    async with make_client(**otel.providers()) as client:
        await client.request("POST", f"subscriptions/{sub_id}/pause", json={})
        with pytest.raises(errors.NotFoundError):
            await client.request("GET", "nope")
    post_call, post, get_call, get = sorted(otel.spans, key=lambda s: s.start_time or 0)
    assert (post_call.name, post.name) == ("asyncsubs.request POST", "POST")
    assert post.parent is not None
    assert post.parent.span_id == post_call.context.span_id
    assert post_call.attributes["asyncsubs.pool"] == "global"
    assert post.attributes["url.full"].endswith(f"/admin/2026-04/subscriptions/{sub_id}/pause")
    assert post_call.status.status_code is StatusCode.UNSET

    assert get_call.name == "asyncsubs.request GET"
    assert get_call.status.status_code is StatusCode.ERROR
    assert get_call.attributes["error.type"] == "404"
    (event,) = get_call.events
    assert event.name == "exception"
    assert event.attributes["exception.type"] == "asyncsubs.errors.NotFoundError"
    assert get.attributes["error.type"] == "404"
    assert get.status.status_code is StatusCode.ERROR


async def test_a_transport_failure_has_an_error_type_and_no_status(otel: Otel) -> None:
    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with AdminClient(
        token="t",
        base_url=f"http://127.0.0.1:{port}",
        retry=RetryPolicy(max_attempts=2),
        **otel.providers(),
    ) as client:
        with pytest.raises(errors.TransportError):
            await client.request("GET", "subscriptions/1")
    attempts = [s for s in otel.spans if s.kind is SpanKind.CLIENT]
    assert [s.attributes.get("http.request.resend_count") for s in attempts] == [None, 1]
    for span in attempts:
        assert span.attributes["error.type"] == "asyncsubs.errors.TransportError"
        assert "http.response.status_code" not in span.attributes
        assert span.status.status_code is StatusCode.ERROR
        assert "cannot connect" in (span.status.description or "")
    (point,) = otel.metrics()["http.client.request.duration"]
    assert point.count == 2
    assert point.attributes["error.type"] == "asyncsubs.errors.TransportError"
    assert "http.response.status_code" not in point.attributes


async def test_page_spans_belong_to_the_callers_span(make_client: MakeClient, otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("test")
    async with make_client(**otel.providers()) as client:
        with tracer.start_as_current_span("sync job") as job:
            # prefetch=1: the pages are fetched by a task of their own
            async for _ in client.orders.list(page_size=250):
                pass
    pages = [s for s in otel.spans if s.name == "asyncsubs.page orders"]
    assert len(pages) == 4
    assert all(p.parent is not None and p.parent.span_id == job.context.span_id for p in pages)


async def test_the_token_and_query_never_reach_spans_or_metrics(
    server: FakeAdminServer, make_client: MakeClient, otel: Otel
) -> None:
    token = server.store("acme").token
    server.enqueue(500, {"success": False, "message": "boom"})
    async with make_client(**otel.providers()) as client:
        async for _ in client.subscriptions.list(page_size=400, params={"status": "ACTIVE"}):
            pass
        with pytest.raises(errors.NotFoundError):
            await client.request("GET", "nope", params={"q": "x"})
    shown = []
    for span in otel.spans:
        shown += [span.name, *map(str, span.attributes.values()), span.status.description or ""]
        for event in span.events:
            shown += map(str, event.attributes.values())
    for points in otel.metrics().values():
        shown += [str(dict(p.attributes)) for p in points]
    text = "\n".join(shown)
    assert token not in text
    assert "?" not in text
    assert "ACTIVE" not in text
    assert "pageSize" not in text


async def test_switched_off_or_without_the_api_nothing_is_recorded(
    make_client: MakeClient, otel: Otel, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_client(telemetry=False) as client:
        async for _ in client.orders.list(page_size=500):
            pass
    monkeypatch.setattr(telemetry, "AVAILABLE", False)
    async with make_client() as client:  # the API "not installed"
        await client.request("GET", "subscriptions", params={"pageSize": 1})
    assert otel.spans == []
    assert otel.metrics() == {}
    with pytest.raises(ConfigError, match=r"pip install 'asyncsubs\[otel\]'"):
        make_client(**otel.providers())


def test_bad_telemetry_arguments(otel: Otel) -> None:
    base = {"token": "t", "base_url": "https://subs.example"}
    with pytest.raises(ConfigError, match="telemetry=False"):
        AdminClient(**base, telemetry=False, meter_provider=otel.meter_provider)
    with pytest.raises(ConfigError, match="meter_provider must be"):
        AdminClient(**base, meter_provider=otel.tracer_provider)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="tracer_provider must be"):
        AdminClient(**base, tracer_provider=otel.meter_provider)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="True or False"):
        AdminClient(**base, telemetry="no")  # type: ignore[arg-type]


#: Run in a process of its own: the global providers can be set once per process.
GLOBAL_PROVIDERS = """
import asyncio, json
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from asyncsubs import AdminClient
from asyncsubs._protocol import Request
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig

REQUEST = Request(method="GET", url="http://127.0.0.1/x", path="x", headers={})

async def main():
    async with FakeAdminServer(stores=[FakeStoreConfig("acme", records=10)]) as server:
        def client(store, **kwargs):  # a limiter store each: no client waits for another
            token = server.store("acme").token
            return AdminClient(token=token, base_url=server.base_url, store=store, **kwargs)
        early = client("early")  # made, and used, before the application configures the SDK
        await early.request("GET", "subscriptions", params={"pageSize": 5})
        before = type(early._telemetry.call("request", REQUEST, "global")).__name__
        reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(tracer_provider)
        async with early, client("late") as late, client("off", telemetry=False) as off:
            for c in (early, late, off):
                await c.request("GET", "subscriptions", params={"pageSize": 5})
    data = reader.get_metrics_data()
    (duration,) = [m for rm in data.resource_metrics for sm in rm.scope_metrics
                   for m in sm.metrics if m.name == "http.client.request.duration"]
    spans = [s.name for s in exporter.get_finished_spans()]
    after = type(early._telemetry.call("request", REQUEST, "global")).__name__
    points = sum(p.count for p in duration.data.data_points)
    print(json.dumps({"points": points, "spans": spans, "calls": [before, after]}))

asyncio.run(main())
"""


def test_the_global_providers_are_used_by_default() -> None:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(GLOBAL_PROVIDERS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    # Two clients record once the SDK is configured (one made and used before, whose calls
    # recorded nothing until then); the one switched off does not.
    assert json.loads(out) == {
        "points": 2,
        "spans": ["GET", "asyncsubs.request GET", "GET", "asyncsubs.request GET"],
        "calls": ["Call", "_RecordingCall"],
    }


def test_a_call_records_nothing_while_no_global_provider_is_set(otel: Otel) -> None:
    """The test process configures no SDK globally: a client on the global providers skips a
    call's recording (it would go nowhere); one given providers records."""
    base = {"token": "t", "base_url": "https://subs.example"}
    request = Request(method="GET", url="https://subs.example/x", path="x", headers={})
    unobserved = AdminClient(**base)._telemetry.call("request", request, "global")
    assert type(unobserved) is telemetry.Call
    observed = AdminClient(**base, **otel.providers())._telemetry.call("request", request, "global")
    assert type(observed) is not telemetry.Call
    with observed:
        pass
    assert [s.name for s in otel.spans] == ["asyncsubs.request GET"]


async def test_in_flight_is_one_sum_for_a_store_bound_in_several_loops(otel: Otel) -> None:
    instruments = telemetry._Instruments(otel.meter_provider)
    limiter, limits = Limiter(), Limits(global_rate=Rate(1000), heavy={})
    store_and_pool = {telemetry.STORE: "shop", telemetry.POOL: "global"}
    here = limiter.bind("shop", limits)
    instruments.observe(here)
    elsewhere: list[Any] = []

    async def start_one_never_answered() -> None:
        elsewhere.append(there := limiter.bind("shop", limits))
        instruments.observe(there)
        await there.slot("global").__aenter__()

    thread = threading.Thread(target=asyncio.run, args=(start_one_never_answered(),))
    thread.start()
    thread.join()
    async with here.slot("global"):
        observed = {
            name: [o.value for o in callback(None) if o.attributes == store_and_pool]  # type: ignore[arg-type]
            for name, callback in [
                ("in flight", instruments._in_flight),
                ("interval", instruments._intervals),
                ("margin", instruments._margins),
            ]
        }
        points = otel.metrics()["asyncsubs.requests.in_flight"]
    # One observation per attributes, as the metrics API asks of a callback, and not left to an
    # SDK to add up: the sum of what is in flight, the widest interval and margin.
    interval = here.stats().pools["global"].interval
    assert observed == {"in flight": [2], "interval": [interval], "margin": [pytest.approx(0.1)]}
    assert [p.value for p in points if p.attributes == store_and_pool] == [2]


async def test_what_a_pool_learned_is_gauged(otel: Otel) -> None:
    """The rate each pool paces at and the page size a ``page_size="max"`` pull learned."""
    async with (
        FakeAdminServer(stores=["acme"], rate_limits=None, records=300, max_page_size=120) as fake,
        AdminClient(
            token=fake.store("acme").token,
            base_url=fake.base_url,
            store="acme",
            limits=Limits(discover=True),
            limiter=Limiter(),
            **otel.providers(),
        ) as client,
    ):
        async for _ in client.orders.list(page_size="max", prefetch=0).pages():
            pass  # three pages: two of 120 records (clamped), one of 60
        paced = client.stats.pools["orders"].rate
        points = otel.metrics()
    (page,) = by_attributes(points["asyncsubs.page_size"], asyncsubs__pool="orders")
    assert page.value == 120  # clamped twice: the server's largest page
    (rate,) = by_attributes(points["asyncsubs.limiter.rate"], asyncsubs__pool="orders")
    assert rate.value == paced >= 1.0  # from where a discovering pool starts
    (light,) = by_attributes(points["asyncsubs.limiter.rate"], asyncsubs__pool="global")
    assert light.value == 50.0
