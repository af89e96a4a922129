"""C. Overhead: the client's pagination against a hand-written aiohttp loop, same server, same run.

Two servers, each in a process of its own, answer every request with the same 100-record page and
a fresh cursor (``_canned``), so both sides fetch identical bytes: the canned server, and a fast
one (nginx when installed, else the canned server again), where the client's own costs weigh
most; the fast one serves a page of small records too (their scalar fields, ~265 bytes a record
against ~770), where decoding gains least and the per-request path weighs most. Each variant is
a page source fetching pages sequentially in a process of its own; the sources take turns (one
at a time, order rotated each turn), and a variant's figure is its pages/s over all its turns
against the baseline's over its own. The client runs with limits out of the way.

- baseline: ``aiohttp.ClientSession.get`` + ``json.loads`` + reading ``pageInfo.nextCursor``
- client: ``client.subscriptions.list(page_size=100, model=..., prefetch=...).pages()``

``prefetch=1`` is the client's default; it overlaps the next request with the consumer's work,
which the sequential baseline cannot (the consumer here does nothing but count), so
``prefetch=0`` is the like-for-like comparison and both are judged. The two are measured
differently:

- ``prefetch=0``: every source stays open and the turns are short (10 pages). The machine's
  speed drifts by tens of % within a second (a source's CPU per page scatters 2x from one
  300-page turn to the next); ten-page turns put a variant and its baseline in the same moment.
- ``prefetch=1``: each turn (200 pages) opens its source anew, so that a prefetching client's
  next page is never fetched during another variant's turn; the baseline takes the same turns.

Each source has a process of its own so that it pays for its own garbage: sharing one process,
the collector's full collections (every ~100 pages, tens of ms each, the whole heap scanned)
fell on whichever source was taking its turn, in step with the rotation (with 4 or 5 sources and
10-page turns, on the same one or two sources each time), and four identical raw loops read
0.77-1.14 of the first. The server is pinned to one core and the sources to another, and every
source's process gets the same hash seed: identical sources then read within a few %.
CPU microseconds per page (the source's process) are printed as well.

With ``ASYNCSUBS_AGAINST=<checkout>`` (e.g. ``git worktree add /tmp/old <commit>``) the fast
server's prefetch=0 rows add the client at that checkout (models), in the same turns.

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
import gc
import json
import multiprocessing
import os
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import aclosing
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import msgspec

from asyncsubs import AdminClient
from asyncsubs._protocol import RawResponse, Request, build_request, parse_page, request_headers
from asyncsubs._transport import AiohttpTransport

from ._canned import canned_server, fast_server
from ._common import LOOSE_LIMITS, Report, loops, median, pages_of, run

NAME = "overhead"
TITLE = "C. Overhead: client pages/s vs raw aiohttp + json.loads (canned server, own process)"
PAGE_SIZE = 100
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
MODELS_P1, DICT_P0, DICT_P1 = (
    "client, models, prefetch=1",
    "client, model=dict, prefetch=0",
    "client, model=dict, prefetch=1",
)
#: Every source, by name (a source's process builds it from its name).
SOURCES: dict[str, Source] = {
    BASELINE: raw_pages,
    NO_SDK: lambda u: client_pages(u, model=None, prefetch=0),
    DICT_P0: lambda u: client_pages(u, model=dict, prefetch=0),
    "client, models, prefetch=0, telemetry=False": (
        lambda u: client_pages(u, model=None, prefetch=0, telemetry=False)
    ),
    "client, models, prefetch=0, SDK configured": (
        lambda u: client_pages(u, model=None, prefetch=0, **sdk_providers())
    ),
    MODELS_P1: lambda u: client_pages(u, model=None, prefetch=1),
    DICT_P1: lambda u: client_pages(u, model=dict, prefetch=1),
}
#: Sources kept open, short turns (prefetch=0: nothing runs between a source's turns).
SEQUENTIAL = [BASELINE, NO_SDK, DICT_P0, *(n for n in SOURCES if "prefetch=0," in n)]
#: Each turn a fresh source (prefetch=1 fetches the next page while the caller has the page).
PREFETCHING = [BASELINE, MODELS_P1, DICT_P1]
#: The canned server's rows: at least as fast as the hand-written loop.
JUDGED = {NO_SDK: 1.0, DICT_P0: 1.1, MODELS_P1: 1.0, DICT_P1: 1.1}
#: The fast server's rows (nginx): where the client's own costs show most.
FAST_SEQUENTIAL = [BASELINE, NO_SDK, DICT_P0]
FAST_JUDGED = {NO_SDK: 1.10, DICT_P0: 1.25, MODELS_P1: 1.8, DICT_P1: 1.8}
#: The fast server's small-record rows: the per-request path against decoding's gain.
SMALL_JUDGED = {NO_SDK: 1.0}
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


async def _serve_turns(conn: Connection, source: Source, base_url: str, fresh: bool) -> None:
    """A source's side of :func:`take_turns`: a warm-up, then a turn each time it is asked.
    Between turns the loop waits in ``conn.recv()``: nothing of the source runs meanwhile."""
    async with contextlib.AsyncExitStack() as stack:
        kept = None if fresh else await stack.enter_async_context(aclosing(source(base_url)))

        def opened() -> contextlib.AbstractAsyncContextManager[AsyncGenerator[int, None]]:
            return aclosing(source(base_url)) if kept is None else contextlib.nullcontext(kept)

        async with opened() as warming:
            await take(warming, WARM_UP_PAGES)
        conn.send("ready")
        while (pages := conn.recv()) is not None:
            async with opened() as turn:
                conn.send(await take(turn, pages))


#: A source run by the checkout ``ASYNCSUBS_AGAINST`` names: the name of today's, and this.
AGAINST = " @ against"


def _source_process(
    conn: Connection, name: str, base_url: str, loop: str, fresh: bool, core: int | None
) -> None:
    if core is not None:
        os.sched_setaffinity(0, {core})
    with conn:
        run(lambda: _serve_turns(conn, SOURCES[name.removesuffix(AGAINST)], base_url, fresh), loop)


def _cores(server_pid: int) -> int | None:
    """With two cores or more: the server pinned to the last, and the core for the sources
    (the first). The scheduler otherwise puts a source beside the server now and then."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if len(cores) < 2:
        return None
    os.sched_setaffinity(server_pid, {cores[-1]})
    return cores[0]


def take_turns(
    server: dict[str, Any],
    names: Sequence[str],
    turns: int,
    pages: int,
    *,
    fresh: bool,
    loop: str,
) -> dict[str, tuple[float, float]]:
    """Each source, in a process of its own, takes ``pages`` pages ``turns`` times from
    ``server``, one source at a time, the order rotated every turn, after a warm-up (imports,
    first connections, caches). ``fresh``: every turn opens its source and closes it afterwards
    (untimed); else each source stays open throughout. Returns each source's (pages/s, CPU us
    per page) over all its turns.

    A process per source: each pays for its own garbage. In one process the collector's full
    collections (every ~100 pages, tens of ms each) fell on whichever source's turn was running,
    and in step with the rotation. Every source's process gets the same hash seed, so that
    identical sources lay out their objects alike."""
    context = multiprocessing.get_context("spawn")
    core = _cores(server["pid"])
    spent = {name: [0.0, 0.0] for name in names}
    with contextlib.ExitStack() as stack:
        conns: dict[str, Connection] = {}
        for name in names:
            conns[name], child = context.Pipe()
            process = context.Process(
                target=_source_process,
                args=(child, name, server["base_url"], loop, fresh, core),
                name=f"overhead-source-{len(conns)}",
                daemon=True,
            )
            checkout = os.environ["ASYNCSUBS_AGAINST"] if name.endswith(AGAINST) else ""
            with _environment(PYTHONHASHSEED="0", ASYNCSUBS_CHECKOUT=checkout):
                process.start()
            child.close()
            stack.callback(_stop, process, conns[name])
        for name, conn in conns.items():
            if not conn.poll(120):
                raise RuntimeError(f"source {name!r} did not warm up within 120 s")
            conn.recv()
        for turn in range(turns):
            for name in [*names[turn % len(names) :], *names[: turn % len(names)]]:
                conns[name].send(pages)
                seconds, cpu = conns[name].recv()
                spent[name][0] += seconds
                spent[name][1] += cpu
    taken = turns * pages
    return {name: (taken / seconds, cpu / taken * 1e6) for name, (seconds, cpu) in spent.items()}


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` for the block (a spawned process starts with it)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)  # an empty value: as unset
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _stop(process: multiprocessing.process.BaseProcess, conn: Connection) -> None:
    with contextlib.suppress(OSError):
        conn.send(None)
    process.join(10)
    if process.is_alive():
        process.kill()
        process.join(5)
    conn.close()


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


def measure(
    server: dict[str, Any],
    loop: str,
    sequential: Sequence[str],
    short: tuple[int, int],
    long: tuple[int, int],
) -> list[dict[str, tuple[float, float]]]:
    """The prefetch=0 sources in ``short`` turns (turns, pages), then the prefetching ones."""
    return [
        take_turns(server, sequential, *short, fresh=False, loop=loop),
        take_turns(server, PREFETCHING, *long, fresh=True, loop=loop),
    ]


def report_rows(
    report: Report,
    results: list[dict[str, tuple[float, float]]],
    judged: dict[str, float],
    label: str,
) -> None:
    """Each measured set's table, then a check per judged source against its target."""
    ratios = {}
    for measured in results:
        baseline_rate = measured[BASELINE][0]
        rows = []
        for name, (rate, cpu_us) in measured.items():
            ratios[name] = rate / baseline_rate
            rows.append([name, rate, ratios[name], cpu_us])
        report.table(["variant", "pages/s", "x baseline", "CPU us/page"], rows)
    for name, target in judged.items():
        report.check(f"{label}{name} / baseline", ratios[name], ">=", target)


def against() -> list[str]:
    """The client at the checkout ``ASYNCSUBS_AGAINST`` names (models, prefetch=0), if any."""
    return [NO_SDK + AGAINST] if os.environ.get("ASYNCSUBS_AGAINST") else []


def small_records(report: Report, loop: str, turns: tuple[int, int]) -> None:
    """The fast server's page of small records, prefetch=0 (and the client at the checkout
    ``ASYNCSUBS_AGAINST`` names, if any, in the same turns)."""
    names = [*FAST_SEQUENTIAL, *against()]
    with fast_server(PAGE_SIZE, small=True) as server:
        results = take_turns(server, names, *turns, fresh=False, loop=loop)
    report.say(f"  event loop: {loop}; the fast server, a page of {PAGE_SIZE} small records")
    report_rows(report, [results], SMALL_JUDGED, f"{loop}, small records: ")


def bench(report: Report) -> None:
    short = (60, 10) if report.quick else (270, 10)  # turns, pages a turn
    long = (4, 100) if report.quick else (15, 200)
    report.say(
        f"  pages of {PAGE_SIZE} records (~77 kB); each source in a process of its own, one at a"
        f" time, order rotated every turn; prefetch=0 rows: sources kept open, {short[0]} turns x"
        f" {short[1]} pages; prefetch=1 rows: {long[0]} turns x {long[1]} pages, each turn a"
        " fresh source; pages/s over all of a source's turns; client rows: OpenTelemetry API"
        " installed, no SDK configured, unless the row says otherwise"
    )
    page_cpu_us = {}
    for loop in loops():
        with canned_server(PAGE_SIZE) as server:
            results = measure(server, loop, SEQUENTIAL, short, long)
        report.say(f"  event loop: {loop} (client and baseline alike); {server['name']} (uvloop)")
        report_rows(report, results, JUDGED, f"{loop}: ")
        page_cpu_us[loop] = results[0][NO_SDK][1]
        with fast_server(PAGE_SIZE) as server:
            results = measure(server, loop, [*FAST_SEQUENTIAL, *against()], short, long)
        report.say(f"  event loop: {loop}; the fast server: {server['name']}")
        report_rows(report, results, FAST_JUDGED, f"{loop}, fast server: ")
        small_records(report, loop, short)
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
        f" {page_cpu_us['asyncio']:,.0f} us a page costs the client, asyncio, models,"
        " prefetch=0)",
        median(cpu["API, no SDK configured"]) - off,
        "<=",
        TARGET_NO_SDK_SHARE * page_cpu_us["asyncio"],
        fmt="{:.1f}",
    )


async def _read_pages(base_url: str, decode: Callable[[bytes], Any]) -> AsyncGenerator[int, None]:
    """Pages with aiohttp, each read and decoded by ``decode`` (``None``: not decoded, the
    cursor found at the end of the body), and held until the next, as a consumer holds it."""
    url = f"{base_url}/admin/2026-04/subscriptions"
    headers = {"X-Service-Token": "token", "Accept": "application/json"}
    async with aiohttp.ClientSession() as session:
        params = {"pageSize": str(PAGE_SIZE)}
        while True:
            async with session.get(url, params=params, headers=headers) as response:
                body = await response.read()
            _held = decode(body)  # until the next page, as a consumer holds its page
            params["afterCursor"] = _CURSOR.findall(body[-200:])[-1].decode()
            yield PAGE_SIZE


async def _transport_pages(base_url: str) -> AsyncGenerator[int, None]:
    """Pages through the client's request building, transport and ``parse_page``."""
    transport = AiohttpTransport(max_response_bytes=1 << 25)
    base, headers = f"{base_url}/admin/2026-04/", request_headers("token")
    params: dict[str, Any] = {"pageSize": PAGE_SIZE}
    try:
        while True:
            request = build_request(
                base, "token", "GET", "subscriptions", params=params, headers=headers
            )
            raw = await transport.send(request, timeout=30.0)
            envelope = parse_page("GET", "subscriptions", raw)
            params["afterCursor"] = envelope.next_cursor
            yield len(envelope.data)
    finally:
        await transport.aclose()


async def _call_pages(base_url: str) -> AsyncGenerator[int, None]:
    """Pages through the client's call path (``_get_page``: limiter, telemetry, retries)."""
    async with AdminClient(
        token="token", base_url=base_url, store="profile", limits=LOOSE_LIMITS
    ) as client:
        params: dict[str, Any] = {"pageSize": PAGE_SIZE}
        while True:
            envelope = await client._get_page("subscriptions", params)
            params["afterCursor"] = envelope.next_cursor
            yield len(envelope.data)


_CURSOR = re.compile(rb'"nextCursor":"([^"]*)"')
#: The steps from aiohttp alone to the client's default pull: each adds one part to the step it
#: builds on (named after it).
STEPS: dict[str, tuple[Source, str | None]] = {
    "1 aiohttp get + read, no decoding": (lambda u: _read_pages(u, len), None),
    "2 json.loads: the baseline": (lambda u: _read_pages(u, json.loads), "1"),
    "3 msgspec instead": (lambda u: _read_pages(u, msgspec.json.decode), "1"),
    "4 client: request building, transport, parse_page": (_transport_pages, "3"),
    "5 the call path (limiter, telemetry, retries)": (_call_pages, "4"),
    "6 pagination: list(model=dict).pages()": (
        lambda u: client_pages(u, model=dict, prefetch=0),
        "5",
    ),
    "7 structuring: list().pages(), models": (
        lambda u: client_pages(u, model=None, prefetch=0),
        "6",
    ),
}


async def _step_costs(base_url: str, turns: int) -> dict[str, list[tuple[float, float]]]:
    """Each step's (CPU us, wall us) per page in each turn: one process, the collector off and
    every turn after a full collection (untimed), ten-page turns rotated."""
    names = list(STEPS)
    costs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    async with contextlib.AsyncExitStack() as stack:
        sources = {
            n: await stack.enter_async_context(aclosing(STEPS[n][0](base_url))) for n in names
        }
        for source in sources.values():
            await take(source, WARM_UP_PAGES)
        gc.disable()
        try:
            for turn in range(turns):
                for name in [*names[turn % len(names) :], *names[: turn % len(names)]]:
                    gc.collect()
                    seconds, cpu_seconds = await take(sources[name], 10)
                    costs[name].append((cpu_seconds / 10 * 1e6, seconds / 10 * 1e6))
        finally:
            gc.enable()
    return costs


def _collector_cost(conn: Connection, name: str, base_url: str, pages: int) -> None:
    """In a process of its own: CPU us per page, and the collector's share of it, of a pull."""
    collecting = [0.0, 0.0]  # CPU seconds in collections, and when the current one began

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting[1] = time.process_time()
        else:
            collecting[0] += time.process_time() - collecting[1]

    async def pull() -> tuple[float, float]:
        async with aclosing(SOURCES[name](base_url)) as source:
            await take(source, WARM_UP_PAGES)
            gc.callbacks.append(timed)
            _, cpu = await take(source, pages)
            gc.callbacks.remove(timed)
        return cpu / pages * 1e6, collecting[0] / pages * 1e6

    with conn:
        conn.send(run(pull))


def profile(report: Report) -> None:
    """Where the microseconds of a 100-record page go, against the fast server (``--profile``):
    :data:`STEPS` in one process with the collector off, then the collector's cost in a pull of
    the baseline and of the client, each in a process of its own."""
    turns, pages = (30, 500) if report.quick else (300, 2000)
    context = multiprocessing.get_context("spawn")
    with fast_server(PAGE_SIZE) as server:
        os.sched_setaffinity(0, {_cores(server["pid"]) or 0})
        costs = run(lambda: _step_costs(server["base_url"], turns))
        collected = {}
        for name in (BASELINE, NO_SDK):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=_collector_cost, args=(sender, name, server["base_url"], pages)
            )
            with _environment(PYTHONHASHSEED="0"):
                process.start()
            sender.close()
            collected[name] = receiver.recv()
            process.join()
    report.say(
        f"  where a page's time goes ({server['name']}, asyncio): {turns} turns x 10 pages each,"
        " one process, the collector off (a full collection before each turn, untimed); medians"
        " over the turns of CPU (this process) and wall time (which adds the server's and the"
        " network's), and of each step's difference from the one it builds on in the same turn"
    )
    by_number = {name.split()[0]: name for name in STEPS}
    rows = []
    for name, (_, base) in STEPS.items():
        turns_cpu, turns_wall = zip(*costs[name], strict=True)
        added = ""
        if base is not None:  # paired by turn: the machine's speed moves between turns
            pairs = zip(turns_cpu, (c for c, _ in costs[by_number[base]]), strict=True)
            added = f"{median([a - b for a, b in pairs]):+,.0f}"
        rows.append([name, median(turns_cpu), median(turns_wall), added, base or ""])
    report.table(["step", "CPU us/page", "wall us/page", "adds CPU us/page", "to step"], rows)
    report.say(f"  the collector, default settings, {pages:,} pages each in a process of its own:")
    report.table(
        ["source", "CPU us/page", "of which the collector"],
        [[name, cpu, gc_us] for name, (cpu, gc_us) in collected.items()],
    )
