"""The dlt source against a real dlt pipeline loading into a real DuckDB, with FakeAdminServer.

The server runs on the test's event loop; each pipeline run goes to a worker thread
(``asyncio.to_thread``), where dlt starts the event loop of its own that runs the resources,
so the server answers while dlt extracts, as a real one does from elsewhere.
"""

from __future__ import annotations

import asyncio
import datetime
import gc
import itertools
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import dlt
import duckdb
import orjson
import pytest
import redis.asyncio as aioredis
from dlt.pipeline.exceptions import PipelineStepFailed
from redis_fixtures import RedisServer, redis_server_fixture  # noqa: F401 - by its name=

from asyncsubs import AdminClient, AuthenticationError, ConfigError, Limits, Page, Rate
from asyncsubs.dlt import DeleteLog, Store, subscription_service
from asyncsubs.stores import stores_from_tables
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, ServerRateLimits, run_in_process
from asyncsubs.webhooks import WebhookConfig, WebhookReceiver

RESOURCES = ("subscriptions", "customers", "orders")
STORES = ("s0", "s1", "s2")
#: Stores of one page per resource, for the tests of configuration (discovery starts at 1/s).
SMALL = ("t0", "t1")
INCREMENTAL = {r: {"param": "updatedAtMin", "field": "updatedAt"} for r in RESOURCES}
STAMP = "%Y-%m-%dT%H:%M:%SZ"  # the fake server's, kept by dlt's lag
#: Fixed limits far above the fake server's (it enforces none here): pages as fast as it answers.
FAST = Limits(global_rate=Rate(1_000), heavy={r: Rate(1_000) for r in RESOURCES})


@pytest.fixture(autouse=True)
def no_dlt_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """dlt reports usage over the network unless told not to; tests talk to loopback only."""
    monkeypatch.setenv("RUNTIME__DLTHUB_TELEMETRY", "false")


@pytest.fixture
async def server() -> AsyncIterator[FakeAdminServer]:
    stores = [FakeStoreConfig(name, records=120) for name in STORES]
    stores += [FakeStoreConfig(name, records=40) for name in SMALL]
    async with FakeAdminServer(stores=stores, rate_limits=None, max_page_size=50) as srv:
        yield srv


@pytest.fixture
def pipeline(tmp_path: Path) -> dlt.Pipeline:
    return dlt.pipeline(
        pipeline_name=f"subs_{uuid.uuid4().hex[:8]}",
        destination=dlt.destinations.duckdb(str(tmp_path / "warehouse.duckdb")),
        pipelines_dir=str(tmp_path / "pipelines"),
        dataset_name="subs",
    )


def stores_of(server: FakeAdminServer, **options: Any) -> list[Store]:
    options.setdefault("limits", FAST)
    options.setdefault("page_size", 50)
    return [
        Store(name=name, base_url=server.base_url, token=server.store(name).token, **options)
        for name in STORES
    ]


async def run(pipeline: dlt.Pipeline, source: Any) -> Any:
    return await asyncio.to_thread(pipeline.run, source)


def query(pipeline: dlt.Pipeline, sql: str) -> list[tuple[Any, ...]]:
    path = pipeline.destination_client().config.credentials.database  # type: ignore[attr-defined]
    with duckdb.connect(path, read_only=True) as conn:
        return conn.sql(sql).fetchall()


def loaded(pipeline: dlt.Pipeline, resource: str) -> dict[tuple[str, str], Any]:
    rows = query(pipeline, f"SELECT store, id, updated_at FROM subs.{resource}")
    keys = [(store, id_) for store, id_, _ in rows]
    assert len(keys) == len(set(keys)), f"duplicate keys in {resource}"
    return {(store, id_): stamp for store, id_, stamp in rows}


def served(
    server: FakeAdminServer, resource: str, stores: tuple[str, ...] = STORES
) -> dict[tuple[str, str], str]:
    return {
        (name, str(record["id"])): record["updatedAt"]
        for name in stores
        for record in server.records(name, resource)
    }


def list_requests(server: FakeAdminServer) -> list[Any]:
    return [r for r in server.requests if r.method == "GET" and r.status == 200]


async def test_three_stores_three_resources_load_exactly(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    await run(pipeline, subscription_service(stores=stores_of(server), max_stores=2))

    for resource in RESOURCES:
        got, want = loaded(pipeline, resource), served(server, resource)
        assert set(got) == set(want)  # row counts and distinct (store, id) both equal
    # Whole pages, three per (store, resource): 120 records at 50 a page.
    requests = list_requests(server)
    assert len(requests) == 3 * 3 * 3
    # At most two stores pulling at once (max_stores), each with all of its resources: the
    # third store's first request comes after the last of one of the first two.
    first = {name: min(i for i, r in enumerate(requests) if r.store == name) for name in STORES}
    last = {name: max(i for i, r in enumerate(requests) if r.store == name) for name in STORES}
    third = max(STORES, key=first.__getitem__)
    assert any(last[name] < first[third] for name in STORES if name != third)
    # Nested arrays are child tables, as dlt makes them.
    lines = query(pipeline, "SELECT count(*) FROM subs.orders__line_items")[0][0]
    assert lines == sum(len(o["lineItems"]) for s in STORES for o in server.records(s, "orders"))


async def test_second_run_merges_changes(server: FakeAdminServer, pipeline: dlt.Pipeline) -> None:
    await run(pipeline, subscription_service(stores=stores_of(server)))
    for name in STORES:
        await server.mutator(name, seed=7).run(steps=40)

    await run(pipeline, subscription_service(stores=stores_of(server)))

    changed = 0
    for resource in RESOURCES:
        got, want = loaded(pipeline, resource), served(server, resource)
        assert set(got) == set(want)
        for key, stamp in want.items():  # the newer value won: the stored stamp is the server's
            assert got[key].strftime(STAMP) == stamp
            changed += stamp >= "2026"
    assert changed > 0  # the mutator's stamps are today's; the seeded records' are older


async def test_incremental_second_run_asks_only_after_the_high_water_mark(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    source = subscription_service(stores=stores_of(server), incremental=INCREMENTAL, lag=60)
    await run(pipeline, source)
    state = pipeline.state["sources"]["subscription_service"]["resources"]
    marks = {r: state[r]["incremental"]["updatedAt"]["last_value"] for r in RESOURCES}
    for resource in RESOURCES:
        assert marks[resource] == max(served(server, resource).values())
    for name in STORES:
        await server.mutator(name, seed=3).run(steps=10)
    server.clear_requests()

    await run(
        pipeline, subscription_service(stores=stores_of(server), incremental=INCREMENTAL, lag=60)
    )

    requests = list_requests(server)
    for resource in RESOURCES:
        asked = [r for r in requests if r.path.endswith(f"/{resource}")]
        # Every request of the second run carries the mark less the lag (60 s)...
        since = {r.query.get("updatedAtMin") for r in asked}
        assert len(since) == 1
        mark = datetime.datetime.strptime(marks[resource], STAMP)
        assert since == {(mark - datetime.timedelta(seconds=60)).strftime(STAMP)}
        # ...and no store needs more than one page for what changed since.
        assert len(asked) == len(STORES)
        got, want = loaded(pipeline, resource), served(server, resource)
        assert got.keys() == want.keys()
        assert {k: v.strftime(STAMP) for k, v in got.items()} == want


async def test_a_store_new_to_the_pipeline_is_pulled_whole(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    first, *_ = stores_of(server)
    await run(pipeline, subscription_service(stores=[first], incremental=INCREMENTAL))
    await run(pipeline, subscription_service(stores=stores_of(server), incremental=INCREMENTAL))

    for resource in RESOURCES:
        assert set(loaded(pipeline, resource)) == set(served(server, resource))


async def test_interrupted_extract_reruns_exactly(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    pages = itertools.count(1)

    def interrupt_at_fourth_page(page: Any) -> Any:
        if next(pages) == 4:
            raise KeyboardInterrupt  # as Ctrl-C would, mid-extract
        return page

    source = subscription_service(stores=stores_of(server), incremental=INCREMENTAL)
    source.orders.add_map(interrupt_at_fourth_page)
    with pytest.raises((KeyboardInterrupt, PipelineStepFailed)):
        await run(pipeline, source)
    # Nothing of the interrupted run was committed: no state, no package left to load.
    assert "resources" not in pipeline.state.get("sources", {}).get("subscription_service", {})
    assert not pipeline.list_normalized_load_packages()

    await run(pipeline, subscription_service(stores=stores_of(server), incremental=INCREMENTAL))

    for resource in RESOURCES:
        assert set(loaded(pipeline, resource)) == set(served(server, resource))


@pytest.mark.parametrize("first", [True, False], ids=["first-run", "later-run"])
async def test_a_run_after_a_failed_load_only_loads_its_package(
    server: FakeAdminServer, pipeline: dlt.Pipeline, tmp_path: Path, first: bool
) -> None:
    """As docs/dlt.md says: a package left pending (its load killed or failed) is what the
    next run loads, and all it does; the run after it pulls what changed. Unless no load ever
    reached the destination: then dlt drops the package, and the next run pulls anew."""

    def process() -> dlt.Pipeline:  # each run in a process of its own: the pipeline attached
        return dlt.pipeline(
            pipeline_name=pipeline.pipeline_name,
            destination=dlt.destinations.duckdb(str(tmp_path / "warehouse.duckdb")),
            pipelines_dir=str(tmp_path / "pipelines"),
            dataset_name="subs",
        )

    def source() -> Any:
        return subscription_service(stores=stores_of(server), incremental=INCREMENTAL)

    if not first:
        await run(process(), source())
        for name in STORES:
            await server.mutator(name, seed=5).run(steps=10)
    killed = process()
    await asyncio.to_thread(killed.extract, source())
    await asyncio.to_thread(killed.normalize)  # extracted and normalized, never loaded
    assert killed.has_pending_data
    for name in STORES:
        await server.mutator(name, seed=6).run(steps=10)
    server.clear_requests()

    await run(process(), source())
    assert not process().has_pending_data
    if first:  # the package dropped, everything pulled and loaded
        assert len(list_requests(server)) == 3 * 3 * 3
    else:
        assert list_requests(server) == []  # nothing pulled: the pending package, loaded
        assert loaded(pipeline, "orders")
        await run(process(), source())
        assert list_requests(server)  # the changes since
    for resource in RESOURCES:
        got, want = loaded(pipeline, resource), served(server, resource)
        assert {k: v.strftime(STAMP) for k, v in got.items()} == want


def chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack += [e for e in (current.__cause__, current.__context__) if e is not None]
        if isinstance(current, BaseExceptionGroup):
            stack += list(current.exceptions)


async def test_a_bad_token_fails_the_run_with_the_typed_error_and_no_token(
    server: FakeAdminServer, pipeline: dlt.Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    stores = stores_of(server)
    bad = "fake_0123456789abcdef-not-a-token"
    stores[1] = Store(name="s1", base_url=server.base_url, token=bad, limits=FAST)
    tokens = [bad, *(server.store(name).token for name in STORES)]

    with pytest.raises(PipelineStepFailed) as failed:
        await run(pipeline, subscription_service(stores=stores))

    errors = list(chain(failed.value))
    auth = [e for e in errors if isinstance(e, AuthenticationError)]
    assert auth
    assert auth[0].status == 401
    assert "store s1" in str(auth[0])
    trace = pipeline.last_trace
    shown = [
        *(f"{e!s} {e!r} {vars(e)!r}" for e in errors),
        str(trace),
        repr(trace.asdict()),
        caplog.text,
    ]
    for text in shown:
        assert not any(token in text for token in tokens)


async def test_a_store_failing_stops_the_other_pulls_with_nothing_left_open(
    pipeline: dlt.Pipeline, caplog: pytest.LogCaptureFixture
) -> None:
    """One store fails its one resource while another store's resources are mid-pull: the run
    fails with that error and nothing else is said. dlt stops its loop without waiting for what
    it cancelled; the pulls, on a loop of the source's own, close there (no generator closed
    while running, no session left open, both of which asyncio would log)."""
    caplog.set_level(logging.WARNING, logger="asyncio")
    stores = [FakeStoreConfig("slow", records=2_000)]
    async with FakeAdminServer(stores=stores, rate_limits=None, latency=0.02) as srv:
        slow = Store("slow", srv.base_url, srv.store("slow").token, limits=FAST, page_size=50)
        bad = Store("bad", srv.base_url, "fake_0123456789abcdef-not-a-token", resources=("orders",))
        with pytest.raises(PipelineStepFailed) as failed:
            await run(pipeline, subscription_service(stores=[slow, bad]))
        for thread in threading.enumerate():  # the run's loop, closing the clients
            if thread.name == "asyncsubs-dlt-run":
                await asyncio.to_thread(thread.join, 30)
        pulled = srv.stats("slow").requests
    gc.collect()  # an unclosed session says so when collected
    assert [str(e) for e in chain(failed.value) if isinstance(e, AuthenticationError)]
    assert 0 < pulled < 3 * 2_000 // 50, "the slow store was not mid-pull"
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_pages_cross_from_the_runs_loop_each_once_and_within_the_room() -> None:
    """The pulls run ahead of their reader by a page a store at most, and every page crosses
    over once, each store's in order, whether the reader keeps up or lags behind."""
    from asyncsubs.dlt._session import Pulls, _Run
    from asyncsubs.stores import StoreClients

    async def pages(count: int) -> AsyncIterator[Page[Any]]:
        for i in range(count):
            yield Page([{"id": i}], cursor=None, next_cursor=None, has_next_page=i + 1 < count)

    run = _Run(StoreClients(None), (), max_stores=8)
    await run.opened
    counts = {"a": 300, "b": 200, "c": 1}
    pulls = Pulls(run, {store: pages(count) for store, count in counts.items()})
    got: dict[str, list[int]] = {store: [] for store in counts}
    most = 0
    async with asyncio.timeout(60):  # a pull never woken when room frees would hang here
        async for store, page in pulls:
            most = max(most, pulls._arrived.qsize() + 1)
            got[store] += [r["id"] for r in page.data]
            if len(got["a"]) % 50 < 25:  # a reader that lags, then keeps up
                await asyncio.to_thread(time.sleep, 0.001)
    await run.call(run.aclose(keep=False))
    assert got == {store: list(range(count)) for store, count in counts.items()}
    assert 1 < most <= len(counts)


async def test_budgets_hold_against_a_server_enforcing_them(pipeline: dlt.Pipeline) -> None:
    heavy = {"subscriptions": Rate(4), "customers": Rate(3), "orders": Rate(5)}
    limits = ServerRateLimits(global_rate=Rate(50), heavy=heavy, window="sliding")
    stores = [FakeStoreConfig(name, records=100, rate_limits=limits) for name in STORES]
    # In a process of its own: sharing this one, the server would stamp requests late by the
    # pipeline's work and count them bunched (README, "Testing your own code").
    with run_in_process(stores=stores, max_page_size=25, default_page_size=25) as server:
        given = [
            Store(
                name, server.base_url, server.tokens[name], limits=Limits(heavy=heavy), page_size=25
            )
            for name in STORES
        ]
        await run(pipeline, subscription_service(stores=given))

        for name in STORES:
            stats = server.stats(name)
            assert stats.rejected == 0
            assert all(stats.pool(r).accepted == 4 for r in RESOURCES)


async def test_learned_values_carry_over_to_the_next_run(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    # The default discovery (Store(limits=None)) starts at 1/s; a faster start keeps this short.
    limits = Limits(heavy={"orders": Rate.discover(start=20)})
    stores = stores_of(server, limits=limits, page_size="max")[:1]
    await run(pipeline, subscription_service(stores=stores, resources=["orders"]))
    learned = pipeline.state["sources"]["subscription_service"]["learned"]["s0"]
    assert learned["pools"]["orders"]["page_size"] == 50  # the server's maximum, found
    first = [r.query.get("pageSize") for r in list_requests(server)]
    assert first[0] == "1000"
    server.clear_requests()

    await run(pipeline, subscription_service(stores=stores, resources=["orders"]))

    # The second run starts from what the first learned: the server's page size at once.
    assert {r.query.get("pageSize") for r in list_requests(server)} == {"50"}


async def test_deletes_from_webhooks_become_hard_deletes(
    server: FakeAdminServer, pipeline: dlt.Pipeline, tmp_path: Path
) -> None:
    log = DeleteLog(tmp_path / "deletes.db")
    options: dict[str, Any] = {"resources": ["subscriptions"], "deletes": str(log.path)}
    await run(pipeline, subscription_service(stores=stores_of(server), **options))
    receiver = WebhookReceiver(WebhookConfig("whsec"), log.handler("s0"), store="s0")
    url = await receiver.listen("127.0.0.1", 0)
    try:
        sender = await server.deliver_webhooks(url, "whsec", stores=["s0"])
        mutator = server.mutator("s0", weights={"subscription_delete": 5.0})
        await mutator.run(steps=20)
        await sender.join()
    finally:
        await receiver.aclose()
    deleted = {("s0", str(m.record_id)) for m in mutator.history if m.kind.endswith("delete")}
    assert deleted

    await run(pipeline, subscription_service(stores=stores_of(server), **options))

    got = loaded(pipeline, "subscriptions")
    assert not deleted & set(got)
    assert set(got) == set(served(server, "subscriptions"))


async def test_a_deleted_id_beyond_64_bits_is_deleted_not_a_failure(
    server: FakeAdminServer, pipeline: dlt.Pipeline, tmp_path: Path
) -> None:
    """A delete's id as large as a pulled record's may be: the run that reads it loads it (it
    failed in extract, and every run after it, the delete read again each time)."""
    log = DeleteLog(tmp_path / "deletes.db")
    options: dict[str, Any] = {"resources": ["subscriptions"], "deletes": str(log.path)}
    await run(pipeline, subscription_service(stores=stores_of(server), **options))
    log.add("s0", "subscriptions", 2**64 + 5)

    for _ in range(2):
        await run(pipeline, subscription_service(stores=stores_of(server), **options))
        assert set(loaded(pipeline, "subscriptions")) == set(served(server, "subscriptions"))


async def test_replace_runs_drop_what_the_server_deleted(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    await run(pipeline, subscription_service(stores=stores_of(server), resources=["subscriptions"]))
    mutator = server.mutator("s1", weights={"subscription_delete": 5.0})
    await mutator.run(steps=10)
    assert any(m.kind.endswith("delete") for m in mutator.history)

    source = subscription_service(
        stores=stores_of(server), resources=["subscriptions"], write_disposition="replace"
    )
    await run(pipeline, source)

    assert set(loaded(pipeline, "subscriptions")) == set(served(server, "subscriptions"))


async def test_integers_beyond_64_bits_load_exactly(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    big_id, big_amount = 2**70 + 1, -(2**100) - 7
    # Written by hand: the fake server's own encoder stops at 64 bits, as orjson does.
    records = f'[{{"id":{big_id},"amountMinor":{big_amount}}},{{"id":7,"amountMinor":5}}]'
    page = (
        f'{{"success":true,"message":"OK","code":"SUCCESS","data":{records},'
        '"pageInfo":{"hasNextPage":false,"nextCursor":null}}'
    )
    server.enqueue(200, page, path="orders", store="s0")
    source = subscription_service(stores=stores_of(server)[:1], resources=["orders"])
    await run(pipeline, source)

    rows = query(pipeline, "SELECT id, CAST(amount_minor AS VARCHAR) FROM subs.orders")
    assert (str(big_id), str(big_amount)) in rows


async def test_config_from_dlt_config_and_secrets(
    server: FakeAdminServer, pipeline: dlt.Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One store the way dlt users configure a source: the URL as config, the token as a secret
    # (environment variables here; .dlt/config.toml and .dlt/secrets.toml alike).
    monkeypatch.setenv("SOURCES__SUBSCRIPTION_SERVICE__BASE_URL", server.base_url)
    monkeypatch.setenv("SOURCES__SUBSCRIPTION_SERVICE__TOKEN", server.store("t1").token)
    monkeypatch.setenv("SOURCES__SUBSCRIPTION_SERVICE__STORE", "t1")
    source = subscription_service(resources=["customers"])
    await run(pipeline, source)
    assert set(loaded(pipeline, "customers")) == set(served(server, "customers", ("t1",)))
    # Rates and page size not given: the pool discovers its rate (here still at its start).
    pools = pipeline.state["sources"]["subscription_service"]["learned"]["t1"]["pools"]
    assert pools["customers"]["rate"] == 1.0


async def test_many_stores_from_a_secrets_table(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    # What [sources.subscription_service.stores.<name>] tables in .dlt/secrets.toml hold.
    tokens = [server.store(name).token for name in SMALL]
    stores = {
        name: {"base_url": server.base_url, "token": token}
        for name, token in zip(SMALL, tokens, strict=True)
    }
    dlt.secrets["sources.subscription_service.stores"] = stores
    try:
        source = subscription_service(resources=["customers"])
        await run(pipeline, source)
    finally:
        dlt.secrets["sources.subscription_service.stores"] = None
    assert set(loaded(pipeline, "customers")) == set(served(server, "customers", SMALL))
    # dlt's trace lists every resolved argument; the stores table is a secret, so not its value.
    trace = pipeline.last_trace
    assert "stores" in str(trace)
    assert not any(token in f"{trace} {trace.asdict()!r}" for token in tokens)


async def test_config_from_a_stores_file(
    server: FakeAdminServer, tmp_path: Path, pipeline: dlt.Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "stores.toml").write_text(
        '[defaults]\nincremental.orders = { param = "updatedAtMin", field = "updatedAt" }\n'
        f'[stores.s2]\nbase_url = "{server.base_url}"\ntoken_env = "S2_TOKEN"\n'
        'limits = { heavy = { orders = "700/s" } }\n'
    )
    monkeypatch.setenv("S2_TOKEN", server.store("s2").token)
    source = subscription_service(stores_file=str(tmp_path / "stores.toml"))
    await run(pipeline, source.with_resources("orders"))

    assert set(loaded(pipeline, "orders")) == {k for k in served(server, "orders") if k[0] == "s2"}
    state = pipeline.state["sources"]["subscription_service"]
    assert "updatedAt" in state["resources"]["orders"]["incremental"]
    assert state["learned"]["s2"]["pools"]["orders"]["rate"] is None  # pinned: not discovered


async def test_other_list_paths_are_resources_too(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    for n, name in enumerate(STORES):
        data = f'[{{"id":{n},"amount":"1.00"}}]'
        body = f'{{"success":true,"data":{data},"pageInfo":{{"hasNextPage":false}}}}'
        server.enqueue(200, body, path="charges", store=name)
    source = subscription_service(stores=stores_of(server), resources=[], list_paths=["charges"])
    await run(pipeline, source)

    rows = query(pipeline, "SELECT store, id, amount FROM subs.charges ORDER BY store")
    assert rows == [(name, str(n), "1.00") for n, name in enumerate(STORES)]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "exactly one of"),
        ({"base_url": "https://x.example", "stores_file": "stores.toml"}, "exactly one of"),
        ({"base_url": "https://x.example"}, "token is required"),
        ({"stores": [], "resources": ["refunds"]}, "stores is empty"),
        ({"resources": ["refunds"]}, "unknown resources"),
        ({"write_disposition": "replace", "incremental": INCREMENTAL}, "replace"),
        ({"write_disposition": "append"}, "write_disposition"),
        ({"lag": -1}, "lag"),
        ({"max_stores": 0}, "max_stores"),
        ({"redis_url": "http://cache.internal:6379"}, "redis_url: expected a redis://"),
    ],
)
def test_bad_configuration_is_refused_before_any_request(
    server: FakeAdminServer, arguments: dict[str, Any], message: str
) -> None:
    if not {"stores", "base_url", "stores_file"} & set(arguments) and arguments:
        arguments = {"stores": stores_of(server), **arguments}
    with pytest.raises(ConfigError, match=message):
        subscription_service(**arguments)
    assert not server.requests


@pytest.mark.redis
async def test_a_redis_url_paces_every_store_through_redis(
    server: FakeAdminServer, pipeline: dlt.Pipeline, redis_server: RedisServer
) -> None:
    source = subscription_service(
        stores=stores_of(server), resources=["orders"], redis_url=redis_server.url
    )
    await run(pipeline, source)

    assert set(loaded(pipeline, "orders")) == set(served(server, "orders"))
    redis = aioredis.Redis.from_url(redis_server.url)
    try:
        for name in STORES:  # each store's pool was paced in Redis (its keys outlive it 10 s)
            assert await redis.exists(f"asyncsubs:{{{name}}}:gcra:orders")
    finally:
        await redis.aclose()


def test_a_demo_rerun_into_the_same_database_starts_from_what_the_first_learned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m asyncsubs.dlt --duckdb X`` twice: the fake server listens on a new port each
    run, and its stores are the same stores all the same (what they learned is theirs by
    name, kept in the pipeline's state in the database)."""
    from asyncsubs.cli._dlt_demo import main
    from asyncsubs.stores import _clients

    made: list[dict[str, Any]] = []  # each client's learned limits, as it was made with them

    def client(**settings: Any) -> AdminClient:
        made_client = AdminClient(**settings)
        if settings["telemetry"]:  # not the check of the settings, which sends nothing
            made.append(settings.get("learned") or {})
        return made_client

    monkeypatch.setattr(_clients, "AdminClient", client)
    monkeypatch.setenv("RUNTIME__LOG_LEVEL", "ERROR")
    args = ["--duckdb", str(tmp_path / "demo.duckdb"), "--stores", "1", "--records", "250"]
    assert main(args) == 0
    assert "probed for them" in capsys.readouterr().out
    assert made == [{}]
    assert main(args) == 0
    second = capsys.readouterr().out
    (learned,) = made[1:]
    assert learned["store"] == "store-1"
    # The page size the first run found is where the second began: no probing.
    assert {p["page_size"] for p in learned["pools"].values()} == {100}
    assert "started from what the last run learned (1 of 1 stores" in second
    assert "0 x 429" in second


def test_ctrl_c_stops_the_demo_with_one_line_and_exit_130(tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches the demo's whole process group while dlt extracts; the
    demo says so in one line and exits 130: no traceback of dlt's, nothing from asyncio."""
    command = [sys.executable, "-m", "asyncsubs.dlt", "--stores", "1", "--records", "4000"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 60.0  # the one bounded wait: until dlt's extract started
        while time.monotonic() < deadline and proc.poll() is None:
            if list(tmp_path.glob("*/pipelines/asyncsubs_demo/normalize/*/*")):  # a load package
                break
            time.sleep(0.01)
        # Ctrl-C again if the first was lost: Python drops an exception raised in a finalizer,
        # and the signal can land in one (dlt's DuckDB pool, collected as the extract starts).
        out = err = b""
        sent = 0
        while sent < 3:
            sent += 1
            os.killpg(proc.pid, signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                continue
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err.decode()
    text = err.decode()
    if sent > 1:  # what Python says of the lost one, then ours
        assert text.startswith("Exception ignored in: "), text
        text = text.split("KeyboardInterrupt", 1)[1].split("\n", 1)[1]
    assert text == "python -m asyncsubs.dlt: interrupted\n"
    assert b"records" not in out  # stopped before its tables: nothing claimed as loaded


async def test_loads_go_through_parquet_unless_the_pipeline_says_otherwise(
    server: FakeAdminServer, tmp_path: Path
) -> None:
    def formats(info: Any) -> set[str]:
        """The formats of the files that carried rows (not the merge's SQL, nor dlt's tables)."""
        jobs = info.load_packages[0].jobs["completed_jobs"]
        found = {job.job_file_info for job in jobs if "_dlt" not in job.file_path}
        return {f.file_format for f in found} - {"sql"}

    def pipeline_at(name: str) -> dlt.Pipeline:
        return dlt.pipeline(
            pipeline_name=f"{name}_{uuid.uuid4().hex[:8]}",
            destination=dlt.destinations.duckdb(str(tmp_path / f"{name}.duckdb")),
            pipelines_dir=str(tmp_path / "pipelines"),
            dataset_name="subs",
        )

    stores = stores_of(server)[:1]
    parquet = pipeline_at("parquet")
    assert formats(await run(parquet, subscription_service(stores=stores))) == {"parquet"}
    chosen = pipeline_at("chosen")
    source = subscription_service(stores=stores)
    info = await asyncio.to_thread(chosen.run, source, loader_file_format="insert_values")
    assert formats(info) == {"insert_values"}
    # The same rows either way.
    for resource in RESOURCES:
        assert loaded(parquet, resource) == loaded(chosen, resource)


def test_store_tables_read_as_stores_toml_reads_them_problems_by_key() -> None:
    """``[sources.subscription_service.stores.<name>]`` tables take a stores.toml store's keys
    (the token itself in place of token_env), every problem named by its key, the token never
    shown."""
    secret = "tok-sEcReT-1234"
    tables = {
        "a": {"base_url": "https://a.example", "token": secret, "page_size": 0, "colour": 1},
        "b": {"base_url": "https://b.example", "incremental": {"orders": {"param": "x"}}},
        "c": {"base_url": "https://c.example", "token": secret, "limits": {"max_in_flight": 4}},
    }
    with pytest.raises(ConfigError) as info:
        subscription_service(stores=tables)
    assert secret not in str(info.value)
    assert [(e.key, e.problem) for e in info.value.errors] == [  # type: ignore[attr-defined]
        (
            "stores.a.page_size",
            'must be a whole number >= 1 or "max" (the largest page, learned), got 0',
        ),
        ("stores.a.colour", "unknown key"),
        ("stores.b.incremental.orders", 'must be { param = "...", field = "..." }'),
        ("stores.b", "token is required"),
    ]
    (store,) = stores_from_tables({"c": tables["c"]})
    assert (store.name, store.token) == ("c", secret)
    assert store.limits == Limits(max_in_flight=4, discover=True)  # the pools not given discover
    (store,) = stores_from_tables({"d": {"base_url": "https://d.example", "token": secret}})
    assert store.limits is None  # every pool discovers, other list paths' included


# --- what a server could send, and the rows it must give ------------------------------------


def one_page(*records: dict[str, Any]) -> dict[str, Any]:
    """A list answer of ``records``, the last page."""
    return {"success": True, "data": list(records), "pageInfo": {"hasNextPage": False}}


async def test_stores_stamping_in_their_own_offsets_share_one_mark(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    """Compared as text, "09:00:00-05:00" (14:00Z) would be older than a mark of "12:00:00Z":
    the change would be dropped, in this run and every later one."""
    stores = stores_of(server)[:2]
    a, b = (s.name for s in stores)
    source = {"stores": stores, "resources": ["orders"], "incremental": INCREMENTAL}
    server.enqueue(200, one_page({"id": 1, "updatedAt": "2026-01-02T12:00:00Z"}), store=a)
    old = {"id": 1, "updatedAt": "2026-01-02T06:00:00-05:00", "v": "old"}
    server.enqueue(200, one_page(old), store=b)
    await run(pipeline, subscription_service(**source))
    server.enqueue(200, one_page(), store=a)
    new = {"id": 1, "updatedAt": "2026-01-02T09:00:00-05:00", "v": "new"}
    server.enqueue(200, one_page(new), store=b)
    await run(pipeline, subscription_service(**source))
    assert query(pipeline, f"SELECT v FROM subs.orders WHERE store = '{b}'") == [("new",)]
    state = pipeline.state["sources"]["subscription_service"]["resources"]["orders"]
    assert state["incremental"]["updatedAt"]["last_value"] == new["updatedAt"]
    # The second run asked both stores from the first run's mark, less the lag.
    asked = {r.query.get("updatedAtMin") for r in list_requests(server)[-2:]}
    assert asked == {"2026-01-02T11:00:00Z"}


async def test_a_store_left_out_of_a_run_is_pulled_whole_when_it_is_back(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    """What changed while it was out is older than the mark the others moved meanwhile."""
    first, second, _ = stores_of(server)
    options = {"resources": ["orders"], "incremental": INCREMENTAL}
    await run(pipeline, subscription_service(stores=[first, second], **options))
    await run(pipeline, subscription_service(stores=[first], **options))
    server.clear_requests()
    await run(pipeline, subscription_service(stores=[first, second], **options))
    asked = {r.store: r.query.get("updatedAtMin") for r in list_requests(server)}
    assert asked[first.name] is not None
    assert asked[second.name] is None


async def test_a_records_own_fields_never_overwrite_its_key(
    server: FakeAdminServer, pipeline: dlt.Pipeline
) -> None:
    """dlt names ``ID`` and ``Store`` as the key's columns; integers from 2**63 fit no bigint."""
    name = stores_of(server)[0].name
    records = (
        {"id": 1, "ID": 2, "Store": "legacy", "amount": 2**63 + 5},
        {"id": 2, "amount": 2**64 - 1},
    )
    server.enqueue(200, one_page(*records), store=name)
    await run(pipeline, subscription_service(stores=stores_of(server)[:1], resources=["orders"]))
    rows = query(
        pipeline, "SELECT store, id, record_id, record_store, amount FROM subs.orders ORDER BY id"
    )
    assert rows == [(name, "1", 2, "legacy", 2**63 + 5), (name, "2", None, None, 2**64 - 1)]


@pytest.mark.parametrize("odd", [{"a": 1}, [1], True, None])
async def test_a_record_whose_id_is_no_key_fails_at_the_extract(
    server: FakeAdminServer, pipeline: dlt.Pipeline, odd: Any
) -> None:
    name = stores_of(server)[0].name
    server.enqueue(200, one_page({"id": odd}), store=name)
    source = subscription_service(stores=stores_of(server)[:1], resources=["orders"])
    with pytest.raises(PipelineStepFailed) as info:
        await run(pipeline, source)
    assert "without an 'id' (a string or a number)" in str(info.value.__cause__)


def test_stores_from_the_environment_are_a_json_object_and_never_shown() -> None:
    table = {"acme": {"base_url": "https://acme.example", "token": "tok-SECRET-1"}}
    source = subscription_service(stores=orjson.dumps(table).decode())
    assert set(source.resources) == set(RESOURCES)
    for bad in ('{"acme": tok-SECRET-1}', "tok-SECRET-1"):
        with pytest.raises(ConfigError) as info:
            subscription_service(stores=bad)
        assert "SECRET" not in str(info.value)
    for lag in (math.nan, math.inf, 1e11, -1):
        with pytest.raises(ConfigError, match="lag must be a number of seconds"):
            subscription_service(stores=orjson.dumps(table).decode(), lag=lag)


@pytest.mark.parametrize(
    ("mark", "lag", "start"),
    [
        ("2026-01-02T12:00:00Z", 3600, "2026-01-02T11:00:00Z"),
        ("2026-01-02T09:00:00-05:00", 3600, "2026-01-02T08:00:00-05:00"),  # its own offset
        ("2026-01-02 10:00", 60, "2026-01-02 09:59:00"),  # UTC, as written
        ("2026-01-10", 3600, "2026-01-09"),  # seconds, not days
        # Nanoseconds (Go), ticks (.NET), RFC 3339's lower case: instants, lagged too.
        ("2024-01-01T10:00:11.000000001Z", 3600, "2024-01-01T09:00:11Z"),
        ("2024-11-03T01:30:00.1234567-04:00", 60, "2024-11-03T01:29:00.123456-04:00"),
        ("2024-01-01t10:00:00z", 60, "2024-01-01T09:59:00Z"),
        ("2024-01-01 10:00:00.5000001", 60, "2024-01-01 09:59:00.500000"),
        ("0001-01-01T00:00:00Z", 3600, "0001-01-01T00:00:00Z"),  # before the calendar: as is
        (1767355200000, 3600, 1767355196400),  # the field's units
        ("1700000000", 3600, "1699996400"),  # digits stay digits, not a date
        ("v-17", 3600, "v-17"),  # text: no lag to take
    ],
)
def test_the_filter_is_the_mark_less_the_lag_in_the_marks_form(
    mark: Any, lag: float, start: Any
) -> None:
    from asyncsubs.dlt._source import _lagged

    assert _lagged(mark, lag) == start
