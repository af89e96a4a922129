"""C. Overhead: the client's pagination against a hand-written aiohttp loop, same server, same run.

The server (``_canned``, its own process) answers every request with the same 100-record page
and a fresh cursor, so it is never the bottleneck and both sides fetch identical bytes. Each
variant is a page source, fetching pages sequentially; the sources take turns in one event loop
(order rotated each turn), and a variant's figure is its pages/s over all its turns against the
baseline's over its own. The client runs with limits out of the way.

- baseline: ``aiohttp.ClientSession.get`` + ``json.loads`` + reading ``pageInfo.nextCursor``
- client: ``client.subscriptions.list(page_size=100, model=..., prefetch=...).pages()``

``prefetch=1`` is the client's default; it overlaps the next request with the consumer's work,
which the sequential baseline cannot, so ``prefetch=0`` is the like-for-like comparison and both
are judged. The two are measured differently:

- ``prefetch=0``: every source stays open and the turns are short (10 pages). The machine's
  speed drifts by tens of % within a second (a source's CPU per page scatters 2x from one
  300-page turn to the next); ten-page turns put a variant and its baseline in the same moment.
- ``prefetch=1``: each turn (300 pages) opens its source anew, so that a prefetching client's
  next page is never fetched during another variant's turn; the baseline takes the same turns.

CPU microseconds per page (this process only) are printed as well.

OpenTelemetry: the client rows run with the API installed and no SDK configured (what a user
who never set one up gets); two more rows show ``telemetry=False`` (no hook records anything)
and an SDK configured (a meter provider aggregating in memory, spans batched to an exporter
that drops them), both models and prefetch=0. The telemetry's own cost is also measured alone:
CPU microseconds per request through an in-memory transport (no socket, no records), the
client's path and nothing else.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import AsyncGenerator, Callable, Sequence
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
WARM_UP_PAGES = 20


async def raw_pages(base_url: str) -> AsyncGenerator[int, None]:
    """Pages with aiohttp + json.loads; yields each page's record count."""
    url = f"{base_url}/admin/2026-04/subscriptions"
    headers = {"X-Service-Token": "token", "Accept": "application/json"}
    async with aiohttp.ClientSession() as session:
        cursor = None
        while True:
            params = {"pageSize": str(PAGE_SIZE)}
            if cursor is not None:
                params["afterCursor"] = cursor
            async with session.get(url, params=params, headers=headers) as response:
                body = await response.read()
            doc = json.loads(body)
            records = doc["data"]
            cursor = doc["pageInfo"]["nextCursor"] if doc["pageInfo"]["hasNextPage"] else None
            assert cursor
            yield len(records)


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


async def client_pages(
    base_url: str, *, model: Any, prefetch: int, **options: Any
) -> AsyncGenerator[int, None]:
    """Pages with the client; yields each page's record count."""
    async with AdminClient(
        token="token", base_url=base_url, store="overhead", limits=LOOSE_LIMITS, **options
    ) as client:
        listing = client.subscriptions.list(page_size=PAGE_SIZE, model=model, prefetch=prefetch)
        async with contextlib.aclosing(pages_of(listing)) as stream:
            async for page in stream:
                yield len(page.data)


Source = Callable[[str], AsyncGenerator[int, None]]

BASELINE = "raw aiohttp + json.loads"
NO_SDK = "client, models, prefetch=0"
#: Sources kept open, short turns (prefetch=0: nothing runs between a source's turns).
SEQUENTIAL: dict[str, Source] = {
    BASELINE: raw_pages,
    NO_SDK: lambda u: client_pages(u, model=None, prefetch=0),
    "client, model=dict, prefetch=0": lambda u: client_pages(u, model=dict, prefetch=0),
    "client, models, prefetch=0, telemetry=False": (
        lambda u: client_pages(u, model=None, prefetch=0, telemetry=False)
    ),
    "client, models, prefetch=0, SDK configured": (
        lambda u: client_pages(u, model=None, prefetch=0, **sdk_providers())
    ),
}
#: Each turn a fresh source (prefetch=1 fetches the next page while the caller has the page).
PREFETCHING: dict[str, Source] = {
    BASELINE: raw_pages,
    "client, models, prefetch=1": lambda u: client_pages(u, model=None, prefetch=1),
    "client, model=dict, prefetch=1": lambda u: client_pages(u, model=dict, prefetch=1),
}
JUDGED = {
    NO_SDK: TARGET_MODELS,
    "client, model=dict, prefetch=0": TARGET_DICT,
    "client, models, prefetch=1": TARGET_MODELS,
    "client, model=dict, prefetch=1": TARGET_DICT,
}
#: "No cost when unused": what the API without an SDK adds to a request, at most this fraction
#: of the CPU a page costs the client. Measured alone (``request_cpu_us``): page rates on a
#: shared machine vary by more than that from turn to turn.
TARGET_NO_SDK_SHARE = 0.01


async def take(source: AsyncGenerator[int, None], pages: int) -> tuple[float, float]:
    """(seconds, CPU seconds) for the next ``pages`` pages of ``source``."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(pages):
        assert await anext(source) == PAGE_SIZE
    return time.perf_counter() - t0, time.process_time() - c0


async def take_turns(
    base_url: str, sources: dict[str, Source], turns: int, pages: int, *, fresh: bool
) -> dict[str, tuple[float, float]]:
    """Each source takes ``pages`` pages ``turns`` times, the order rotated every turn, after a
    warm-up (imports, first connections, caches). ``fresh``: every turn opens its source and
    closes it afterwards (untimed); else each source stays open throughout. Returns each
    source's (pages/s, CPU us per page) over all its turns."""
    names = list(sources)
    spent = {name: [0.0, 0.0] for name in names}
    async with contextlib.AsyncExitStack() as stack:
        kept = {}
        if not fresh:
            for name in names:
                source = sources[name](base_url)
                kept[name] = await stack.enter_async_context(contextlib.aclosing(source))

        def opened(name: str) -> contextlib.AbstractAsyncContextManager[AsyncGenerator[int, None]]:
            if fresh:
                return contextlib.aclosing(sources[name](base_url))
            return contextlib.nullcontext(kept[name])

        for name in names:
            async with opened(name) as source:
                await take(source, WARM_UP_PAGES)
        for turn in range(turns):
            for name in names[turn % len(names) :] + names[: turn % len(names)]:
                async with opened(name) as source:
                    seconds, cpu = await take(source, pages)
                spent[name][0] += seconds
                spent[name][1] += cpu
    taken = turns * pages
    return {name: (taken / seconds, cpu / taken * 1e6) for name, (seconds, cpu) in spent.items()}


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


async def measure(
    base_url: str, short: tuple[int, int], long: tuple[int, int]
) -> list[dict[str, tuple[float, float]]]:
    """The prefetch=0 sources in ``short`` turns (turns, pages), then the prefetching ones."""
    return [
        await take_turns(base_url, SEQUENTIAL, *short, fresh=False),
        await take_turns(base_url, PREFETCHING, *long, fresh=True),
    ]


def bench(report: Report) -> None:
    short = (60, 10) if report.quick else (270, 10)  # turns, pages a turn
    long = (3, 120) if report.quick else (9, 300)
    report.say(
        f"  pages of {PAGE_SIZE} records (~77 kB); order rotated every turn; prefetch=0 rows:"
        f" sources kept open, {short[0]} turns x {short[1]} pages; prefetch=1 rows: {long[0]}"
        f" turns x {long[1]} pages, each turn a fresh source; pages/s over all of a source's turns"
    )
    for loop in loops():
        with canned_server(PAGE_SIZE) as server:
            results = run(lambda: measure(server["base_url"], short, long), loop)
        report.say(
            f"  event loop: {loop} (client and baseline alike; server: uvloop); client rows:"
            " OpenTelemetry API installed, no SDK configured, unless the row says otherwise"
        )
        ratios = {}
        for measured in results:
            baseline_rate = measured[BASELINE][0]
            rows = []
            for name, (rate, cpu_us) in measured.items():
                ratios[name] = rate / baseline_rate
                rows.append([name, rate, ratios[name], cpu_us])
            report.table(["variant", "pages/s", "x baseline", "CPU us/page"], rows)
        for name, target in JUDGED.items():
            report.check(f"{loop}: {name} / baseline", ratios[name], ">=", target)
        page_cpu_us = results[0][NO_SDK][1]
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
    """pyinstrument over the default-model, prefetch=0 client pages (``--profile``)."""
    from pyinstrument import Profiler

    async def pull(base_url: str) -> None:
        async with contextlib.aclosing(client_pages(base_url, model=None, prefetch=0)) as source:
            await take(source, pages)

    with canned_server(PAGE_SIZE) as server:
        profiler = Profiler(interval=0.0005)
        profiler.start()
        run(lambda: pull(server["base_url"]))
        profiler.stop()
    report.say(profiler.output_text(unicode=False, color=False, show_all=False))
