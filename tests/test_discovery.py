"""Discovery: heavy pools' rates and pages' sizes found at run time, remembered and shared.

Rates on the virtual loop clock against a sliding window modelled in the test (a server that
stamps each request as it starts); page sizes against the search alone and against a real
FakeAdminServer that clamps or refuses pages above its maximum.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from typing import Any

import attrs
import orjson
import pytest
from redis_fixtures import (  # noqa: F401 - the fixture registers by its name=
    RedisServer,
    redis_server_fixture,
)
from virtual_clock import VirtualClock

from asyncsubs import AdminClient, BadRequestError, ConfigError, Limits, Rate
from asyncsubs._config import Discovery
from asyncsubs._discovery import (
    LEARNED_MAX_AGE,
    MAX_HOLD,
    PROBE_HOLD,
    Learned,
    RateSearch,
    merged,
)
from asyncsubs._learned import SYNC_EVERY
from asyncsubs._page_size import FIRST_PAGE_ASK, PageSizeSearch, route
from asyncsubs._protocol import RawResponse, Request
from asyncsubs._server_limits import ServerLimit
from asyncsubs.limiting import Limiter, StoreLimiter
from asyncsubs.stores import parse_rate
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, ServerRateLimits
from asyncsubs.testing._limits import StoreWindows, Window

ORDERS = "orders"


class SlidingWindow:
    """A server's pool: at most ``n`` starts in any ``per`` seconds, stamped at the start."""

    def __init__(self, n: int, per: float = 1.0) -> None:
        self.n, self.per, self.starts = n, per, deque[float]()

    def admit(self, now: float) -> float | None:
        """None when accepted, else the Retry-After (seconds until a slot frees)."""
        while self.starts and self.starts[0] <= now - self.per:
            self.starts.popleft()
        if len(self.starts) < self.n:
            self.starts.append(now)
            return None
        return self.starts[0] + self.per - now


@attrs.define
class Run:
    refusals: list[float] = attrs.Factory(list)  # loop times of 429s
    accepted: list[float] = attrs.Factory(list)
    rates: list[tuple[float, float]] = attrs.Factory(list)  # (time, rate) at each change


async def pull(
    sl: StoreLimiter, server: SlidingWindow, seconds: float, *, pool: str = ORDERS
) -> Run:
    """A sequential pull of ``pool`` for ``seconds`` of loop time, each page 10 ms to answer;
    a 429 pauses the pool for the server's Retry-After, as the client does."""
    loop, run = asyncio.get_running_loop(), Run()
    end = loop.time() + seconds
    while loop.time() < end:
        async with sl.slot(pool) as slot:
            now = loop.time()
            retry_after = server.admit(now)
            await asyncio.sleep(0.01)
        if retry_after is None:
            run.accepted.append(now)
        else:
            run.refusals.append(now)
            sl.rate_limited(slot, math.ceil(retry_after))
        rate = sl.stats().pools[pool].rate
        if not run.rates or run.rates[-1][1] != rate:
            run.rates.append((now, rate))
    return run


def discovering(ceiling: int = 50, start: int = 1) -> Limits:
    return Limits(heavy={ORDERS: Rate.discover(start=start, ceiling=ceiling)})


def bind(limits: Limits, limiter: Limiter | None = None) -> StoreLimiter:
    return (limiter or Limiter()).bind("acme", limits)


def achieved(times: list[float], since: float, until: float) -> float:
    return sum(since <= t < until for t in times) / (until - since)


# --------------------------------------------------------------------------------------------
# Configuration


def test_discovery_is_one_keyword_away_and_fixed_rates_keep_their_meaning() -> None:
    assert Limits().discovery_for(ORDERS) is None  # the default stays fixed and conservative
    limits = Limits(discover=True, heavy={"customers": Rate(5)})
    assert limits.discovery_for(ORDERS) == Discovery()
    assert limits.discovery_for("customers") is None
    assert limits.rate_for("customers") == Rate(5)
    assert limits.rate_for(ORDERS) == Rate(1)  # where a discovering pool starts
    assert limits.discovery_for("global") is None  # the interface documents its 50/s
    assert Limits(discover=True) == Limits(heavy={p: Rate.discover() for p in limits.heavy})
    assert Rate.discover(start=2, ceiling=Rate(20, per=2.0)) == Discovery(Rate(2), Rate(20, 2.0))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: Rate.discover(start=20, ceiling=10), "above its ceiling"),
        (lambda: Rate.discover(start=0), "positive int"),
        (lambda: Limits(global_rate=Rate.discover()), "global_rate must be a Rate"),  # type: ignore[arg-type]
        (lambda: Limits(heavy={ORDERS: 5}), "must be a Rate or Rate.discover"),  # type: ignore[dict-item]
        (lambda: Limits(discover="yes"), "discover must be a bool"),  # type: ignore[arg-type]
        # Beyond any server; it would overflow the pacing's per-window state.
        (lambda: Rate(10**30), "Rate.n must be at most 1,000,000"),
        (lambda: Rate(1, per=1e308), "Rate.per must be at most 86,400 seconds"),
        (lambda: parse_rate(f"{10**400}/s"), "a rate needs at most 1,000,000 requests"),
    ],
)
def test_bad_discovery_config_is_a_config_error(call: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        call()


# --------------------------------------------------------------------------------------------
# The rate search, on the virtual clock


async def test_a_clean_pool_doubles_after_two_clean_windows_up_to_its_ceiling(
    clock: VirtualClock,
) -> None:
    run = await pull(bind(discovering(ceiling=40)), SlidingWindow(1000), 20.0)
    assert [rate for _, rate in run.rates] == [1, 2, 4, 8, 16, 32, 40]
    changes = [t for t, _ in run.rates]
    # Each rate ran two windows, with starts that waited for their slot.
    assert all(b - a >= 2.0 for a, b in itertools.pairwise(changes))
    assert changes[-1] - changes[0] < 16.0  # 1 to 40/s in under sixteen seconds
    assert not run.refusals


async def test_a_429_sets_the_rate_to_what_the_server_allowed_then_holds(
    clock: VirtualClock,
) -> None:
    sl = bind(discovering())
    run = await pull(sl, SlidingWindow(10), PROBE_HOLD - 30)
    assert len(run.refusals) == 1  # the ramp's step to 16/s, answered with the 10 it accepted
    pool = sl.stats().pools[ORDERS]
    # Just under the 10 it accepted in the window before the refused start.
    assert (pool.rate, pool.rate_by, pool.ceiling_found) == (10 / 1.02, "429", 16.0)
    assert run.rates[-1][0] == run.refusals[0]  # no raise during the hold
    # From then on, the pool runs at that rate less the 2% margin, with no 429.
    start = run.refusals[0] + 2
    assert achieved(run.accepted, start, start + 200) == pytest.approx(10 / 1.02**2, rel=0.005)


class ServerWindow:
    """The fake server's own window of a flavour, as a ``SlidingWindow`` is used."""

    def __init__(self, window: Window, n: int, per: float = 1.0) -> None:
        limits = ServerRateLimits(heavy={ORDERS: Rate(n, per=per)}, window=window)
        self.windows = StoreWindows(limits)

    def admit(self, now: float) -> float | None:
        return self.windows.acquire(ORDERS, now)


@pytest.mark.parametrize("window", ["sliding", "fixed", "leaky"])
@pytest.mark.parametrize("n", [2, 5, 10])
async def test_every_window_flavour_is_found_with_few_429s(
    clock: VirtualClock, window: Window, n: int
) -> None:
    sl = bind(discovering())
    run = await pull(sl, ServerWindow(window, n), 120)  # type: ignore[arg-type]
    # A token bucket lets a rate above its refill run clean until its reserve is spent, so the
    # rates just above its limit look clean for a while: a probe more.
    assert len(run.refusals) <= (5 if window == "leaky" else 4)
    # The pool's rate may sit a margin above n where the pull's own pauses keep its starts
    # under n (a token bucket then never refuses it); what the server sees stays under n.
    rate = sl.stats().pools[ORDERS].rate
    assert 0.9 * n <= rate <= 1.02 * n
    start = run.accepted[-1] - 60
    assert 0.9 * n <= achieved(run.accepted, start, start + 60) <= n


async def test_a_token_buckets_leak_is_what_it_let_through_between_two_refusals(
    clock: VirtualClock,
) -> None:
    """A bucket of 3 refilled at 1.5/s lets 2/s run clean for two windows while it fills; the
    first refusal at the rate found under it comes seconds later, when the bucket is full
    again: it let through what it leaked in between."""
    sl, server = bind(discovering()), ServerWindow("leaky", 3, per=2.0)
    run = await pull(sl, server, 20)
    assert len(run.refusals) == 2  # the probe to 4/s, then 1.96/s once the bucket filled
    assert 1.5 * 0.9 <= sl.stats().pools[ORDERS].rate <= 1.5  # not the 1.92/s a margin gives
    later = await pull(sl, server, 60)
    assert not later.refusals
    assert achieved(later.accepted, later.accepted[0], later.accepted[-1]) >= 0.9 * 1.5


def test_a_refusal_soon_after_the_last_says_nothing_of_a_leak() -> None:
    """Two windows at least between two refusals, most of it running: a span shorter, or
    mostly a pause, would count a pause's silence as the server's refusal to serve."""

    def at_the_edge() -> RateSearch:
        search = RateSearch(Discovery(start=Rate(1), ceiling=Rate(50)))
        search._goods, search.good, search.rate = [2.0], 2.0, 2.0
        return search

    def refused_twice(search: RateSearch, pause: float, then: float) -> float:
        """Refused at 0, paused, then saturated at 2/s until refused ``then`` s later."""
        search.refused_start(0.0, 0.01, -math.inf, 1, 0.5)
        search.rate, search.good, search._goods, search.changed_at = 2.0, 2.0, [2.0], 0.01
        search._edge = 0  # the first refusal at this level
        starts = [pause + i * 0.5 for i in range(int((then - pause) / 0.5) + 1)]
        for start in starts:
            search.started(start, waited=True)
        search.refused_start(starts[-1], starts[-1] + 0.01, pause, 1, 0.5)
        return search.rate

    # Paused 1 s, refused 3 s later: 4 accepted starts of the 6 its pace would have sent in
    # 3 s, so two thirds of 2/s less the margin.
    assert refused_twice(at_the_edge(), 1.0, 3.0) == pytest.approx(4 / 3 / 1.02)
    # 1.5 s later (under two windows), or mostly paused: a margin's step, as without a leak.
    assert refused_twice(at_the_edge(), 1.0, 1.5) == pytest.approx(2 / 1.02)
    assert refused_twice(at_the_edge(), 2.5, 4.0) == pytest.approx(2 / 1.02)


async def test_probes_after_the_hold_grow_rarer_at_the_same_level(clock: VirtualClock) -> None:
    sl = bind(discovering())
    run = await pull(sl, SlidingWindow(10), 40 * 60)
    gaps = [b - a for a, b in itertools.pairwise(run.refusals)]
    # 5, 10 and 20 minutes (and the probe's own clean windows) between refusals.
    assert gaps == pytest.approx([PROBE_HOLD, 2 * PROBE_HOLD, 4 * PROBE_HOLD], abs=15.0)
    assert sl.stats().pools[ORDERS].rate == pytest.approx(10 / 1.02, rel=0.03)
    assert len(run.refusals) <= 1 + 40 // 10  # at most one 429 per ten minutes after the first


async def test_a_server_that_raises_its_limit_is_followed_after_the_hold(
    clock: VirtualClock,
) -> None:
    sl, server = bind(discovering()), SlidingWindow(10)
    await pull(sl, server, 60)
    server.n = 20  # the service gave the store a larger pool
    run = await pull(sl, server, PROBE_HOLD + 60)
    pool = sl.stats().pools[ORDERS]
    assert pool.rate == pytest.approx(20.0, rel=0.05)
    assert pool.ceiling_found is None or pool.ceiling_found > 20  # the old refusal forgotten
    assert len(run.refusals) <= 2


async def test_a_server_that_lowers_its_limit_costs_two_429s(clock: VirtualClock) -> None:
    sl, server = bind(discovering()), SlidingWindow(10)
    await pull(sl, server, 60)
    server.n = 5  # mid-window: the first 429's window still holds starts it took at 10/s
    run = await pull(sl, server, 120)
    assert len(run.refusals) == 2
    assert sl.stats().pools[ORDERS].rate == pytest.approx(5 / 1.02)


async def test_an_announced_quota_replaces_the_search(clock: VirtualClock) -> None:
    sl = bind(discovering())
    sl.server_limit(ORDERS, ServerLimit(quota=6, window=1.0, remaining=5, reset=1.0))
    run = await pull(sl, SlidingWindow(1000), 30)
    pool = sl.stats().pools[ORDERS]
    assert (pool.rate, pool.rate_by, pool.paced_by) == (6.0, "server", "server")
    assert [rate for _, rate in run.rates] == [6.0]  # never probed above it


async def test_probing_never_touches_the_global_pool(clock: VirtualClock) -> None:
    sl = bind(discovering())
    await pull(sl, SlidingWindow(10), 20)
    pool = sl.stats().pools["global"]
    assert (pool.rate_by, pool.ceiling_found) == ("configured", None)
    run = await pull(sl, SlidingWindow(1000), 5, pool="global")
    assert {rate for _, rate in run.rates} == {50.0}


def test_a_refusal_never_goes_below_the_last_clean_rate_or_a_quarter_of_the_start() -> None:
    search = RateSearch(Discovery(start=Rate(4), ceiling=Rate(50)))
    search._goods, search.good, search.rate = [4.0, 8.0], 8.0, 16.0
    # Counted from this process's starts only (workers shared through Redis): fewer than 8/s
    # needs means other workers' went unseen.
    search.refused_at(0.0, allowed=2.0, every_start=False)
    assert search.rate == 12.0  # halfway back to the rate that ran clean
    search.refused_at(1.0, allowed=None)
    assert search.rate == 10.0
    search.rate = 8.0
    # The rate that ran clean was refused: at the server's edge, a margin's step down from
    # it, and the rate that ran clean before it is the floor now.
    search.refused_at(2.0, allowed=None)
    assert (search.good, search.rate) == (4.0, 8 / 1.02)
    # Counted from every start of the pool: the server evidently lowered its limit.
    search.refused_at(3.0, allowed=4.5)
    assert (search.good, search.rate) == (4.0, 4.5 / 1.02)
    for now in range(4, 60):
        search.refused_at(float(now), allowed=None)
    assert search.rate == 1.0  # a quarter of the start at least
    assert search.hold_until == 59.0 + MAX_HOLD


def test_a_probe_refused_keeps_the_rate_that_ran_clean_a_start_under_the_count() -> None:
    def probing() -> RateSearch:
        search = RateSearch(Discovery(start=Rate(1), ceiling=Rate(50)))
        search._goods, search.good, search.rate = [1.0, 2.0, 4.0, 4.9], 4.9, 4.9 * 1.05
        return search

    # The server allows 5/s; this loop's window counted four of the starts it accepted (the
    # server's window is not quite ours): 4.9/s ran clean, so the limit was not lowered.
    search = probing()
    search.refused_at(0.0, allowed=4.0)
    assert (search.good, search.rate) == (4.9, 4.9 / 1.02)
    # Two starts fewer than the rate that ran clean needs: the server lowered its limit.
    search = probing()
    search.refused_at(0.0, allowed=2.0)
    assert (search.good, search.rate) == (2.0, 2.0 / 1.02)


# --------------------------------------------------------------------------------------------
# Remembered: import, export, expiry, sharing between loops and workers


async def test_an_export_imported_starts_the_next_client_where_the_first_stopped(
    clock: VirtualClock,
) -> None:
    server = SlidingWindow(10)
    async with FakeAdminServer(stores=["acme"], rate_limits=None) as fake:
        kwargs: dict[str, Any] = {
            "token": fake.store("acme").token,
            "base_url": fake.base_url,
            "store": "acme",
            "limits": discovering(),
        }
        first = AdminClient(**kwargs, limiter=Limiter())
        await pull(first._bound_limiter(), server, 60)
        saved = first.export_learned()
        await asyncio.sleep(1.0)  # the server's window empties, as between two runs
        second = AdminClient(**kwargs, limiter=Limiter(), learned=saved)
        run = await pull(second._bound_limiter(), server, 60)
    assert not run.refusals  # no probing 429 the second time: the hold came along
    assert achieved(run.accepted, run.accepted[0], run.accepted[0] + 10) > 0.93 * 10
    pool = second.stats.pools[ORDERS]
    assert (pool.rate, pool.rate_by, pool.ceiling_found) == (10 / 1.02, "remembered", 16.0)
    assert saved["pools"][ORDERS]["hold_until"] > time.time() + PROBE_HOLD - 120


async def test_a_run_from_an_imported_refusal_holds_it_before_a_probe(
    clock: VirtualClock,
) -> None:
    """A record whose hold ran out between two runs (a rerun an hour later): the new run holds
    the refused level as long as a 429 would from its start, then probes 5% up."""
    sl = bind(discovering())
    rate = 10 / 1.02
    done = Learned(rate=rate, rate_by="429", good=rate, refused=16.0, strikes=1, age=3600.0)
    sl.learning.restore({ORDERS: done})
    run = await pull(sl, SlidingWindow(10), PROBE_HOLD - 30)
    assert not run.refusals  # no step up: no 429
    assert [r for _, r in run.rates] == [rate]
    later = await pull(sl, SlidingWindow(10), 60)
    assert later.rates[1][1] == pytest.approx(rate * 1.05)  # a probe, once the hold ran out


async def test_an_expired_record_is_probed_again_from_its_rate(clock: VirtualClock) -> None:
    sl = bind(discovering())
    old = Learned(rate=10.0, rate_by="429", good=10.0, refused=16.0, strikes=3, hold=3000.0)
    sl.learning.restore({ORDERS: attrs.evolve(old, age=LEARNED_MAX_AGE + 1)})
    run = await pull(sl, SlidingWindow(30), 10)
    assert [rate for _, rate in run.rates][:2] == [10.0, 20.0]  # from it, far from a refusal


def test_an_import_of_another_store_or_a_damaged_one_is_a_config_error() -> None:
    kwargs: dict[str, Any] = {"token": "t", "base_url": "https://subs.example", "store": "acme"}
    base = "https://subs.example/admin/2026-04/"
    good = {"format": "asyncsubs.learned/1", "base_url": base, "store": "acme", "pools": {}}
    AdminClient(**kwargs, learned=good)
    for learned, match in [
        ({**good, "store": "globex"}, "another store"),
        ({**good, "base_url": "https://other.example/admin/2026-04/"}, "another"),
        ({**good, "format": "v0"}, "export_learned"),
        ({**good, "pools": {"orders": {"rate": -1}}}, r"pools\['orders'\]: rate must be"),
        # A page of no records: every pull of the path would ask for it, and be refused.
        ({**good, "pools": {"orders": {"page_size": 0}}}, "page_size must be an int >= 1"),
        ({**good, "pools": {"orders": {"rate": 5, "bogus": 1}}}, "unknown fields"),
        ({**good, "pools": {"orders": {"learned_at": "yesterday"}}}, "Unix times"),
        ([1, 2], "export_learned"),
    ]:
        with pytest.raises(ConfigError, match=match):
            AdminClient(**kwargs, learned=learned)  # type: ignore[arg-type]


def test_an_unused_clients_export_keeps_the_times_it_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kwargs: dict[str, Any] = {"token": "t", "base_url": "https://subs.example", "store": "acme"}
    now = time.time()
    record = {"rate": 5.0, "rate_by": "429", "hold_until": now + 300, "learned_at": now - 60}
    given = {
        "format": "asyncsubs.learned/1",
        "base_url": "https://subs.example/admin/2026-04/",
        "store": "acme",
        "pools": {ORDERS: record},
    }
    client = AdminClient(**kwargs, learned=given)
    wall, monotonic = time.time, time.monotonic
    monkeypatch.setattr(time, "time", lambda: wall() + 100)  # the client idle 100 s
    monkeypatch.setattr(time, "monotonic", lambda: monotonic() + 100)
    exported = client.export_learned()["pools"][ORDERS]
    assert exported["hold_until"] == pytest.approx(now + 300, abs=1.0)
    assert exported["learned_at"] == pytest.approx(now - 60, abs=1.0)


async def test_a_pools_exchanges_with_the_backend_never_overlap(clock: VirtualClock) -> None:
    limiter = Limiter()
    backend: Any = limiter._backend
    exchange, inside, most = backend.exchange, 0, 0

    async def slow_exchange(*args: Any) -> Any:  # a round trip, as to Redis
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        try:
            await asyncio.sleep(0.05)
            return await exchange(*args)
        finally:
            inside -= 1

    backend.exchange = slow_exchange
    sl = bind(discovering(), limiter)
    await pull(sl, SlidingWindow(10), 30)  # raises, a 429, the sweeps: each shares
    assert most == 1
    assert sl.stats().pools[ORDERS].rate == pytest.approx(10 / 1.02, rel=0.05)


async def test_loops_of_one_process_share_what_a_pool_learned(clock: VirtualClock) -> None:
    limiter, server = Limiter(), SlidingWindow(10)
    await pull(bind(discovering(), limiter), server, 30)
    # Another store limiter of the same store (as a second loop binds) starts from it.
    other = StoreLimiter("acme", discovering(), limiter._backend, bind(discovering()).jitter)
    run = await pull(other, server, 30)
    assert not run.refusals
    assert run.rates[0][1] == 10 / 1.02


def test_two_records_changed_at_once_keep_the_lower_rate_and_all_page_evidence() -> None:
    raised = Learned(rate=20.0, rate_by="probe", good=10.0, page_accepted=500)
    refused = Learned(rate=9.0, rate_by="429", refused=10.0, page_refused=501, age=3.0)
    both = merged(raised, refused)
    assert (both.rate, both.rate_by, both.refused) == (9.0, "429", 10.0)
    assert (both.page_accepted, both.page_refused) == (500, 501)


# --------------------------------------------------------------------------------------------
# Page sizes


def play(search: PageSizeSearch, largest: int, over: str, pages: int = 40) -> tuple[int, list[int]]:
    """Pages of a big list against a server serving at most ``largest`` records, clamping or
    refusing larger pages: the 400s and the sizes asked."""
    refusals, asked = 0, []
    for _ in range(pages):
        size = search.ask()
        asked.append(size)
        if size > largest and over == "reject":
            refusals += 1
            assert search.refused_size(size)
            continue
        search.served(size, min(size, largest), has_next=True)
    return refusals, asked


@pytest.mark.parametrize(
    ("largest", "asked"),
    [
        (100, [1000, 1000, 100, 100]),
        (500, [1000, 1000, 500, 500]),
        # A page served in full (1,000 of 1,000) is followed by one of the next size up.
        (1000, [1000, 2500, 2500, 1000]),
    ],
)
def test_a_clamping_server_tells_its_size_in_two_short_pages(
    largest: int, asked: list[int]
) -> None:
    search = PageSizeSearch()
    assert play(search, largest, "clamp", pages=4) == (0, asked)
    assert (search.size, search.by) == (largest, "clamp")


@pytest.mark.parametrize(("largest", "most"), [(100, 4), (500, 2), (1000, 2), (5000, 2)])
def test_a_refusing_server_round_maximum_costs_few_400s(largest: int, most: int) -> None:
    search = PageSizeSearch()
    refusals, asked = play(search, largest, "reject")
    assert (search.size, search.by) == (largest, "400")
    assert refusals <= most
    assert len(set(asked[-10:])) == 1  # then every page is asked at the size learned


@pytest.mark.parametrize("largest", [73, 300, 777, 2345])
def test_a_refusing_server_odd_maximum_is_found_within_two_percent(largest: int) -> None:
    search = PageSizeSearch()
    refusals, asked = play(search, largest, "reject", pages=60)
    assert search.size is not None
    assert 0.98 * largest <= search.size <= largest
    assert refusals <= 9
    assert all(asked.count(size) == 1 for size in asked if size != search.size)  # never twice


def test_a_400_to_a_size_accepted_before_is_not_about_the_size() -> None:
    search = PageSizeSearch()
    search.served(1000, 1000, has_next=True)
    assert not search.refused_size(1000)
    assert search.refused is None


def test_a_first_page_refused_at_every_rung_is_not_about_the_size() -> None:
    search = PageSizeSearch()
    asked = []
    while True:
        asked.append(size := search.ask())
        if not search.refused_size(size):
            break
    assert asked == [1000, 500, 250, 100, 50]
    assert (search.refused, search.size, search.ask()) == (None, None, FIRST_PAGE_ASK)


def test_one_short_page_is_not_a_clamp() -> None:
    search = PageSizeSearch()
    search.served(1000, 40, has_next=True)  # a filtered stretch
    search.served(1000, 1000, has_next=True)
    search.served(1000, 40, has_next=True)
    search.served(1000, 7, has_next=False)  # the last page
    assert search.size is None


@pytest.fixture
async def large_stores() -> Any:
    stores = [
        FakeStoreConfig("clamps", records={"orders": 2_345}, max_page_size=300),
        FakeStoreConfig("refuses", records={"orders": 2_345}, max_page_size=500, over_max="reject"),
        FakeStoreConfig("small", records={"orders": 345}, max_page_size=20, over_max="reject"),
    ]
    async with FakeAdminServer(stores=stores, rate_limits=None) as fake:
        yield fake


@pytest.mark.parametrize(
    ("store", "largest", "most_400s"), [("clamps", 300, 0), ("refuses", 500, 2), ("small", 20, 7)]
)
async def test_a_max_pull_learns_the_size_and_keeps_every_record_once(
    large_stores: FakeAdminServer, store: str, largest: int, most_400s: int
) -> None:
    fake = large_stores
    async with AdminClient(
        token=fake.store(store).token,
        base_url=fake.base_url,
        store=store,
        limiter=Limiter(),
        limits=discovering(ceiling=10_000, start=10_000),
    ) as client:
        pages = [page async for page in client.orders.list(page_size="max", model=dict).pages()]
        ids = [record["id"] for page in pages for record in page.data]
        assert ids == [r["id"] for r in fake.records(store, ORDERS)]
        pool = client.stats.pools[ORDERS]
        assert pool.page_size == largest
        assert fake.stats(store).statuses.get(400, 0) <= most_400s
        # The next pull of the store asks the learned size from its first page.
        async for _ in client.orders.list(page_size="max", model=dict).pages():
            break
    sizes = [r.query["pageSize"] for r in fake.requests if r.store == store]
    assert sizes[-1] == str(largest)


async def test_a_page_size_exported_as_before_starts_the_next_client_at_it(
    large_stores: FakeAdminServer,
) -> None:
    """The page size travels in the export's format of old (one record per pool or path, rate
    and page fields together): an import is used from the path's first page, without a 400,
    and the export of a client that has not pulled the path yet keeps it."""
    fake = large_stores
    kwargs: dict[str, Any] = {
        "token": fake.store("refuses").token,
        "base_url": fake.base_url,
        "store": "refuses",
        "limits": discovering(ceiling=10_000, start=10_000),
    }
    now = time.time()
    old = {  # as asyncsubs wrote it before page sizes moved out of the limiter
        "format": "asyncsubs.learned/1",
        "base_url": f"{fake.base_url}/admin/2026-04/",
        "store": "refuses",
        "pools": {
            "subscriptions": {
                "page_size": 500,
                "page_by": "400",
                "page_accepted": 500,
                "page_refused": 501,
                "hold_until": now,
                "learned_at": now - 60,
            },
            ORDERS: {
                "rate": 10_000.0,
                "rate_by": "start",
                "page_size": 500,
                "page_by": "400",
                "page_accepted": 500,
                "page_refused": 501,
                "hold_until": now,
                "learned_at": now - 60,
            },
        },
    }
    async with AdminClient(**kwargs, limiter=Limiter(), learned=old) as client:
        async for _ in client.orders.list(page_size="max", model=dict).pages():
            pass
        pool = client.stats.pools[ORDERS]
        assert (pool.page_size, pool.page_size_by) == (500, "remembered")
        exported = client.export_learned()["pools"]
    assert fake.stats("refuses").statuses.get(400, 0) == 0
    assert {r.query["pageSize"] for r in fake.requests if r.path.endswith(ORDERS)} == {"500"}
    assert exported["subscriptions"]["page_size"] == 500  # not pulled, still known
    assert (exported[ORDERS]["page_size"], exported[ORDERS]["page_refused"]) == (500, 501)


@pytest.mark.parametrize(
    ("store", "pull", "said", "most_400s"),
    [
        # A filter the server refuses: the ladder down to 50, no further, then the 400.
        ("refuses", {"params": {"status": "NO"}}, "status must be one of", 5),
        # An expired or foreign cursor: the 400 at once.
        ("clamps", {"after_cursor": "expired"}, "INVALID_CURSOR", 1),
    ],
)
async def test_a_400_that_is_not_about_the_size_fails_and_teaches_no_size(
    large_stores: FakeAdminServer,
    fast_limits: Limits,
    store: str,
    pull: dict[str, Any],
    said: str,
    most_400s: int,
) -> None:
    fake = large_stores
    async with AdminClient(
        token=fake.store(store).token,
        base_url=fake.base_url,
        store=store,
        limiter=Limiter(),
        limits=fast_limits,  # the ladder's requests unpaced: its steps are what counts here
    ) as client:
        with pytest.raises(BadRequestError, match=said):
            await anext(aiter(client.subscriptions.list(page_size="max", **pull)))
        learned = client.export_learned()["pools"]["subscriptions"]
    assert fake.stats(store).statuses[400] <= most_400s
    assert (learned["page_size"], learned["page_refused"]) == (None, None)


def test_page_size_max_is_spelled_as_documented() -> None:
    client = AdminClient(token="t", base_url="https://subs.example")
    with pytest.raises(ConfigError, match='page_size \\(or "max"\\)'):
        client.orders.list(page_size="largest")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Shared through a real redis-server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.mark.redis
async def test_redis_keeps_one_record_per_pool_written_compare_and_set(redis_url: str) -> None:
    from asyncsubs.redis import RedisLimiter

    record = Learned(rate=7.0, rate_by="429", refused=8.0, strikes=1, hold=100.0)
    async with RedisLimiter(redis_url, prefix=f"t-{time.monotonic_ns()}") as limiter:
        pacing = limiter.pacing
        assert await pacing.exchange("acme", ORDERS, 0, None) == (0, None, False)
        assert await pacing.exchange("acme", ORDERS, 0, record) == (1, record, True)
        other = attrs.evolve(record, rate=9.0)
        version, shared, written = await pacing.exchange("acme", ORDERS, 0, other)
        assert (version, shared, written) == (1, record, False)  # made from a stale version
        await asyncio.sleep(0.2)
        version, shared, _ = await pacing.exchange("acme", ORDERS, 1, None)
        assert shared is not None
        assert 99.0 < shared.hold < 99.9  # counted down on Redis's clock
        assert 0.1 < shared.age < 1.0


@pytest.mark.redis
async def test_workers_sharing_redis_pace_one_pool_by_the_store_s_learned_rate(
    redis_url: str,
) -> None:
    """Two workers (each its own RedisLimiter) pull one discovering pool of a store against a
    server allowing 4/s: what either learns is the store's, and together they stay inside."""
    from asyncsubs.redis import RedisLimiter

    prefix, server = f"t-{time.monotonic_ns()}", SlidingWindow(4)
    limits = discovering(ceiling=16, start=2)
    async with (
        RedisLimiter(redis_url, prefix=prefix) as a,
        RedisLimiter(redis_url, prefix=prefix) as b,
    ):
        workers = [a.bind("acme", limits), b.bind("acme", limits)]
        runs = await asyncio.gather(*(pull(worker, server, 7.0) for worker in workers))
        # A second more: each reads what the other wrote last.
        await asyncio.gather(*(pull(worker, server, 1.2) for worker in workers))
    first, second = (worker.stats().pools[ORDERS].rate for worker in workers)
    assert first == second  # one learned rate, the store's
    # Together within the server's 4/s; the starts a 429 counts are each worker's own, scaled by
    # the workers sharing the pool, so not exactly 4/s (the benchmark measures how close).
    assert 2 <= first <= 4
    assert sum(len(run.refusals) for run in runs) <= 4
    accepted = sorted(t for run in runs for t in run.accepted)
    late = [t for t in accepted if t > accepted[-1] - 2.0]
    assert len(late) / 2.0 <= 4.0


@pytest.mark.redis
async def test_a_page_size_learned_by_one_worker_is_the_next_workers_through_redis(
    large_stores: FakeAdminServer, redis_url: str
) -> None:
    """The page size is part of the path's shared record: a worker starting after another
    learned it (and shared it, at its next request a second on) asks that size from its first
    page, without a 400."""
    from asyncsubs.redis import RedisLimiter

    fake, prefix = large_stores, f"t-{time.monotonic_ns()}"
    kwargs: dict[str, Any] = {
        "token": fake.store("refuses").token,
        "base_url": fake.base_url,
        "store": "refuses",
    }
    async with (
        RedisLimiter(redis_url, prefix=prefix) as first,
        AdminClient(**kwargs, limiter=first) as client,
    ):
        async for _ in client.orders.list(page_size="max", model=dict).pages():
            pass
        await asyncio.sleep(SYNC_EVERY)
        first_id = fake.records("refuses", ORDERS)[0]["id"]
        await client.request("GET", f"orders/{first_id}")  # a start: what was learned is shared
        await asyncio.sleep(0.2)
    fake.clear_requests()
    refused = fake.stats("refuses").statuses.get(400, 0)
    async with (
        RedisLimiter(redis_url, prefix=prefix) as second,
        AdminClient(**kwargs, limiter=second) as client,
    ):
        page = await anext(aiter(client.orders.list(page_size="max").pages()))
        assert client.stats.pools[ORDERS].page_size == 500
    assert len(page.data) == 500
    assert [r.query["pageSize"] for r in fake.requests] == ["500"]
    assert fake.stats("refuses").statuses.get(400, 0) == refused


def test_a_probe_not_yet_answered_is_remembered_as_the_rate_before_it() -> None:
    """A pull too short to see its last raise refused or run clean exported it: the next run
    starts where the rate last ran clean, not above the server's limit."""
    search = RateSearch(Discovery())
    probe = Learned(rate=4.0, rate_by="probe", good=2.0, age=10.0)
    search.restore(probe, 0.0, by="remembered")
    assert (search.rate, search.by) == (2.0, "remembered")
    settled = Learned(rate=9.5, rate_by="429", good=8.0, refused=16.0, hold=100.0, age=10.0)
    search.restore(settled, 0.0, by="remembered")
    assert search.rate == 9.5  # a rate a 429 set is the server's evidence


class NestedLists:
    """A transport serving ``customers/<id>/orders``: 250 records a page at most, clamped."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        path, _, query = request.url.partition("/admin/2026-04/")[2].partition("?")
        asked = int(dict(p.split("=") for p in query.split("&"))["pageSize"])
        self.asked.append((path, asked))
        served = min(asked, 250)
        after = "afterCursor" in query
        body = {
            "success": True,
            "code": "SUCCESS",
            "data": [{"id": i} for i in range(served)],
            "pageInfo": {"hasNextPage": not after, "nextCursor": None if after else "c1"},
        }
        return RawResponse(200, {}, orjson.dumps(body))

    async def aclose(self) -> None:
        pass


async def test_a_nested_list_learns_one_page_size_for_all_its_parents() -> None:
    """Each customer's orders share one route: the page size found for the first customer
    serves the others, and the store holds one record for them all, not one per customer."""
    transport = NestedLists()
    kwargs: dict[str, Any] = {"token": "t", "base_url": "https://subs.example"}
    async with AdminClient(**kwargs, transport=transport, limiter=Limiter()) as client:
        for customer in range(1, 30):
            orders = client.list_endpoint(f"customers/{customer}/orders")
            async for _ in orders.list(page_size="max", model=dict).pages():
                pass
        exported = client.export_learned()["pools"]
    assert [asked for path, asked in transport.asked if path == "customers/29/orders"] == [250, 250]
    assert [key for key in exported if key.startswith("customers")] == ["customers/{id}/orders"]
    assert exported["customers/{id}/orders"]["page_size"] == 250


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("subscriptions", "subscriptions"),
        ("customers/123/orders", "customers/{id}/orders"),
        ("customers/gid-9f3/orders/open", "customers/{id}/orders/open"),
        ("a/1/b/2/c", "a/{id}/b/{id}/c"),
        ("reports/daily", "reports/daily"),  # a last segment is a list, not an id
        ("reports/2026/items", "reports/{id}/items"),
        ("customers/vip/orders", "customers/vip/orders"),  # no digit: not taken for an id
    ],
)
def test_a_list_path_learns_under_its_route(path: str, expected: str) -> None:
    assert route(path) == expected


async def test_a_heavy_pool_of_a_nested_path_learns_under_its_own_name() -> None:
    """A path given its own heavy pool keeps its page size under the pool's name (its stats)."""
    path = "customers/7/orders"
    limits = Limits(heavy={path: Rate(100_000)})
    kwargs: dict[str, Any] = {"token": "t", "base_url": "https://subs.example", "limits": limits}
    async with AdminClient(**kwargs, transport=NestedLists(), limiter=Limiter()) as client:
        for _ in range(2):  # a page cut short twice: the size
            async for _ in client.list_endpoint(path).list(page_size="max", model=dict).pages():
                pass
        assert client.stats.pools[path].page_size == 250
        assert path in client.export_learned()["pools"]
