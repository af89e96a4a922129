"""Tests for asyncsubs._limiter on a virtual clock.

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
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncsubs import AdminClient, SendReportingConnector
from asyncsubs._config import Limits, Rate
from asyncsubs._limiter import (
    Limiter,
    LimiterStats,
    LocalLimiter,
    MemoryPacing,
    PoolStats,
    StoreLimiter,
    default_limiter,
)
from asyncsubs._protocol import RawResponse, Request, build_request
from asyncsubs._transport import AiohttpTransport, report_sent, watch_sends
from asyncsubs.errors import ConfigError, LimiterUnavailableError
from asyncsubs.testing import FakeAdminServer

EPS = 1e-9


class VirtualClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.timers = 0  # loop.call_at calls, to check that nothing polls
        self.lateness = 0.0  # how late every timer fires, as a real loop's do
        self.late_once = 0.0  # extra lateness of the next timer only (a busy loop iteration)

    def time(self) -> float:
        return self.now


@pytest.fixture
async def clock() -> AsyncIterator[VirtualClock]:
    loop = asyncio.get_running_loop()
    selector = getattr(loop, "_selector", None)
    if selector is None:  # pragma: no cover - only selector loops are used here
        pytest.skip("the virtual clock needs a selector event loop")
    vclock = VirtualClock()
    real_select = selector.select
    real_call_at = loop.call_at

    def select(timeout: float | None = None) -> Any:
        events = real_select(0)
        if events:
            return events
        if timeout is None:
            # Nothing ready, no timer: in these tests that can only be a deadlock.
            raise RuntimeError("virtual clock: every task waits and no timer is set")
        # Land exactly on the next timer: ``now + (when - now)`` can round to just before it,
        # which would only add spurious wake-ups.
        if timeout > 0:
            scheduled = loop._scheduled  # type: ignore[attr-defined]
            landing = max(vclock.now + timeout, scheduled[0].when() if scheduled else 0.0)
            vclock.now = landing + vclock.lateness + vclock.late_once
            vclock.late_once = 0.0
        return events

    def call_at(when: float, callback: Callable[..., object], *args: Any, **kw: Any) -> Any:
        vclock.timers += 1
        return real_call_at(when, callback, *args, **kw)

    loop.time = vclock.time  # type: ignore[method-assign]
    loop.call_at = call_at  # type: ignore[method-assign,assignment]
    selector.select = select
    try:
        yield vclock
    finally:
        # Restore before the runner closes the loop (its shutdown may wait on real I/O).
        del loop.time, loop.call_at, selector.select


def limits(n: int = 10, per: float = 1.0, *, max_in_flight: int = 64, **heavy: Rate) -> Limits:
    return Limits(global_rate=Rate(n, per=per), heavy=heavy or {}, max_in_flight=max_in_flight)


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
# Pacing


@pytest.mark.parametrize(
    "rate", [Rate(50, per=1.0), Rate(2, per=3.0), Rate(1, per=1.0), Rate(7, per=0.5)]
)
async def test_cold_start_is_paced_without_burst(clock: VirtualClock, rate: Rate) -> None:
    lim = Limits(global_rate=rate)
    sl = LocalLimiter().bind("acme", lim)
    interval = lim.interval_for("global")
    t0 = clock.now
    starts: list[float] = []
    await asyncio.gather(*spawn(4 * rate.n + 3, sl, "global", starts))

    assert starts[0] == t0  # the first request does not wait
    assert max_starts_in_window(starts, rate.per) <= rate.n
    # Even spacing: every gap is one interval, neither shorter nor (with no other limit) longer.
    assert all(interval - EPS <= g <= interval + 1e-6 for g in gaps(starts))


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

    sl = LocalLimiter().bind("acme", limits(10, 1.0))
    starts: list[float] = []
    await asyncio.gather(*spawn(10, sl, "global", starts))
    assert max_starts_in_window(starts, 0.1) == 1


async def test_idle_pool_starts_at_once_but_never_closer_than_interval(
    clock: VirtualClock,
) -> None:
    sl = LocalLimiter().bind("acme", limits(10, 1.0))
    interval = sl.limits.interval_for("global")
    starts: list[float] = []
    await request(sl, "global", starts)
    await asyncio.sleep(interval / 2)
    await request(sl, "global", starts)  # too soon: waits out the rest of the interval
    await asyncio.sleep(5 * interval)
    t = clock.now
    await request(sl, "global", starts)  # idle long enough: starts at once
    assert gaps(starts)[0] == pytest.approx(interval)
    assert starts[2] == t


async def test_pools_are_independent(clock: VirtualClock) -> None:
    lim = limits(50, 1.0, subscriptions=Rate(2, per=3.0), orders=Rate(1, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
    t0 = clock.now
    by_pool: dict[str, list[float]] = {"global": [], "subscriptions": [], "orders": []}
    tasks = [t for pool, s in by_pool.items() for t in spawn(6, sl, pool, s)]
    await asyncio.gather(*tasks)
    for pool, starts in by_pool.items():
        interval = lim.interval_for(pool)
        assert starts[0] == t0, pool  # no pool waits for another
        assert starts[-1] == pytest.approx(t0 + 5 * interval), pool
    # The heavy pools did not draw on the global one: 6 global starts in 5 global intervals.
    assert by_pool["global"][-1] - t0 < 0.2


async def test_bindings_of_one_store_share_the_budget(clock: VirtualClock) -> None:
    limiter = LocalLimiter()
    a = limiter.bind("acme", limits(10, 1.0))
    b = limiter.bind("acme", limits(10, 1.0))
    assert a is b
    starts: list[float] = []
    await asyncio.gather(*spawn(5, a, "global", starts), *spawn(5, b, "global", starts))
    assert max_starts_in_window(starts, 1.0) <= 10
    assert min(gaps(starts)) >= a.limits.interval_for("global") - EPS


async def test_different_stores_do_not_slow_each_other(clock: VirtualClock) -> None:
    limiter = LocalLimiter()
    t0 = clock.now
    per_store: dict[str, list[float]] = {"a": [], "b": []}
    tasks = []
    for store, starts in per_store.items():
        tasks += spawn(10, limiter.bind(store, limits(10, 1.0)), "global", starts)
    await asyncio.gather(*tasks)
    interval = limits(10, 1.0).interval_for("global")
    for starts in per_store.values():
        assert starts[0] == t0
        assert starts[-1] == pytest.approx(t0 + 9 * interval)


async def test_separate_limiters_are_separate(clock: VirtualClock) -> None:
    assert LocalLimiter().bind("acme", limits()) is not LocalLimiter().bind("acme", limits())


async def test_many_stores_and_tasks_are_cheap(clock: VirtualClock) -> None:
    limiter = LocalLimiter()
    lim = limits(50, 1.0, max_in_flight=8, orders=Rate(2, per=3.0))
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
    is one more for the garbage collector to scan and promote (a 75-store run queues ~200): the
    request path builds no closure, cell or retry object until an attempt has failed."""

    class Stalled:
        reports_sends = True
        release = asyncio.Event()

        async def send(self, request: Request, *, timeout: float) -> RawResponse:
            report_sent()
            await self.release.wait()
            return RawResponse(200, {}, b'{"success": true, "code": "SUCCESS", "data": {}}')

        async def aclose(self) -> None:
            pass

    client = AdminClient(
        token="t",
        base_url="https://subs.example",
        transport=Stalled(),
        limits=Limits(global_rate=Rate(1, per=1.0), heavy={}),
        limiter=LocalLimiter(),
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
    # 19 on CPython 3.11 (task, future, eight coroutines, the request, its slot, ...); a closure
    # per request with its cells and a retry wrapper made it 34.
    assert per_request <= 24


# ---------------------------------------------------------------------------------------------
# In-flight cap, ordering, fairness


async def test_max_in_flight_is_respected_in_fifo_order(clock: VirtualClock) -> None:
    sl = LocalLimiter().bind("acme", limits(1000, 1.0, max_in_flight=3))
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
    # Waves of three, one second apart; within a wave still paced.
    t0 = starts[0]
    assert [round(t - t0) for t in starts] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


async def test_in_flight_places_go_to_pools_in_the_order_they_became_ready(
    clock: VirtualClock,
) -> None:
    lim = limits(10, 1.0, max_in_flight=1, orders=Rate(10, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
    blocker = asyncio.create_task(request(sl, "global", [], hold=1.0))
    order: list[object] = []
    await asyncio.sleep(0.2)
    first = asyncio.create_task(request(sl, "orders", [], tag="orders", order=order, hold=0.1))
    await asyncio.sleep(0.2)
    second = asyncio.create_task(request(sl, "global", [], tag="global", order=order))
    await asyncio.gather(blocker, first, second)
    assert order == ["orders", "global"]


async def test_start_delayed_by_the_gate_is_not_followed_by_a_burst(clock: VirtualClock) -> None:
    sl = LocalLimiter().bind("acme", limits(10, 1.0, max_in_flight=1))
    interval = sl.limits.interval_for("global")
    starts: list[float] = []
    blocker = asyncio.create_task(request(sl, "global", [], hold=1.0))
    await settle()
    await asyncio.gather(*spawn(5, sl, "global", starts, hold=0.0), blocker)
    # The first waited for the place; the others are paced from its actual start.
    assert starts[0] == pytest.approx(1000.0 + 1.0)
    assert all(g == pytest.approx(interval) for g in gaps(starts))


async def test_heavy_waiters_do_not_delay_light_requests(clock: VirtualClock) -> None:
    lim = limits(50, 1.0, max_in_flight=4, subscriptions=Rate(1, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
    t0 = clock.now
    heavy: list[float] = []
    light: list[float] = []
    # A long heavy pull queues first; light requests come in after it.
    heavy_tasks = spawn(20, sl, "subscriptions", heavy, hold=0.01)
    await settle()
    await asyncio.gather(*spawn(40, sl, "global", light, hold=0.02), *heavy_tasks)
    interval = lim.interval_for("global")
    # Every light request starts exactly on the global pace, as if no heavy request existed.
    assert light == pytest.approx([t0 + i * interval for i in range(40)])
    assert heavy == pytest.approx([t0 + i * lim.interval_for("subscriptions") for i in range(20)])


@given(
    n=st.integers(1, 10_000),
    per=st.floats(0.001, 3600.0),
    margin=st.floats(0.0, 0.5),
)
def test_credit_and_write_span_keep_n_plus_one_starts_out_of_a_window(
    n: int, per: float, margin: float
) -> None:
    """The budget the margin buys, split between timer lateness and write jitter."""
    lim = Limits(global_rate=Rate(n, per=per), heavy={}, safety_margin=margin)
    scheduled_span = n * lim.interval_for("global") - lim.lateness_credit_for("global")
    assert scheduled_span >= lim.send_span_for("global") * (1 - 1e-12) >= per * (1 - 1e-12)


# ---------------------------------------------------------------------------------------------
# Writes: requests that go out later than they started


async def written_request(
    sl: StoreLimiter,
    pool: str,
    starts: list[float],
    sends: list[float],
    write_after: float,
    hold: float = 0.0,
    *,
    written: bool = True,
) -> None:
    """A request whose write lags its start by ``write_after`` (a new connection, a busy loop);
    ``written=False``: it never goes out (it could not connect)."""
    loop = asyncio.get_running_loop()
    async with sl.slot(pool, reports_sends=True) as start:
        starts.append(loop.time())
        await asyncio.sleep(write_after)
        if written:
            start.sent()
            sends.append(loop.time())
        await asyncio.sleep(hold)


def min_span_of(times: list[float], n: int) -> float:
    """The shortest time in which any n + 1 of ``times`` fall."""
    s = sorted(times)
    return min((s[i + n] - s[i] for i in range(len(s) - n)), default=math.inf)


async def test_a_late_write_holds_back_the_start_n_places_later(clock: VirtualClock) -> None:
    lim = Limits(global_rate=Rate(5, per=1.0), heavy={}, safety_margin=0.0)
    sl = LocalLimiter().bind("acme", lim)
    t0 = clock.now
    starts: list[float] = []
    sends: list[float] = []
    first = written_request(sl, "global", starts, sends, write_after=0.15, hold=0.1)
    others = [written_request(sl, "global", starts, sends, 0.0, hold=0.1) for _ in range(5)]
    await asyncio.gather(first, *others)
    # The first went out 0.15 s late; five requests were written after it, so the sixth is
    # held until a full span after that write, not one window after the first start.
    assert starts[:5] == pytest.approx([t0 + i * 0.2 for i in range(5)])
    assert starts[5] == pytest.approx(t0 + 0.15 + lim.send_span_for("global"))
    assert min_span_of(sends, 5) >= lim.send_span_for("global") - EPS


async def test_unreported_writes_count_from_the_start(clock: VirtualClock) -> None:
    lim = Limits(global_rate=Rate(5, per=1.0), heavy={}, safety_margin=0.0)
    sl = LocalLimiter().bind("acme", lim)
    t0 = clock.now
    starts: list[float] = []
    # The slot cannot know the first went out late: pacing alone, a window after the first.
    await asyncio.gather(*spawn(6, sl, "global", starts, hold=0.15))
    assert starts == pytest.approx([t0 + i * 0.2 for i in range(6)])


async def test_random_write_delays_never_put_n_plus_one_writes_in_a_span(
    clock: VirtualClock,
) -> None:
    rng = random.Random(7)
    lim = Limits(global_rate=Rate(5, per=1.0), heavy={})
    sl = LocalLimiter().bind("acme", lim)
    starts: list[float] = []
    sends: list[float] = []
    tasks = [
        written_request(sl, "global", starts, sends, rng.choice([0.0, 0.0, rng.uniform(0, 0.6)]))
        for _ in range(60)
    ]
    await asyncio.gather(*tasks)
    assert len(sends) == 60
    assert min_span_of(sends, 5) >= lim.send_span_for("global") - EPS
    assert max_starts_in_window(starts, 1.0 - EPS) <= 5
    # Held back only where a write lagged: well above 80% of the paced rate.
    assert (len(starts) - 1) / (max(starts) - min(starts)) >= 0.8 * 5


async def test_requests_that_are_never_written_hold_the_pool_only_while_unwritten(
    clock: VirtualClock,
) -> None:
    lim = Limits(global_rate=Rate(2, per=1.0), heavy={}, safety_margin=0.0)
    sl = LocalLimiter().bind("acme", lim)
    t0 = clock.now
    starts: list[float] = []
    sends: list[float] = []
    # Two requests stuck connecting: nobody knows when they will reach the server, so the next
    # may not start yet; once they give up unwritten, they never count.
    stuck = [written_request(sl, "global", starts, sends, 4.2, written=False) for _ in range(2)]
    nxt = written_request(sl, "global", starts, sends, 0.0)
    after = written_request(sl, "global", starts, sends, 0.0)
    await asyncio.gather(*stuck, nxt, after)
    assert starts[:2] == pytest.approx([t0, t0 + 0.5])
    # Due at 1.0 by pacing, it waits while both are unwritten and starts when one gives up.
    assert starts[2] == pytest.approx(t0 + 4.2)
    # The next: its write plus the one still stuck would make three within a span, until that
    # one gives up too (0.5 s later, also the paced moment).
    assert starts[3] == pytest.approx(t0 + 4.7)
    # Woken by those changes, not by looking again: the stuck two's sleeps, three turn hand-offs
    # (each woken at its paced moment) and one bound.
    assert clock.timers <= 6
    assert sl.stats().pools["global"].requests == 4


async def test_the_client_reports_writes_from_its_transport(clock: VirtualClock) -> None:
    """Through the transport seam: a transport that reports each write makes the client pace
    writes; one that does not is paced by starts only."""

    class SlowFirstWrite:
        reports_sends = True

        def __init__(self) -> None:
            self.sends: list[float] = []

        async def send(self, request: Request, *, timeout: float) -> RawResponse:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(0.15 if not self.sends else 0.0)
            report_sent()
            self.sends.append(loop.time())
            await asyncio.sleep(0.05)
            return RawResponse(200, {}, b'{"success": true, "code": "SUCCESS", "data": {}}')

        async def aclose(self) -> None:
            pass

    transport = SlowFirstWrite()
    lim = Limits(global_rate=Rate(5, per=1.0), heavy={}, safety_margin=0.0)
    client = AdminClient(
        token="t",
        base_url="https://subs.example",
        transport=transport,
        limits=lim,
        limiter=LocalLimiter(),
    )
    t0 = clock.now
    await asyncio.gather(*(client.request("GET", "subscriptions/1") for _ in range(6)))
    assert transport.sends[0] == pytest.approx(t0 + 0.15)
    assert transport.sends[5] == pytest.approx(t0 + 0.15 + lim.send_span_for("global"))
    report_sent()  # outside a request: nothing to report to, no error


async def test_aiohttp_transport_reports_writes_through_its_connector(
    server: FakeAdminServer,
) -> None:
    request = build_request(
        server.base_url + "/admin/2021-01/", server.tokens["acme"], "GET", "subscriptions/1"
    )
    reported: list[int] = []
    own = AiohttpTransport(max_response_bytes=1 << 20)
    assert own.reports_sends is True
    try:
        with watch_sends(lambda: reported.append(1)):
            raw = await own.send(request, timeout=5.0)
        assert raw.status in (200, 404)
        assert reported == [1]
        async with aiohttp.ClientSession() as session:
            shared = AiohttpTransport(session, max_response_bytes=1 << 20)
            assert shared.reports_sends is False  # the caller's connector: it cannot tell
            with watch_sends(lambda: reported.append(1)):
                await shared.send(request, timeout=5.0)
        assert reported == [1]
        connector = SendReportingConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            shared = AiohttpTransport(session, max_response_bytes=1 << 20)
            assert shared.reports_sends is True
            with watch_sends(lambda: reported.append(1)):
                await shared.send(request, timeout=5.0)
            assert reported == [1, 1]
            # Other code's requests through the session run unwatched: nothing reported.
            async with session.get(server.base_url + "/admin/2021-01/subscriptions/1") as resp:
                await resp.read()
            # Nor does a request in another task while this one watches.
            with watch_sends(lambda: reported.append(1)):
                await asyncio.create_task(shared.send(request, timeout=5.0))
        assert reported == [1, 1]
    finally:
        await own.aclose()


# ---------------------------------------------------------------------------------------------
# Pauses (429)


async def test_pause_holds_the_pool_then_resumes_paced(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, orders=Rate(10, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
    interval = lim.interval_for("global")
    starts: list[float] = []
    other: list[float] = []
    tasks = spawn(10, sl, "global", starts) + spawn(10, sl, "orders", other)
    await asyncio.sleep(2.5 * interval)  # three starts so far
    assert len(starts) == 3
    paused_at = clock.now
    sl.pause("global", 2.0)
    sl.pause("global", 0.5)  # ends earlier: does not shorten the pause
    await asyncio.gather(*tasks)

    assert not [t for t in starts if paused_at <= t < paused_at + 2.0]
    assert starts[3] == pytest.approx(paused_at + 2.0)
    assert gaps(starts[3:]) == pytest.approx([interval] * 6)  # no burst after the pause
    # The other pool went on unpaused.
    assert other[-1] == pytest.approx(other[0] + 9 * lim.interval_for("orders"))


async def test_pause_reaches_a_request_queued_for_an_in_flight_place(clock: VirtualClock) -> None:
    sl = LocalLimiter().bind("acme", limits(10, 1.0, max_in_flight=1))
    blocker = asyncio.create_task(request(sl, "global", [], hold=1.0))
    starts: list[float] = []
    waiter = asyncio.create_task(request(sl, "global", starts))
    await asyncio.sleep(0.5)  # the waiter is now queued at the gate
    sl.pause("global", 3.0)
    await asyncio.gather(blocker, waiter)
    assert starts == [pytest.approx(1000.0 + 0.5 + 3.0)]
    assert sl.stats().in_flight == 0


async def test_pause_ignores_nonsense_and_unknown_pools_raise(clock: VirtualClock) -> None:
    sl = LocalLimiter().bind("acme", limits())
    for seconds in (0.0, -1.0, float("nan"), float("inf")):
        sl.pause("global", seconds)
    starts: list[float] = []
    await request(sl, "global", starts)
    assert starts == [clock.now]
    with pytest.raises(ConfigError, match="no rate-limit pool 'nope'"):
        sl.slot("nope")
    with pytest.raises(ConfigError):
        sl.pause("nope", 1.0)


# ---------------------------------------------------------------------------------------------
# Cancellation


async def test_cancelled_head_gives_its_start_time_to_the_next(clock: VirtualClock) -> None:
    sl = LocalLimiter().bind("acme", limits(10, 1.0))
    interval = sl.limits.interval_for("global")
    t0 = clock.now
    starts: list[float] = []
    first, head, *rest = spawn(4, sl, "global", starts)
    await asyncio.sleep(interval / 2)  # first started; head sleeps until t0 + interval
    head.cancel()
    await asyncio.gather(first, *rest)
    assert head.cancelled()
    assert starts == pytest.approx([t0, t0 + interval, t0 + 2 * interval])
    stats = sl.stats()
    assert stats.in_flight == 0
    assert stats.pools["global"].requests == 3
    assert stats.pools["global"].waiting == 0


async def test_cancelled_task_in_the_middle_leaves_no_gap(clock: VirtualClock) -> None:
    sl = LocalLimiter().bind("acme", limits(10, 1.0))
    interval = sl.limits.interval_for("global")
    t0 = clock.now
    starts: list[float] = []
    tasks = spawn(6, sl, "global", starts)
    await settle()
    tasks[3].cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert starts == pytest.approx([t0 + i * interval for i in range(5)])


async def test_cancel_while_queued_for_an_in_flight_place(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, max_in_flight=1, orders=Rate(10, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
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
    sl = LocalLimiter().bind("acme", lim)
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
    await asyncio.sleep(0.5)  # its paced start has come: it is first in line for the place
    later = asyncio.create_task(request(sl, "orders", starts, tag="o", order=order))
    await asyncio.gather(first, later)
    await asyncio.gather(*granted, return_exceptions=True)
    assert granted[0].cancelled()
    assert order == ["o"]
    assert starts == [pytest.approx(1001.0)]
    stats = sl.stats()
    assert stats.in_flight == 0
    assert stats.pools["global"].requests == 1  # the blocker only
    # The cancelled request did not use up a global start: the next one goes at once.
    now = clock.now
    await request(sl, "global", starts)
    assert starts[-1] == now


# ---------------------------------------------------------------------------------------------
# Statistics and logging


async def test_stats_count_requests_429s_retries_and_waiting(clock: VirtualClock) -> None:
    lim = limits(10, 1.0, orders=Rate(1, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
    interval = lim.interval_for("global")
    await asyncio.gather(*spawn(5, sl, "global", []))
    sl.record_429("global")
    sl.record_retry("global")
    sl.record_retry("global")
    stats = sl.stats()
    assert isinstance(stats, LimiterStats)
    assert stats.store == "acme"
    assert stats.max_in_flight == 64
    assert stats.pools["orders"] == PoolStats()
    g = stats.pools["global"]
    assert (g.requests, g.rate_limited, g.retries, g.waiting) == (5, 1, 2, 0)
    assert g.wait_seconds == pytest.approx(interval * (0 + 1 + 2 + 3 + 4))
    assert (stats.requests, stats.rate_limited, stats.retries) == (5, 1, 2)
    assert stats.wait_seconds == g.wait_seconds
    assert hash(stats) == hash(sl.stats())
    # A snapshot: frozen, and later activity does not change it.
    with pytest.raises(AttributeError):
        g.requests = 0  # type: ignore[misc]
    await request(sl, "global", [])
    assert stats.pools["global"].requests == 5
    assert sl.stats().pools["global"].requests == 6


async def test_debug_logs_for_pauses_and_long_waits(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncsubs")
    sl = LocalLimiter().bind("acme", limits(1, 1.0))
    sl.pause("global", 2.0)
    await asyncio.gather(*spawn(2, sl, "global", []))
    messages = [r.getMessage() for r in caplog.records if r.name == "asyncsubs.limiter"]
    assert any("paused for 2.000s" in m for m in messages)
    assert any("waited" in m for m in messages)
    assert all(r.levelno == logging.DEBUG for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# Binding


async def test_rebinding_with_other_limits_keeps_the_first_and_warns(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = LocalLimiter()
    first = limiter.bind("acme", limits(10, 1.0, orders=Rate(1)))
    with caplog.at_level(logging.WARNING, logger="asyncsubs.limiter"):
        again = limiter.bind("acme", limits(20, 1.0, customers=Rate(1)))
    assert again is first
    assert again.limits == limits(10, 1.0, orders=Rate(1))
    assert "already bound" in caplog.text
    # Requests must pick pools by the binding in force, not by their own (ignored) Limits.
    assert again.pool_for("GET", "/orders") == "orders"
    assert again.pool_for("GET", "/customers") == "global"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="asyncsubs.limiter"):
        assert limiter.bind("acme", limits(10, 1.0, orders=Rate(1))) is first  # equal: quiet
    assert not caplog.records


async def test_bind_validates_its_arguments(clock: VirtualClock) -> None:
    with pytest.raises(ConfigError):
        LocalLimiter().bind("", limits())
    with pytest.raises(ConfigError):
        LocalLimiter().bind("acme", Rate(1))  # type: ignore[arg-type]


def test_bind_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="event loop"):
        LocalLimiter().bind("acme", limits())


async def test_default_limiter_is_shared_per_loop(clock: VirtualClock) -> None:
    assert default_limiter() is default_limiter()
    here = default_limiter().bind("acme", limits())
    assert default_limiter().bind("acme", limits()) is here

    elsewhere: list[StoreLimiter] = []

    async def bind_in_other_loop() -> None:
        elsewhere.append(default_limiter().bind("acme", limits()))

    thread = threading.Thread(target=asyncio.run, args=(bind_in_other_loop(),))
    thread.start()
    thread.join()
    assert elsewhere
    assert elsewhere[0] is not here
    with pytest.raises(RuntimeError, match="another event loop"):
        async with elsewhere[0].slot("global"):
            pass


# ---------------------------------------------------------------------------------------------
# Shared backends (what a RedisLimiter plugs into)


async def test_processes_sharing_a_backend_pace_together(clock: VirtualClock) -> None:
    shared = MemoryPacing()
    lim = limits(10, 1.0)
    procs = [Limiter(shared).bind("acme", lim) for _ in range(3)]
    assert procs[0] is not procs[1]
    starts: list[float] = []
    await asyncio.gather(*(t for sl in procs for t in spawn(6, sl, "global", starts)))
    assert max_starts_in_window(starts, 1.0) <= 10
    assert min(gaps(starts)) >= lim.interval_for("global") - EPS
    assert max(gaps(starts)) == pytest.approx(lim.interval_for("global"))


async def test_a_pause_is_shared_through_the_backend(clock: VirtualClock) -> None:
    shared = MemoryPacing()
    lim = limits(10, 1.0)
    a, b = Limiter(shared).bind("acme", lim), Limiter(shared).bind("acme", lim)
    await request(a, "global", [])
    a.pause("global", 2.0)  # a got the 429; b must hold too
    t = clock.now
    starts: list[float] = []
    await asyncio.gather(*spawn(3, b, "global", starts))
    assert starts[0] == pytest.approx(t + 2.0)
    assert gaps(starts) == pytest.approx([lim.interval_for("global")] * 2)


class SlowPacing(MemoryPacing):
    """A backend whose round trip takes 10 ms, and which can be made to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.fail: Exception | None = None

    async def reserve(self, store: str, pool: str, interval: float) -> float:
        self.calls += 1
        await asyncio.sleep(0.01)
        if self.fail is not None:
            raise self.fail
        return await super().reserve(store, pool, interval) + 0.0

    async def pause(self, store: str, pool: str, seconds: float) -> None:
        if self.fail is not None:
            raise self.fail
        await super().pause(store, pool, seconds)


async def test_cancelled_claim_of_a_shared_slot_is_not_wasted(clock: VirtualClock) -> None:
    backend = SlowPacing()
    sl = Limiter(backend).bind("acme", limits(10, 1.0))
    starts: list[float] = []
    head, nxt = spawn(2, sl, "global", starts)
    await asyncio.sleep(0.005)  # head is in the middle of its round trip
    head.cancel()
    await nxt
    assert backend.calls == 1  # the next task used the slot the cancelled one claimed
    assert starts == [pytest.approx(1000.01)]
    assert sl.stats().in_flight == 0


async def test_backend_failure_is_limiter_unavailable_and_leaks_nothing(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    backend = SlowPacing()
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
    starts: list[float] = []
    await request(sl, "global", starts)
    assert len(starts) == 1


@pytest.mark.parametrize("lateness", [0.0005, 0.001, 0.002])
async def test_late_timers_neither_slow_the_rate_nor_overfill_a_window(
    clock: VirtualClock, lateness: float
) -> None:
    """Real loops wake timers ~1 ms late; pacing from each actual start would lose a few % of
    the rate (20.4 ms + 1 ms per start). Small lateness is forgiven, never beyond the window."""
    clock.lateness = lateness
    lim = Limits(global_rate=Rate(50, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
    interval = lim.interval_for("global")
    starts: list[float] = []
    await asyncio.gather(*spawn(1_000, sl, "global", starts))
    starts.sort()
    # The first window after the cold start keeps the lateness: slack for the cold connections
    # whose requests reach the server late.
    assert starts[50] - starts[0] >= 50 * interval + 40 * lateness
    # After it, lateness no longer adds up.
    later = starts[50:]
    achieved = (len(later) - 1) / (later[-1] - later[0])
    assert achieved >= 0.975 * 50  # the safety margin's 98%, less a hair
    assert max_starts_in_window(starts, 1.0) <= 50


async def test_one_very_late_timer_does_not_cost_a_window_of_credit(clock: VirtualClock) -> None:
    """On a busy loop a timer now and then fires later than the credit: that start is paced
    from its actual moment, but the starts after it keep the credit (treating it like a cold
    start, a window without credit, cost the 75-store benchmark 3-4 % of its rate)."""
    clock.lateness = 0.001
    lim = Limits(global_rate=Rate(50, per=1.0))
    sl = LocalLimiter().bind("acme", lim)
    starts: list[float] = []
    tasks = spawn(200, sl, "global", starts)

    async def one_busy_iteration() -> None:
        await asyncio.sleep(1.5)  # well after the cold-start window
        clock.late_once = 0.012

    await asyncio.gather(one_busy_iteration(), *tasks)
    starts.sort()
    gaps_after = gaps(starts)
    late = max(range(len(gaps_after)), key=gaps_after.__getitem__)
    assert gaps_after[late] >= lim.interval_for("global") + 0.01  # that start was late
    after = starts[late + 1 : late + 52]
    assert (len(after) - 1) / (after[-1] - after[0]) >= 0.975 * 50
    assert max_starts_in_window(starts, 1.0) <= 50
