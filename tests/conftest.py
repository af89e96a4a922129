"""Shared fixtures: a FakeAdminServer on loopback and clients whose limits are out of the way.

The suite runs in two pytest-xdist workers (pyproject.toml's addopts; ``-n 0`` for one
process). Each worker is a session of its own: session fixtures (redis-server, PostgreSQL) start
once per worker, on free loopback ports and in temporary directories, and a test shares nothing
with the other worker but the machine: no fixed port, no file outside its ``tmp_path``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from virtual_clock import VirtualClock

from asyncsubs import AdminClient, Limits, Rate
from asyncsubs._limiter import DEFAULT_LIMITER
from asyncsubs.limiting import Limiter
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, no_waiting

RESOURCES = ("subscriptions", "customers", "orders")
#: Limits that never make a functional test wait (rate limiting has its own tests).
FAST_LIMITS = Limits(
    global_rate=Rate(100_000, per=1.0),
    heavy={name: Rate(100_000, per=1.0) for name in RESOURCES},
)


@pytest.fixture
def fast_limits() -> Limits:
    return FAST_LIMITS


@pytest.fixture(autouse=True)
def no_retry_waits() -> Iterator[None]:
    """Retry backoffs and 429 pauses take no time in tests (stamina-style testing switch)."""
    with no_waiting():
        yield


@pytest.fixture(autouse=True)
def own_cache_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What pulls learn goes to a cache directory of the test's own, not the user's."""
    monkeypatch.setenv("ASYNCSUBS_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def fresh_default_limiter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts from untouched budgets: the default limiter's state outlives a test's
    loop, and one test's virtual clock means nothing on the next one's."""
    for name, value in vars(Limiter()).items():
        monkeypatch.setattr(DEFAULT_LIMITER, name, value)


@pytest.fixture
async def server() -> AsyncIterator[FakeAdminServer]:
    stores = [
        FakeStoreConfig("acme", records=1_000),
        FakeStoreConfig("globex", records={"subscriptions": 0, "customers": 1, "orders": 250}),
        FakeStoreConfig("initech", records=10, forbidden_paths=("orders",)),
    ]
    async with FakeAdminServer(stores=stores, rate_limits=None, max_page_size=250) as srv:
        yield srv


@pytest.fixture
def make_client(server: FakeAdminServer) -> Callable[..., AdminClient]:
    def make(store: str = "acme", **kwargs: Any) -> AdminClient:
        kwargs.setdefault("token", server.store(store).token)
        kwargs.setdefault("base_url", server.base_url)
        kwargs.setdefault("store", store)
        kwargs.setdefault("limits", FAST_LIMITS)
        kwargs.setdefault("timeout", 5.0)
        return AdminClient(**kwargs)

    return make


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
