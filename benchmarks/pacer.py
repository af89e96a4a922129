"""H. The pacer against servers that are not ours: arrival jitter, lower limits, headers.

Every row starts a fresh FakeAdminServer in its own process (default asyncio loop) and drives
it from a fresh client with no warm-up, as a first sync would: 429s at the cold start count.
The server stamps each request only after its ``inbound_delay`` (an auth step or a proxy queue
in front of its limiter), and answers after 10-30 ms of outbound latency. Achieved rates are
the server's accepted starts over the row's length (``_common.achieved_rate``), as a ratio of
what the server allows; 429s are counted by the client at the row's mark and at its end.
Each row also prints its slack (``closest_to_a_window``): how close the pacing came to a
sliding log's refusal after the mark, which a count of 429s shows only once it is crossed.

1. Jitter: inbound delay 0, 10-30 ms, 20-60 ms x sliding, fixed and leaky-bucket windows x 1
   store (200 tasks) and 20 stores (50 tasks each, one shared session), 50/s enforced and
   configured. Targets: >= 0.97 / 0.95 / 0.93 of 50/s for the three delays (every store), at
   most one 429 per store in the first 10 s and none after.
2. Unannounced lower limit: the server enforces 40/s, the client is configured for 50/s,
   sliding window, 60 s. Target: >= 0.90 of 40/s, at most 3 x 429 per minute after 20 s.
3. Announced lower limit: the same with IETF ``RateLimit-Policy``/``RateLimit`` headers, and
   again with ``X-RateLimit-*`` headers, 30 s. Target: >= 0.95 of 40/s, at most 1 x 429.
4. Heavy pool: 2/s enforced and configured, pages built in 100-800 ms after the stamp (the
   server's outbound latency), three pulls at once, no inbound delay, 30 s. Target: >= 0.97
   of 2/s, no 429.
5. Stalls: a server that stamps nothing for 40 ms every 5 s, then stamps what it held at once
   (a collector pause, a process descheduled), sliding window, 20 stores, 30 s. Printed, not
   judged: the late stamps overflow a window a second later unless the margin has grown by
   then; the row shows how often that still happens.
6. A loaded machine: H.1's 0 ms fixed-window row for 20 stores, with a process spinning on
   every core beside the client and the server (``busy_cores``), so that both wait for a core
   now and then and start, stamp and read requests late, as in a slow hour of a shared VM.
   Printed, not judged: what the client gives up when its machine is busy, and that it still
   draws no 429.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from typing import Any

import aiohttp

from asyncsubs import AdminClient, Limits, Rate
from asyncsubs.limiting import Limiter
from asyncsubs.testing import FakeStoreConfig, RemoteFakeServer, ServerRateLimits
from asyncsubs.testing._limits import Window

from ._common import (
    Report,
    Tally,
    achieved_rate,
    all_stats,
    busy_cores,
    hammer,
    pages_of,
    remote_server,
    run,
    run_tasks_for,
    subscription_ids,
    warm_up,
)

NAME = "pacer"
TITLE = "H. Pacer: arrival jitter, windows, lower limits, rate-limit headers, heavy pages"

RATE = Rate(50, per=1.0)
HEAVY = Rate(2, per=1.0)
LATENCY = (0.010, 0.030)
RECORDS = 5000
DELAYS: Sequence[tuple[str, Any, float]] = (
    ("0", None, 0.97),
    ("10-30 ms", (0.010, 0.030), 0.95),
    ("20-60 ms", (0.020, 0.060), 0.93),
)
WINDOWS: tuple[Window, ...] = ("sliding", "fixed", "leaky")
#: H.5: a server that stamps nothing for 40 ms every 5 s, then what it held at once.
STALLS = (5.0, 0.040)


def heavy_map(rate: Rate) -> dict[str, Rate]:
    return {"subscriptions": rate, "customers": rate, "orders": rate}


async def drive(
    remote: RemoteFakeServer,
    stores: Sequence[str],
    tasks_per_store: int,
    seconds: float,
    mark: float,
    *,
    pulls: int = 0,
    warm: bool = True,
) -> dict[str, Any]:
    """Hammer (or, with ``pulls``, list-pull) every store for ``seconds``; 429s at ``mark``."""
    limits = Limits(global_rate=RATE, heavy=heavy_map(HEAVY))
    # Every row is a fresh client against a fresh server: nothing learnt in the row before (the
    # default limiter's is process-wide and the rows reuse store names).
    limiter = Limiter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        if warm:
            await warm_up(remote, stores, session)
        clients = {
            s: AdminClient(
                token=remote.tokens[s],
                base_url=remote.base_url,
                store=s,
                limits=limits,
                session=session,
                limiter=limiter,
            )
            for s in stores
        }
        coroutines = []
        for store, client in clients.items():
            if pulls:
                coroutines += [pull(client) for _ in range(pulls)]
            else:
                ids = subscription_ids(store, RECORDS)
                tally = Tally()
                coroutines += [
                    hammer(client, ids, tally, k, tasks_per_store) for k in range(tasks_per_store)
                ]

        marked: dict[str, int] = {}

        async def snapshot() -> None:
            await asyncio.sleep(mark)
            marked.update({s: c.stats.rate_limited for s, c in clients.items()})

        t0 = time.monotonic()
        watcher = asyncio.ensure_future(snapshot())
        await run_tasks_for(seconds, coroutines)
        await watcher
        final = {s: c.stats for s, c in clients.items()}
        for client in clients.values():
            await client.aclose()
    return {"t0": t0, "marked": marked, "final": final}


async def pull(client: AdminClient) -> None:
    while True:
        listing = client.subscriptions.list(page_size=50, prefetch=0)
        async with contextlib.aclosing(pages_of(listing)) as pages:
            async for _ in pages:
                pass


def closest_to_a_window(starts: Sequence[float], n: int, after: float) -> float:
    """How much more than a second the closest ``n + 1`` accepted starts after ``after`` spanned:
    a sliding log refuses below 0, so this is the room a row kept on the server's side."""
    kept = sorted(t for t in starts if t >= after)
    return min((b - a for a, b in zip(kept, kept[n:], strict=False)), default=math.inf) - 1.0


def row(
    report: Report,
    label: str,
    *,
    server: dict[str, Any],
    stores: int,
    seconds: float,
    mark: float,
    allowed: float,
    pool: str = "global",
    pulls: int = 0,
) -> dict[str, float]:
    names = [f"h-{i:02d}" for i in range(1, stores + 1)]
    with remote_server(
        stores=[FakeStoreConfig(s) for s in names],
        records={"subscriptions": RECORDS, "customers": 10, "orders": 10},
        request_log_size=1,
        **server,
    ) as remote:
        tasks = 200 if stores == 1 else 50
        result = run(lambda: drive(remote, names, tasks, seconds, mark, pulls=pulls))
        stats = all_stats(remote)
    rates, slacks = [], []
    for s in names:
        starts = stats[s].pool(pool).starts
        _, achieved = achieved_rate(starts, result["t0"], seconds)
        rates.append(achieved / allowed)
        slacks.append(closest_to_a_window(starts, int(allowed), result["t0"] + mark))
    early = max(result["marked"].get(s, 0) for s in names)
    late = max(result["final"][s].rate_limited - result["marked"].get(s, 0) for s in names)
    p = result["final"][names[0]].pools[pool]
    figures = {
        "min": min(rates),
        "mean": sum(rates) / len(rates),
        "early": float(early),
        "late": float(late),
        "mark": mark,
    }
    headers = ["row", "min rate", "mean rate", f"429/store <{mark:g}s", "after", "slack ms"]
    values = [label, figures["min"], figures["mean"], early, late, min(slacks) * 1e3]
    report.table([*headers, "interval", "by"], [[*values, p.interval * 1e3, p.paced_by]])
    return figures


def jitter_row(
    report: Report, label: str, delay: Any, window: Window, stores: int, seconds: float
) -> dict[str, float]:
    """An H.1 row: the server stamps after ``delay`` (None: at once) in ``window``s of 50/s."""
    return row(
        report,
        label,
        server={
            "inbound_delay": delay,
            "latency": LATENCY,
            "rate_limits": ServerRateLimits(
                global_rate=RATE, heavy=heavy_map(HEAVY), window=window
            ),
        },
        stores=stores,
        seconds=seconds,
        mark=min(10.0, seconds / 2),
        allowed=RATE.per_second,
    )


def printed(report: Report, label: str, f: dict[str, float]) -> None:
    """The figures of a row that is printed, not judged."""
    report.say(
        f"  info  {label}: slowest store {f['min']:.3f}, mean {f['mean']:.3f}; most 429s a store"
        f" drew: {f['early']:.0f} in the first {f['mark']:g} s, {f['late']:.0f} after (not judged)"
    )


def bench(report: Report) -> None:
    quick = report.quick
    seconds = 8.0 if quick else 30.0
    for delay_label, delay, target in DELAYS:
        for window in WINDOWS:
            for stores in (1, 20):
                label = f"{delay_label} {window} x{stores}"
                f = jitter_row(report, label, delay, window, stores, seconds)
                report.check(f"H.1 {label}: min rate", f["min"], ">=", target)
                report.check(f"H.1 {label}: 429/store early", f["early"], "<=", 1, "{:.0f}")
                report.check(f"H.1 {label}: 429/store after", f["late"], "<=", 0, "{:.0f}")
    lower = Rate(40, per=1.0)
    long = 20.0 if quick else 60.0
    f = row(
        report,
        "unannounced 40/s",
        server={
            "latency": LATENCY,
            "rate_limits": ServerRateLimits(global_rate=lower, heavy=heavy_map(HEAVY)),
        },
        stores=1,
        seconds=long,
        mark=min(20.0, long / 2),
        allowed=lower.per_second,
    )
    report.check("H.2 unannounced 40/s: rate", f["min"], ">=", 0.90)
    per_minute = f["late"] * 60.0 / (long - min(20.0, long / 2))
    report.check("H.2 unannounced 40/s: 429/min after 20 s", per_minute, "<=", 3, "{:.1f}")
    for style in ("ietf", "x"):
        f = row(
            report,
            f"announced 40/s ({style})",
            server={
                "latency": LATENCY,
                "rate_limits": ServerRateLimits(
                    global_rate=lower, heavy=heavy_map(HEAVY), headers=style
                ),
            },
            stores=1,
            seconds=seconds,
            mark=seconds / 2,
            allowed=lower.per_second,
        )
        report.check(f"H.3 announced ({style}): rate", f["min"], ">=", 0.95)
        report.check(f"H.3 announced ({style}): 429s", f["early"] + f["late"], "<=", 1, "{:.0f}")
    f = row(
        report,
        "heavy 2/s, 100-800 ms pages",
        server={
            "latency": (0.100, 0.800),
            "rate_limits": ServerRateLimits(global_rate=RATE, heavy=heavy_map(HEAVY)),
        },
        stores=1,
        seconds=seconds,
        mark=seconds / 2,
        allowed=HEAVY.per_second,
        pool="subscriptions",
        pulls=3,
    )
    report.check("H.4 heavy pages: rate", f["min"], ">=", 0.97)
    report.check("H.4 heavy pages: 429s", f["early"] + f["late"], "<=", 0, "{:.0f}")
    f = row(
        report,
        "stalls of 40 ms every 5 s x20",
        server={
            "latency": LATENCY,
            "stalls": STALLS,
            "rate_limits": ServerRateLimits(global_rate=RATE),
        },
        stores=20,
        seconds=seconds,
        mark=min(10.0, seconds / 2),
        allowed=RATE.per_second,
    )
    printed(report, "H.5 stalls", f)
    with busy_cores():
        f = jitter_row(report, "0 fixed x20, every core busy", None, "fixed", 20, seconds)
    printed(report, "H.6 loaded machine", f)
