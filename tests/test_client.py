"""AdminClient against a real FakeAdminServer on loopback: pagination, models, errors."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable
from typing import Any

import aiohttp
import attrs
import pytest
from hostile import WireServer, assert_printable
from virtual_clock import VirtualClock

import asyncsubs
from asyncsubs import AdminClient, Limits, Rate, RetryPolicy, _converter, errors
from asyncsubs._protocol import RawResponse, Request, build_request
from asyncsubs._transport import AiohttpTransport
from asyncsubs.limiting import Limiter
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, no_waiting

MakeClient = Callable[..., AdminClient]


async def ids_of(call: Any) -> list[Any]:
    return [r["id"] if isinstance(r, dict) else r.id async for r in call]


@pytest.mark.parametrize(
    ("count", "page_size"),
    [(0, 10), (1, 10), (30, 10), (35, 10), (35, 1), (35, 250)],
)
async def test_pagination_shapes(count: int, page_size: int, fast_limits: Limits) -> None:
    async with FakeAdminServer(
        stores=[FakeStoreConfig("s", records=count)], rate_limits=None
    ) as server:
        async with AdminClient(
            token=server.store("s").token, base_url=server.base_url, store="s", limits=fast_limits
        ) as client:
            pages = [p async for p in client.subscriptions.list(page_size=page_size).pages()]
        expected = [r["id"] for r in server.records("s", "subscriptions")]
        assert [r.id for p in pages for r in p.data] == expected
        assert len(pages) == max(1, -(-count // page_size))
        assert pages[0].cursor is None
        assert [p.has_next_page for p in pages] == [True] * (len(pages) - 1) + [False]
        assert pages[-1].next_cursor is None
        for before, after in itertools.pairwise(pages):
            assert after.cursor == before.next_cursor is not None
        assert all(len(p) <= page_size for p in pages)


async def test_ten_thousand_records_each_exactly_once_in_order(fast_limits: Limits) -> None:
    async with FakeAdminServer(
        stores=[FakeStoreConfig("big", records={"orders": 10_000})], rate_limits=None
    ) as server:
        async with AdminClient(
            token=server.store("big").token,
            base_url=server.base_url,
            store="big",
            limits=fast_limits,
        ) as client:
            got = await ids_of(client.orders.list(page_size=250, model=dict))
        expected = [r["id"] for r in server.records("big", "orders")]
        assert len(got) == 10_000
        assert got == expected
        assert len(set(got)) == 10_000


async def test_resume_from_any_page_yields_exactly_the_rest(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    expected = [r["id"] for r in server.records("globex", "orders")]
    async with make_client("globex") as client:
        pages = [p async for p in client.orders.list(page_size=40).pages()]
        seen: list[Any] = []
        for page in pages:
            seen.extend(r.id for r in page.data)
            if page.next_cursor is None:
                continue
            rest = await ids_of(client.orders.list(page_size=40, after_cursor=page.next_cursor))
            assert seen + rest == expected


async def test_page_size_clamped_by_server_still_complete(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    async with make_client() as client:
        pages = [p async for p in client.customers.list(page_size=10_000).pages()]
    assert [len(p) for p in pages] == [250, 250, 250, 250]


async def test_models_dicts_and_user_classes(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    first = server.records("acme", "subscriptions")[0]

    @attrs.frozen
    class Mine:
        id: int
        customer_id: int
        status: str
        raw: dict[str, Any] = attrs.field(repr=False)

    async with make_client() as client:
        sub = await anext(aiter(client.subscriptions.list(page_size=5)))
        plain = await anext(aiter(client.subscriptions.list(page_size=5, model=dict)))
        mine = await anext(aiter(client.subscriptions.list(page_size=5, model=Mine)))
        order = await anext(aiter(client.orders.list(page_size=5)))
        customer = await anext(aiter(client.customers.list(page_size=5)))
        other = await anext(aiter(client.list_endpoint("orders").list(page_size=5)))
    assert isinstance(sub, asyncsubs.Subscription)
    assert sub.id == first["id"]
    assert sub.customer_id == first["customerId"]
    assert sub.status == first["status"]
    assert sub.created_at == first["createdAt"]
    assert sub.raw == first  # lossless: every field, nested objects and nulls included
    assert "lineItems" in sub.raw
    assert plain == first
    assert type(plain) is dict
    assert isinstance(mine, Mine)
    assert (mine.id, mine.customer_id, mine.raw) == (first["id"], first["customerId"], first)
    assert isinstance(order, asyncsubs.Order)
    assert order.subscription_id == order.raw["subscriptionId"]
    assert isinstance(customer, asyncsubs.Customer)
    assert customer.email == customer.raw["email"]
    assert type(other) is dict


async def test_missing_fields_never_fail(server: FakeAdminServer, make_client: MakeClient) -> None:
    body = {
        "success": True,
        "message": "OK",
        "code": "SUCCESS",
        "data": [{"id": 1}, {"id": "x-2", "brandNewField": {"a": [1, None]}}],
        "pageInfo": {"hasNextPage": False, "nextCursor": None},
    }
    server.enqueue(200, body, path="subscriptions")
    async with make_client() as client:
        subs = [s async for s in client.subscriptions.list()]
    assert [s.id for s in subs] == [1, "x-2"]
    assert subs[0].status is None
    assert subs[1].raw["brandNewField"] == {"a": [1, None]}


@pytest.mark.parametrize("model", [asyncsubs.Subscription, asyncsubs.Customer, asyncsubs.Order])
def test_a_page_structured_at_once_is_each_record_structured(model: type) -> None:
    structure, structure_all = _converter._OWN_HOOKS[model]
    names = [a.name for a in attrs.fields(model) if a.name != "raw"]
    full = {_converter.camel(n): f"{n}-value" for n in names}
    records = [full, {"id": 7}, {**full, "status": None, "unknown": [1]}, {}] * 10
    assert len(records) >= _converter._PASSES_FROM  # the page goes in passes, field by field
    page = structure_all(records)
    one_by_one = [structure(r) for r in records]
    assert [attrs.astuple(m, recurse=False) for m in page] == [
        attrs.astuple(m, recurse=False) for m in one_by_one
    ]
    assert all(m.raw is r for m, r in zip(page, records, strict=True))
    assert getattr(page[0], names[-1]) == f"{names[-1]}-value"
    assert page[1].id == 7
    spoiled = [*records[:17], ["not", "an", "object"], *records[18:]]
    with pytest.raises(errors.ProtocolError, match="record 17: TypeError: expected a JSON object"):
        _converter.structure_records(spoiled, structure, method="GET", path="things")
    assert getattr(page[1], names[-1]) is None


async def test_params_pass_through(server: FakeAdminServer, make_client: MakeClient) -> None:
    async with make_client() as client:
        active = [
            s async for s in client.subscriptions.list(page_size=100, params={"status": "ACTIVE"})
        ]
    expected = [r["id"] for r in server.records("acme", "subscriptions") if r["status"] == "ACTIVE"]
    assert [s.id for s in active] == expected
    assert 0 < len(expected) < 1_000
    assert all(r.query.get("status") == "ACTIVE" for r in server.requests)


async def test_headers_on_every_request(server: FakeAdminServer, make_client: MakeClient) -> None:
    async with make_client() as client:
        await ids_of(client.orders.list(page_size=500))
        await client.request("POST", "subscriptions/" + str(client_first_id(server)) + "/pause")
    assert len(server.requests) >= 5
    for record in server.requests:
        assert record.headers["X-Service-Token"] == server.store("acme").token
        assert record.headers["Content-Type"] == "application/json"
        assert record.headers["User-Agent"] == f"asyncsubs/{asyncsubs.__version__}"
        assert record.path.startswith("/admin/2026-04/")
    first_query = server.requests[0].query
    assert "afterCursor" not in first_query
    assert first_query["pageSize"] == "500"


def client_first_id(server: FakeAdminServer) -> Any:
    return server.records("acme", "subscriptions")[0]["id"]


async def test_request_non_list(server: FakeAdminServer, make_client: MakeClient) -> None:
    sub_id = client_first_id(server)
    async with make_client() as client:
        resp = await client.request("POST", f"subscriptions/{sub_id}/pause", json={})
        got = await client.request("GET", f"subscriptions/{sub_id}")
    assert (resp.status, resp.code) == (200, "SUCCESS")
    assert resp.data["status"] == "PAUSED"
    assert got.data["id"] == sub_id
    assert got.data["status"] == "PAUSED"


@pytest.mark.parametrize(
    ("setup", "call", "cls"),
    [
        ("bad_token", "list", errors.AuthenticationError),
        ("forbidden", "list", errors.PermissionDeniedError),
        ("none", "missing", errors.NotFoundError),
        ("none", "bad_cursor", errors.BadRequestError),
        ("script_500", "list", errors.ServerError),
        ("script_429", "list", errors.RateLimitError),
        ("script_422", "list", errors.BadRequestError),
        ("script_200_false", "list", errors.APIError),
    ],
)
async def test_error_classes_from_server(
    server: FakeAdminServer, make_client: MakeClient, setup: str, call: str, cls: type
) -> None:
    store = "initech" if setup == "forbidden" else "acme"
    token = "not-the-token-XYZ" if setup == "bad_token" else server.store(store).token
    if setup == "script_500":
        server.enqueue(500, {"success": False, "code": "INTERNAL_ERROR"}, times=None)
    elif setup == "script_429":
        server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "9999"})
    elif setup == "script_422":
        server.enqueue(422, {"success": False, "code": "VALIDATION_ERROR", "message": "bad"})
    elif setup == "script_200_false":
        server.enqueue(200, {"success": False, "code": "SOMETHING", "message": "no"})
    async with make_client(store, token=token) as client:
        if call == "list":
            action = ids_of(client.orders.list(page_size=10))
        elif call == "missing":
            action = client.request("GET", "subscriptions/424242")
        else:
            action = ids_of(client.orders.list(after_cursor="garbage"))
        with pytest.raises(cls) as info:
            await action
        assert type(info.value) is cls
        text = f"{info.value} {info.value!r} {client!r}"
        assert token not in text
        assert server.store(store).token not in text
        assert info.value.status >= 400 or setup == "script_200_false"


async def test_cursor_loop_raises_protocol_error(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    loop_page = {
        "success": True,
        "code": "SUCCESS",
        "data": [{"id": 1}],
        "pageInfo": {"hasNextPage": True, "nextCursor": "same"},
    }
    server.enqueue(200, loop_page, path="orders", times=5)
    seen: list[Any] = []

    async def consume(client: AdminClient) -> None:
        async for page in client.orders.list().pages():
            seen.append(page)

    async with make_client() as client:
        with pytest.raises(errors.ProtocolError, match="returned before"):
            await consume(client)
    assert len(seen) == 1  # the repeating page itself is never yielded


def _page(data: list[Any], cursor: str | None) -> dict[str, Any]:
    return {
        "success": True,
        "code": "SUCCESS",
        "data": data,
        "pageInfo": {"hasNextPage": cursor is not None, "nextCursor": cursor},
    }


async def test_empty_pages_that_promise_more_are_followed(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    for page in (_page([], "c1"), _page([], "c2"), _page([{"id": 7}], None)):
        server.enqueue(200, page, path="orders")
    async with make_client() as client:
        pages = [p async for p in client.orders.list(model=dict).pages()]
    assert [(p.cursor, len(p.data), p.next_cursor) for p in pages] == [
        (None, 0, "c1"),
        ("c1", 0, "c2"),
        ("c2", 1, None),
    ]


async def test_empty_pages_in_a_row_are_bounded(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    pages = [_page([{"id": 1}], "a"), *(_page([], f"e{i}") for i in range(5))]
    for page in pages:
        server.enqueue(200, page, path="orders")
    seen: list[Any] = []

    async def consume(client: AdminClient) -> None:
        async for page in client.orders.list(max_empty_pages=3, prefetch=0).pages():
            seen.append(page)

    async with make_client() as client:
        with pytest.raises(errors.ProtocolError, match="4 empty pages in a row"):
            await consume(client)
        assert len(seen) == 4  # the page with a record, then three empty ones
        server.clear_scripted()
        server.enqueue(200, _page([], "same"), path="orders", times=2)
        with pytest.raises(errors.ProtocolError, match="returned before"):
            await ids_of(client.orders.list())


@attrs.frozen
class Renewal:
    id: int
    next_charge_at: int


@pytest.mark.parametrize(
    ("model", "detail"),
    [
        (
            Renewal,
            r"required field missing @ \$\[1\]\.id; invalid value for type, expected int"
            r" @ \$\[1\]\.next_charge_at",
        ),
        (asyncsubs.Order, "record 2: TypeError: expected a JSON object, got list"),
    ],
)
async def test_a_record_that_does_not_structure_is_named(
    server: FakeAdminServer, make_client: MakeClient, model: Any, detail: str
) -> None:
    records = [{"id": 1, "nextChargeAt": 5}, {"nextChargeAt": "soon"}, [3]]
    page = {"success": True, "code": "SUCCESS", "data": records, "pageInfo": {"hasNextPage": False}}
    server.enqueue(200, page, path="orders")
    async with make_client() as client:
        with pytest.raises(errors.ProtocolError, match=f"could not be structured: {detail}"):
            await ids_of(client.orders.list(model=model))


@attrs.frozen
class Node:
    id: int
    children: list[Node] = attrs.field(factory=list)


async def test_a_record_too_deep_for_its_class_fails_with_an_error_that_prints(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    """cattrs' tree of exceptions is as deep as the record: said in the message, not chained."""
    deep = '{"id":1,"children":[' * 450 + '{"id":2}' + "]}" * 450
    body = '{"success":true,"data":[' + deep + '],"pageInfo":{"hasNextPage":false}}'
    server.enqueue(200, body, path="orders")
    async with make_client() as client:
        with pytest.raises(errors.ProtocolError, match=r"could not be structured.*\$\[0\]") as info:
            await ids_of(client.orders.list(model=Node))
    assert_printable(info.value)


async def test_resume_cursor_repeated_by_server_is_a_loop(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    page = {
        "success": True,
        "code": "SUCCESS",
        "data": [{"id": 1}],
        "pageInfo": {"hasNextPage": True, "nextCursor": "start"},
    }
    server.enqueue(200, page, path="orders")
    async with make_client() as client:
        with pytest.raises(errors.ProtocolError):
            await ids_of(client.orders.list(after_cursor="start"))


@pytest.mark.parametrize("page_size", [0, -1, 1.5, "10", True])
async def test_bad_page_size_before_any_request(
    server: FakeAdminServer, make_client: MakeClient, page_size: Any
) -> None:
    async with make_client() as client:
        with pytest.raises(errors.ConfigError):
            client.subscriptions.list(page_size=page_size)
    assert server.requests == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"params": {"afterCursor": "x"}},
        {"params": {"status": object()}},
        {"params": ["status"]},
        {"after_cursor": ""},
        {"model": int},
        {"max_empty_pages": -1},
        {"max_empty_pages": 1.5},
    ],
)
async def test_bad_list_arguments(make_client: MakeClient, kwargs: dict[str, Any]) -> None:
    async with make_client() as client:
        with pytest.raises(errors.ConfigError):
            client.orders.list(**kwargs)


def test_config_from_env_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASYNCSUBS_TOKEN", "env-TOKEN-77")
    monkeypatch.setenv("ASYNCSUBS_BASE_URL", "https://subs.example")
    client = AdminClient()
    assert client.base_url == "https://subs.example/admin/2026-04/"
    assert client.store.startswith("store-")
    assert "env-TOKEN-77" not in repr(client)
    assert "env-TOKEN-77" not in client.store
    assert AdminClient(store="x").store == "x"
    assert AdminClient(version="2027-01").base_url.endswith("/admin/2027-01/")
    monkeypatch.delenv("ASYNCSUBS_TOKEN")
    with pytest.raises(errors.ConfigError, match="token"):
        AdminClient()
    for bad in (
        {"token": "t", "base_url": "http://shop.example"},
        {"token": "t", "base_url": "https://x", "timeout": 0},
        {"token": "t", "base_url": "https://x", "store": ""},
        {"token": "t", "base_url": "https://x", "limits": {"global": 5}},
        {"token": "t", "base_url": "https://x", "session": object()},
    ):
        with pytest.raises(errors.ConfigError):
            AdminClient(**bad)
    assert AdminClient(token="t", base_url="http://shop.example", allow_insecure=True)


@pytest.mark.parametrize(
    "host", ["127.0.0.1.attacker.example", "127.attacker.example", "localhost.example", "10.0.0.1"]
)
def test_plain_http_to_a_name_that_only_looks_local_is_refused(host: str) -> None:
    with pytest.raises(errors.ConfigError, match="unencrypted"):
        AdminClient(token="t", base_url=f"http://{host}:8080")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.8.9.10", "[::1]", "localhost", "LOCALHOST"])
def test_plain_http_to_loopback_is_allowed(host: str) -> None:
    assert AdminClient(token="t", base_url=f"http://{host}:8080").base_url.startswith("http://")


def _client(**settings: Any) -> AdminClient:
    return AdminClient(**{"token": "t", "base_url": "https://shop.example", **settings})


@pytest.mark.parametrize(
    "make",
    [
        lambda: _client(limiter="redis://localhost:6379/0"),  # where RedisLimiter(url) goes
        lambda: _client(transport=object()),
        lambda: _client(user_agent="app\r\nX-Injected: 1"),
        lambda: RetryPolicy(retry_statuses=None),
        lambda: RetryPolicy(retry_statuses=429),
        lambda: RetryPolicy(retry_statuses="429"),
        lambda: RetryPolicy(retry_statuses={"503"}),
        lambda: RetryPolicy(retry_statuses={99999}),
        lambda: RetryPolicy(retry_non_idempotent="no"),
        lambda: Limits(heavy={"global": Rate(1)}),
        lambda: _client(base_url="https://shop.example/admin/2026-04/"),  # the client's suffix
        lambda: _client(base_url="https://shop.example/admin"),
    ],
)
def test_plausible_mistakes_are_config_errors_at_construction(make: Callable[[], object]) -> None:
    with pytest.raises(errors.ConfigError):
        make()


async def test_request_params_must_be_a_mapping() -> None:
    async with AdminClient(token="t", base_url="https://shop.example") as client:
        with pytest.raises(errors.ConfigError, match="params must be a mapping"):
            await client.request("GET", "subscriptions", params=[("pageSize", 1)])  # type: ignore[arg-type]


async def test_default_store_is_shared_by_same_token_and_base() -> None:
    a = AdminClient(token="T1", base_url="https://a.example")
    b = AdminClient(token="T1", base_url="https://a.example/")
    c = AdminClient(token="T2", base_url="https://a.example")
    assert a.store == b.store != c.store
    # One store whatever the interface version or the host's case.
    d = AdminClient(token="T1", base_url="https://A.example", version="2025-01")
    assert d.store == a.store


async def test_shared_session_is_not_closed(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    async with aiohttp.ClientSession() as session:
        async with make_client(session=session) as client:
            await ids_of(client.customers.list(page_size=250))
        assert not session.closed
        async with make_client(session=session) as again:
            assert len(await ids_of(again.customers.list(page_size=250))) == 1_000


async def test_a_closed_shared_session_fails_at_once(make_client: MakeClient) -> None:
    session = aiohttp.ClientSession()
    await session.close()
    async with make_client(session=session) as client:
        with pytest.raises(
            errors.TransportError, match="session passed to the client is closed"
        ) as info:
            await client.request("GET", "subscriptions/1")
    assert info.value.attempts == 1


async def test_closed_client_refuses(make_client: MakeClient) -> None:
    client = make_client()
    await client.aclose()
    with pytest.raises(errors.ConfigError, match="closed"):
        await client.request("GET", "subscriptions/1")


async def test_token_never_logged(
    server: FakeAdminServer, make_client: MakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    server.enqueue(500, b"<html>oops</html>", {"Content-Type": "text/html"})
    server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "1"})
    async with make_client() as client:
        await ids_of(client.orders.list(page_size=250))
        with pytest.raises(errors.NotFoundError):
            await client.request("GET", "nope")
    assert caplog.records, "expected DEBUG logs from retries and the 429 pause"
    assert server.store("acme").token not in caplog.text


async def test_stats_count_requests_and_429s(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "1"})
    async with make_client() as client:
        await ids_of(client.orders.list(page_size=250))
        stats = client.stats
    orders = stats.pools["orders"]
    assert orders.requests == 5  # 4 pages + the 429'd attempt
    assert orders.rate_limited == 1
    assert orders.retries == 1


async def test_on_retry_is_told_each_retry_with_its_error_and_pool(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    """The public retry hook: one event per retried attempt, in order, from the task that made
    the request; a request that succeeds at once tells it nothing."""
    server.enqueue(500, b"<html>oops</html>", {"Content-Type": "text/html"}, path="orders")
    server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "1"})
    seen: list[tuple[asyncsubs.RetryEvent, asyncio.Task[Any] | None]] = []
    one = f"subscriptions/{server.records('acme', 'subscriptions')[0]['id']}"
    async with make_client(on_retry=lambda e: seen.append((e, asyncio.current_task()))) as client:
        await client.request("GET", one)  # the 429, then once more
        await ids_of(client.orders.list(page_size=250))  # the 500 on its first page
        retried = [e for e, _ in seen]
        assert [(e.method, e.path, e.attempt, e.pool) for e in retried] == [
            ("GET", one, 1, "global"),
            ("GET", "orders", 1, "orders"),
        ]
        assert isinstance(retried[0].error, errors.RateLimitError)
        assert retried[0].delay == 0.0  # a 429 waits in the pool's pause, not here
        assert isinstance(retried[1].error, errors.ServerError)
        assert all(task is not None for _, task in seen)
        assert client.stats.retries == 2
    with pytest.raises(errors.ConfigError, match="on_retry must be callable"):
        make_client(on_retry="print")


async def test_an_on_retry_that_raises_ends_the_request(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    server.enqueue(500, b"<html>oops</html>", {"Content-Type": "text/html"})

    def refuse(event: asyncsubs.RetryEvent) -> None:
        raise RuntimeError("no retries here")

    async with make_client(on_retry=refuse) as client:
        with pytest.raises(RuntimeError, match="no retries here") as info:
            await client.request("GET", "subscriptions/1")
    assert info.value.__context__ is None  # raised outside the error's handler
    assert server.stats("acme").requests == 1


def test_the_fingerprint_is_the_default_store_and_keeps_no_token() -> None:
    a = AdminClient(token="secret-T1", base_url="https://a.example")
    named = AdminClient(token="secret-T1", base_url="https://a.example/", store="acme")
    other = AdminClient(token="T2", base_url="https://a.example")
    assert a.fingerprint == a.store == named.fingerprint != other.fingerprint
    assert "secret" not in a.fingerprint


def test_the_settings_checks_are_the_clients() -> None:
    from asyncsubs import json, settings

    assert settings.check_token("t") == "t"
    assert settings.check_version("2027-01") == "2027-01"
    assert settings.versioned_base("http://127.0.0.1:9", settings.DEFAULT_VERSION) == (
        f"http://127.0.0.1:9/admin/{settings.DEFAULT_VERSION}/"
    )
    assert settings.is_loopback("::1")
    assert not settings.is_loopback("127.0.0.1.example")
    for check, value, message in [
        (settings.check_token, "t\n", "token contains control characters"),
        (settings.check_version, "04/2026", "version must look like '2026-04'"),
    ]:
        with pytest.raises(errors.ConfigError, match=message):
            check(value)
        kwargs = {"token": value} if check is settings.check_token else {"version": value}
        with pytest.raises(errors.ConfigError, match=message):  # the client's own message
            AdminClient(**{"token": "t", "base_url": "https://a.example", **kwargs})
    with pytest.raises(errors.ConfigError, match="plain http://"):
        settings.versioned_base("http://a.example", "2026-04")
    big = 2**64 + 1
    assert json.loads(json.dumps({"id": big, "s": "é"})) == {"id": big, "s": "é"}
    assert json.dumps({"s": "é"}) == '{"s":"é"}'.encode()


async def test_a_rate_limited_code_in_a_200_answer_is_a_429(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    # Whatever its status, a rate-limit answer is counted and pauses the pool like a 429,
    # instead of being retried at once.
    server.enqueue(200, {"success": False, "code": "RATE_LIMITED"})
    async with make_client() as client:
        await ids_of(client.orders.list(page_size=250))
        orders = client.stats.pools["orders"]
    assert (orders.rate_limited, orders.retries) == (1, 1)


def test_stats_before_any_request_outside_a_loop() -> None:
    """Binding the store's limiter needs the running loop; before the first request there is
    nothing to count, so the stats are zeros rather than an error."""
    client = AdminClient(token="t", base_url="https://subs.example", limits=Limits(max_in_flight=7))
    stats = client.stats
    assert stats.store == client.store
    assert set(stats.pools) == {"global", "subscriptions", "customers", "orders"}
    counters = (stats.requests, stats.rate_limited, stats.retries, stats.in_flight)
    assert counters == (0, 0, 0, 0)
    assert stats.max_in_flight == 7


async def test_requests_caught_by_aclose_open_no_new_session(make_client: MakeClient) -> None:
    arrived = asyncio.Event()
    wire = WireServer(lambda _: arrived.set())  # never answers
    async with wire:
        client = make_client(base_url=wire.base_url, timeout=2.0, limits=Limits(max_in_flight=1))
        in_flight = asyncio.create_task(client.request("GET", "subscriptions/1"))
        queued = asyncio.create_task(client.request("GET", "subscriptions/2"))
        await arrived.wait()
        await client.aclose()
        results = await asyncio.gather(in_flight, queued, return_exceptions=True)
    # The request on the closing session failed there; its retry and the queued request met
    # the closed client instead of opening a session nothing would close.
    assert [type(r) for r in results] == [errors.ConfigError, errors.ConfigError]
    assert "closed while this request was in flight" in str(results[0])  # not "waited"
    assert "closed while this request waited" in str(results[1])
    assert client._transport._session is None  # type: ignore[attr-defined]
    assert len(wire.requests) == 1


class Answers:
    """A transport answering with ``answers`` in turn, at once."""

    def __init__(self, *answers: tuple[int, bytes]) -> None:
        self.answers = list(answers)
        self.sent = 0

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        self.sent += 1
        status, body = self.answers.pop(0) if self.answers else (200, OK_BODY)
        return RawResponse(status, {}, body)

    async def aclose(self) -> None:
        pass


OK_BODY = b'{"success": true, "code": "SUCCESS", "data": {}}'


async def test_a_clean_up_request_of_a_cancelled_task_is_answered_as_any() -> None:
    """A task handling its cancellation (``except CancelledError: <clean up>; raise``) gets its
    clean-up request's own errors, and its retries."""
    gone = (404, b'{"success": false, "code": "NOT_FOUND", "message": "gone"}')
    failed = (500, b'{"success": false, "code": "INTERNAL_ERROR"}')
    transport = Answers(gone, failed)
    outcomes: list[object] = []

    async def cleaning_up(client: AdminClient) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            for _ in range(2):
                try:
                    outcomes.append((await client.request("GET", "things/1")).status)
                except BaseException as exc:
                    outcomes.append(type(exc))
            raise

    client = AdminClient(token="t", base_url="https://subs.example", transport=transport)
    with no_waiting():
        async with client:
            task = asyncio.create_task(cleaning_up(client))
            await asyncio.sleep(0)  # the task waits
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert outcomes == [errors.NotFoundError, 200]
    assert transport.sent == 3  # the 500 retried


async def test_requests_queued_when_their_client_closes_claim_no_start(
    clock: VirtualClock,
) -> None:
    """A closed client's queued requests fail as their turn comes, not after waiting out a
    start each from the store's budget, which another client of the store is waiting on."""
    shared, limits = Limiter(), Limits(global_rate=Rate(10))
    options: dict[str, Any] = {"token": "t", "base_url": "https://subs.example", "store": "acme"}
    closing = AdminClient(**options, limits=limits, limiter=shared, transport=Answers())
    other = AdminClient(**options, limits=limits, limiter=shared, transport=Answers())
    await other.request("GET", "things/1")
    queued = [asyncio.create_task(closing.request("GET", "things/1")) for _ in range(40)]
    await asyncio.sleep(0)
    await closing.aclose()
    t0 = clock.now
    await other.request("GET", "things/1")
    assert clock.now - t0 < 3 * limits.global_rate.per / limits.global_rate.n  # 40 before
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert {type(r) for r in results} == {errors.ConfigError}
    assert other.stats.requests == 2 + 1  # its two, and the one head that had claimed already
    await other.aclose()


async def test_a_client_used_from_a_second_event_loop_says_so(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    path = f"subscriptions/{client_first_id(server)}"
    async with make_client() as client:
        assert (await client.request("GET", path)).status == 200

        def from_another_thread() -> object:
            return asyncio.run(asyncio.wait_for(client.request("GET", path), 5))

        with pytest.raises(errors.ConfigError, match="one client per event loop"):
            await asyncio.to_thread(from_another_thread)
        assert (await client.request("GET", path)).status == 200


@pytest.mark.parametrize(
    ("method", "json"),
    [("GÉT", None), ("GET /x", None), ("POST", {1: 2}), ("POST", object()), ("POST", [{"a": {2}}])],
)
async def test_misuse_is_a_config_error(make_client: MakeClient, method: str, json: Any) -> None:
    async with make_client() as client:
        with pytest.raises(errors.ConfigError, match=r"method name|cannot be sent as JSON"):
            await client.request(method, "subscriptions/1", json=json)


@pytest.mark.parametrize(
    "json",
    [{"price": math.nan}, [1, None, [math.inf]], {"a": {"b": (None, -math.inf)}}, 2**64 * 1.0e300],
)
async def test_a_nan_or_an_infinity_is_not_sent_as_null(make_client: MakeClient, json: Any) -> None:
    async with make_client() as client:
        with pytest.raises(errors.ConfigError, match="NaN or an infinity"):
            await client.request("POST", "subscriptions/1/pause", json=json)
        with pytest.raises(errors.ConfigError, match="finite float"):
            await client.request("GET", "subscriptions", params={"since": math.nan})
        await client.request("GET", "subscriptions", params={"pageSize": 1, "since": 0.5})


async def test_json_body_integers_beyond_64_bits_are_sent_exactly(make_client: MakeClient) -> None:
    wire = WireServer(lambda _: b"HTTP/1.1 204 No Content\r\n\r\n")
    async with wire, make_client(base_url=wire.base_url) as client:
        await client.request("POST", "subscriptions/1/pause", json={"id": 2**64 + 1})
    assert wire.requests[0].endswith(b'{"id":18446744073709551617}')


async def test_a_long_retry_after_fails_every_request_of_the_pool_fast(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    """Retry-After beyond max_retry_after: that call fails fast, and so does every later request
    of the pool while the pause lasts, instead of each waiting it out (nothing is sent)."""
    from asyncsubs.testing import set_waiting

    previous = set_waiting(True)
    try:
        server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "3600"})
        async with make_client() as client:
            loop = asyncio.get_running_loop()
            with pytest.raises(errors.RateLimitError) as first:
                await client.request("GET", "subscriptions/1")
            sent = server.stats("acme").requests
            started = loop.time()
            with pytest.raises(errors.RateLimitError) as later:
                await client.request("GET", "subscriptions/1")
            assert loop.time() - started < 1.0
            # Another pool is not paused.
            await client.request("GET", "orders", params={"pageSize": 1})
    finally:
        set_waiting(previous)
    assert first.value.retry_after == 3600
    assert later.value.retry_after is not None
    assert 3590 < later.value.retry_after <= 3600
    assert server.stats("acme").requests == sent + 1  # only the orders request went out
    assert (later.value.method, later.value.path) == ("GET", "subscriptions/1")
    assert str(later.value).startswith("GET subscriptions/1: store 'acme': the global pool is")
    assert str(later.value).endswith("longer than RetryPolicy.max_retry_after (not sent)")


async def test_the_clients_own_session_reports_each_request_as_it_gets_its_connection(
    server: FakeAdminServer,
) -> None:
    """Its connector calls the request's ``on_connected`` once, before the server has seen it
    (the limiter counts the start from then: a connect delays it unseen otherwise). A session
    passed in is the caller's, and calls nothing."""
    request = build_request(server.api_url, server.tokens["acme"], "GET", "subscriptions")
    seen: list[int] = []

    def connected() -> None:
        seen.append(len(server.requests))

    own = AiohttpTransport(max_response_bytes=1 << 20)
    try:
        for _ in range(3):
            assert (await own.send(request, timeout=5.0, on_connected=connected)).status == 200
        assert (await own.send(request, timeout=5.0)).status == 200  # none: nothing to call
    finally:
        await own.aclose()
    assert seen == [0, 1, 2]
    async with aiohttp.ClientSession() as session:
        passed = AiohttpTransport(session, max_response_bytes=1 << 20)
        assert (await passed.send(request, timeout=5.0, on_connected=connected)).status == 200
    assert seen == [0, 1, 2]


class CancelledAsFailure:
    """A transport that reports its cancellation as a failure, as a library below may (redis-py
    turns one that lands in a reply into its TimeoutError); counts its sends."""

    def __init__(self) -> None:
        self.sends = 0
        self.entered = asyncio.Event()

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        self.sends += 1
        if self.sends > 1:
            raise AssertionError("a cancelled request was sent again")
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise errors.TransportError("GET orders: no complete response") from None
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        pass


async def test_a_cancelled_request_is_not_retried_whatever_reports_it() -> None:
    """Regression: a worker cancelling its requests waited on one that its client had sent
    again, the cancellation having come back as a retryable error."""
    transport = CancelledAsFailure()
    client = AdminClient(token="t", base_url="https://subs.example", transport=transport)
    with no_waiting():  # a retry's backoff takes no time
        async with client:
            sending = asyncio.create_task(client.request("GET", "orders/1"))
            await transport.entered.wait()
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
    assert transport.sends == 1
