"""Tests for asyncsubs._limiter and _calibration on a virtual clock.

The ``clock`` fixture makes the running loop's ``time()`` virtual and lets the selector jump it
straight to the next timer instead of blocking, so seconds of pacing run in microseconds and
every start time is exact.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import itertools
import logging
import math
import random
import re
import sys
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import attrs
import pytest
from virtual_clock import VirtualClock

import asyncsubs
from asyncsubs import AdminClient
from asyncsubs._calibration import SLOWDOWN_HALF_LIFE, SLOWDOWN_STEP, Jitter, Slowdown
from asyncsubs._config import Limits, Rate
from asyncsubs._limiter import DEFAULT_LIMITER
from asyncsubs._protocol import RawResponse, Request
from asyncsubs._server_limits import ServerLimit
from asyncsubs.errors import ConfigError, LimiterUnavailableError, RateLimitError
from asyncsubs.limiting import (
    Limiter,
    LimiterStats,
    MemoryPacing,
    PoolStats,
    Slot,
    StoreLimiter,
)

EPS = 1e-9


def limits(
    n: int = 10, per: float = 1.0, *, max_in_flight: int = 64, margin: float = 0.0, **heavy: Rate
) -> Limits:
    """Limits whose margin is fixed (floor = cap = start), so intervals are exact."""
    return Limits(
        global_rate=Rate(n, per=per),
        heavy=heavy or {},
        max_in_flight=max_in_flight,
        safety_margin=margin,
        max_margin=margin,
    )


def interval_of(lim: Limits, pool: str = "global") -> float:
    return lim.rate_for(pool).interval * (1 + lim.safety_margin)


def max_starts_in_window(starts: Iterable[float], per: float) -> int:
    """The most starts any closed window of ``per`` seconds holds."""
    s = sorted(starts)
    return max((bisect.bisect_right(s, t + per) - i for i, t in enumerate(s)), default=0)


def gaps(starts: list[float]) -> list[float]:
    s = sorted(starts)
    return [b - a for a, b in itertools.pairwise(s)]


async def request(
    sl: StoreLimiter,
    pool: str,
    starts: list[float],
    hold: float = 0.0,
    tag: object = None,
    order: list[object] | None = None,
) -> None:
    async with sl.slot(pool):
        starts.append(asyncio.get_running_loop().time())
        if order is not None:
            order.append(tag)
        if hold:
            await asyncio.sleep(hold)


def spawn(n: int, sl: StoreLimiter, pool: str, starts: list[float], **kw: Any) -> list[Any]:
    return [asyncio.create_task(request(sl, pool, starts, **kw)) for _ in range(n)]


async def settle() -> None:
    """Let every ready callback run without letting virtual time pass."""
    for _ in range(10):
        await asyncio.sleep(0)


# ---------------------------------------------------------------------------------------------
# Pacing (GCRA without burst)


@pytest.mark.parametrize(
    "rate", [Rate(50, per=1.0), Rate(2, per=3.0), Rate(1, per=1.0), Rate(7, per=0.5)]
)
async def test_cold_start_is_paced_without_burst(clock: VirtualClock, rate: Rate) -> None:
    lim = limits(rate.n, rate.per, margin=0.02)
    sl = Limiter().bind("acme", lim)
    t0 = clock.now
    starts: list[float] = []
    await asyncio.gather(*spawn(4 * rate.n + 3, sl, "global", starts))

    assert starts[0] == t0  # the first request does not wait
    assert max_starts_in_window(starts, rate.per) <= rate.n
    # Even spacing: every gap is one interval, neither shorter nor (with no other limit) longer.
    assert gaps(starts) == pytest.approx([interval_of(lim)] * (len(starts) - 1))


async def test_aiolimiter_would_burst_ours_does_not(clock: VirtualClock) -> None:
    # Why we do not use aiolimiter's AsyncLimiter: a fresh one lets a full bucket through at once.
    from aiolimiter import AsyncLimiter

    bucket = AsyncLimiter(10, 1)
    burst: list[float] = []

    async def leaky() -> None:
        async with bucket:
            burst.append(clock.now)

    await asyncio.gather(*(leaky() for _ in range(10)))
    assert max_starts_in_window(burst, 0.1) == 10

    sl = Limiter().bind("acme", limits(10, 1.0))
    starts: list[float] = []
    await asyncio.gather(*spawn(10, sl, "global", starts))
    assert max_starts_in_window(starts, 0.099) == 1


async def test_idle_pool_starts_at_once_but_never_closer_than_interval(
    clock: VirtualClock,
) -> None:
    lim = limits(10, 1.0)
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    await request(sl, "global", starts)
    await asyncio.sleep(interval_of(lim) / 2)
    await request(sl, "global", starts)  # too soon: waits out the rest of the interval
    await asyncio.sleep(5 * interval_of(lim))
    t = clock.now
    await request(sl, "global", starts)  # idle long enough: starts at once
    assert gaps(starts)[0] == pytest.approx(interval_of(lim))
    assert starts[2] == t


async def test_late_timers_do_not_add_up(clock: VirtualClock) -> None:
    """Real loops wake timers ~1 ms late. The next slot follows the previous *slot*, not the
    late start, so lateness neither lowers the rate nor (being constant) bunches starts."""
    clock.lateness = 0.001
    lim = limits(50, 1.0, margin=0.02)
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    await asyncio.gather(*spawn(500, sl, "global", starts))
    achieved = (len(starts) - 1) / (starts[-1] - starts[0])
    assert achieved == pytest.approx(50 / 1.02, rel=1e-3)
    assert max_starts_in_window(starts, 1.0) <= 50


async def test_a_start_later_than_the_room_paces_the_next_from_it(clock: VirtualClock) -> None:
    """A blocked loop (a full garbage collection) starts a request 120 ms late. At 2/s with 2%
    margin, the slots after it would put three starts in one second from it (a 429 from a
    sliding window); the pool's pace restarts from the late start instead, so the starts after
    it keep the whole 20 ms margin for the server's stamps (the excess alone would leave none)."""
    lim = limits(2, 1.0, margin=0.02)
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    for i in range(8):
        if i == 2:
            clock.late_once = 0.12
        await request(sl, "global", starts)
    assert starts[2] - starts[1] == pytest.approx(0.51 + 0.12)
    assert starts[3] - starts[2] == pytest.approx(0.51)
    assert min(b - a for a, b in zip(starts, starts[2:], strict=False)) >= 1.02 - EPS
    assert gaps(starts)[3:] == pytest.approx([0.51] * 4)  # then paced as before


async def test_a_runs_first_answer_paces_a_lone_heavy_pool(clock: VirtualClock) -> None:
    """A run's first heavy page is answered 0.3 s after it went out: a server that took a burst
    of first requests at once may have stamped it that late, and nothing yet tells how late. A
    lone puller's third start then comes a window after that answer (at 2/s with a 10% margin:
    0.1 s of room, less than the 0.3 s); later answers pace nothing. Beside a second puller the
    pool keeps its pace: the rule is for a pool whose starts wait on its answers."""

    async def pull(sl: StoreLimiter, starts: list[float], t0: float) -> None:
        for page in range(4):
            async with sl.slot("orders"):
                starts.append(clock.now - t0)
                await asyncio.sleep(0.3 if page == 0 else 0.05)

    for pullers in (1, 2):
        sl = Limiter().bind("acme", limits(orders=Rate(2, per=1.0), margin=0.10))
        starts: list[float] = []
        await asyncio.gather(*(pull(sl, starts, clock.now) for _ in range(pullers)))
        if pullers == 1:
            assert starts[:3] == pytest.approx([0.0, 0.75, 1.3])
            assert gaps(starts)[2:] == pytest.approx([0.55])
        else:
            assert gaps(starts) == pytest.approx([0.55] * 7)


@pytest.mark.parametrize(("late", "restarts"), [(0.06, True), (0.04, False)])
async def test_a_start_keeps_half_the_room_for_the_server(
    clock: VirtualClock, late: float, restarts: bool
) -> None:
    """At 2/s with a 10% margin (a pool at the start margin) three starts span 1.1 s: 0.1 s of
    room. A start 0.06 s late, inside the room, would leave the server 0.04 s for its own delay
    before it stamps; past half the room the pace restarts from it. A start late by less than
    half leaves the pace as it was: no start is lost to the loop's usual lateness."""
    sl = Limiter().bind("acme", limits(2, 1.0, margin=0.10))
    starts: list[float] = []
    for i in range(5):
        if i == 1:
            clock.late_once = late
        await request(sl, "global", starts)
    if restarts:
        assert gaps(starts) == pytest.approx([0.55 + late] + [0.55] * 3)
        assert starts[3] - starts[1] == pytest.approx(1.1)
    else:
        assert gaps(starts) == pytest.approx([0.55 + late, 0.55 - late, 0.55, 0.55])
        assert starts[3] - starts[1] == pytest.approx(1.1 - late)


async def test_a_request_whose_connection_comes_late_paces_the_next_from_it(
    clock: VirtualClock,
) -> None:
    """The slot is on time, but a new connection takes 150 ms (60 opened at once by a busy
    loop): when it is handed out, ``sending`` restarts the pool's pace from it, so that three
    starts at 2/s span a second and the margin from the late one."""
    sl = Limiter().bind("acme", limits(2, 1.0, margin=0.02))
    starts: list[float] = []
    for i in range(6):
        async with sl.slot("global") as slot:
            if i == 1:
                clock.now += 0.15  # connecting
                slot.sending()
            starts.append(clock.now)
    assert starts[2] - starts[1] == pytest.approx(0.51)
    assert min(b - a for a, b in zip(starts, starts[2:], strict=False)) >= 1.02 - EPS
    # Without the call the next start would be due 0.36 s after the late one, as before.
    sl2 = Limiter().bind("acme", limits(2, 1.0, margin=0.02))
    late: list[float] = []
    for i in range(3):
        async with sl2.slot("global"):
            clock.now += 0.15 if i == 1 else 0.0
            late.append(clock.now)
    assert late[2] - late[1] == pytest.approx(0.51 - 0.15)


async def test_the_client_reports_a_requests_connection_to_its_slot(clock: VirtualClock) -> None:
    """The client's own connector calls ``on_connected`` as it hands a request its connection
    (tests/test_client.py); the client passes each request the slot's, to any transport whose
    ``send`` takes it. A transport stands in for the connector here: the second request
    connects for 150 ms."""
    sent: list[float] = []

    class Connecting:
        async def send(
            self,
            request: Request,
            *,
            timeout: float,
            on_connected: Callable[[], None] | None = None,
        ) -> RawResponse:
            callback = on_connected
            assert callback is not None
            if len(sent) == 1:
                clock.now += 0.15
            callback()
            sent.append(clock.now)
            return RawResponse(200, {}, b'{"success": true, "code": "SUCCESS", "data": {}}')

        async def aclose(self) -> None:
            pass

    lim = Limits(global_rate=Rate(2, per=1.0), heavy={}, safety_margin=0.02)
    async with AdminClient(
        token="t",
        base_url="https://s.example",
        transport=Connecting(),
        limits=lim,
        limiter=Limiter(),
    ) as client:
        for _ in range(5):
            await client.request("GET", "subscriptions/1")
    assert min(b - a for a, b in zip(sent, sent[2:], strict=False)) >= 1.0 - EPS


async def test_a_changed_interval_applies_from_the_next_slot(clock: VirtualClock) -> None:
    shared = MemoryPacing()
    assert await shared.reserve("acme", "global", 0.1) == (0.0, 1.0)
    assert await shared.reserve("acme", "global", 0.5) == (pytest.approx(0.1), 1.0)
    # The slot after is paced by the interval given with the previous claim.
    assert (await shared.reserve("acme", "global", 0.1))[0] == pytest.approx(0.6)


async def test_pools_are_independent(clock: VirtualClock) -> None:
    lim = limits(50, 1.0, subscriptions=Rate(2, per=3.0), orders=Rate(1, per=1.0))
    sl = Limiter().bind("acme", lim)
    t0 = clock.now
    by_pool: dict[str, list[float]] = {"global": [], "subscriptions": [], "orders": []}
    tasks = [t for pool, s in by_pool.items() for t in spawn(6, sl, pool, s)]
    await asyncio.gather(*tasks)
    for pool, starts in by_pool.items():
        assert starts[0] == t0, pool  # no pool waits for another
        assert starts[-1] == pytest.approx(t0 + 5 * interval_of(lim, pool)), pool
    assert by_pool["global"][-1] - t0 < 0.2


async def test_bindings_of_one_store_share_the_budget(clock: VirtualClock) -> None:
    limiter = Limiter()
    a = limiter.bind("acme", limits(10, 1.0))
    b = limiter.bind("acme", limits(10, 1.0))
    assert a is b
    starts: list[float] = []
    await asyncio.gather(*spawn(5, a, "global", starts), *spawn(5, b, "global", starts))
    assert min(gaps(starts)) >= interval_of(a.limits) - EPS


async def test_different_stores_do_not_slow_each_other(clock: VirtualClock) -> None:
    limiter = Limiter()
    t0 = clock.now
    per_store: dict[str, list[float]] = {"a": [], "b": []}
    tasks = []
    for store, starts in per_store.items():
        tasks += spawn(10, limiter.bind(store, limits(10, 1.0)), "global", starts)
    await asyncio.gather(*tasks)
    for starts in per_store.values():
        assert starts[0] == t0
        assert starts[-1] == pytest.approx(t0 + 9 * interval_of(limits(10, 1.0)))


async def test_separate_limiters_are_separate(clock: VirtualClock) -> None:
    assert Limiter().bind("acme", limits()) is not Limiter().bind("acme", limits())


async def test_many_stores_and_tasks_are_cheap(clock: VirtualClock) -> None:
    limiter = Limiter()
    lim = limits(50, 1.0, max_in_flight=8, margin=0.02, orders=Rate(2, per=3.0))
    starts: dict[tuple[str, str], list[float]] = {}
    tasks = []
    for i in range(100):
        sl = limiter.bind(f"store-{i}", lim)
        for pool, n in (("global", 30), ("orders", 3)):
            tasks += spawn(n, sl, pool, starts.setdefault((sl.store, pool), []), hold=0.05)
    big = limiter.bind("big", lim)
    tasks += spawn(250, big, "global", starts.setdefault(("big", "global"), []), hold=0.05)
    timers_before = clock.timers
    wall = time.perf_counter()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - wall

    for (_, pool), s in starts.items():
        rate = lim.rate_for(pool)
        assert max_starts_in_window(s, rate.per) <= rate.n
    # At most one pacing timer per request (plus each request's own 50 ms hold): no polling.
    assert clock.timers - timers_before <= 2 * len(tasks)
    assert wall < 3.0


async def test_a_queued_request_keeps_few_objects_alive(clock: VirtualClock) -> None:
    """With hundreds of requests queued in the limiter, every GC-tracked object each keeps alive
    is one more for the garbage collector to scan and promote: the request path builds no
    closure, cell or retry object until an attempt has failed."""

    class Stalled:
        release = asyncio.Event()

        async def send(self, request: Request, *, timeout: float) -> RawResponse:
            await self.release.wait()
            return RawResponse(200, {}, b'{"success": true, "code": "SUCCESS", "data": {}}')

        async def aclose(self) -> None:
            pass

    client = AdminClient(
        token="t",
        base_url="https://subs.example",
        transport=Stalled(),
        limits=Limits(global_rate=Rate(1, per=1.0), heavy={}),
        limiter=Limiter(),
    )
    first = asyncio.ensure_future(client.request("GET", "subscriptions/1"))
    await settle()  # the store's limiter and pools exist; this one is in flight
    gc.collect()
    before = len(gc.get_objects())
    queued = [asyncio.ensure_future(client.request("GET", "subscriptions/1")) for _ in range(200)]
    await settle()
    per_request = (len(gc.get_objects()) - before) / len(queued)
    for task in (first, *queued):
        task.cancel()
    await asyncio.gather(first, *queued, return_exceptions=True)
    await client.aclose()
    assert per_request <= 24


# ---------------------------------------------------------------------------------------------
# In-flight cap, ordering, fairness


async def test_max_in_flight_is_respected_in_fifo_order(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(1000, 1.0, max_in_flight=3))
    starts: list[float] = []
    order: list[object] = []
    peak = 0

    async def watched(i: int) -> None:
        nonlocal peak
        async with sl.slot("global"):
            order.append(i)
            starts.append(clock.now)
            peak = max(peak, sl.stats().in_flight)
            await asyncio.sleep(1.0)

    await asyncio.gather(*(watched(i) for i in range(12)))
    assert peak == 3
    assert order == list(range(12))
    assert sl.stats().in_flight == 0
    t0 = starts[0]
    assert [round(t - t0) for t in starts] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


async def test_in_flight_places_go_to_pools_in_the_order_they_asked(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, max_in_flight=1, orders=Rate(10, per=1.0))
    sl = Limiter().bind("acme", lim)
    blocker = asyncio.create_task(request(sl, "global", [], hold=1.0))
    order: list[object] = []
    await asyncio.sleep(0.2)
    first = asyncio.create_task(request(sl, "orders", [], tag="orders", order=order, hold=0.1))
    await asyncio.sleep(0.2)
    second = asyncio.create_task(request(sl, "global", [], tag="global", order=order))
    await settle()
    pools = sl.stats().pools  # each pool counts its own requests in flight and waiting
    assert [(p.in_flight, p.waiting) for p in (pools["global"], pools["orders"])] == [
        (1, 1),
        (0, 1),
    ]
    await asyncio.sleep(0.65)  # the blocker is done; "orders" holds the place for 0.1 s
    pools = sl.stats().pools
    assert [(p.in_flight, p.waiting) for p in (pools["global"], pools["orders"])] == [
        (0, 1),
        (1, 0),
    ]
    await asyncio.gather(blocker, first, second)
    assert order == ["orders", "global"]
    assert sl.stats().in_flight == sum(p.in_flight for p in sl.stats().pools.values()) == 0


async def test_start_delayed_by_the_gate_is_not_followed_by_a_burst(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, max_in_flight=1)
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    blocker = asyncio.create_task(request(sl, "global", [], hold=1.0))
    await settle()
    await asyncio.gather(*spawn(5, sl, "global", starts, hold=0.0), blocker)
    # The first waited for the place and claimed its slot only then: no catch-up burst.
    assert starts[0] == pytest.approx(1000.0 + 1.0)
    assert gaps(starts) == pytest.approx([interval_of(lim)] * 4)


async def test_heavy_waiters_do_not_delay_light_requests(clock: VirtualClock) -> None:
    lim = limits(50, 1.0, max_in_flight=4, subscriptions=Rate(1, per=1.0))
    sl = Limiter().bind("acme", lim)
    t0 = clock.now
    heavy: list[float] = []
    light: list[float] = []
    heavy_tasks = spawn(20, sl, "subscriptions", heavy, hold=0.01)
    await settle()
    await asyncio.gather(*spawn(40, sl, "global", light, hold=0.02), *heavy_tasks)
    # Every light request starts exactly on the global pace, as if no heavy request existed.
    assert light == pytest.approx([t0 + i * interval_of(lim) for i in range(40)])
    step = interval_of(lim, "subscriptions")
    assert heavy == pytest.approx([t0 + i * step for i in range(20)])


# ---------------------------------------------------------------------------------------------
# Pauses


async def test_pause_holds_the_pool_then_resumes_paced(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, orders=Rate(10, per=1.0))
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    other: list[float] = []
    tasks = spawn(10, sl, "global", starts) + spawn(10, sl, "orders", other)
    await asyncio.sleep(2.5 * interval_of(lim))  # three starts so far
    assert len(starts) == 3
    paused_at = clock.now
    sl.pause("global", 2.0)
    sl.pause("global", 0.5)  # ends earlier: does not shorten the pause
    await asyncio.gather(*tasks)

    assert not [t for t in starts if paused_at <= t < paused_at + 2.0]
    assert starts[3] == pytest.approx(paused_at + 2.0)
    assert gaps(starts[3:]) == pytest.approx([interval_of(lim)] * 6)  # no burst after the pause
    assert other[-1] == pytest.approx(other[0] + 9 * interval_of(lim, "orders"))


async def test_pause_reaches_a_request_queued_for_an_in_flight_place(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(10, 1.0, max_in_flight=1))
    blocker = asyncio.create_task(request(sl, "global", [], hold=1.0))
    starts: list[float] = []
    waiter = asyncio.create_task(request(sl, "global", starts))
    await asyncio.sleep(0.5)  # the waiter is now queued at the gate
    sl.pause("global", 3.0)
    await asyncio.gather(blocker, waiter)
    assert starts == [pytest.approx(1000.0 + 0.5 + 3.0)]
    assert sl.stats().in_flight == 0


async def test_a_pause_that_comes_in_while_a_slot_is_awaited_is_honoured(
    clock: VirtualClock,
) -> None:
    lim = limits(1, 1.0)
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    await request(sl, "global", starts)
    waiter = asyncio.create_task(request(sl, "global", starts))
    await asyncio.sleep(0.5)  # the waiter sleeps until its slot at +1.0
    sl.pause("global", 2.0)
    await waiter
    assert starts[1] == pytest.approx(starts[0] + 2.5)


async def test_pause_ignores_nonsense_and_unknown_pools_raise(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits())
    for seconds in (0.0, -1.0, float("nan"), float("inf")):
        sl.pause("global", seconds)
    starts: list[float] = []
    await request(sl, "global", starts)
    assert starts == [clock.now]
    with pytest.raises(ConfigError, match="no rate-limit pool 'nope'"):
        sl.slot("nope")
    with pytest.raises(ConfigError):
        sl.pause("nope", 1.0)


async def test_a_wait_longer_than_max_wait_fails_fast(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits())
    sl.pause("global", 3600.0)
    t = clock.now
    with pytest.raises(RateLimitError) as info:
        async with sl.slot("global", max_wait=120.0):
            pass
    assert clock.now == t  # at once
    assert info.value.retry_after == pytest.approx(3600.0)
    assert "3600.0s, longer than RetryPolicy.max_retry_after" in str(info.value)
    assert sl.stats().in_flight == 0
    assert sl.stats().pools["global"].waiting == 0


async def test_a_slow_pinned_rate_is_paced_not_failed_by_max_wait(clock: VirtualClock) -> None:
    """A rate of one request per 200 s waits its interval, longer than ``max_wait`` (which is
    for pauses): each request starts in its turn, none fails."""
    sl = Limiter().bind("acme", limits(1, 200.0))
    starts: list[float] = []
    for _ in range(3):
        async with sl.slot("global", max_wait=120.0):
            starts.append(clock.now)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert gaps == [pytest.approx(sl.stats().pools["global"].interval)] * 2
    assert gaps[0] >= 200.0


async def test_requests_that_fail_fast_claim_one_slot_between_them(clock: VirtualClock) -> None:
    """Another process paused the store for longer than ``max_wait``: this one's requests fail at
    once, and only the first claims a slot (the backend's answer), so when the pause is near its
    end a request starts one interval after it, not one interval per refused request."""
    backend = MemoryPacing()
    here = Limiter(backend).bind("acme", limits(10, 1.0))
    Limiter(backend).bind("acme", limits(10, 1.0)).pause("global", 130.0)
    await asyncio.sleep(0)  # the other process's pause reaches the backend
    t0 = clock.now
    for _ in range(10):
        with pytest.raises(RateLimitError):
            async with here.slot("global", max_wait=120.0):
                pass
    assert clock.now == t0
    await asyncio.sleep(15.0)
    starts: list[float] = []
    async with here.slot("global", max_wait=120.0):
        starts.append(clock.now)
    assert starts == [pytest.approx(t0 + 130.0 + 0.1)]


async def test_memory_pacing_forgets_pools_idle_for_an_hour(clock: VirtualClock) -> None:
    """A process that paces ever more stores (a service for thousands of them) holds the state
    of the pools used within the hour, as Redis lets its keys expire: one idle that long has no
    start or pause ahead, and its slowdown (30 half-lives on) is gone."""
    backend = MemoryPacing()
    for i in range(1000):
        await backend.reserve(f"store-{i}", "global", 0.02)
    clock.now += 3000.0
    await backend.pause("slowed", "global", 0.0, 2.0)  # a 429's slowdown, shared
    clock.now += 601.0
    await backend.pause("paused", "global", 30.0, 1.0)
    assert await backend.reserve("busy", "global", 0.02) == (0.0, 1.0)
    for i in range(1000, 1100):
        await backend.reserve(f"store-{i}", "global", 0.02)
    assert len(backend._pools) == 3 + 100  # swept past 1,024 pools: the first 1,000 went
    assert await backend.reserve("busy", "global", 0.02) == (pytest.approx(0.02), 1.0)
    assert (await backend.reserve("paused", "global", 0.02))[0] == pytest.approx(30.0)
    slowdown = 1.0 + 0.5 ** (601.0 / SLOWDOWN_HALF_LIFE)
    assert (await backend.reserve("slowed", "global", 0.02))[1] == pytest.approx(slowdown)
    assert await backend.reserve("store-0", "global", 0.02) == (0.0, 1.0)  # as new: no wait


# ---------------------------------------------------------------------------------------------
# Cancellation


async def test_a_cancelled_head_loses_its_slot_and_nothing_else(clock: VirtualClock) -> None:
    lim = limits(10, 1.0)
    sl = Limiter().bind("acme", lim)
    step = interval_of(lim)
    t0 = clock.now
    starts: list[float] = []
    first, head, *rest = spawn(4, sl, "global", starts)
    await asyncio.sleep(step / 2)  # first started; head sleeps until its slot at t0 + step
    head.cancel()
    await asyncio.gather(first, *rest)
    assert head.cancelled()
    # Its slot is not handed on (a shared backend could not take it back either): the safe side.
    assert starts == pytest.approx([t0, t0 + 2 * step, t0 + 3 * step])
    stats = sl.stats()
    assert stats.in_flight == 0
    assert stats.pools["global"].requests == 3
    assert stats.pools["global"].waiting == 0


async def test_cancelled_task_in_the_middle_leaves_no_gap(clock: VirtualClock) -> None:
    lim = limits(10, 1.0)
    sl = Limiter().bind("acme", lim)
    t0 = clock.now
    starts: list[float] = []
    tasks = spawn(6, sl, "global", starts)
    await settle()
    tasks[3].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert starts == pytest.approx([t0 + i * interval_of(lim) for i in range(5)])


async def test_cancel_while_queued_for_an_in_flight_place(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, max_in_flight=1, orders=Rate(10, per=1.0))
    sl = Limiter().bind("acme", lim)
    blocker = asyncio.create_task(request(sl, "global", [], hold=1.0))
    order: list[object] = []
    queued = asyncio.create_task(request(sl, "global", [], tag="global", order=order))
    other = asyncio.create_task(request(sl, "orders", [], tag="orders", order=order))
    await asyncio.sleep(0.5)
    assert sl.stats().in_flight == 1
    queued.cancel()
    await asyncio.gather(blocker, other)
    assert queued.cancelled()
    assert order == ["orders"]
    assert sl.stats().in_flight == 0


async def test_cancel_after_being_granted_a_place_passes_it_on(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, max_in_flight=1, orders=Rate(10, per=1.0))
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    order: list[object] = []
    granted: list[asyncio.Task[None]] = []

    async def blocker() -> None:
        async with sl.slot("global"):
            await asyncio.sleep(1.0)
        # The release above handed the place to the next waiter; cancel it before it runs.
        granted[0].cancel()

    first = asyncio.create_task(blocker())
    await settle()
    granted.append(asyncio.create_task(request(sl, "global", starts, tag="g", order=order)))
    await asyncio.sleep(0.5)
    later = asyncio.create_task(request(sl, "orders", starts, tag="o", order=order))
    await asyncio.gather(first, later)
    await asyncio.gather(*granted, return_exceptions=True)
    assert granted[0].cancelled()
    assert order == ["o"]
    assert starts == [pytest.approx(1001.0)]
    stats = sl.stats()
    assert stats.in_flight == 0
    assert stats.pools["global"].requests == 1  # the blocker only
    # The cancelled request claimed no slot: the next global request goes at once.
    now = clock.now
    await request(sl, "global", starts)
    assert starts[-1] == now


# ---------------------------------------------------------------------------------------------
# The measured margin


def test_jitter_spread_waits_for_16_samples_then_covers_every_sample_of_two_windows() -> None:
    jitter = Jitter(50)
    for i in range(15):
        jitter.add(0.010 + (i % 11) * 0.001)
        assert jitter.spread is None
    jitter.add(0.020)  # the 16th sample: a spread at last
    assert jitter.spread == pytest.approx(0.010)
    # 102 samples kept (2 n + 2); one answer held by a stall counts while it is among them.
    for _ in range(7 * 16):  # recomputed every 16 samples
        jitter.add(0.015)
    assert jitter.spread == pytest.approx(0.0)
    jitter.add(0.500)  # a new largest sample counts at once, not at the next recomputation
    assert jitter.spread == pytest.approx(0.485)
    for _ in range(6 * 16):  # 96 newer samples: the stalled one is still in the window
        jitter.add(0.015)
    assert jitter.spread == pytest.approx(0.485)
    for _ in range(16):  # pushed out of the window: forgotten at the next recomputation
        jitter.add(0.015)
    assert jitter.spread == pytest.approx(0.0)


async def run_with_holds(sl: StoreLimiter, pool: str, holds: list[float]) -> None:
    """One request per hold, each answered ``hold`` seconds after its start."""
    await asyncio.gather(*(request(sl, pool, [], hold=h) for h in holds))


def calibrating(n: int = 10, **heavy: Rate) -> Limits:
    return Limits(
        global_rate=Rate(n, per=1.0),
        heavy=heavy or {},
        safety_margin=0.02,
        max_margin=0.10,
    )


async def test_a_pool_starts_at_the_cap(clock: VirtualClock) -> None:
    lim = calibrating()
    sl = Limiter().bind("acme", lim)
    starts: list[float] = []
    await asyncio.gather(*spawn(5, sl, "global", starts))
    g = sl.stats().pools["global"]
    assert (g.margin, g.paced_by) == (0.10, "start")
    assert gaps(starts) == pytest.approx([0.1 * 1.10] * 4)


async def test_the_margin_follows_the_spread_of_answers(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", calibrating())
    rng = random.Random(1)
    # Answers 20-80 ms after their slot: a spread of ~0.055 s over per = 1 s.
    await run_with_holds(sl, "global", [rng.uniform(0.02, 0.08) for _ in range(40)])
    g = sl.stats().pools["global"]
    assert g.paced_by == "jitter"
    assert 0.045 <= g.margin <= 0.06
    assert g.interval == pytest.approx(0.1 * (1 + g.margin))


async def test_the_margin_is_floored_and_capped(clock: VirtualClock) -> None:
    floor = Limiter().bind("steady", calibrating())
    await run_with_holds(floor, "global", [0.03] * 20)
    assert (floor.stats().pools["global"].margin, floor.stats().pools["global"].paced_by) == (
        0.02,
        "floor",
    )
    cap = Limiter().bind("wild", calibrating())
    rng = random.Random(2)
    await run_with_holds(cap, "global", [rng.uniform(0.0, 0.9) for _ in range(20)])
    assert cap.stats().pools["global"].margin == 0.10


async def test_a_request_late_for_its_slot_widens_the_spread(clock: VirtualClock) -> None:
    """Samples run from the slot, not from the start: a loop that starts requests late (a
    busy loop) shows as spread, the lateness a server sees as bunched arrivals."""
    sl = Limiter().bind("acme", calibrating())
    for i in range(24):
        if i % 2:
            clock.late_once = 0.06  # a busy loop iteration: the next timer fires 60 ms late
        await request(sl, "global", [], hold=0.03)
    assert sl.stats().pools["global"].margin >= 0.05


async def test_heavy_pools_take_the_global_spread_not_their_own(clock: VirtualClock) -> None:
    lim = calibrating(orders=Rate(2, per=1.0))
    sl = Limiter().bind("acme", lim)
    # Pages built for 100-800 ms: their round trips would make a huge spread; they are ignored.
    await run_with_holds(sl, "orders", [0.1, 0.8, 0.4, 0.7])
    orders = sl.stats().pools["orders"]
    assert (orders.margin, orders.paced_by) == (0.02, "floor")  # no light requests: the floor
    await run_with_holds(sl, "global", [0.01 + 0.005 * (i % 11) for i in range(22)])
    await run_with_holds(sl, "orders", [0.5])
    orders = sl.stats().pools["orders"]
    assert orders.paced_by == "jitter"
    assert orders.margin == pytest.approx(sl.stats().pools["global"].margin)


# ---------------------------------------------------------------------------------------------
# 429 feedback


async def slots(sl: StoreLimiter, pool: str, count: int) -> list[Slot]:
    taken = []
    for _ in range(count):
        async with sl.slot(pool) as slot:
            taken.append(slot)
    return taken


async def test_a_429_after_a_cold_start_learns_the_quota(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(10, 1.0))
    taken = await slots(sl, "global", 9)
    # The server took 8 and refused the 9th: it allows 8 per window, 10 / 8 = 1.25 slower.
    sl.rate_limited(taken[-1], 1.0)
    await slots(sl, "global", 1)
    g = sl.stats().pools["global"]
    assert g.rate_limited == 1
    assert (g.paced_by, g.interval) == ("429", pytest.approx(0.125, rel=1e-2))


async def test_a_429_learns_one_step_when_the_count_says_less(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(20, 1.0))
    taken = await slots(sl, "global", 60)  # 19-20 starts in the window before the refused one
    sl.rate_limited(taken[-1], None)
    await slots(sl, "global", 1)
    assert sl.stats().pools["global"].interval == pytest.approx(0.05 * (1 + SLOWDOWN_STEP))


async def test_one_widening_per_round_trip(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(20, 1.0))
    taken = await slots(sl, "global", 60)
    await asyncio.sleep(0.05)  # the answers come back a round trip later
    for slot in taken[-3:]:  # three requests were in flight, all refused
        sl.rate_limited(slot, None)
    await slots(sl, "global", 1)
    g = sl.stats().pools["global"]
    assert g.rate_limited == 3
    assert g.interval == pytest.approx(0.05 * (1 + SLOWDOWN_STEP))


async def test_after_a_pause_a_429_counts_no_quota(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(10, 1.0))
    taken = await slots(sl, "global", 3)
    sl.pause("global", 1.5)
    taken = await slots(sl, "global", 3)
    # Only 3 starts since the pause, but the server may still count ones from before it.
    sl.rate_limited(taken[-1], None)
    await slots(sl, "global", 1)
    assert sl.stats().pools["global"].interval == pytest.approx(0.1 * (1 + SLOWDOWN_STEP))


async def test_a_429_without_a_pause_shares_its_slowdown(clock: VirtualClock) -> None:
    shared = MemoryPacing()
    a, b = (Limiter(shared).bind("acme", limits(10, 1.0)) for _ in range(2))
    taken = await slots(a, "global", 5)
    a.rate_limited(taken[-1], None)  # a 429 with no Retry-After and no backoff: no hold
    await settle()  # the backend call runs in the background
    starts: list[float] = []
    t0 = clock.now
    await asyncio.gather(*spawn(3, b, "global", starts))
    assert starts[0] <= t0 + 0.1 + EPS  # no hold: the slot after a's last
    # a's slowdown reached b: 4 starts in the window before the refused one, 10 / 4 slower.
    assert starts[2] - starts[1] == pytest.approx(0.1 * 10 / 4, rel=1e-3)
    assert b.stats().pools["global"].paced_by == "429"


async def test_the_slowdown_decays_by_half_in_a_half_life(clock: VirtualClock) -> None:
    slowdown = Slowdown()
    assert slowdown.widen(100.0, 1.5) == 1.5
    assert slowdown.value(100.0 + SLOWDOWN_HALF_LIFE) == pytest.approx(1.25)
    assert slowdown.value(100.0 + 10 * SLOWDOWN_HALF_LIFE) == pytest.approx(1.0, abs=1e-3)
    slowdown.set(100.0 + SLOWDOWN_HALF_LIFE, 1.1)  # lower than the current value: kept
    assert slowdown.value(100.0 + SLOWDOWN_HALF_LIFE) == pytest.approx(1.25)
    assert slowdown.widen(200.0, 100.0) == 4.0  # capped


async def test_the_slowdown_is_shared_through_the_backend(clock: VirtualClock) -> None:
    shared = MemoryPacing()
    lim = limits(10, 1.0)
    a, b = Limiter(shared).bind("acme", lim), Limiter(shared).bind("acme", lim)
    taken = await slots(a, "global", 9)
    a.rate_limited(taken[-1], None)
    await settle()  # the backend call runs in the background
    starts: list[float] = []
    await asyncio.gather(*spawn(3, b, "global", starts))
    assert b.stats().pools["global"].paced_by == "429"
    assert gaps(starts)[-1] == pytest.approx(0.125, rel=1e-3)


# ---------------------------------------------------------------------------------------------
# Server hints


async def test_an_announced_lower_quota_paces_the_pool(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(10, 1.0))
    sl.server_limit("global", ServerLimit(quota=4, window=1.0, remaining=3, reset=1.0))
    await slots(sl, "global", 2)
    g = sl.stats().pools["global"]
    assert (g.paced_by, g.interval) == ("server", pytest.approx(0.25))
    sl.server_limit("global", ServerLimit(quota=40, window=1.0))  # higher: not followed
    await slots(sl, "global", 1)
    assert sl.stats().pools["global"].interval == pytest.approx(0.1)


async def test_server_limits_follow_and_ignore(clock: VirtualClock) -> None:
    follow = Limiter().bind("f", attrs.evolve(limits(10, 1.0), server_limits="follow"))
    follow.server_limit("global", ServerLimit(quota=40, window=2.0))
    await slots(follow, "global", 1)
    assert follow.stats().pools["global"].interval == pytest.approx(0.05)
    ignore = Limiter().bind("i", attrs.evolve(limits(10, 1.0), server_limits="ignore"))
    ignore.server_limit("global", ServerLimit(quota=1, window=1.0, remaining=0, reset=30.0))
    t = clock.now
    await slots(ignore, "global", 1)
    assert clock.now == t
    assert ignore.stats().pools["global"].interval == pytest.approx(0.1)


async def test_nothing_remaining_holds_the_pool_until_the_reset(clock: VirtualClock) -> None:
    sl = Limiter().bind("acme", limits(10, 1.0))
    sl.server_limit("global", ServerLimit(remaining=0, reset=5.0))
    t = clock.now
    await slots(sl, "global", 1)
    assert clock.now == pytest.approx(t + 5.0)
    # A Retry-After came with it: that one rules, the reset is not added.
    sl.server_limit("global", ServerLimit(remaining=0, reset=50.0), hold=False)
    t = clock.now
    await slots(sl, "global", 1)
    assert clock.now - t < 1.0
    # Pacing by the announced quota already spreads its window: a reset within it is no pause.
    sl.server_limit("global", ServerLimit(quota=5, window=1.0, remaining=0, reset=1.0))
    t = clock.now
    await slots(sl, "global", 1)
    assert clock.now - t <= 0.2 + EPS


# ---------------------------------------------------------------------------------------------
# Statistics and logging


async def test_stats_count_requests_429s_retries_and_waiting(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, orders=Rate(1, per=1.0))
    sl = Limiter().bind("acme", lim)
    taken: list[Slot] = []

    async def take() -> None:
        async with sl.slot("global") as slot:
            taken.append(slot)

    await asyncio.gather(*(take() for _ in range(5)))
    sl.rate_limited(taken[-1], None)
    sl.record_retry("global")
    sl.record_retry("global")
    stats = sl.stats()
    assert isinstance(stats, LimiterStats)
    assert stats.store == "acme"
    assert stats.max_in_flight == 64
    assert stats.pools["orders"] == PoolStats(rate=1.0)  # untouched: its rate, no counts
    g = stats.pools["global"]
    assert (g.requests, g.rate_limited, g.retries, g.waiting) == (5, 1, 2, 0)
    assert g.wait_seconds == pytest.approx(0.1 * (0 + 1 + 2 + 3 + 4))
    assert (stats.requests, stats.rate_limited, stats.retries) == (5, 1, 2)
    assert stats.wait_seconds == g.wait_seconds
    assert hash(stats) == hash(sl.stats())
    with pytest.raises(AttributeError):
        g.requests = 0  # type: ignore[misc]
    await request(sl, "global", [])
    assert stats.pools["global"].requests == 5
    assert sl.stats().pools["global"].requests == 6


async def test_debug_logs_for_pauses_and_interval_changes(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncsubs")
    sl = Limiter().bind("acme", limits(1, 1.0))
    sl.pause("global", 2.0)
    taken = await slots(sl, "global", 2)
    sl.rate_limited(taken[-1], None)
    await slots(sl, "global", 1)
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncsubs.limiter"]
    assert any("paused for 2.000s" in m for m in messages)
    assert any("429, slowdown now" in m for m in messages)
    assert sum("interval" in m for m in messages) == 2  # the first, and the widened one
    assert all(r.levelno == logging.DEBUG for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# Binding


async def test_rebinding_with_other_limits_is_a_config_error(clock: VirtualClock) -> None:
    limiter = Limiter()
    first = limiter.bind("acme", limits(10, 1.0, orders=Rate(1)))
    with pytest.raises(ConfigError, match="already in use with other Limits"):
        limiter.bind("acme", limits(20, 1.0, customers=Rate(1)))
    assert limiter.bind("acme", limits(10, 1.0, orders=Rate(1))) is first  # equal: the same


async def test_bind_validates_its_arguments(clock: VirtualClock) -> None:
    for store in ("", "  "):  # a blank name, as AdminClient refuses it too
        with pytest.raises(ConfigError, match=re.escape(f"non-empty string, got {store!r}")):
            Limiter().bind(store, limits())
    with pytest.raises(ConfigError, match="limits must be a Limits, got Rate"):
        Limiter().bind("acme", Rate(1))  # type: ignore[arg-type]


def test_bind_needs_a_running_loop() -> None:
    with pytest.raises(ConfigError, match="event loop"):
        Limiter().bind("acme", limits())


def in_other_loop(clock: VirtualClock, main: Callable[[], Awaitable[None]]) -> None:
    """Run ``main()`` in a thread with an event loop of its own, on the same (virtual) clock: real
    loops all read the monotonic one. Virtual time stands still meanwhile."""

    async def on_clock() -> None:
        asyncio.get_running_loop().time = clock.time  # type: ignore[method-assign]
        await main()

    thread = threading.Thread(target=asyncio.run, args=(on_clock(),))
    thread.start()
    thread.join()


async def test_the_default_limiter_shares_a_budget_between_loops(clock: VirtualClock) -> None:
    here = DEFAULT_LIMITER.bind("acme", limits())
    assert DEFAULT_LIMITER.bind("acme", limits()) is here
    await request(here, "global", [])
    elsewhere: list[StoreLimiter] = []
    waits: list[float | None] = []

    async def claim() -> None:
        elsewhere.append(there := DEFAULT_LIMITER.bind("acme", limits()))
        try:  # the slot just claimed here is an interval away from the next one there
            async with there.slot("global", max_wait=-math.inf):  # fails: says the wait
                waits.append(None)
        except RateLimitError as exc:
            waits.append(exc.retry_after)

    in_other_loop(clock, claim)
    assert waits == [pytest.approx(interval_of(limits()))]
    assert elsewhere[0] is not here  # a queue and an in-flight cap of its own
    with pytest.raises(ConfigError, match="another event loop"):
        async with elsewhere[0].slot("global"):
            pass


async def test_a_loop_new_to_a_store_paces_by_the_spread_measured_in_others(
    clock: VirtualClock,
) -> None:
    lim = limits(10, 1.0, margin=0.02)
    here = DEFAULT_LIMITER.bind("acme", lim)
    await asyncio.gather(*spawn(11, here, "global", []))  # n + 1 answers: a spread
    assert here.stats().pools["global"].paced_by == "start"  # as the 11th start was paced
    paced_by: list[str] = []

    async def claim() -> None:
        there = DEFAULT_LIMITER.bind("acme", lim)
        with pytest.raises(RateLimitError):  # an interval away: not waited for
            async with there.slot("global", max_wait=-math.inf):
                pass
        paced_by.append(there.stats().pools["global"].paced_by)

    in_other_loop(clock, claim)
    assert paced_by == ["floor"]  # not "start": no samples of its own needed


async def test_loops_share_a_stores_spread_under_the_same_limits_only(clock: VirtualClock) -> None:
    limiter = Limiter()
    here = limiter.bind("acme", limits(10))
    jitters: list[Any] = []

    async def bind(lim: Limits) -> None:
        jitters.append(limiter.bind("acme", lim).jitter)

    in_other_loop(clock, lambda: bind(limits(10)))
    in_other_loop(clock, lambda: bind(limits(50)))  # a misconfiguration: sized for its own rate
    assert jitters[0] is here.jitter
    assert jitters[1] is not here.jitter
    assert jitters[1]._samples.maxlen == 102  # two windows of its own rate


def test_a_finished_loop_is_not_kept_alive_by_the_limiter() -> None:
    """A pool's asyncio lock holds its loop once contended; the limiter holds a loop's limiters
    weakly, so a finished loop goes with its clients."""
    limiter, finished = Limiter(), list[Any]()

    async def contended() -> None:
        finished.append(weakref.ref(asyncio.get_running_loop()))
        sl = limiter.bind("acme", limits(1_000))  # a millisecond apart: the 3rd waits for its turn
        await asyncio.gather(*spawn(3, sl, "global", []))
        assert sl._pools["global"].turn._loop is not None  # type: ignore[attr-defined]

    for _ in range(3):
        asyncio.run(contended())
    gc.collect()
    assert [loop() for loop in finished] == [None, None, None]


def test_threads_claiming_at_once_lose_no_slot() -> None:
    """Claims from loops in several threads are serialised: every slot is claimed once."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows
    shared, waits = MemoryPacing(), list[float]()

    async def claim() -> None:
        asyncio.get_running_loop().time = lambda: 0.0  # type: ignore[method-assign]
        for _ in range(2_000):
            waits.append((await shared.reserve("acme", "global", 1.0))[0])

    try:
        threads = [threading.Thread(target=asyncio.run, args=(claim(),)) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(previous)
    assert sorted(waits) == [float(i) for i in range(8_000)]


# ---------------------------------------------------------------------------------------------
# Shared backends (what a RedisLimiter plugs into)


async def test_processes_sharing_a_backend_pace_together(clock: VirtualClock) -> None:
    shared = MemoryPacing()
    lim = limits(10, 1.0)
    procs = [Limiter(shared).bind("acme", lim) for _ in range(3)]
    assert procs[0] is not procs[1]
    starts: list[float] = []
    await asyncio.gather(*(t for sl in procs for t in spawn(6, sl, "global", starts)))
    assert gaps(starts) == pytest.approx([interval_of(lim)] * 17)


async def test_a_pause_is_shared_through_the_backend(clock: VirtualClock) -> None:
    shared = MemoryPacing()
    lim = limits(10, 1.0)
    a, b = Limiter(shared).bind("acme", lim), Limiter(shared).bind("acme", lim)
    await request(a, "global", [])
    a.pause("global", 2.0)  # a got the 429; b must hold too
    await settle()
    t = clock.now
    starts: list[float] = []
    await asyncio.gather(*spawn(3, b, "global", starts))
    assert starts[0] == pytest.approx(t + 2.0)
    assert gaps(starts) == pytest.approx([interval_of(lim)] * 2)


class FailingPacing(MemoryPacing):
    """A backend whose round trip takes 10 ms, and which can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: Exception | None = None
        self.reply: tuple[Any, Any] | None = None

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]:
        await asyncio.sleep(0.01)
        if self.fail is not None:
            raise self.fail
        if self.reply is not None:
            return self.reply
        return await super().reserve(store, pool, interval)

    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None:
        if self.fail is not None:
            raise self.fail
        await super().pause(store, pool, seconds, slowdown)


async def test_backend_failure_is_limiter_unavailable_and_leaks_nothing(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = FailingPacing()
    sl = Limiter(backend).bind("acme", limits(10, 1.0))
    backend.fail = ConnectionError("redis://:secret@host down")
    with pytest.raises(LimiterUnavailableError) as info:
        await request(sl, "global", [])
    assert "secret" not in str(info.value)
    assert isinstance(info.value.__cause__, ConnectionError)
    with caplog.at_level(logging.WARNING, logger="asyncsubs.limiter"):
        sl.pause("global", 0.1)
        await settle()
    assert "could not share a pause" in caplog.text
    assert "secret" not in caplog.text
    stats = sl.stats()
    assert (stats.in_flight, stats.pools["global"].waiting, stats.requests) == (0, 0, 0)

    backend.fail = None
    for reply in ((-1.0, 1.0), (float("inf"), 1.0), (0.0, 0.5), ("x", 1.0)):
        backend.reply = reply
        with pytest.raises(LimiterUnavailableError):
            await request(sl, "global", [])
    backend.reply = None
    starts: list[float] = []
    await request(sl, "global", starts)
    assert len(starts) == 1
    assert sl.stats().in_flight == 0


def test_the_limiter_paces_and_stays_small() -> None:
    """The limiter's modules read at first sight: pacing only (what pools and pulls learn is
    kept by ``_learned``, the page size by ``_page_size``), under 450 lines together."""
    root = Path(asyncsubs.__file__).parent
    modules = ("_limiter.py", "_server_limits.py", "limiting.py")
    sources = {name: (root / name).read_text() for name in modules}
    assert sum(len(text.splitlines()) for text in sources.values()) < 450
    assert not any("page_size" in text or "PageSize" in text for text in sources.values())
