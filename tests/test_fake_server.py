"""Tests for asyncsubs.testing.FakeAdminServer, driven by a plain aiohttp client.

Rate-limit windows run on a manual clock patched into the event loop (``clock`` fixture), so
nothing here sleeps to synchronise; latency is 0 unless a test is about latency.
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import aiohttp
import orjson
import pytest

from asyncsubs._config import Rate
from asyncsubs._server_limits import ServerLimit, parse_server_limit
from asyncsubs.testing import (
    ChangeEvent,
    FakeAdminServer,
    FakeStoreConfig,
    Faults,
    Reviser,
    ServerRateLimits,
    run_in_process,
    serve_in_thread,
)
from asyncsubs.testing._data import RESOURCES
from asyncsubs.testing._ports import free_port

TOKEN_HEADER = "X-Service-Token"


class ManualClock:
    """Stands in for ``loop.time``: frozen until ``advance``."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def align(self, per: float, offset: float = 0.001) -> None:
        """Move just past the start of the next window aligned to ``per``."""
        self.now = (self.now // per + 1) * per + offset


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    loop = asyncio.get_running_loop()
    manual = ManualClock(loop.time())
    monkeypatch.setattr(loop, "time", manual)
    return manual


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


class Reply:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def code(self) -> str:
        return str(self.json["code"])


async def call(
    session: aiohttp.ClientSession,
    server: FakeAdminServer,
    path: str,
    *,
    store: str | None = "acme",
    method: str = "GET",
    token: str | None = None,
    data: bytes | None = None,
    **params: Any,
) -> Reply:
    headers = {}
    if token is None and store is not None:
        token = server.store(store).token
    if token is not None:
        headers[TOKEN_HEADER] = token
    url = server.api_url + path
    query = {k: str(v) for k, v in params.items()}
    async with session.request(
        method, url, params=query, headers=headers, data=data, allow_redirects=False
    ) as response:
        return Reply(response.status, response.headers, await response.read())


async def walk(
    session: aiohttp.ClientSession,
    server: FakeAdminServer,
    resource: str,
    store: str = "acme",
    **params: Any,
) -> tuple[list[dict[str, Any]], int]:
    """All records of a list endpoint, page by page; returns (records, pages)."""
    records: list[dict[str, Any]] = []
    cursor = None
    pages = 0
    while True:
        extra: dict[str, Any] = {} if cursor is None else {"afterCursor": cursor}
        reply = await call(session, server, resource, store=store, **params, **extra)
        assert reply.status == 200, reply.body
        body = reply.json
        pages += 1
        records.extend(body["data"])
        info = body["pageInfo"]
        if not info["hasNextPage"]:
            assert info["nextCursor"] is None
            return records, pages
        cursor = info["nextCursor"]
        assert isinstance(cursor, str)


def unlimited(**kwargs: Any) -> FakeAdminServer:
    kwargs.setdefault("stores", [FakeStoreConfig("acme"), FakeStoreConfig("globex")])
    kwargs.setdefault("rate_limits", None)
    return FakeAdminServer(**kwargs)


# --- envelope, pagination -----------------------------------------------------------------------


async def test_success_envelope_and_default_page(session: aiohttp.ClientSession) -> None:
    async with unlimited() as server:
        reply = await call(session, server, "subscriptions")
    assert reply.status == 200
    assert reply.headers["Content-Type"] == "application/json"
    body = reply.json
    assert list(body) == ["success", "message", "code", "data", "pageInfo"]
    assert (body["success"], body["message"], body["code"]) == (True, "OK", "SUCCESS")
    assert len(body["data"]) == 50  # default_page_size
    assert body["pageInfo"]["hasNextPage"] is True
    assert server.records("acme", "subscriptions")[:50] == body["data"]


async def test_reprs_of_requests_and_stores_never_show_a_token(
    session: aiohttp.ClientSession,
) -> None:
    """A user's failed assertion prints them: a token sent (it may be a real one, picked up from
    the environment) or configured shows as nothing."""
    token = "tok-0123456789-secret"
    async with unlimited(stores=[FakeStoreConfig("acme", token=token)]) as server:
        reply = await call(session, server, "subscriptions", token=token)
        assert reply.status == 200
        record = server.requests[-1]
        assert record.headers[TOKEN_HEADER] == token  # recorded as sent
        assert token not in repr(record)
        assert "'X-Service-Token': '***'" in repr(record)
        assert token not in repr(server.store("acme")) + repr(FakeStoreConfig("a", token=token))


async def test_arguments_a_test_could_not_mean_are_refused_at_once(
    session: aiohttp.ClientSession,
) -> None:
    """Each of these was taken and misbehaved later: a scripted answer for ever (2.5 never
    counts down to 0), a status line the client cannot read, a store that never matches, four
    stores named a, c, m and e, a mutator failing only when the server closed."""
    with pytest.raises(TypeError, match="got 'acme'"):
        FakeAdminServer(stores="acme")  # type: ignore[arg-type]
    async with unlimited() as server:
        for times in (2.5, True, 0):
            with pytest.raises(ValueError, match="times must be a whole number"):
                server.enqueue(503, times=times)  # type: ignore[arg-type]
        for status in (-5, 700, True):
            with pytest.raises(ValueError, match="status must be an HTTP status"):
                server.enqueue(status)
        with pytest.raises(ValueError, match="no store 'acme-typo'"):
            server.enqueue(503, store="acme-typo")
        for interval in (-1, float("nan"), float("inf")):
            with pytest.raises(ValueError, match="interval must be"):
                server.mutator("acme").start(interval=interval)
        assert (await call(session, server, "subscriptions")).status == 200  # nothing scripted


async def test_a_page_size_of_thousands_of_digits_is_clamped(
    session: aiohttp.ClientSession,
) -> None:
    """int() refuses more than 4,300 digits: the fake answered a plain-text 500."""
    async with unlimited(max_page_size=100) as server:
        reply = await call(session, server, "subscriptions", pageSize="9" * 5000)
        assert reply.status == 200
        assert len(reply.json["data"]) == 100
        reply = await call(session, server, "subscriptions", pageSize="0" * 20 + "7")
        assert len(reply.json["data"]) == 7


def test_a_server_in_a_thread_that_fails_to_start_says_so_once() -> None:
    """Raised in the caller's thread, not once more in the server's (which pytest reports as
    an unhandled thread exception, its traceback run into the caller's)."""
    hooks: list[BaseException | None] = []
    previous, before = threading.excepthook, set(threading.enumerate())
    threading.excepthook = lambda args: hooks.append(args.exc_value)
    try:
        with pytest.raises(ValueError, match="stores must be >= 1"), serve_in_thread(stores=0):
            pass
        for thread in set(threading.enumerate()) - before:
            thread.join(10)  # the server's thread, ending
    finally:
        threading.excepthook = previous
    assert hooks == []


@pytest.mark.parametrize("page_size", [1, 7, 50, 137, 250])
async def test_walk_returns_every_record_once(
    session: aiohttp.ClientSession, page_size: int
) -> None:
    async with unlimited(stores=[FakeStoreConfig("acme", records=137)]) as server:
        records, pages = await walk(session, server, "subscriptions", pageSize=page_size)
        expected = server.records("acme", "subscriptions")
    assert records == expected
    ids = [r["id"] for r in records]
    assert ids == sorted(set(ids))
    assert pages == max(1, -(-137 // page_size))


@pytest.mark.parametrize("resource", ["customers", "orders"])
async def test_other_list_endpoints(session: aiohttp.ClientSession, resource: str) -> None:
    async with unlimited(records=61) as server:
        records, pages = await walk(session, server, resource, pageSize=20)
        assert records == server.records("acme", resource)
    assert (len(records), pages) == (61, 4)


async def test_empty_resource(session: aiohttp.ClientSession) -> None:
    stores = [FakeStoreConfig("acme", records={"orders": 0}), FakeStoreConfig("globex")]
    async with unlimited(stores=stores, records={"customers": 3}) as server:
        reply = await call(session, server, "orders")
        assert len(server.records("acme", "subscriptions")) == 120  # the default count
        assert len(server.records("acme", "customers")) == 3  # the server's default
        assert len(server.records("globex", "orders")) == 120
    assert reply.json["data"] == []
    assert reply.json["pageInfo"] == {"hasNextPage": False, "nextCursor": None}


async def test_page_size_is_clamped(session: aiohttp.ClientSession) -> None:
    async with unlimited(records=300, max_page_size=250) as server:
        reply = await call(session, server, "customers", pageSize=1000)
        huge = await call(session, server, "customers", pageSize="9" * 40)
    assert len(reply.json["data"]) == 250
    assert len(huge.json["data"]) == 250


@pytest.mark.parametrize("page_size", ["0", "-1", "abc", "1.5", "", " 5", "²"])
async def test_bad_page_size(session: aiohttp.ClientSession, page_size: str) -> None:
    async with unlimited() as server:
        reply = await call(session, server, "subscriptions", pageSize=page_size)
    assert reply.status == 400
    assert reply.json == {
        "success": False,
        "message": reply.json["message"],
        "code": "BAD_REQUEST",
        "data": None,
    }
    assert "pageSize" in reply.json["message"]


async def test_bad_cursors(session: aiohttp.ClientSession) -> None:
    async with unlimited() as server:
        first = await call(session, server, "subscriptions", pageSize=10)
        cursor = first.json["pageInfo"]["nextCursor"]
        foreign_store = (await call(session, server, "subscriptions", store="globex")).json
        foreign_resource = (await call(session, server, "orders")).json
        tampered = cursor[:-2] + ("AA" if cursor[-2:] != "AA" else "BB")
        bad = [
            "garbage",
            "",
            "%%%",
            tampered,
            foreign_store["pageInfo"]["nextCursor"],
            foreign_resource["pageInfo"]["nextCursor"],
            "x" * 2000,
        ]
        for value in bad:
            reply = await call(session, server, "subscriptions", afterCursor=value)
            assert reply.status == 400, value
            assert reply.code == "INVALID_CURSOR"
            assert reply.json["success"] is False
        ok = await call(session, server, "subscriptions", afterCursor=cursor)
    assert ok.status == 200


async def test_cursor_survives_new_records_and_restart(session: aiohttp.ClientSession) -> None:
    async with unlimited(records=30, seed=5) as server:
        first = await call(session, server, "orders", pageSize=10)
        cursor = first.json["pageInfo"]["nextCursor"]
        added = server.store("acme").add_record("orders", {"status": "PAID", "note": "late"})
        rest, _ = await walk(session, server, "orders", afterCursor=cursor, pageSize=100)
    assert [r["id"] for r in first.json["data"] + rest] == [
        *[r["id"] for r in server.records("acme", "orders")]
    ]
    assert rest[-1] == added
    # Same seed, new process or server: same tokens, same data, old cursors still valid.
    async with unlimited(records=30, seed=5) as again:
        assert again.store("acme").token == server.store("acme").token
        reply = await call(session, again, "orders", afterCursor=cursor, pageSize=5)
    assert reply.json["data"] == rest[:5]


async def test_lists_by_change_serve_a_record_changed_mid_pull_again(
    session: aiohttp.ClientSession,
) -> None:
    reviser = Reviser(per_page=2)
    async with unlimited(records=30, list_order="changed", before_page=reviser) as server:
        served, pages = await walk(session, server, "subscriptions", pageSize=10)
        reviser.enabled = False
        stamps = [(r["updatedAt"], r["id"]) for r in served]
        ids = [r["id"] for r in served]
        final = {r["id"]: r for r in server.records("acme", "subscriptions")}
        # A cursor of one list order is refused by a server of the other, not misread.
        first = await call(session, server, "subscriptions", pageSize=10)
        async with unlimited(records=30) as by_id:
            cursor = first.json["pageInfo"]["nextCursor"]
            refused = await call(session, by_id, "subscriptions", afterCursor=cursor)
    assert refused.status == 400
    assert refused.code == "INVALID_CURSOR"
    # In change order, then id; every change moved its record to the end, served again there.
    assert stamps == sorted(stamps)
    twice = {i for i in ids if ids.count(i) > 1}
    assert twice, "records changed mid-pull are served twice"
    assert set(ids) == set(final)
    for record_id in twice:
        versions = [r for r in served if r["id"] == record_id]
        assert [v.get("revision", 0) for v in versions] == sorted(
            v.get("revision", 0) for v in versions
        )  # old version first
        assert versions[-1] == final[record_id]  # the last served is the server's now
    assert pages == -(-len(served) // 10)


async def test_status_filter(session: aiohttp.ClientSession) -> None:
    async with unlimited(records=200) as server:
        active, _ = await walk(session, server, "subscriptions", pageSize=7, status="ACTIVE")
        several, _ = await walk(session, server, "subscriptions", status="PAUSED,CANCELLED")
        bad = await call(session, server, "subscriptions", status="SLEEPING")
        everything = server.records("acme", "subscriptions")
    assert active == [r for r in everything if r["status"] == "ACTIVE"]
    assert 0 < len(active) < 200
    assert several == [r for r in everything if r["status"] != "ACTIVE"]
    assert bad.status == 400
    assert bad.code == "BAD_REQUEST"


async def test_records_are_deterministic_and_realistic() -> None:
    one = unlimited(seed=1)
    two = unlimited(seed=1)
    other = unlimited(seed=2)
    for resource in ("subscriptions", "customers", "orders"):
        assert one.records("acme", resource) == two.records("acme", resource)
        assert one.records("acme", resource) != other.records("acme", resource)
        assert one.records("acme", resource) != one.records("globex", resource)
    subs = one.records("acme", "subscriptions")
    customers = {c["id"]: c for c in one.records("acme", "customers")}
    assert all(100_000_000 <= s["id"] < 1_000_000_000 for s in subs)
    assert {s["status"] for s in subs} == {"ACTIVE", "PAUSED", "CANCELLED"}
    assert any(s["shippingAddress"] is None for s in subs)
    assert any(s["note"] is not None for s in subs)
    assert all(s["createdAt"].endswith("Z") and s["lineItems"] for s in subs)
    assert all(s["customerId"] in customers for s in subs)
    active = sum(s["status"] == "ACTIVE" for s in subs)
    assert sum(c["activeSubscriptionCount"] for c in customers.values()) == active
    for order in one.records("acme", "orders"):
        assert order["processedAt"] is None or order["status"] in ("PAID", "REFUNDED")


async def test_100k_records_are_cheap() -> None:
    # CPU time of this thread: what making them costs, not what the machine's other
    # processes (a parallel test worker among them) take meanwhile.
    started = time.thread_time()
    server = unlimited(stores=[FakeStoreConfig("big", records=100_000)])
    records = server.records("big", "subscriptions")
    elapsed = time.thread_time() - started
    assert len(records) == 100_000
    assert elapsed < 5  # ~1 s here; generous for slow CI machines


# --- single records and actions ---------------------------------------------------------------


async def test_get_record_by_id(session: aiohttp.ClientSession) -> None:
    async with unlimited() as server:
        for resource in ("subscriptions", "customers", "orders"):
            expected = server.records("acme", resource)[3]
            reply = await call(session, server, f"{resource}/{expected['id']}")
            assert reply.status == 200
            assert reply.json["data"] == expected
            assert reply.json["code"] == "SUCCESS"
        missing = await call(session, server, "orders/1")
        not_a_number = await call(session, server, "orders/abc")
    assert (missing.status, missing.code) == (404, "NOT_FOUND")
    assert (not_a_number.status, not_a_number.code) == (404, "NOT_FOUND")


async def test_pause_resume_cancel(session: aiohttp.ClientSession) -> None:
    async with unlimited() as server:
        subs = server.records("acme", "subscriptions")
        sub = next(s for s in subs if s["status"] == "ACTIVE")
        customer = server.record("acme", "customers", sub["customerId"])
        assert customer is not None
        path = f"subscriptions/{sub['id']}"

        paused = await call(session, server, f"{path}/pause", method="POST", data=b"{}")
        assert paused.status == 200
        assert paused.json["data"]["status"] == "PAUSED"
        assert paused.json["data"]["nextChargeDate"] is None
        assert paused.json["data"]["updatedAt"] != sub["updatedAt"]
        assert (await call(session, server, path)).json["data"]["status"] == "PAUSED"
        after = server.record("acme", "customers", sub["customerId"])
        assert after is not None
        assert after["activeSubscriptionCount"] == customer["activeSubscriptionCount"] - 1

        again = await call(session, server, f"{path}/pause", method="POST")  # empty body
        assert again.json["data"]["status"] == "PAUSED"
        resumed = await call(session, server, f"{path}/resume", method="POST", data=b"{}")
        assert resumed.json["data"]["status"] == "ACTIVE"
        assert resumed.json["data"]["nextChargeDate"] is not None
        body = orjson.dumps({"reason": "too much coffee"})
        cancelled = await call(session, server, f"{path}/cancel", method="POST", data=body)
        assert cancelled.json["data"]["cancellationReason"] == "too much coffee"
        assert cancelled.json["data"]["cancelledAt"] is not None
        stuck = await call(session, server, f"{path}/resume", method="POST", data=b"{}")
        assert (stuck.status, stuck.code) == (422, "INVALID_STATE")

        bad_json = await call(session, server, f"{path}/pause", method="POST", data=b"{nope")
        not_object = await call(session, server, f"{path}/pause", method="POST", data=b"[]")
        missing = await call(session, server, "subscriptions/5/pause", method="POST", data=b"{}")
        wrong_method = await call(session, server, f"{path}/pause")
        assert server.requests[-4].body == b"{nope"
        listed = server.records("acme", "subscriptions")
    assert (bad_json.status, bad_json.code) == (400, "BAD_REQUEST")
    assert (not_object.status, not_object.code) == (400, "BAD_REQUEST")
    assert (missing.status, missing.code) == (404, "NOT_FOUND")
    assert (wrong_method.status, wrong_method.code) == (405, "METHOD_NOT_ALLOWED")
    assert next(s for s in listed if s["id"] == sub["id"])["status"] == "CANCELLED"


async def test_change_listeners() -> None:
    server = unlimited()
    events: list[ChangeEvent] = []
    store = server.store("acme")
    store.listeners.append(events.append)
    sub = next(s for s in store.records("subscriptions") if s["status"] == "PAUSED")
    store.apply_action(sub["id"], "cancel")
    assert [(e.resource, e.kind) for e in events] == [("subscriptions", "updated")]
    assert events[0].record["status"] == "CANCELLED"


# --- auth, errors ---------------------------------------------------------------------------------


async def test_auth_and_routing_errors(session: aiohttp.ClientSession) -> None:
    stores = [FakeStoreConfig("acme", forbidden_paths=["orders"]), FakeStoreConfig("globex")]
    async with unlimited(stores=stores) as server:
        missing = await call(session, server, "subscriptions", store=None)
        unknown = await call(session, server, "subscriptions", token="not-a-token")
        forbidden = await call(session, server, "orders")
        forbidden_one = await call(session, server, "orders/1")
        other_store = await call(session, server, "orders", store="globex")
        unknown_path = await call(session, server, "webhooks")
        async with session.get(
            f"{server.base_url}/admin/2025-01/subscriptions",
            headers={TOKEN_HEADER: server.store("acme").token},
        ) as response:
            old_version = Reply(response.status, response.headers, await response.read())
    for reply in (missing, unknown):
        assert reply.status == 401
        assert reply.code == "UNAUTHORIZED"
        assert "Settings > API Tokens" in reply.json["message"]
        assert reply.json["data"] is None
        assert reply.json["success"] is False
    assert (forbidden.status, forbidden.code) == (403, "FORBIDDEN")
    assert (forbidden_one.status, forbidden_one.code) == (403, "FORBIDDEN")
    assert other_store.status == 200
    assert (unknown_path.status, unknown_path.code) == (404, "NOT_FOUND")
    assert (old_version.status, old_version.code) == (404, "NOT_FOUND")
    assert old_version.headers["Content-Type"] == "application/json"


async def test_custom_version(session: aiohttp.ClientSession) -> None:
    async with unlimited(version="2027-01") as server:
        assert server.api_url.endswith("/admin/2027-01/")
        reply = await call(session, server, "customers")
    assert reply.status == 200


async def test_request_log(session: aiohttp.ClientSession) -> None:
    async with unlimited(request_log_size=3) as server:
        for i in range(5):
            await call(session, server, "subscriptions", pageSize=i + 1)
        await call(session, server, "subscriptions", store=None)
        log = server.requests
    assert len(log) == 3
    last = log[-1]
    assert (last.status, last.store, last.method) == (401, None, "GET")
    previous = log[-2]
    assert previous.store == "acme"
    assert previous.path == "/admin/2026-04/subscriptions"
    assert previous.query == {"pageSize": "5"}
    assert previous.headers["x-service-token"] == server.store("acme").token
    assert previous.headers["User-Agent"].startswith("Python/")
    assert previous.pool == "subscriptions"
    server.clear_requests()
    assert server.requests == []


# --- rate limits ----------------------------------------------------------------------------------


def limited(**limits: Any) -> FakeAdminServer:
    return FakeAdminServer(
        stores=[FakeStoreConfig("acme"), FakeStoreConfig("globex")],
        rate_limits=ServerRateLimits(**limits),
    )


async def test_sliding_window(session: aiohttp.ClientSession, clock: ManualClock) -> None:
    heavy = {"subscriptions": Rate(2, per=10), "customers": Rate(1, per=10)}
    async with limited(heavy=heavy, window="sliding") as server:
        first = [await call(session, server, "subscriptions") for _ in range(2)]
        clock.advance(4)
        refused = await call(session, server, "subscriptions")
        clock.advance(5.5)  # 9.5 s after the first start: still inside its window
        refused_again = await call(session, server, "subscriptions")
        clock.advance(0.5)  # the first start leaves the window; the second is 0 s younger
        accepted = [await call(session, server, "subscriptions") for _ in range(2)]
        other_store = await call(session, server, "subscriptions", store="globex")
        stats = server.stats("acme")
    assert [r.status for r in first] == [200, 200]
    assert (refused.status, refused.code) == (429, "RATE_LIMITED")
    assert refused.headers["Retry-After"] == "6"
    assert refused.json["success"] is False
    assert refused_again.headers["Retry-After"] == "1"  # ceil(0.5)
    # Both earlier starts were at the same instant, so both slots free together; the 429s did
    # not consume anything.
    assert [r.status for r in accepted] == [200, 200]
    assert other_store.status == 200
    pool = stats.pool("subscriptions")
    assert (pool.accepted, pool.rejected) == (4, 2)
    assert pool.max_in_window(10) == 2
    assert stats.rejected == 2
    assert stats.statuses == {200: 4, 429: 2}


@pytest.mark.parametrize("window", ["fixed", "leaky"])
async def test_peak_counts_starts_as_the_window_does(
    session: aiohttp.ClientSession, clock: ManualClock, window: Literal["fixed", "leaky"]
) -> None:
    """A fixed window accepts its limit on both sides of a boundary, a full bucket its burst
    and then what refilled: more starts within 1 s than 2 per 1 s, none of them refused. The
    peak counts them as the server does, and never reads as more than the limit."""
    rate = Rate(2, per=1)
    async with limited(heavy={"subscriptions": rate}, window=window) as server:
        clock.align(1, 0.55)
        replies = [await call(session, server, "subscriptions") for _ in range(2)]
        clock.advance(0.5 if window == "fixed" else 0.6)  # a new window; a bucket 1.2 fuller
        replies += [await call(session, server, "subscriptions") for _ in range(2)]
        pool = server.stats("acme").pool("subscriptions")
    accepted = 4 if window == "fixed" else 3
    assert [r.status for r in replies] == [200] * accepted + [429] * (4 - accepted)
    assert pool.max_in_window(rate.per) == accepted  # within 1 s: not the server's count
    assert pool.peak(rate, window) == 2
    assert pool.peak(rate, "sliding") == accepted


async def test_heavy_pools_are_independent_of_global(
    session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    limits = {"global_rate": Rate(3, per=1), "heavy": {"subscriptions": Rate(1, per=60)}}
    async with limited(**limits) as server:
        sub_id = server.records("acme", "subscriptions")[0]["id"]
        heavy = [await call(session, server, "subscriptions") for _ in range(2)]
        singles = [await call(session, server, f"subscriptions/{sub_id}") for _ in range(3)]
        fourth = await call(session, server, f"subscriptions/{sub_id}")
        post = await call(session, server, f"subscriptions/{sub_id}/pause", method="POST")
        not_heavy = await call(session, server, "orders")  # not configured heavy: global
        clock.advance(1)
        recovered = await call(session, server, "orders")
        stats = server.stats("acme")
    assert [r.status for r in heavy] == [200, 429]
    assert heavy[1].headers["Retry-After"] == "60"
    assert [r.status for r in singles] == [200, 200, 200]
    assert [fourth.status, post.status, not_heavy.status] == [429, 429, 429]
    assert recovered.status == 200
    assert (stats.pool("subscriptions").accepted, stats.pool("subscriptions").rejected) == (1, 1)
    assert (stats.pool("global").accepted, stats.pool("global").rejected) == (4, 3)
    assert list(stats.pools) == ["global", "subscriptions"]
    server.reset_stats()
    assert server.stats("acme").accepted == 0


async def test_fixed_window(session: aiohttp.ClientSession, clock: ManualClock) -> None:
    async with limited(global_rate=Rate(3, per=10), window="fixed") as server:
        clock.align(10, offset=0.25)
        burst = [await call(session, server, "orders/1") for _ in range(4)]
        clock.advance(9.5)  # 0.25 s before the window ends
        late = await call(session, server, "orders/1")
        clock.advance(0.25)  # next window: a fresh budget at once (unlike a sliding window)
        fresh = [await call(session, server, "orders/1") for _ in range(4)]
    assert [r.status for r in burst] == [404, 404, 404, 429]
    assert burst[3].headers["Retry-After"] == "10"  # ceil(9.75)
    assert late.status == 429
    assert late.headers["Retry-After"] == "1"
    assert [r.status for r in fresh] == [404, 404, 404, 429]


async def test_leaky_window_and_float_retry_after(
    session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    limits = ServerRateLimits(global_rate=Rate(2, per=1), window="leaky", retry_after_float=True)
    async with FakeAdminServer(stores=["acme"], rate_limits=limits) as server:
        burst = [await call(session, server, "orders/1") for _ in range(3)]
        clock.advance(0.5)  # one token back
        refill = [await call(session, server, "orders/1") for _ in range(2)]
    assert [r.status for r in burst] == [404, 404, 429]
    assert burst[2].headers["Retry-After"] == "0.500"
    assert [r.status for r in refill] == [404, 429]


async def test_per_store_rate_limits(session: aiohttp.ClientSession, clock: ManualClock) -> None:
    stores = [
        FakeStoreConfig("acme", rate_limits=ServerRateLimits.disabled()),
        FakeStoreConfig("globex"),
    ]
    tight = ServerRateLimits(global_rate=Rate(1, per=5))
    async with FakeAdminServer(stores=stores, rate_limits=tight) as server:
        free = [await call(session, server, "orders/1") for _ in range(5)]
        capped = [await call(session, server, "orders/1", store="globex") for _ in range(2)]
        server.set_rate_limits(None)
        lifted = await call(session, server, "orders/1", store="globex")
    assert {r.status for r in free} == {404}
    assert [r.status for r in capped] == [404, 429]
    assert lifted.status == 404
    assert server.stats("acme").pool("global").accepted == 5


def ietf(reply: Reply) -> tuple[str, str]:
    return reply.headers["RateLimit-Policy"], reply.headers["RateLimit"]


def x_headers(reply: Reply) -> tuple[str, str, str]:
    h = reply.headers
    return h["X-RateLimit-Limit"], h["X-RateLimit-Remaining"], h["X-RateLimit-Reset"]


async def test_ietf_headers_sliding_window(
    session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    async with limited(global_rate=Rate(2, per=10), headers="ietf") as server:
        first = await call(session, server, "orders/1")
        clock.advance(4)
        last_slot = await call(session, server, "orders/1")
        clock.advance(1)
        refused = await call(session, server, "orders/1")
        clock.advance(5)  # the first start leaves the window
        again = await call(session, server, "orders/1")
    policy = '"default";q=2;w=10'
    assert (first.status, ietf(first)) == (404, (policy, '"default";r=1;t=0'))
    # Taking the last slot: nothing left until the first start leaves, 6 s on.
    assert ietf(last_slot) == (policy, '"default";r=0;t=6')
    assert (refused.status, ietf(refused)) == (429, (policy, '"default";r=0;t=5'))
    assert refused.headers["Retry-After"] == "5"
    assert ietf(again) == (policy, '"default";r=0;t=4')
    # What the client reads from them.
    got = parse_server_limit({k.lower(): v for k, v in refused.headers.items()})
    assert got == ServerLimit(quota=2, window=10.0, remaining=0, reset=5.0)


async def test_x_headers_fixed_window(session: aiohttp.ClientSession, clock: ManualClock) -> None:
    async with limited(global_rate=Rate(3, per=10), window="fixed", headers="x") as server:
        clock.align(10, offset=0.25)
        burst = [await call(session, server, "orders/1") for _ in range(4)]
        clock.advance(9.5)
        late = await call(session, server, "orders/1")
        clock.advance(0.25)  # the next window: the whole quota again
        fresh = await call(session, server, "orders/1")
    assert [r.status for r in burst] == [404, 404, 404, 429]
    assert [x_headers(r) for r in burst] == [
        ("3", "2", "0"),
        ("3", "1", "0"),
        ("3", "0", "10"),  # ceil(9.75): the window's end
        ("3", "0", "10"),
    ]
    assert burst[3].headers["Retry-After"] == "10"
    assert (late.status, x_headers(late)) == (429, ("3", "0", "1"))
    assert (fresh.status, x_headers(fresh)) == (404, ("3", "2", "0"))
    got = parse_server_limit({k.lower(): v for k, v in burst[3].headers.items()})
    assert got == ServerLimit(quota=3, window=None, remaining=0, reset=10.0)


@pytest.mark.parametrize("style", ["ietf", "x"])
async def test_rate_headers_leaky_window(
    session: aiohttp.ClientSession, clock: ManualClock, style: Literal["ietf", "x"]
) -> None:
    limits = ServerRateLimits(global_rate=Rate(2, per=1), window="leaky", headers=style)
    async with FakeAdminServer(stores=["acme"], rate_limits=limits) as server:
        burst = [await call(session, server, "orders/1") for _ in range(3)]
        clock.advance(0.5)  # one token back, taken at once
        refill = await call(session, server, "orders/1")
        clock.advance(1)  # the bucket full again
        full = await call(session, server, "orders/1")
    replies = [*burst, refill, full]
    assert [r.status for r in replies] == [404, 404, 429, 404, 404]
    # (remaining, reset): the next token comes 0.5 s after the bucket empties, sent as 1 s.
    expected = [(1, 0), (0, 1), (0, 1), (0, 1), (1, 0)]
    if style == "ietf":
        assert {r.headers["RateLimit-Policy"] for r in replies} == {'"default";q=2;w=1'}
        assert [r.headers["RateLimit"] for r in replies] == [
            f'"default";r={left};t={reset}' for left, reset in expected
        ]
    else:
        assert [x_headers(r) for r in replies] == [
            ("2", str(left), str(reset)) for left, reset in expected
        ]
    other_style = "RateLimit" if style == "x" else "X-RateLimit-Limit"
    assert all(other_style not in r.headers for r in replies)


async def test_rate_headers_per_pool_and_only_when_asked(
    session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    stores = [
        FakeStoreConfig("acme"),
        FakeStoreConfig("globex", rate_limits=ServerRateLimits.disabled()),
        FakeStoreConfig("initech", rate_limits=ServerRateLimits()),
    ]
    limits = ServerRateLimits(heavy={"subscriptions": Rate(2, per=10)}, headers="x")
    async with FakeAdminServer(stores=stores, rate_limits=limits) as server:
        heavy = await call(session, server, "subscriptions")
        light = await call(session, server, "orders/1")
        unlimited_store = await call(session, server, "orders/1", store="globex")
        no_headers = await call(session, server, "orders/1", store="initech")
        server.enqueue(200, {"success": True, "data": None}, path="orders/1")
        scripted = await call(session, server, "orders/1")
        unauthenticated = await call(session, server, "orders/1", store=None)
    assert x_headers(heavy) == ("2", "1", "0")
    assert x_headers(light) == ("50", "49", "0")
    for reply in (unlimited_store, no_headers, scripted, unauthenticated):
        assert not any(
            name.lower().startswith(("x-ratelimit", "ratelimit")) for name in reply.headers
        )


# --- faults ---------------------------------------------------------------------------------------


async def test_fault_error_500_and_html_502(session: aiohttp.ClientSession) -> None:
    async with unlimited(faults=Faults(error_500=1.0)) as server:
        error = await call(session, server, "subscriptions")
        unauthenticated = await call(session, server, "subscriptions", store=None)
        server.faults = Faults(html_502=1.0)
        html = await call(session, server, "subscriptions")
        server.faults = None
        fine = await call(session, server, "subscriptions")
        counts = server.fault_counts
    assert (error.status, error.code) == (500, "INTERNAL_ERROR")
    assert error.json["success"] is False
    assert unauthenticated.status == 401  # faults apply after auth
    assert html.status == 502
    assert html.headers["Content-Type"].startswith("text/html")
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(html.body)
    assert fine.status == 200
    assert counts["error_500"] == 1
    assert counts["html_502"] == 1


async def test_fault_reset(session: aiohttp.ClientSession) -> None:
    async with unlimited(faults=Faults(reset=1.0)) as server:
        url = server.api_url + "subscriptions"
        headers = {TOKEN_HEADER: server.store("acme").token}
        statuses: list[int] = []

        async def fetch() -> bytes:
            async with session.get(url, headers=headers) as response:
                statuses.append(response.status)
                return await response.read()

        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
            await fetch()
        assert statuses == [200]  # status and headers arrived, then the body broke off
        server.faults = None
        reply = await call(session, server, "subscriptions")  # the pool recovers
        assert server.stats("acme").faults == {"reset": 1}
    assert reply.status == 200


async def test_fault_truncate(session: aiohttp.ClientSession) -> None:
    async with unlimited(faults=Faults(truncate=1.0)) as server:
        headers = {TOKEN_HEADER: server.store("acme").token}
        async with session.get(server.api_url + "customers", headers=headers) as response:
            body = await response.read()
            assert response.status == 200
            assert int(response.headers["Content-Length"]) == len(body)
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(body)
    assert body.startswith(b'{"success":true')


async def test_fault_slow_outlasts_client_timeout(session: aiohttp.ClientSession) -> None:
    server = unlimited(faults=Faults(slow=1.0))  # default slow_seconds: 60
    await server.start()
    url = server.api_url + "orders"
    headers = {TOKEN_HEADER: server.store("acme").token}
    with pytest.raises(asyncio.TimeoutError):
        async with session.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=0.1)):
            pass
    started = time.perf_counter()
    await server.aclose()
    assert time.perf_counter() - started < 5  # close() does not wait the 60 s out
    assert server.fault_counts["slow"] == 1


async def test_fault_slow_answers_eventually(session: aiohttp.ClientSession) -> None:
    async with unlimited(faults=Faults(slow=1.0, slow_seconds=0.01)) as server:
        reply = await call(session, server, "orders")
    assert reply.status == 200


async def test_fault_429_without_retry_after(
    session: aiohttp.ClientSession, clock: ManualClock
) -> None:
    server = limited(global_rate=Rate(1, per=10))
    server.faults = Faults(rate_limit_no_retry_after=1.0)
    async with server:
        injected = await call(session, server, "orders/1")
        server.faults = None
        real = await call(session, server, "orders/1")  # the injected 429 consumed nothing
    assert (injected.status, injected.code) == (429, "RATE_LIMITED")
    assert "Retry-After" not in injected.headers
    assert real.status == 404


async def test_fault_fractions_are_seeded(session: aiohttp.ClientSession) -> None:
    faults = Faults(seed=7, error_500=0.3, html_502=0.2, paths=["orders"])

    async def statuses() -> list[int]:
        async with unlimited(faults=faults) as server:
            replies = [await call(session, server, "orders", pageSize=1) for _ in range(60)]
            untouched = await call(session, server, "customers")
            assert untouched.status == 200  # outside ``paths``
            assert server.fault_counts["error_500"] == sum(r.status == 500 for r in replies)
            return [r.status for r in replies]

    first, second = await statuses(), await statuses()
    assert first == second
    assert set(first) == {200, 500, 502}
    assert 5 < first.count(500) < 35


def test_faults_validation() -> None:
    with pytest.raises(ValueError, match="add up"):
        Faults(error_500=0.7, reset=0.5)
    with pytest.raises(ValueError, match="fraction"):
        Faults(truncate=1.5)


# --- scripted answers ---------------------------------------------------------------------------


async def test_enqueue(session: aiohttp.ClientSession) -> None:
    async with unlimited() as server:
        server.enqueue(200, {"success": True, "data": "not a list"}, path="subscriptions")
        server.enqueue(503, "<h1>down</h1>", {"Content-Type": "text/html"}, times=2)
        server.enqueue(200, b'{"success": tru', path="/admin/2026-04/customers", method="GET")
        server.enqueue(418, None, store="globex")
        odd = await call(session, server, "subscriptions")
        down = [await call(session, server, "orders") for _ in range(2)]
        broken = await call(session, server, "customers")
        unauthenticated = await call(session, server, "customers", store=None)
        teapot = await call(session, server, "customers", store="globex")
        normal = await call(session, server, "customers")
        assert server.stats("acme").scripted == 4
    assert odd.json == {"success": True, "data": "not a list"}
    assert odd.headers["Content-Type"] == "application/json"
    assert [(r.status, r.body) for r in down] == [(503, b"<h1>down</h1>")] * 2
    assert down[0].headers["Content-Type"] == "text/html"
    assert broken.body == b'{"success": tru'
    assert unauthenticated.status == 401
    assert (teapot.status, teapot.body) == (418, b"")
    assert normal.status == 200


async def test_redirect(session: aiohttp.ClientSession) -> None:
    async with unlimited() as server:
        elsewhere = "http://127.0.0.1:9/admin/2026-04/subscriptions"
        server.redirect("subscriptions", elsewhere)
        server.redirect("orders", "/admin/2026-04/customers", status=301, times=None)
        moved = await call(session, server, "subscriptions")
        again = await call(session, server, "subscriptions")
        permanent = [await call(session, server, "orders") for _ in range(2)]
        server.clear_scripted()
        cleared = await call(session, server, "orders")
    assert (moved.status, moved.headers["Location"]) == (307, elsewhere)
    assert again.status == 200
    assert [r.status for r in permanent] == [301, 301]
    assert cleared.status == 200


# --- latency, fixtures, processes ---------------------------------------------------------------


async def test_latency(session: aiohttp.ClientSession) -> None:
    async with unlimited(latency=0.05) as server:
        started = time.perf_counter()
        reply = await call(session, server, "orders/1")
        elapsed = time.perf_counter() - started
        server.latency = (0.0, 0.001)
        assert server.latency == (0.0, 0.001)
    assert reply.status == 404  # errors are delayed too
    assert elapsed >= 0.05
    with pytest.raises(ValueError, match="latency"):
        FakeAdminServer(latency=(0.2, 0.1))


async def test_inbound_delay_stamps_requests_late(session: aiohttp.ClientSession) -> None:
    """The stamp (the request log's time, the limiter's start) comes the inbound delay after
    the request was sent; the latency comes after the stamp."""
    loop = asyncio.get_running_loop()
    async with FakeAdminServer(stores=["acme"], inbound_delay=0.05, latency=0.03) as server:
        first_sent = loop.time()
        reply = await call(session, server, "orders/1")
        answered = loop.time()
        record = server.requests[-1]
        starts = server.stats("acme").pool("global").starts
        server.inbound_delay = (0.01, 0.03)
        server.latency = None
        lags = []
        for _ in range(5):
            sent = loop.time()
            await call(session, server, "orders/1")
            lags.append(server.requests[-1].time - sent)
    assert reply.status == 404
    assert record.time - first_sent >= 0.05
    assert answered - record.time >= 0.03
    assert starts == (record.time,)
    assert min(lags) >= 0.01
    assert len(set(lags)) == 5  # drawn from the range, not fixed


@pytest.mark.parametrize(
    "knobs",
    [
        {"latency": math.inf},  # would never answer
        {"latency": math.nan},
        {"latency": (0, math.inf)},
        {"latency": 10**400},  # past a float
        {"max_page_size": 2.5},  # a 500 on every clamped page
        {"default_page_size": 0},
        {"rate_limits": lambda: ServerRateLimits(headers="IETF")},  # else X-RateLimit-* sent
    ],
)
def test_a_knob_no_server_could_have_is_refused(knobs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each knob's own message
        FakeAdminServer(**{k: v() if callable(v) else v for k, v in knobs.items()})


@pytest.mark.parametrize(
    "delay", [-0.1, (0.2, 0.1), (-1.0, 0.5), True, "0.1", math.inf, math.nan, (0, math.inf)]
)
def test_inbound_delay_is_validated(delay: Any) -> None:
    with pytest.raises(ValueError, match="inbound_delay"):
        FakeAdminServer(inbound_delay=delay)
    server = FakeAdminServer(inbound_delay=(0, 0.02))
    assert server.inbound_delay == (0.0, 0.02)
    with pytest.raises(ValueError, match="inbound_delay"):
        server.inbound_delay = delay
    assert server.inbound_delay == (0.0, 0.02)


async def test_a_stall_stamps_what_arrived_during_it_at_its_end(
    session: aiohttp.ClientSession,
) -> None:
    """Stalls follow the loop clock: requests sent just after one begins are stamped (logged,
    counted by the limiter) together when it ends."""
    every, length = 0.5, 0.3
    loop = asyncio.get_running_loop()
    async with FakeAdminServer(stores=["acme"], stalls=(every, length)) as server:
        begins = (loop.time() // every + 1) * every
        await asyncio.sleep(begins + 0.01 - loop.time())  # the stall's phase, not a hand-over
        sent = loop.time()
        replies = await asyncio.gather(*(call(session, server, f"orders/{i}") for i in (1, 2)))
        stamps = [record.time for record in list(server.requests)[-2:]]
        starts = server.stats("acme").pool("global").starts
    assert sent < begins + length  # else this run could not send inside the stall
    assert [reply.status for reply in replies] == [404, 404]
    assert min(stamps) >= begins + length - 1e-6
    assert sorted(starts) == sorted(stamps)


@pytest.mark.parametrize(
    "stalls",
    [(0.1, 0.1), (0.1, 0.0), (0.1, 0.2), (float("inf"), 1.0), 5.0, (5.0,), ("5", 0.1), (5, True)],
)
def test_stalls_are_validated(stalls: Any) -> None:
    with pytest.raises(ValueError, match="stalls"):
        FakeAdminServer(stalls=stalls)


async def test_fixture_by_name(
    fake_admin_server: FakeAdminServer, session: aiohttp.ClientSession
) -> None:
    assert fake_admin_server.started
    assert list(fake_admin_server.stores) == ["store-1", "store-2"]
    assert fake_admin_server.base_url.startswith("http://127.0.0.1:")
    token = fake_admin_server.tokens["store-2"]
    replies = []
    for _ in range(10):  # no rate limits in the fixture
        async with session.get(
            fake_admin_server.api_url + "subscriptions", headers={TOKEN_HEADER: token}
        ) as response:
            replies.append(response.status)
    assert replies == [200] * 10


async def test_factory_fixture(fake_admin_server_factory: Any) -> None:
    server = await fake_admin_server_factory(stores=3, records=5)
    assert server.started
    assert sorted(server.tokens) == ["store-1", "store-2", "store-3"]
    assert len(server.records("store-3", "orders")) == 5


def test_configuration_errors() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        FakeAdminServer(stores=["a", "a"])
    with pytest.raises(ValueError, match="unknown resources"):
        FakeStoreConfig("a", records={"invoices": 1})
    with pytest.raises(ValueError, match="window"):
        ServerRateLimits(window="token")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not started"):
        _ = FakeAdminServer().base_url


@pytest.fixture
def remote() -> Iterator[Any]:
    with run_in_process(stores=["acme"], records=20, rate_limits=None, seed=3) as handle:
        yield handle


async def test_run_in_process(remote: Any, session: aiohttp.ClientSession) -> None:
    headers = {TOKEN_HEADER: remote.tokens["acme"]}
    async with session.get(remote.api_url + "customers", headers=headers) as response:
        body = await response.json()
    assert response.status == 200
    assert len(body["data"]) == 20
    assert body["data"] == unlimited(records=20, seed=3).records("acme", "customers")
    stats = await asyncio.to_thread(remote.stats, "acme")
    assert stats.pool("customers").accepted == 1
    await asyncio.to_thread(remote.reset_stats)
    assert (await asyncio.to_thread(remote.stats, "acme")).requests == 0
    remote.stop()
    assert not remote.process.is_alive()
    assert remote.process.exitcode == 0


def _ignores(pid: int, sig: signal.Signals) -> bool:
    """Whether ``pid`` has ``sig`` set to SIG_IGN (Linux's /proc: the kernel drops it)."""
    with open(f"/proc/{pid}/status") as status:
        mask = next(line for line in status if line.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) >> (sig - 1) & 1)


async def test_a_ctrl_c_leaves_a_process_server_to_its_parent(remote: Any) -> None:
    """A terminal's Ctrl-C reaches the server's process too: it keeps answering (an interrupted
    demo reads its counts) until the parent stops it."""
    assert _ignores(remote.process.pid, signal.SIGINT)
    os.kill(remote.process.pid, signal.SIGINT)
    assert (await asyncio.to_thread(remote.stats, "acme")).requests == 0
    remote.stop()
    assert remote.process.exitcode == 0


_ORPHANING_PARENT = """
import os
from asyncsubs.testing import run_in_process
if __name__ == "__main__":
    remote = run_in_process(stores=["acme"], rate_limits=None)
    print(remote.process.pid, flush=True)
    os._exit(0)  # no cleanup: as if killed
"""


def test_a_process_server_ends_when_its_parent_dies() -> None:
    command = [sys.executable, "-c", _ORPHANING_PARENT]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
    assert parent.returncode == 0
    try:
        exited = os.pidfd_open(pid)  # readable once the process has ended
    except ProcessLookupError:
        return  # ended already
    try:
        ended = select.select([exited], [], [], 30)[0] == [exited]
        if not ended:
            signal.pidfd_send_signal(exited, signal.SIGKILL)
        assert ended
    finally:
        os.close(exited)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["INT", "TERM"]
)
def test_a_signal_while_the_cli_server_makes_its_records_stops_it_at_once(
    sig: signal.Signals, code: int
) -> None:
    """``asyncsubs fake-server`` listens, then makes its records (600,000 here: seconds) before
    it prints how to use it: Ctrl-C or SIGTERM meanwhile ends it then, with no usage printed,
    as an interrupted command (130, 143)."""
    port = free_port()
    command = [sys.executable, "-m", "asyncsubs", "fake-server", "--port", str(port)]
    command += ["--stores", "4", "--records", "50000", "--no-rate-limits"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            deadline = time.monotonic() + 30
            while not _listening(port):  # it listens, then makes the records
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline
                time.sleep(0.02)
            proc.send_signal(sig)
            sent = time.monotonic()
            out, err = proc.communicate(timeout=30)
            took = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert (proc.returncode, out, err) == (code, "", "asyncsubs: interrupted before it served\n")
    assert took < 2


def test_make_records_makes_every_stores_records_and_freezes_them() -> None:
    """What ``run_in_process(make_records=True)`` runs before it reports the server ready: no
    request then waits for its store's records to be made."""
    server = FakeAdminServer(stores=[FakeStoreConfig("a", records=7), FakeStoreConfig("b")])
    sets = [server.store(name).data[r] for name in ("a", "b") for r in RESOURCES]
    assert all(None in s._encoded for s in sets if len(s))  # made lazily, on first request
    frozen = gc.get_freeze_count()
    try:
        server.make_records()
        assert gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
    assert all(None not in s._encoded for s in sets)
