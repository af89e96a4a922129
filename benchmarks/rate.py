"""A. Rate limits: running at the edge of a store's budget without tripping it.

One FakeAdminServer in its own process (default asyncio loop, so its clock is exact) enforces
50 req/s per store in a sliding window (heavy list pools 2/s) and answers after 10-30 ms. Each
phase uses fresh stores, touched once beforehand (``_common.warm_up``). The achieved rate is
counted by the server: accepted request starts in the phase's window over its length (see
``_common.achieved_rate``); 429s are the server's. The client runs on the default asyncio loop.

1. 200 tasks hammer one store with light requests (``GET subscriptions/<id>``): the client with
   the default ``safety_margin=0.02``, with 0.01 and with 0.0, side by side on their own stores;
   then, alone (its opening burst would disturb the others), the naive baseline: aiohttp +
   ``aiolimiter.AsyncLimiter(50, 1)``, 200 tasks, no retries.
2. A heavy list pull (``subscriptions``, page size 50, client heavy pool 2/s matching the
   server's) together with 200 light tasks on one store: each pool against its own rate.
3. 20 stores at once (50 tasks each, one shared aiohttp session on a
   ``TCPConnector(limit=0)``): every store against its
   rate, and the client's CPU seconds per 1,000 requests (``time.process_time`` of this process; the
   server's CPU is read from /proc), next to raw aiohttp sending the same requests.
4. One store from 4 threads, each running an event loop and a client of its own (50 tasks each,
   the default limiter): the threads together against the store's rate.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp

from asyncsubs import AdminClient, Limits, Rate
from asyncsubs.testing import FakeStoreConfig, RemoteFakeServer, ServerRateLimits

from ._common import (
    CpuMeter,
    Report,
    Tally,
    achieved_rate,
    all_stats,
    hammer,
    naive_tasks,
    pages_of,
    pct,
    raw_light_baseline,
    remote_server,
    run,
    run_tasks_for,
    subscription_ids,
    warm_up,
)

NAME = "rate"
TITLE = "A. Rate limits: 50 req/s sliding window, 10-30 ms latency (server in its own process)"

RATE = Rate(50, per=1.0)
HEAVY = Rate(2, per=1.0)
LATENCY = (0.010, 0.030)
TASKS = 200
RECORDS = 5000
MIN_ONE_STORE = 0.97
MIN_MANY_STORES = 0.95
MARGINS = (0.02, 0.01, 0.0)
NAIVE = "a1-naive"
BASELINE = "a3-baseline"
MANY = 20
TASKS_PER_STORE = 50
THREADS = 4


def client_limits(margin: float = 0.02) -> Limits:
    return Limits(
        global_rate=RATE,
        heavy={"subscriptions": HEAVY, "customers": HEAVY, "orders": HEAVY},
        safety_margin=margin,
    )


def client_for(remote: RemoteFakeServer, store: str, **kwargs: Any) -> AdminClient:
    return AdminClient(token=remote.tokens[store], base_url=remote.base_url, store=store, **kwargs)


async def phase_one(remote: RemoteFakeServer, seconds: float) -> dict[str, Any]:
    """The client at each safety margin, side by side on their own stores."""
    tallies: dict[str, Tally] = {}
    clients: dict[str, AdminClient] = {}
    coroutines = []
    for margin in MARGINS:
        store = f"a1-margin-{margin}"
        client = clients[store] = client_for(remote, store, limits=client_limits(margin))
        tally = tallies[store] = Tally()
        ids = subscription_ids(store, RECORDS)
        coroutines += [hammer(client, ids, tally, k, TASKS) for k in range(TASKS)]
    await warm_up(remote, list(clients))
    try:
        t0 = time.monotonic()  # system-wide: the server's loop clock
        await run_tasks_for(seconds + 0.5, coroutines)
        stats = {s: c.stats for s, c in clients.items()}
    finally:
        for client in clients.values():
            await client.aclose()
    return {"t0": t0, "tallies": tallies, "client_stats": stats}


async def phase_naive(remote: RemoteFakeServer, seconds: float) -> dict[str, Any]:
    """The baseline alone afterwards (its opening burst and 429s must not disturb the client)."""
    tally = Tally()
    await warm_up(remote, [NAIVE])
    async with aiohttp.ClientSession() as session:
        t0 = time.monotonic()
        await run_tasks_for(
            seconds + 0.5, naive_tasks(session, remote, NAIVE, tally, tasks=TASKS, records=RECORDS)
        )
    return {"t0": t0, "tally": tally}


async def phase_two(remote: RemoteFakeServer, seconds: float) -> dict[str, Any]:
    store = "a2-mixed"
    ids = subscription_ids(store, RECORDS)
    light, heavy = Tally(), Tally()
    await warm_up(remote, [store])
    async with client_for(remote, store, limits=client_limits()) as client:

        async def pull() -> None:
            listing = client.subscriptions.list(page_size=50)
            async with contextlib.aclosing(pages_of(listing)) as pages:
                async for page in pages:
                    heavy.ok += 1
                    assert page.has_next_page, "ran out of records: raise RECORDS"

        t0 = time.monotonic()
        await run_tasks_for(
            seconds + 0.5, [pull(), *(hammer(client, ids, light, k, TASKS) for k in range(TASKS))]
        )
        client_stats = client.stats
    return {"t0": t0, "light": light, "heavy": heavy, "client_stats": client_stats}


async def phase_three(remote: RemoteFakeServer, seconds: float) -> dict[str, Any]:
    stores = [f"a3-{i:02d}" for i in range(1, MANY + 1)]
    tallies = {s: Tally() for s in stores}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        clients = [client_for(remote, s, limits=client_limits(), session=session) for s in stores]
        await warm_up(remote, stores, session)
        coroutines = []
        for client, store in zip(clients, stores, strict=True):
            ids = subscription_ids(store, RECORDS)
            tally = tallies[store]
            coroutines += [
                hammer(client, ids, tally, k, TASKS_PER_STORE) for k in range(TASKS_PER_STORE)
            ]
        with CpuMeter(remote.process.pid) as meter:
            t0 = time.monotonic()
            await run_tasks_for(seconds + 0.5, coroutines)
        client_429 = sum(c.stats.rate_limited for c in clients)
        for client in clients:
            await client.aclose()
    return {
        "t0": t0,
        "stores": stores,
        "tallies": tallies,
        "meter": meter,
        "client_429": client_429,
    }


def phase_four(remote: RemoteFakeServer, seconds: float) -> dict[str, Any]:
    """One store from THREADS threads, each with an event loop and a client of its own."""
    store, per_thread = "a4-threads", TASKS // THREADS
    ids = subscription_ids(store, RECORDS)
    tallies = [Tally() for _ in range(THREADS)]

    async def thread_main(i: int) -> None:
        async with client_for(remote, store, limits=client_limits()) as client:
            firsts = range(i * per_thread, (i + 1) * per_thread)
            await run_tasks_for(
                seconds + 0.5, [hammer(client, ids, tallies[i], k, TASKS) for k in firsts]
            )

    run(lambda: warm_up(remote, [store]))
    t0 = time.monotonic()
    with ThreadPoolExecutor(THREADS) as pool:
        for thread in [pool.submit(run, lambda i=i: thread_main(i)) for i in range(THREADS)]:
            thread.result()  # a thread's crash is the bench's
    return {"t0": t0, "store": store, "tallies": tallies}


def bench(report: Report) -> None:
    seconds = 4.0 if report.quick else 20.0
    stores = [f"a1-margin-{m}" for m in MARGINS] + [NAIVE, "a2-mixed"]
    stores += [f"a3-{i:02d}" for i in range(1, MANY + 1)] + ["a4-threads"]
    limits = ServerRateLimits(
        global_rate=RATE,
        heavy={"subscriptions": HEAVY, "customers": HEAVY, "orders": HEAVY},
        window="sliding",
    )
    with remote_server(
        stores=[FakeStoreConfig(s) for s in stores]
        + [FakeStoreConfig(BASELINE, rate_limits=ServerRateLimits.disabled())],
        records={"subscriptions": RECORDS, "customers": 10, "orders": 10},
        latency=LATENCY,
        rate_limits=limits,
        # No request log: 10,000 kept records make the server's own GC pauses long enough
        # to bunch up arrival times (its rate limiter stamps a request when it handles it).
        request_log_size=1,
    ) as remote:
        report.say(
            f"  server: {RATE} per store (heavy pools {HEAVY}), sliding window, latency"
            f" {LATENCY[0] * 1e3:g}-{LATENCY[1] * 1e3:g} ms; {seconds:g} s per phase;"
            " client on the default asyncio loop"
        )
        one(report, remote, seconds)
        two(report, remote, seconds)
        three(report, remote, seconds)
        four(report, remote, seconds)


def one(report: Report, remote: RemoteFakeServer, seconds: float) -> None:
    result = run(lambda: phase_one(remote, seconds))
    naive_result = run(lambda: phase_naive(remote, seconds))
    stats = all_stats(remote)
    report.say(
        f"  A.1  {TASKS} tasks hammering one store, {seconds:g} s; the client rows side by side"
        " (each its own store), then the baseline alone"
    )
    rows = []
    figures = {}
    for store in [f"a1-margin-{m}" for m in MARGINS] + [NAIVE]:
        pool = stats[store].pool("global")
        t0 = naive_result["t0"] if store == NAIVE else result["t0"]
        count, rate = achieved_rate(pool.starts, t0, seconds)
        ratio = rate / RATE.per_second
        if store == NAIVE:
            label = "naive: aiohttp + AsyncLimiter(50, 1)"
            retries = "-"
            tally = naive_result["tally"]
        else:
            margin = float(store.rsplit("-", 1)[1])
            label = f"client, safety_margin={margin:g}" + (" (default)" if margin == 0.02 else "")
            retries = str(result["client_stats"][store].retries)
            tally = result["tallies"][store]
        figures[store] = (ratio, pool.rejected)
        rows.append(
            [
                label,
                count,
                rate,
                pct(ratio),
                pool.rejected,
                retries,
                pool.max_in_window(1.0),
                tally.failed,
            ]
        )
    report.table(
        ["", "accepted", "req/s", "x 50/s", "429s", "retries", "max in 1 s", "errors raised"],
        rows,
    )
    ratio, rejected = figures["a1-margin-0.02"]
    report.check("A.1 one store, default margin: achieved / allowed", ratio, ">=", MIN_ONE_STORE)
    report.check("A.1 one store, default margin: 429 responses", rejected, "==", 0, "{:.0f}")


def two(report: Report, remote: RemoteFakeServer, seconds: float) -> None:
    result = run(lambda: phase_two(remote, seconds))
    stats = all_stats(remote)["a2-mixed"]
    report.say(
        f"  A.2  heavy pull of subscriptions (page size 50) + {TASKS} light tasks, one store,"
        f" {seconds:g} s"
    )
    rows = []
    ratios = {}
    for pool, allowed in (("global", RATE), ("subscriptions", HEAVY)):
        counters = stats.pool(pool)
        count, rate = achieved_rate(counters.starts, result["t0"], seconds)
        ratios[pool] = rate / allowed.per_second
        rows.append([pool, str(allowed), count, rate, pct(ratios[pool]), counters.rejected])
    report.table(["pool", "allowed", "accepted", "req/s", "x allowed", "429s"], rows)
    report.check(
        "A.2 light pool with a heavy pull: achieved / allowed",
        ratios["global"],
        ">=",
        MIN_ONE_STORE,
    )
    report.check(
        "A.2 heavy pool with light load: achieved / allowed",
        ratios["subscriptions"],
        ">=",
        MIN_ONE_STORE,
    )
    report.check("A.2 429 responses", stats.rejected, "==", 0, "{:.0f}")


def three(report: Report, remote: RemoteFakeServer, seconds: float) -> None:
    requests = 1000 if report.quick else 3000
    base = run(lambda: raw_light_baseline(remote, BASELINE, requests))
    result = run(lambda: phase_three(remote, seconds))
    stats = all_stats(remote)
    meter: CpuMeter = result["meter"]
    ratios = []
    rejected = 0
    for store in result["stores"]:
        pool = stats[store].pool("global")
        _, rate = achieved_rate(pool.starts, result["t0"], seconds)
        ratios.append(rate / RATE.per_second)
        rejected += pool.rejected
    ok = sum(t.ok for t in result["tallies"].values())
    failed = sum(t.failed for t in result["tallies"].values())
    report.say(
        f"  A.3  {MANY} stores at once ({MANY} x {RATE} = {MANY * RATE.per_second:g} req/s),"
        f" {TASKS_PER_STORE} tasks each, one shared session, {seconds:g} s"
    )
    base_cpu = base.cpu / requests * 1000
    cpu = meter.cpu / ok * 1000
    report.table(
        [
            "",
            "req/s",
            "min / median / max per store",
            "429s",
            "errors raised",
            "client CPU s per 1,000 req",
            "client CPU",
            "server CPU",
        ],
        [
            [
                f"client, {MANY} stores",
                ok / meter.wall,
                " / ".join(
                    pct(r) for r in (min(ratios), sorted(ratios)[len(ratios) // 2], max(ratios))
                ),
                rejected,
                failed,
                cpu,
                pct(meter.utilisation),
                pct(meter.other_utilisation),
            ],
            [
                "baseline: raw aiohttp, no limiter, 20 at a time",
                requests / base.wall,
                "-",
                "-",
                "-",
                base_cpu,
                pct(base.utilisation),
                pct(base.other_utilisation),
            ],
        ],
    )
    report.say(
        f"  client CPU per request = {cpu / base_cpu:.2f} x raw aiohttp's (same light requests,"
        " same server; the baseline runs flat out, so it amortises loop wake-ups better)"
    )
    report.check(
        "A.3 20 stores: slowest store achieved / allowed", min(ratios), ">=", MIN_MANY_STORES
    )
    report.check("A.3 20 stores: 429 responses", rejected, "==", 0, "{:.0f}")


def four(report: Report, remote: RemoteFakeServer, seconds: float) -> None:
    result = phase_four(remote, seconds)
    pool = all_stats(remote)[result["store"]].pool("global")
    count, rate = achieved_rate(pool.starts, result["t0"], seconds)
    ratio = rate / RATE.per_second
    report.say(
        f"  A.4  one store from {THREADS} threads, each an event loop and a client of its own"
        f" ({TASKS // THREADS} tasks each, the default limiter), {seconds:g} s"
    )
    failed = sum(t.failed for t in result["tallies"])
    report.table(
        ["", "accepted", "req/s", "x 50/s", "429s", "max in 1 s", "errors raised"],
        [
            [
                f"client, {THREADS} threads",
                count,
                rate,
                pct(ratio),
                pool.rejected,
                pool.max_in_window(1.0),
                failed,
            ]
        ],
    )
    report.check("A.4 one store from 4 threads: achieved / allowed", ratio, ">=", MIN_ONE_STORE)
    report.check("A.4 one store from 4 threads: 429 responses", pool.rejected, "==", 0, "{:.0f}")
