"""G. Many stores: 1, 10, 50, 75 and 100 stores at 50 req/s each from one client process (75: full
runs only).

The FakeAdminServer runs in its own process (default asyncio loop, exact clock; 50 req/s per
store, sliding window, 10-30 ms latency, no request log). For each event loop of the client
(asyncio, uvloop) and each store count, fresh stores (touched once beforehand, see
``_common.warm_up``) are hammered with light requests (5 tasks per store, one AdminClient per
store, one shared aiohttp session) for the phase's duration.
Rates and 429s are the server's counts; CPU is ``time.process_time`` here and /proc for the
server.

Baseline in the same run: raw aiohttp sending the same light requests (no limiter, 20 at a
time) to the same server and decoding each answer with ``json.loads``, as C's raw loop does,
for CPU per request and for the server's capacity; the median of three runs of it before a
loop's rows and three after them. The target (every store >= 95% of
its rate, no 429) applies until a core saturates: a row where the client or the server would
use >= 90% of a core at the rate the stores allow (its measured share times allowed / sent
requests: a core that holds a row below that rate reads less busy than the rate would keep it)
is reported as saturated, naming the side, and is not judged; so is a row
where the client's loop no longer runs timers on time. A probe task sleeps 5 ms over and over
during the phase and records how late it wakes; when the 90th percentile of that lateness
exceeds ``LATE_LIMIT`` (10 ms, half of what the 2% margin floor spans at 50/s), one start in
ten goes out later than the floor allows for, whatever the CPU figure says (an event loop at
80-90% of a core runs long iterations), and the row reads "client loop" saturated.

Client CPU per request at 20 and 75 stores is judged against raw aiohttp sending the same
requests: at most ``MAX_CPU_RATIO`` times as much. The machine's speed drifts by tens of % over
seconds to minutes (both processes' CPU per request rise together), so runs one after the other
are not the measure (pairs of a raw run and a row run back to back read 1.01 to 1.50 for one
count in one run): after the rows, the client at each judged count (fresh stores) and raw aiohttp
flat out take turns in one loop, ``CPU_WINDOW`` s each (``CPU_WINDOWS`` turns a side, the first
and last ``CPU_SETTLE`` s of a turn not counted, after one turn a side that warms up: connections
made, every client's first call), and the median of the adjacent turns' ratios is judged. The
table's "x raw aiohttp" divides by the median of the baseline runs around the rows.

The largest counts run a second time with the process's garbage collector tuned as README.md
recommends for thousands of requests per second (``gc.freeze()`` after start-up and a gen-0
threshold of 10,000): with Python's default threshold of 700, a few hundred tasks in flight
trigger ~60 young collections a second and a 40-50 ms full one every two seconds, which alone
costs ~10% of a core and the pacing its p99 timer lateness. Those rows are labelled and judged
like the others.

Full runs add one more row at 75 stores without asyncsubs: the same light requests, 5 tasks per
store, through raw aiohttp behind one ``aiolimiter.AsyncLimiter(50, 1)`` per store (the loop a
user would write by hand, as in A.1), with no retries. Its accepted rate and 429s are printed
for comparison, not judged. Full runs also send the 20 stores' requests paced by nothing but an
``asyncio.sleep`` per store (5% over the rate's, so that no 429 skews them): through raw
aiohttp, and through the client with limits that never hold it. Their CPU per request says what
pacing costs at that load and what the client's own path does; printed, not judged.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import json
import time
from typing import Any

import aiohttp

from asyncsubs import AdminClient, Limits, Rate
from asyncsubs.testing import FakeStoreConfig, RemoteFakeServer, ServerRateLimits

from ._common import (
    LOOSE_LIMITS,
    CpuMeter,
    Report,
    Tally,
    achieved_rate,
    all_stats,
    hammer,
    loops,
    median,
    naive_tasks,
    pct,
    raw_headers,
    raw_light_baseline,
    remote_server,
    run,
    run_tasks_for,
    subscription_ids,
    warm_up,
)

NAME = "stores"
TITLE = "G. Many stores: 1/10/50/75/100 stores x 50 req/s from one client process (+ GC tuned)"
RATE = Rate(50, per=1.0)
LATENCY = (0.010, 0.030)
COUNTS = (1, 10, 20, 50, 75, 100)
QUICK_COUNTS = (1, 20, 50, 100)
#: Counts whose client CPU per request is judged against raw aiohttp's.
CPU_COUNTS = (20, 75)
MAX_CPU_RATIO = 1.3
#: Turns a side for the judged counts' CPU ratio, seconds counted in each, seconds not counted at
#: either end of it (the other side's requests under way end; this side's start).
CPU_WINDOWS, QUICK_CPU_WINDOWS = 20, 4
CPU_WINDOW, CPU_SETTLE = 0.5, 0.2
#: Raw aiohttp's requests at a time, flat out (as ``raw_light_baseline``'s).
RAW_CONCURRENCY = 20
LATE_LIMIT = 0.010
#: Counts run again with the garbage collector tuned (see the module docstring).
TUNED_COUNTS = (75, 100)
QUICK_TUNED_COUNTS = (100,)
GEN0_THRESHOLD = 10_000
TASKS_PER_STORE = 5
RECORDS = 500
MIN_RATIO = 0.95
SATURATED = 0.90
PROBE_PERIOD = 0.005
BASELINE_STORE = "g-baseline"
BASELINE_RUNS = 3


#: Rows: the client with Python's default GC, the client with the GC tuned, and (full runs only)
#: a hand-written baseline with no client at all, and, where the CPU per request is judged, the
#: same requests paced by a bare ``asyncio.sleep`` per store: through raw aiohttp, and through
#: the client with limits that never hold it (what pacing costs, and what the client's own path
#: costs at that load). Those three are printed, not judged.
DEFAULT, TUNED, NAIVE = "", "gc tuned", "naive: aiohttp + AsyncLimiter(50, 1)"
SLEPT_RAW, SLEPT_CLIENT = "raw aiohttp, sleep-paced", "client, loose limits, sleep-paced"
INFO = (NAIVE, SLEPT_RAW, SLEPT_CLIENT)
#: Count of the naive row, and of the sleep-paced ones.
NAIVE_COUNT, SLEPT_COUNT = 75, 20
#: The sleep-paced rows' interval: 5% over the rate's, so that no 429 (and its pause) skews them.
SLEPT_INTERVAL = RATE.interval * 1.05


def store_names(loop: str, count: int, variant: str = DEFAULT, cpu: bool = False) -> list[str]:
    """Fresh stores of one row; ``cpu``: of the judged counts' CPU turns."""
    tags = {DEFAULT: "", TUNED: "-gc", NAIVE: "-naive", SLEPT_RAW: "-sr", SLEPT_CLIENT: "-sc"}
    tag = tags[variant] + ("-cpu" if cpu else "")
    return [f"g-{loop}-{count}{tag}-{i:03d}" for i in range(count)]


def store_clients(
    remote: RemoteFakeServer, stores: list[str], session: aiohttp.ClientSession
) -> list[AdminClient]:
    """One client a store at ``RATE``, all on ``session``."""
    limits = Limits(global_rate=RATE)
    return [
        AdminClient(
            token=remote.tokens[s],
            base_url=remote.base_url,
            store=s,
            limits=limits,
            session=session,
        )
        for s in stores
    ]


async def phase(
    remote: RemoteFakeServer, stores: list[str], seconds: float, tune_gc: bool = False
) -> dict[str, Any]:
    tallies = {s: Tally() for s in stores}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        clients = store_clients(remote, stores, session)
        await warm_up(remote, stores, session)
        coroutines = []
        for client, store in zip(clients, stores, strict=True):
            ids = subscription_ids(store, RECORDS)
            coroutines += [
                hammer(client, ids, tallies[store], k, TASKS_PER_STORE)
                for k in range(TASKS_PER_STORE)
            ]
        threshold = gc.get_threshold()
        if tune_gc:
            gc.freeze()
            gc.set_threshold(GEN0_THRESHOLD, *threshold[1:])
        try:
            result = await measure(remote, seconds, coroutines, tallies)
        finally:
            gc.set_threshold(*threshold)
            gc.unfreeze()
        for client in clients:
            await client.aclose()
    return result


async def naive_phase(
    remote: RemoteFakeServer, stores: list[str], seconds: float
) -> dict[str, Any]:
    """The same load without asyncsubs: what a hand-written loop with a per-store leaky bucket
    gets (no retries; a 429 counts as an error)."""
    tallies = {s: Tally() for s in stores}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await warm_up(remote, stores, session)
        coroutines = []
        for store in stores:
            coroutines += naive_tasks(
                session, remote, store, tallies[store], tasks=TASKS_PER_STORE, records=RECORDS
            )
        return await measure(remote, seconds, coroutines, tallies)


async def _get_raw(session: Any, url: str, headers: dict[str, str], id_: int) -> None:
    async with session.get(f"{url}{id_}", headers=headers) as response:
        json.loads(await response.read())  # as raw_light_baseline's loop


async def _get_through(client: AdminClient, id_: int) -> None:
    await client.request("GET", f"subscriptions/{id_}")


async def slept_phase(
    remote: RemoteFakeServer, stores: list[str], seconds: float, client: bool
) -> dict[str, Any]:
    """The same requests, 5 tasks per store, each store's starts spaced ``SLEPT_INTERVAL`` apart
    by ``asyncio.sleep`` alone: through raw aiohttp, or through the client with ``LOOSE_LIMITS``."""
    tallies = {s: Tally() for s in stores}
    loop = asyncio.get_running_loop()

    async def task(
        ids: list[int], first: int, tally: Tally, get: Any, next_start: list[float]
    ) -> None:
        n = first
        while True:
            now = loop.time()
            start = next_start[0] = max(now, next_start[0])
            next_start[0] += SLEPT_INTERVAL
            await asyncio.sleep(start - now)
            await get(ids[n % len(ids)])
            tally.ok += 1
            n += TASKS_PER_STORE

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await warm_up(remote, stores, session)
        coroutines, admins = [], []
        url = f"{remote.api_url}subscriptions/"
        for store in stores:
            if client:
                admin = AdminClient(
                    token=remote.tokens[store],
                    base_url=remote.base_url,
                    store=store,
                    limits=LOOSE_LIMITS,
                    session=session,
                )
                admins.append(admin)
                get = functools.partial(_get_through, admin)
            else:
                get = functools.partial(_get_raw, session, url, raw_headers(remote, store))
            ids, next_start = subscription_ids(store, RECORDS), [loop.time()]
            coroutines += [
                task(ids, k, tallies[store], get, next_start) for k in range(TASKS_PER_STORE)
            ]
        result = await measure(remote, seconds, coroutines, tallies)
        for admin in admins:
            await admin.aclose()
        return result


async def cpu_ratio_phase(
    remote: RemoteFakeServer, stores: list[str], windows: int
) -> list[tuple[float, float]]:
    """Client CPU per request at ``stores`` and raw aiohttp's flat out, measured in windows that
    take turns in one loop (``CPU_WINDOW`` s each, after ``CPU_SETTLE`` s of start-up and
    before as long for the requests under way): ``windows`` (client, raw) pairs, in seconds
    per request, after one turn a side not counted. Each side waits at a gate while the other
    runs."""
    loop = asyncio.get_running_loop()
    gates = {"client": asyncio.Event(), "raw": asyncio.Event()}
    tallies = {"client": Tally(), "raw": Tally()}
    pairs: list[tuple[float, float]] = []

    def done(side: str) -> int:
        return tallies[side].ok + tallies[side].failed

    async def raw(session: aiohttp.ClientSession, first: int) -> None:
        ids = subscription_ids(BASELINE_STORE, RECORDS)
        headers, url = raw_headers(remote, BASELINE_STORE), f"{remote.api_url}subscriptions/"
        for n in itertools.count(first, RAW_CONCURRENCY):
            await gates["raw"].wait()
            await _get_raw(session, url, headers, ids[n % len(ids)])
            tallies["raw"].ok += 1

    async def take_turns() -> None:
        for k in range(-1, windows):  # the first turns warm up, as raw_light_baseline does
            per: dict[str, float] = {}
            for side in ("client", "raw") if k % 2 == 0 else ("raw", "client"):
                gates[side].set()
                await asyncio.sleep(CPU_SETTLE)
                cpu, count = time.process_time(), done(side)
                await asyncio.sleep(CPU_WINDOW)
                per[side] = (time.process_time() - cpu) / max(1, done(side) - count)
                gates[side].clear()
                await asyncio.sleep(CPU_SETTLE)
            if k >= 0:  # after connections are made and every client has sent
                pairs.append((per["client"], per["raw"]))

    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        aiohttp.ClientSession() as raw_session,
    ):
        clients = store_clients(remote, stores, session)
        await warm_up(remote, stores, session)
        await warm_up(remote, [BASELINE_STORE], raw_session, settle=0.0)
        coroutines = [
            hammer(
                client,
                subscription_ids(store, RECORDS),
                tallies["client"],
                k,
                TASKS_PER_STORE,
                gates["client"],
            )
            for client, store in zip(clients, stores, strict=True)
            for k in range(TASKS_PER_STORE)
        ]
        coroutines += [raw(raw_session, k) for k in range(RAW_CONCURRENCY)]
        tasks = [loop.create_task(c) for c in coroutines]
        try:
            await take_turns()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        for client in clients:
            await client.aclose()
    if failed := tallies["client"].failed:
        raise RuntimeError(f"CPU windows: {failed} client requests failed")
    return pairs


async def measure(
    remote: RemoteFakeServer,
    seconds: float,
    coroutines: list[Any],
    tallies: dict[str, Tally],
) -> dict[str, Any]:
    """Run a phase's load generators and the lateness probe for ``seconds``, metering CPU."""
    lateness: list[float] = []
    with CpuMeter(remote.process.pid) as meter:
        t0 = time.monotonic()  # system-wide: the server's loop clock
        await run_tasks_for(seconds + 0.5, [*coroutines, probe_loop(lateness)])
    lateness.sort()
    return {"t0": t0, "meter": meter, "tallies": tallies, "lateness": lateness}


async def probe_loop(lateness: list[float]) -> None:
    """How late the loop runs a task woken by a timer (what the limiter's pacing relies on)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + PROBE_PERIOD
        await asyncio.sleep(PROBE_PERIOD)
        lateness.append(max(0.0, loop.time() - due))


def percentile(values: list[float], fraction: float) -> float:
    """Of sorted ``values``."""
    return values[min(len(values) - 1, int(len(values) * fraction))] if values else float("nan")


def bench(report: Report) -> None:
    seconds = 2.0 if report.quick else 8.0
    counts = QUICK_COUNTS if report.quick else COUNTS
    rows_to_run = [(c, DEFAULT) for c in counts]
    rows_to_run += [(c, TUNED) for c in (QUICK_TUNED_COUNTS if report.quick else TUNED_COUNTS)]
    if not report.quick:
        rows_to_run += [(NAIVE_COUNT, NAIVE), (SLEPT_COUNT, SLEPT_RAW), (SLEPT_COUNT, SLEPT_CLIENT)]
    baseline_requests = 1000 if report.quick else 3000
    windows = QUICK_CPU_WINDOWS if report.quick else CPU_WINDOWS
    credit = LATE_LIMIT
    configs = [FakeStoreConfig(BASELINE_STORE, rate_limits=ServerRateLimits.disabled())]
    for loop in loops():
        for count, variant in rows_to_run:
            configs += [FakeStoreConfig(n) for n in store_names(loop, count, variant)]
        for count in CPU_COUNTS:
            configs += [FakeStoreConfig(n) for n in store_names(loop, count, cpu=True)]
    with remote_server(
        stores=configs,
        records={"subscriptions": RECORDS, "customers": 0, "orders": 0},
        latency=LATENCY,
        rate_limits=ServerRateLimits(global_rate=RATE, window="sliding"),
        request_log_size=1,
    ) as remote:
        report.say(
            f"  server: {RATE} per store, sliding window, latency {LATENCY[0] * 1e3:g}-"
            f"{LATENCY[1] * 1e3:g} ms, default asyncio loop; {TASKS_PER_STORE} tasks per store;"
            f" {seconds:g} s per row"
        )
        for loop in loops():

            def baselines(count: int = BASELINE_RUNS, loop: str = loop) -> list[CpuMeter]:
                return [
                    run(lambda: raw_light_baseline(remote, BASELINE_STORE, baseline_requests), loop)
                    for _ in range(count)
                ]

            # Runs before and after the rows, and their median: one 3-second run moved by a
            # third from run to run, and the machine's speed drifts over the minutes between.
            bases = baselines()
            rows = []
            verdicts = []
            naive_line = ""
            info_lines: list[tuple[str, float]] = []
            # (requests, client CPU s per 1,000, server CPU s per 1,000) of the busiest row
            busiest: tuple[float, float, float] = (0.0, float("nan"), float("nan"))
            for count, variant in rows_to_run:
                stores = store_names(loop, count, variant)
                if variant == NAIVE:
                    result = run(lambda s=stores: naive_phase(remote, s, seconds), loop)  # type: ignore[misc]
                elif variant in INFO:
                    result = run(
                        lambda s=stores, c=variant == SLEPT_CLIENT: slept_phase(
                            remote, s, seconds, c
                        ),  # type: ignore[misc]
                        loop,
                    )
                else:
                    result = run(
                        lambda s=stores, t=variant == TUNED: phase(remote, s, seconds, t),  # type: ignore[misc]
                        loop,
                    )
                label = f"{count} ({variant})" if variant else str(count)
                stats = all_stats(remote)
                meter: CpuMeter = result["meter"]
                ratios, rejected = [], 0
                for store in stores:
                    pool = stats[store].pool("global")
                    _, rate = achieved_rate(pool.starts, result["t0"], seconds)
                    ratios.append(rate / RATE.per_second)
                    rejected += pool.rejected
                ok = sum(t.ok for t in result["tallies"].values())
                failed = sum(t.failed for t in result["tallies"].values())
                ratios.sort()
                cpu_per_k = meter.cpu / ok * 1000 if ok else float("nan")
                if ok > busiest[0] and variant not in INFO:
                    busiest = (ok, cpu_per_k, meter.other_cpu / ok * 1000)
                # A core's share at the rate the stores allow: a row that a busy core holds
                # below it reads less busy than the full rate would keep it.
                sent = (ok + failed) / meter.wall
                scale = max(1.0, count * RATE.per_second / sent) if sent else 1.0
                saturated = [
                    side
                    for side, used in (
                        ("client", meter.utilisation),
                        ("server", meter.other_utilisation),
                    )
                    if used * scale >= SATURATED
                ]
                late90 = percentile(result["lateness"], 0.90)
                late99 = percentile(result["lateness"], 0.99)
                if "client" not in saturated and late90 > credit:
                    saturated.insert(0, "client loop")
                state = "saturated: " + " + ".join(saturated) if saturated else "-"
                rows.append(
                    [
                        label,
                        count * RATE.per_second,
                        ok / meter.wall,
                        f"{pct(ratios[0])} / {pct(ratios[len(ratios) // 2])}",
                        rejected,
                        failed,
                        cpu_per_k,
                        pct(meter.utilisation),
                        f"{late90 * 1e3:.1f} / {late99 * 1e3:.1f} ms",
                        pct(meter.other_utilisation),
                        state,
                    ]
                )
                if variant == NAIVE:
                    naive_line = (
                        f"  info  {loop}, {label}: slowest store {pct(ratios[0])}"
                        f" accepted, {rejected:,} 429s ({rejected / (ok + failed):.0%} of its"
                        " requests refused; a baseline, not judged)"
                    )
                elif variant in INFO:
                    info_lines.append((label, cpu_per_k))
                else:
                    verdicts.append((label, ratios[0], rejected, saturated))
            after = baselines()
            # (count, [client / raw CPU per request of each two adjacent turns])
            cpu_ratios: list[tuple[int, list[float]]] = []
            for count in CPU_COUNTS:
                fresh = store_names(loop, count, cpu=True)
                turns = run(lambda s=fresh: cpu_ratio_phase(remote, s, windows), loop)  # type: ignore[misc]
                cpu_ratios.append((count, [client / raw for client, raw in turns]))
            runs = bases + after
            base = sorted(runs, key=lambda b: b.cpu)[len(runs) // 2]
            base_cpu = base.cpu / baseline_requests * 1000

            def per_k(runs: list[CpuMeter]) -> str:
                return ", ".join(f"{b.cpu / baseline_requests * 1000:.3f}" for b in runs)

            report.say(
                f"  [{loop}] baseline, raw aiohttp (median of {len(runs)} runs, CPU s"
                f" per 1,000: {per_k(bases)} before the rows, {per_k(after)} after):"
                f" {baseline_requests / base.wall:,.0f} req/s (client CPU {pct(base.utilisation)},"
                f" server CPU {pct(base.other_utilisation)}); CPU s per 1,000 requests: client"
                f" {base_cpu:.3f}, server {base.other_cpu / baseline_requests * 1000:.3f}"
            )
            report.table(
                [
                    "stores",
                    "allowed req/s",
                    "achieved req/s",
                    "min / median per store",
                    "429s",
                    "errors",
                    "client CPU s / 1k req",
                    "x raw aiohttp",
                    "client CPU",
                    "client loop lateness p90 / p99",
                    "server CPU",
                    "saturation",
                ],
                # Each row's CPU over the baseline's, known once the runs after the rows are in.
                [[*row[:7], row[6] / base_cpu, *row[7:]] for row in rows],
            )
            capacity = 1000 / busiest[1]
            report.say(
                f"  [{loop}] busiest row: the client spent {busiest[1]:.3f} CPU s per 1,000"
                f" requests (one core: ~{capacity:,.0f} req/s, ~{capacity / RATE.per_second:.0f}"
                f" stores), the server {busiest[2]:.3f}; raw aiohttp alone"
                f" {base_cpu:.3f} (at its own, lower load)"
            )
            report.say(
                f"  [{loop}] saturated: a core >= {pct(SATURATED)} busy at the allowed rate (its"
                " share scaled by allowed / sent requests), or the client loop's"
                f" p90 timer lateness above {credit * 1e3:.1f} ms"
            )
            if naive_line:
                report.say(naive_line)
            for label, cpu_per_k in info_lines:
                report.say(
                    f"  info  {loop}, {label}: client CPU per request"
                    f" {cpu_per_k / base_cpu:.2f}x raw aiohttp flat out (not judged)"
                )
            for count, ratios in cpu_ratios:
                ordered = sorted(ratios)
                quartiles = f"{percentile(ordered, 0.25):.2f}-{percentile(ordered, 0.75):.2f}"
                report.check(
                    f"{loop}, {count} stores: client CPU per request / raw aiohttp's, median of"
                    f" {len(ratios)} turns taken in one loop (quartiles {quartiles})",
                    median(ratios),
                    "<=",
                    MAX_CPU_RATIO,
                    "{:.2f}",
                )
            for label, slowest, rejected, saturated in verdicts:
                if saturated:
                    report.say(
                        f"  n/a   {loop}, {label} stores: {' + '.join(saturated)} saturated;"
                        f" slowest store {pct(slowest)}, {rejected} 429s (not judged)"
                    )
                    continue
                report.check(
                    f"{loop}, {label} stores: slowest store achieved / allowed",
                    slowest,
                    ">=",
                    MIN_RATIO,
                )
                report.check(f"{loop}, {label} stores: 429 responses", rejected, "==", 0, "{:.0f}")
