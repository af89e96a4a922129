"""Shared fixtures: a FakeAdminServer on loopback and clients whose limits are out of the way."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from asyncsubs import AdminClient, Limits, Rate
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
