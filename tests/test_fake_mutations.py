"""The fake server's records over time: the seeded Mutator, deletes, the incremental
``updatedAtMin`` filter of list endpoints, and the WebhookSender delivering signed changes."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from app_server import serving

from asyncsubs import AdminClient, BadRequestError, Limits, NotFoundError
from asyncsubs.testing import (
    ChangeEvent,
    FakeAdminServer,
    FakeStoreConfig,
    Mutator,
    WebhookSender,
)
from asyncsubs.testing._data import iso
from asyncsubs.webhooks import WebhookConfig, verify_delivery

RESOURCES = ("subscriptions", "customers", "orders")
SECRET = "fake-webhook-secret"
START = 1_900_000_000.0  # 2030: later than every generated record


def stepping_clock(start: float = START, step: float = 0.3) -> Callable[[], float]:
    ticks = itertools.count()
    return lambda: start + step * next(ticks)


def fake(records: int = 80, **kwargs: Any) -> FakeAdminServer:
    kwargs.setdefault("rate_limits", None)
    return FakeAdminServer(stores=[FakeStoreConfig("acme", records=records)], **kwargs)


def client_for(server: FakeAdminServer, limits: Limits) -> AdminClient:
    return AdminClient(
        token=server.store("acme").token,
        base_url=server.base_url,
        store="acme",
        limits=limits,
        timeout=5.0,
    )


async def pull(client: AdminClient, resource: str, **params: Any) -> list[dict[str, Any]]:
    endpoint = getattr(client, resource)
    return [r async for r in endpoint.list(page_size=7, params=params or None, model=dict)]


def active_counts_hold(server: FakeAdminServer) -> bool:
    active = collections.Counter(
        s["customerId"] for s in server.records("acme", "subscriptions") if s["status"] == "ACTIVE"
    )
    return all(
        c["activeSubscriptionCount"] == active[c["id"]] for c in server.records("acme", "customers")
    )


# --- Mutator ------------------------------------------------------------------------------------


async def test_mutator_is_deterministic() -> None:
    results = []
    for _ in range(2):
        server = fake(seed=9)
        mutator = server.mutator("acme", clock=stepping_clock())
        await mutator.run(steps=120)
        results.append((list(mutator.history), {r: server.records("acme", r) for r in RESOURCES}))
    assert results[0] == results[1]
    other = fake(seed=9).mutator("acme", seed=10, clock=stepping_clock())
    await other.run(steps=120)
    assert list(other.history) != results[0][0]


async def test_every_change_moves_updated_at_and_reaches_the_listeners() -> None:
    server = fake()
    store = server.store("acme")
    events: list[ChangeEvent] = []
    store.listeners.append(events.append)
    before = {r: {x["id"]: x for x in store.records(r)} for r in RESOURCES}
    mutator = Mutator(store, seed=1, weights={"subscription_delete": 1.0}, clock=stepping_clock())
    await mutator.run(steps=200)

    assert set(mutator.counts) == {
        "subscription_action",
        "subscription_reschedule",
        "subscription_create",
        "subscription_delete",
        "order_create",
        "order_update",
        "customer_create",
        "customer_update",
    }
    assert len(events) >= 200
    since = iso(START)
    for event in events:
        assert event.store == "acme"
        if event.kind != "deleted":
            assert event.record["updatedAt"] >= since, event
        if event.kind == "created":
            assert event.record["id"] not in before[event.resource]
    # Every record that differs from the start carries a new stamp, so incremental pulls see it.
    for resource in RESOURCES:
        for record in store.records(resource):
            old = before[resource].get(record["id"])
            if old != record:
                assert record["updatedAt"] >= since
    # Derived fields stay true through creates, status changes and deletes.
    assert active_counts_hold(server)


def test_mutator_weights_are_validated() -> None:
    store = fake().store("acme")
    with pytest.raises(ValueError, match="unknown mutation kinds"):
        Mutator(store, weights={"explode": 1.0})
    with pytest.raises(ValueError, match="positive weight"):
        Mutator(store, weights=dict.fromkeys(Mutator(store).weights, 0.0))
    with pytest.raises(ValueError, match=">= 0"):
        Mutator(store, weights={"order_create": -1})
    only_orders = Mutator(
        store, weights={k: 0.0 for k in Mutator(store).weights} | {"order_create": 1}
    )
    for _ in range(5):
        assert only_orders.step().kind == "order_create"


async def test_background_mutations_stop_when_the_server_closes() -> None:
    async with fake() as server:
        store = server.store("acme")
        ten = asyncio.Event()
        seen: list[ChangeEvent] = []

        def listen(event: ChangeEvent) -> None:
            seen.append(event)
            if len(seen) >= 10:
                ten.set()

        store.listeners.append(listen)
        mutator = server.mutator("acme")
        mutator.start(interval=0)
        with pytest.raises(RuntimeError, match="already running"):
            mutator.start()
        await ten.wait()
        assert mutator.running
    assert not mutator.running
    count = len(seen)
    await asyncio.sleep(0)
    assert len(seen) == count


# --- deletes ------------------------------------------------------------------------------------


async def test_deleted_records_are_gone_everywhere_and_cursors_survive(fast_limits: Limits) -> None:
    async with fake(records=30) as server, client_for(server, fast_limits) as client:
        store = server.store("acme")
        events: list[ChangeEvent] = []
        store.listeners.append(events.append)
        subs = store.records("subscriptions")
        pages = client.subscriptions.list(page_size=10, model=dict).pages()
        first = await anext(pages)
        # Delete the last record of the page just read (the cursor's anchor) and one ahead.
        doomed = [first.data[-1]["id"], subs[15]["id"]]
        for record_id in doomed:
            last = store.delete_record("subscriptions", record_id)
            assert last["id"] == record_id
        rest = [r for page in [p async for p in pages] for r in page.data]
        assert [r["id"] for r in first.data + rest] == [
            s["id"] for s in subs if s["id"] != subs[15]["id"]
        ]
        assert [e.kind for e in events] == ["deleted", "deleted"]
        assert len(store.records("subscriptions")) == 28
        assert store.get("subscriptions", doomed[0]) is None
        with pytest.raises(KeyError):
            store.delete_record("subscriptions", doomed[0])
        with pytest.raises(KeyError):
            store.update_record("subscriptions", doomed[0], {"status": "ACTIVE"})
        assert store.apply_action(doomed[0], "pause") is None
        assert "subscriptions=28" in repr(store)
        with pytest.raises(NotFoundError):
            await client.request("GET", f"subscriptions/{doomed[0]}")


# --- the incremental filter ---------------------------------------------------------------------


async def test_incremental_filter_returns_changed_records_in_order(fast_limits: Limits) -> None:
    async with fake() as server, client_for(server, fast_limits) as client:
        mutator = server.mutator("acme", clock=stepping_clock())
        since = iso(START)
        for resource in RESOURCES:
            assert await pull(client, resource, updatedAtMin=since) == []
        await mutator.run(steps=60)
        for resource in RESOURCES:
            expected = [r for r in server.records("acme", resource) if r["updatedAt"] >= since]
            got = await pull(client, resource, updatedAtMin=since)
            assert got == expected
            assert 0 < len(got) < len(server.records("acme", resource))
            assert [r["id"] for r in got] == sorted(r["id"] for r in got)
        # Later cut-off: fewer records; inclusive at the second.
        middle = sorted(r["updatedAt"] for r in server.records("acme", "customers"))[-5]
        got = await pull(client, "customers", updatedAtMin=middle)
        assert len(got) >= 5
        assert all(r["updatedAt"] >= middle for r in got)
        # Any ISO-8601 spelling of the same instant works; combined with the status filter too.
        for spelling in (
            "2030-03-17T17:46:40Z",
            "2030-03-17T19:46:40+02:00",
            "2030-03-17T17:46:40",
        ):
            assert await pull(client, "orders", updatedAtMin=spelling) == await pull(
                client, "orders", updatedAtMin="2030-03-17T17:46:40.000Z"
            )
        active = await pull(client, "subscriptions", updatedAtMin=since, status="ACTIVE")
        assert active == [
            r
            for r in server.records("acme", "subscriptions", status="ACTIVE")
            if r["updatedAt"] >= since
        ]
        with pytest.raises(BadRequestError, match="updatedAtMin must be an ISO-8601"):
            await pull(client, "orders", updatedAtMin="yesterday")


async def test_incremental_parameter_name_is_configurable(fast_limits: Limits) -> None:
    async with (
        fake(incremental_param="changedSince") as server,
        client_for(server, fast_limits) as client,
    ):
        await server.mutator("acme", clock=stepping_clock()).run(steps=20)
        total = len(server.records("acme", "customers"))
        assert len(await pull(client, "customers", updatedAtMin=iso(START))) == total
        assert 0 < len(await pull(client, "customers", changedSince=iso(START))) < total
    async with fake(incremental_param=None) as server, client_for(server, fast_limits) as client:
        assert len(await pull(client, "orders", updatedAtMin=iso(START))) == 80


async def test_a_pull_misses_changes_behind_its_cursor_and_the_next_incremental_pull_catches_them(
    fast_limits: Limits,
) -> None:
    clock = stepping_clock()
    async with fake(records=40) as server, client_for(server, fast_limits) as client:
        store = server.store("acme")
        started = iso(clock())  # the pull starts: the next incremental pull starts from here
        local: dict[int, dict[str, Any]] = {}
        pages = client.customers.list(page_size=10, model=dict).pages()
        first = await anext(pages)
        local.update((r["id"], r) for r in first.data)
        # Changed after its page was read: this pull will not see the change.
        behind = first.data[3]["id"]
        store.update_record("customers", behind, {"tags": ["moved"], "updatedAt": iso(clock())})
        async for page in pages:
            local.update((r["id"], r) for r in page.data)
        assert local[behind]["tags"] != ["moved"]
        for record in await pull(client, "customers", updatedAtMin=started):
            local[record["id"]] = record
        assert local[behind]["tags"] == ["moved"]
        assert local == {r["id"]: r for r in server.records("acme", "customers")}


def test_every_resource_has_updated_at() -> None:
    server = fake(records=20)
    for resource in RESOURCES:
        assert all(isinstance(r["updatedAt"], str) for r in server.records("acme", resource))
    for order in server.records("acme", "orders"):
        assert order["updatedAt"] == (order["processedAt"] or order["createdAt"])


# --- WebhookSender ------------------------------------------------------------------------------


class Sink:
    """A webhook endpoint on loopback that records deliveries and answers from a script."""

    def __init__(self, answer: Callable[[int], int] = lambda n: 200) -> None:
        self.answer = answer
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.attempts: collections.Counter[str] = collections.Counter()
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        event_id = request.headers.get("X-Service-Event-Id", "")
        self.attempts[event_id] += 1
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        status = self.answer(self.attempts[event_id])
        if status == 200:
            self.bodies.append(body)
            self.headers.append(dict(request.headers))
        return web.Response(status=status)


@pytest.fixture
async def sink() -> AsyncIterator[Callable[..., Any]]:
    async with contextlib.AsyncExitStack() as servers:

        async def start(answer: Callable[[int], int] = lambda n: 200) -> Sink:
            sink = Sink(answer)
            app = web.Application()
            app.router.add_post("/hook", sink.handle)
            origin = await servers.enter_async_context(serving(app, shutdown_timeout=0.5))
            sink.url = f"{origin}/hook"
            return sink

        yield start


async def test_sender_signs_every_delivery_and_drops_deterministically(sink: Any) -> None:
    outcomes = []
    for _ in range(2):
        target = await sink()
        server = fake(seed=2)
        sender = await server.deliver_webhooks(target.url, SECRET, drop_fraction=0.3, seed=4)
        await server.mutator("acme", clock=stepping_clock()).run(steps=80)
        await sender.join()
        await server.aclose()
        outcomes.append([(d.event_id, d.outcome) for d in sender.deliveries])
        stats = sender.stats
        assert stats.delivered + stats.dropped == stats.events
        assert 0.15 * stats.events < stats.dropped < 0.45 * stats.events
        assert len(target.bodies) == stats.delivered
        config = WebhookConfig(SECRET)
        for body, headers in zip(target.bodies, target.headers, strict=True):
            assert verify_delivery(config, headers, body, now=time.time()) is None  # or raises
            payload = orjson.loads(body)
            assert set(payload) == {"id", "topic", "store", "createdAt", "data"}
            assert headers["X-Service-Event-Id"] == payload["id"]
            assert headers["X-Service-Topic"] == payload["topic"]
            resource, action = payload["topic"].split("/")
            assert resource in RESOURCES
            assert action in ("create", "update", "delete")
            assert payload["store"] == "acme"
    assert outcomes[0] == outcomes[1]


async def test_sender_retries_transient_failures_and_gives_up_on_refusals(sink: Any) -> None:
    server = fake()
    store = server.store("acme")
    flaky = await sink(lambda attempt: 503 if attempt <= 2 else 200)
    async with WebhookSender(flaky.url, SECRET, stores=[store], drop_fraction=0.0) as sender:
        store.update_record("customers", store.records("customers")[0]["id"], {"tags": ["x"]})
        await sender.join()
    [delivery] = sender.deliveries
    assert (delivery.outcome, delivery.attempts, delivery.status) == ("delivered", 3, 200)
    assert sender.stats.retries == 2

    for answer, attempts, status in ((lambda n: 401, 1, 401), (lambda n: 500, 4, 500)):
        target = await sink(answer)
        async with WebhookSender(
            target.url, SECRET, stores=[store], drop_fraction=0.0, max_attempts=4
        ) as sender:
            store.update_record("customers", store.records("customers")[0]["id"], {"tags": []})
            await sender.join()
        [delivery] = sender.deliveries
        assert (delivery.outcome, delivery.attempts, delivery.status) == (
            "failed",
            attempts,
            status,
        )

    # Nothing listening: connection refused, retried, then failed.
    async with WebhookSender(
        unused_url(), SECRET, stores=[store], drop_fraction=0.0, max_attempts=2
    ) as s:
        store.update_record("customers", store.records("customers")[0]["id"], {"tags": ["y"]})
        await s.join()
    assert [(d.outcome, d.attempts, d.status) for d in s.deliveries] == [("failed", 2, None)]
    assert store.listeners == []  # senders detach when closed


def unused_url() -> str:
    # A loopback port that was free a moment ago and that nobody listens on.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


async def test_pending_deliveries_are_abandoned_when_the_server_closes(sink: Any) -> None:
    target = await sink()
    target.gate = asyncio.Event()  # the endpoint hangs
    server = fake()
    await server.start()
    sender = await server.deliver_webhooks(target.url, SECRET, drop_fraction=0.0)
    await server.mutator("acme", clock=stepping_clock()).run(steps=5)
    await target.entered.wait()
    await server.aclose()
    stats = sender.stats
    assert stats.abandoned == stats.events >= 5
    assert server.store("acme").listeners == []
    target.gate.set()
