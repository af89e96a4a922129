"""C. Overhead: the client's pagination against a hand-written aiohttp loop, same server, same run.

The server (``_canned``, its own process) answers every request with the same 100-record page
and a fresh cursor, so it is never the bottleneck and both sides fetch identical bytes. Rounds
interleave the variants (order rotated each round); each variant fetches ``pages`` pages
sequentially. A round's ratio is the variant's pages/s over the baseline's in that round; the
figure is the median over rounds. The client runs with limits out of the way.

- baseline: ``aiohttp.ClientSession.get`` + ``json.loads`` + reading ``pageInfo.nextCursor``
- client: ``client.subscriptions.list(page_size=100, model=..., prefetch=...).pages()``

``prefetch=1`` is the client's default; it overlaps the next request with the consumer's work,
which the sequential baseline cannot, so ``prefetch=0`` is the like-for-like comparison and both
are judged. CPU microseconds per page (this process only) are printed as well.

OpenTelemetry: the client rows run with the API installed and no SDK configured (what a user
who never set one up gets); two more rows show ``telemetry=False`` (no hook records anything)
and an SDK configured (a meter provider aggregating in memory, spans batched to an exporter
that drops them), both models and prefetch=0. Page rates are noisy on a shared machine, so the
telemetry's own cost is also measured alone: CPU microseconds per request through an in-memory
transport (no socket, no records), the client's path and nothing else.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from asyncsubs import AdminClient
from asyncsubs._protocol import RawResponse, Request

from ._canned import canned_server
from ._common import LOOSE_LIMITS, Report, loops, median, pages_of, run

NAME = "overhead"
TITLE = "C. Overhead: client pages/s vs raw aiohttp + json.loads (canned server, own process)"
PAGE_SIZE = 100
TARGET_MODELS = 1.0
TARGET_DICT = 1.1


async def raw_loop(base_url: str, pages: int) -> tuple[float, float]:
    """(seconds, CPU seconds) for ``pages`` pages with aiohttp + json.loads."""
    url = f"{base_url}/admin/2026-04/subscriptions"
    headers = {"X-Service-Token": "token", "Accept": "application/json"}
    async with aiohttp.ClientSession() as session:
        cursor = None
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(pages):
            params = {"pageSize": str(PAGE_SIZE)}
            if cursor is not None:
                params["afterCursor"] = cursor
            async with session.get(url, params=params, headers=headers) as response:
                body = await response.read()
            doc = json.loads(body)
            records = doc["data"]
            cursor = doc["pageInfo"]["nextCursor"] if doc["pageInfo"]["hasNextPage"] else None
            assert len(records) == PAGE_SIZE
            assert cursor
        return time.perf_counter() - t0, time.process_time() - c0


@functools.cache
def sdk_providers() -> dict[str, Any]:
    """An SDK meter and tracer provider as an application would configure them, exporting
    nowhere: metrics aggregate in memory, spans go through a batch processor to a sink."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Sink(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Sink()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return {"meter_provider": meter_provider, "tracer_provider": tracer_provider}


async def client_loop(
    base_url: str, pages: int, *, model: Any, prefetch: int, **options: Any
) -> tuple[float, float]:
    async with AdminClient(
        token="token", base_url=base_url, store="overhead", limits=LOOSE_LIMITS, **options
    ) as client:
        listing = client.subscriptions.list(page_size=PAGE_SIZE, model=model, prefetch=prefetch)
        seen = 0
        t0, c0 = time.perf_counter(), time.process_time()
        async with contextlib.aclosing(pages_of(listing)) as stream:
            async for page in stream:
                assert len(page.data) == PAGE_SIZE
                seen += 1
                if seen >= pages:
                    break
        return time.perf_counter() - t0, time.process_time() - c0


Variant = tuple[str, Callable[[str, int], Awaitable[tuple[float, float]]]]

BASELINE = "raw aiohttp + json.loads"
VARIANTS: list[Variant] = [
    (BASELINE, raw_loop),
    ("client, models, prefetch=1", lambda u, n: client_loop(u, n, model=None, prefetch=1)),
    ("client, models, prefetch=0", lambda u, n: client_loop(u, n, model=None, prefetch=0)),
    ("client, model=dict, prefetch=1", lambda u, n: client_loop(u, n, model=dict, prefetch=1)),
    ("client, model=dict, prefetch=0", lambda u, n: client_loop(u, n, model=dict, prefetch=0)),
    (
        "client, models, prefetch=0, telemetry=False",
        lambda u, n: client_loop(u, n, model=None, prefetch=0, telemetry=False),
    ),
    (
        "client, models, prefetch=0, SDK configured",
        lambda u, n: client_loop(u, n, model=None, prefetch=0, **sdk_providers()),
    ),
]
NO_SDK = "client, models, prefetch=0"
#: "No cost when unused": what the API without an SDK adds to a request, at most this fraction
#: of the CPU a page costs the client. Measured alone (``request_cpu_us``): page rates on a
#: shared machine vary by more than that from round to round.
TARGET_NO_SDK_SHARE = 0.01


async def measure(base_url: str, rounds: int, pages: int) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {
        name: {"rate": [], "ratio": [], "cpu_us": []} for name, _ in VARIANTS
    }
    for _, fn in VARIANTS:  # warm-up: imports, first connections, caches
        await fn(base_url, 20)
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        rates = {}
        for name, fn in order:
            seconds, cpu = await fn(base_url, pages)
            rates[name] = pages / seconds
            results[name]["rate"].append(pages / seconds)
            results[name]["cpu_us"].append(cpu / pages * 1e6)
        for name in rates:
            results[name]["ratio"].append(rates[name] / rates[BASELINE])
    return results


class Instant:
    """A transport that answers every request at once with the same small envelope."""

    ANSWER = RawResponse(200, {}, b'{"success": true, "code": "SUCCESS", "data": {}}')

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        return self.ANSWER

    async def aclose(self) -> None:
        pass


TELEMETRY: dict[str, Callable[[], dict[str, Any]]] = {
    "telemetry=False": lambda: {"telemetry": False},
    "API, no SDK configured": dict,
    "SDK configured": sdk_providers,
}


async def request_cpu_us(requests: int, rounds: int) -> dict[str, list[float]]:
    """CPU microseconds per ``client.request`` through :class:`Instant`, per telemetry setting,
    interleaved rounds."""
    found: dict[str, list[float]] = {name: [] for name in TELEMETRY}
    for r in range(rounds + 1):  # the first round warms up
        for name, options in TELEMETRY.items():
            async with AdminClient(
                token="token",
                base_url="https://subs.example",
                store=f"cpu-{name}",
                limits=LOOSE_LIMITS,
                transport=Instant(),
                **options(),
            ) as client:
                c0 = time.process_time()
                for _ in range(requests):
                    await client.request("GET", "things/1")
                if r:
                    found[name].append((time.process_time() - c0) / requests * 1e6)
    return found


def bench(report: Report) -> None:
    rounds, pages = (3, 120) if report.quick else (9, 300)
    report.say(
        f"  {rounds} interleaved rounds x {pages} pages of {PAGE_SIZE} records"
        " (~77 kB each) per variant; median over rounds"
    )
    for loop in loops():
        with canned_server(PAGE_SIZE) as server:
            results = run(lambda: measure(server["base_url"], rounds, pages), loop)
        report.say(
            f"  event loop: {loop} (client and baseline alike; server: uvloop); client rows:"
            " OpenTelemetry API installed, no SDK configured, unless the row says otherwise"
        )
        rows = []
        for name, _ in VARIANTS:
            r = results[name]
            rows.append([name, median(r["rate"]), median(r["ratio"]), median(r["cpu_us"])])
        report.table(["variant", "pages/s", "x baseline", "CPU us/page"], rows)
        for name, _ in VARIANTS[1:5]:
            target = TARGET_DICT if "dict" in name else TARGET_MODELS
            report.check(f"{loop}: {name} / baseline", median(results[name]["ratio"]), ">=", target)
        page_cpu_us = median(results[NO_SDK]["cpu_us"])
    requests, cpu_rounds = (2_000, 3) if report.quick else (10_000, 7)
    cpu = run(lambda: request_cpu_us(requests, cpu_rounds))
    report.say(
        f"  the client's own path: CPU us per request through an in-memory transport"
        f" (asyncio, {cpu_rounds} interleaved rounds x {requests:,} requests, median)"
    )
    off = median(cpu["telemetry=False"])
    report.table(
        ["telemetry", "CPU us/request", "+ us vs telemetry=False"],
        [[name, median(v), median(v) - off] for name, v in cpu.items()],
    )
    report.check(
        f"API without an SDK: + CPU us per request (target: {TARGET_NO_SDK_SHARE:.0%} of the"
        f" {page_cpu_us:,.0f} us a page costs the client, {loop}, models, prefetch=0)",
        median(cpu["API, no SDK configured"]) - off,
        "<=",
        TARGET_NO_SDK_SHARE * page_cpu_us,
        fmt="{:.1f}",
    )


def profile(report: Report, pages: int = 2000) -> None:
    """pyinstrument over the default-model, prefetch=0 client loop (``--profile``)."""
    from pyinstrument import Profiler

    with canned_server(PAGE_SIZE) as server:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        run(lambda: client_loop(server["base_url"], pages, model=None, prefetch=0))
        profiler.stop()
    report.say(profiler.output_text(unicode=False, color=False, show_all=False))
