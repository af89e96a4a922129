"""F. Prefetch: with server latency L and a consumer spending L per page, ``prefetch=1`` overlaps
the two, so it should approach 2x the speed of ``prefetch=0`` (target >= 1.7x).

A FakeAdminServer in its own process answers after L = 50 ms (no rate limits); the consumer
awaits L per page (``asyncio.sleep``: the typical consumer writes each page somewhere). Runs
alternate between prefetch=0 (the baseline) and prefetch=1; the figure is the ratio of median
times. A consumer that blocks the loop for L instead (``time.sleep``, CPU-bound work) is shown
for information: the request for the next page is already on the wire before the consumer runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from asyncsubs import AdminClient
from asyncsubs.testing import FakeStoreConfig

from ._common import LOOSE_LIMITS, Report, loops, median, remote_server, run

NAME = "prefetch"
TITLE = "F. Prefetch: latency 50 ms, consumer 50 ms per page: prefetch=1 vs prefetch=0"
LATENCY = 0.05
PAGE_SIZE = 50
TARGET = 1.7
STORE = "prefetch"


async def pull(
    base_url: str, token: str, pages: int, prefetch: int, work: Callable[[], Any]
) -> float:
    async with AdminClient(
        token=token, base_url=base_url, store=STORE, limits=LOOSE_LIMITS
    ) as client:
        t0 = time.perf_counter()
        seen = 0
        async for _ in client.subscriptions.list(page_size=PAGE_SIZE, prefetch=prefetch).pages():
            seen += 1
            await work()
        assert seen == pages, seen
        return time.perf_counter() - t0


async def async_work() -> None:
    await asyncio.sleep(LATENCY)


async def blocking_work() -> None:
    time.sleep(LATENCY)  # noqa: ASYNC251 - the point: a consumer that blocks the loop


def bench(report: Report) -> None:
    pages, rounds = (10, 1) if report.quick else (20, 3)
    report.say(
        f"  {pages} pages of {PAGE_SIZE}, server latency {LATENCY * 1e3:g} ms, consumer"
        f" {LATENCY * 1e3:g} ms per page, {rounds} alternating round(s), median"
    )
    with remote_server(
        stores=[FakeStoreConfig(STORE)],
        records={"subscriptions": pages * PAGE_SIZE, "customers": 0, "orders": 0},
        rate_limits=None,
        latency=LATENCY,
    ) as remote:
        token = remote.tokens[STORE]
        cases = [(loop, "async", async_work) for loop in loops()]
        cases.append(("asyncio", "blocking (info)", blocking_work))
        rows: list[tuple[str, str, float, float, float, float]] = []
        for loop, kind, work in cases:
            times: dict[int, list[float]] = {0: [], 1: []}
            for _ in range(rounds):
                for prefetch in (0, 1):
                    seconds = run(
                        lambda p=prefetch, w=work: pull(remote.base_url, token, pages, p, w),  # type: ignore[misc]
                        loop,
                    )
                    times[prefetch].append(seconds)
            t0, t1 = median(times[0]), median(times[1])
            ideal = pages * 2 * LATENCY / ((pages + 1) * LATENCY)
            rows.append((loop, kind, t0, t1, t0 / t1, ideal))
        report.table(
            ["loop", "consumer", "prefetch=0 s", "prefetch=1 s", "speed-up", "ideal"], rows
        )
        for loop, kind, _, _, speedup, _ in rows:
            if "info" not in kind:
                report.check(f"{loop}: prefetch=1 speed-up over prefetch=0", speedup, ">=", TARGET)
