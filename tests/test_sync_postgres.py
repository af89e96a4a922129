"""``sync --db postgresql://``: the PostgreSQL sink, units shared by workers through leases.

Against a real PostgreSQL the suite starts (``postgres_fixtures``), one fresh database per
test. Workers run in-process (several ``run_workers`` on one loop, each with its own sink and
holder name) or as subprocesses that are SIGKILLed; the records to compare with come straight
from the fake server.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import random
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from postgres_fixtures import pg_url_fixture, postgres_server_fixture
from redis_fixtures import redis_server_fixture
from test_sync import RESOURCES, STORES, env_name, write_config
from virtual_clock import VirtualClock

from asyncsubs.__main__ import main
from asyncsubs._versions import older, older_sql
from asyncsubs.cli._progress import Progress
from asyncsubs.cli._status import cmd_sync_status
from asyncsubs.cli._summaries import sync_summary
from asyncsubs.stores import load_config
from asyncsubs.sync import (
    DatabaseError,
    LeaseLostError,
    ListenSync,
    PageWrite,
    Sink,
    SyncEngine,
    run_round,
    sink_for,
)
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, serve_in_thread

# Under CI the dev extra installs psycopg: an import error there fails the module.
psycopg = __import__("psycopg") if os.environ.get("CI") else pytest.importorskip("psycopg")

from asyncsubs.sync.postgres import DEFAULT_TIMEOUT, PostgresInbox, PostgresSink  # noqa: E402
from asyncsubs.webhooks import InboxEntry  # noqa: E402

__all__ = ["pg_url_fixture", "postgres_server_fixture", "redis_server_fixture"]

pytestmark = pytest.mark.postgres
SYNC_COMMAND = (sys.executable, "-m", "asyncsubs", "sync")


@pytest.fixture(name="server")
def server_fixture() -> Iterator[FakeAdminServer]:
    stores = [
        FakeStoreConfig("store-1", records={"subscriptions": 130, "customers": 70, "orders": 101}),
        FakeStoreConfig("store-2", records={"subscriptions": 45, "customers": 0, "orders": 88}),
        FakeStoreConfig("store-3", records={"subscriptions": 60, "customers": 59, "orders": 61}),
    ]
    with serve_in_thread(stores=stores, rate_limits=None) as srv:
        yield srv


@pytest.fixture(name="token_env")
def token_env_fixture(server: FakeAdminServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {env_name(name): token for name, token in server.tokens.items()}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def query(url: str, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def pg_rows(url: str, resource: str, store: str) -> list[tuple[Any, ...]]:
    return query(
        url,
        f"SELECT id, status, customer_id, created_at, updated_at, raw FROM {resource}"
        " WHERE store = %s ORDER BY id::bigint",
        (store,),
    )


def assert_exact(url: str, server: FakeAdminServer, stores: Sequence[str] = STORES) -> None:
    """The database holds exactly the server's records: same ids, once each, raw as served."""
    for store in stores:
        for resource in RESOURCES:
            expected = server.records(store, resource)
            rows = pg_rows(url, resource, store)
            assert [r[0] for r in rows] == [str(rec["id"]) for rec in expected], (store, resource)
            for row, record in zip(rows, expected, strict=True):
                assert row[5] == orjson.loads(orjson.dumps(record))
                assert row[1] == record.get("status")
                assert row[4] == record.get("updatedAt")


def units(url: str) -> dict[tuple[str, str], tuple[str, str | None]]:
    rows = query(url, "SELECT store, resource, state, holder FROM asyncsubs_sync_units")
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


# ---------------------------------------------------------------------------------------------
# One sink interface, two implementations: the same rules


@pytest.fixture(params=["sqlite", "postgres"])
def sink_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "subs.db")
    url: str = request.getfixturevalue("pg_url")
    return url


def make_sink(url: str) -> Sink:
    return sink_for(url)


def page(store: str, records: list[dict[str, Any]], cursor: str | None, *, new: bool) -> PageWrite:
    return PageWrite(
        store=store,
        resource="orders",
        records=records,
        next_cursor=cursor,
        new_run=new,
        run_params={},
        run_from=None,
        incremental_field="updatedAt",
    )


async def test_both_sinks_keep_the_same_upsert_rules(sink_url: str) -> None:
    sink = make_sink(sink_url)
    await sink.open()
    try:
        if isinstance(sink, PostgresSink):  # pages are written under a lease
            await sink.join_round([("s", "orders")])
            assert await sink.claim([("s", "orders")]) == ("s", "orders")
        v1 = {"id": 1, "status": "a", "updatedAt": "2026-01-01T10:00:00Z"}
        await sink.commit_page(page("s", [v1, {"id": 2}], "c1", new=True))
        state = await sink.load_state("s", "orders")
        assert (state.cursor, state.done, state.run_pages, state.run_records) == ("c1", False, 1, 2)
        assert state.seen_max == "2026-01-01T10:00:00Z"
        # An older version (as an instant: +02:00 is earlier) does not replace a newer one.
        older = {"id": 1, "status": "old", "updatedAt": "2026-01-01T11:00:00+02:00"}
        assert not await sink.upsert_record("s", "orders", older)
        newer = {"id": 1, "status": "new", "updatedAt": "2026-01-01T10:00:01Z"}
        assert await sink.upsert_record("s", "orders", newer)
        # A deleted id never comes back, from a webhook or a page.
        await sink.delete_record("s", "orders", 2)
        assert not await sink.upsert_record("s", "orders", {"id": 2})
        await sink.commit_page(page("s", [{"id": 2}, {"id": 3}], None, new=False))
        assert await sink.count("s", "orders") == 2
        state = await sink.load_state("s", "orders")
        assert (state.cursor, state.done, state.run_pages, state.run_records) == (None, True, 2, 4)
    finally:
        await sink.aclose()


#: Pairs of stamps (new, stored) on which a database's comparison could part from Python's.
STAMP_PAIRS: Final = [
    ("2036-01-01T00:00:00.000100Z", "2036-01-01T00:00:00.000400Z"),  # within a millisecond
    ("2036-01-01T00:00:00.000400Z", "2036-01-01T00:00:00.000100Z"),
    (9_999_999_999, 10_000_000_000),  # epoch seconds: numbers, not Julian days, not text
    ("9999999", "10000000"),  # a sequence sent as digits
    (2**70, 2**70 + 1),  # beyond 64 bits
    (1.5, "2"),
    ("2026-01-01T09:00:00Z", "2026-01-01T10:00:00+0530"),  # an offset without its colon
    ("2026-01-01T10:00:00+0530", "2026-01-01T09:00:00Z"),
    ("2026-01-01T11:00:00+02:00", "2026-01-01T10:00:00Z"),  # earlier as an instant
    ("2026-01-01T00:00:00", "2026-01-01T00:00:01Z"),  # no offset: UTC
    ("2026-01-01", "2026-01-01T00:00:01Z"),
    ("2026-01-01 10:00", "2026-01-01T10:00:00.5Z"),
    ("2026-13-01T00:00:00Z", "2026-12-01T00:00:00Z"),  # no instant: text
    # Fractions beyond the microsecond (Go, .NET): to it as instants, then by the rest.
    ("2026-01-01T00:00:00.1234567Z", "2026-01-01T00:00:00.2Z"),
    ("2024-11-03T01:30:00.0000000-04:00", "2024-11-03T01:10:00.0000000-05:00"),  # 40 min older
    ("2024-11-03T01:10:00.0000000-05:00", "2024-11-03T01:30:00.0000000-04:00"),
    ("2026-01-01T10:00:00.123456789Z", "2026-01-01T10:00:00.12345678Z"),  # 9 ns later
    ("2026-01-01T10:00:00.12345678Z", "2026-01-01T10:00:00.123456789Z"),
    ("2026-01-01T10:00:00.1234567Z", "2026-01-01T10:00:00.123456700Z"),  # equal
    ("2026-01-01T10:00:00.1234569Z", "2026-01-01T05:00:00.1234561-05:00"),
    ("2026-01-01t10:00:00z", "2026-01-01T09:00:00Z"),  # RFC 3339's lower case
    ("2026-01-01T09:00:00Z", "2026-01-01t10:00:00z"),
    # Read by one of Python and PostgreSQL and not the other: text for both.
    ("2026-01-01T24:00:00Z", "2026-01-01T00:00:00Z"),
    ("2026-01-01T23:59:60Z", "2026-01-01T00:00:00Z"),
    ("2026-01-01T10:00:00+23:59", "2026-01-01T00:00:00Z"),
    ("0001-01-01Z", ":"),
    ("1", "1e131072"),  # beyond what both read as a number: text, another kind
    (10**300, 10**300 + 1),  # beyond it too: text, by code point
    ("", "2026-01-01T00:00:00Z"),  # an empty stamp orders nothing
    ("b", "a"),
    ("a", "b"),
    ("Z", "a"),  # by code point, not by a collation
    ("5", "2026-01-01T00:00:00Z"),  # two kinds: the later wins
    ("2026-01-01T00:00:00Z", "today"),
    (None, "2026-01-01T00:00:00Z"),
    ("2026-01-01T00:00:00Z", None),
    ("2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),  # equal: replaced
]


async def test_both_sinks_order_versions_by_the_one_rule(sink_url: str) -> None:
    """A stored version is replaced exactly when ``_versions.older`` says the new one is not
    older: the database's comparison is the receiver's and the dlt source's."""
    sink = make_sink(sink_url)
    await sink.open()
    try:
        for i, (new, stored) in enumerate(STAMP_PAIRS):
            await sink.upsert_record("s", "orders", {"id": i, "updatedAt": stored})
            replaced = await sink.upsert_record("s", "orders", {"id": i, "updatedAt": new})
            assert replaced is not older(new, stored), (new, stored)
    finally:
        await sink.aclose()


def _random_stamp(rng: random.Random) -> str:
    """A timestamp-like text: a date, a time of any precision, any zone; some not instants."""
    text = f"{rng.choice(['2024', '0001', '9999'])}-{rng.choice(['01', '11', '13'])}-"
    text += rng.choice(["01", "03", "31"])
    if rng.random() < 0.9:
        text += rng.choice("Tt ") + rng.choice(["00", "01", "23", "24"]) + ":"
        text += rng.choice(["00", "59"]) + ":" + rng.choice(["00", "05", "60"])
        if rng.random() < 0.8:
            text += "." + "".join(rng.choices("0123456789", k=rng.choice([1, 6, 7, 9, 30])))
        text += rng.choice(["", "Z", "z", "+00:00", "-05:00", "+0530", "+15:59", "+16:00", "-04"])
    return text


def test_postgresql_orders_any_two_stamps_as_python_does(pg_url: str) -> None:
    """``older_sql`` against ``older`` on random stamps, half of them pairs equal to the
    microsecond that differ beyond it (where PostgreSQL alone would round)."""
    rng = random.Random(7)
    pairs = [(_random_stamp(rng), _random_stamp(rng)) for _ in range(300)]
    for a, _ in pairs[:300]:
        head, dot, fraction = a.partition(".")
        if dot and fraction[:6].isdigit():
            b = f"{head}.{fraction[:6]}{rng.randint(0, 999)}{fraction.lstrip('0123456789')}"
            pairs += [(a, b), (b, a)]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(older_sql("older_checked"))
        for a, b in pairs:
            row = conn.execute("SELECT older_checked(%s, %s)", (a, b)).fetchone()
            assert row == (older(a, b),), (a, b)


async def test_both_sinks_keep_the_newer_or_equal_of_an_id_a_page_repeats(sink_url: str) -> None:
    # As instants, 11:00+02:00 is older than 10:00:01Z (as text it would be newer).
    old, new = "2026-01-01T11:00:00+02:00", "2026-01-01T10:00:01Z"
    versions = [(1, "new", new), (1, "old", old), (2, "old", old), (2, "new", new)]
    versions += [(3, "first", new), (3, "last", new), (2, "stale", old)]
    records = [{"id": i, "status": status, "updatedAt": at} for i, status, at in versions]
    sink = make_sink(sink_url)
    await sink.open()
    try:
        if isinstance(sink, PostgresSink):
            await sink.join_round([("s", "orders")])
            assert await sink.claim([("s", "orders")]) == ("s", "orders")
        await sink.commit_page(page("s", records, None, new=True))
        state = await sink.load_state("s", "orders")
        # The high-water mark is the newest instant, not the largest text.
        assert (state.run_records, state.seen_max) == (7, new)
    finally:
        await sink.aclose()
    sql = "SELECT id, status FROM orders WHERE store = 's' ORDER BY id"
    if isinstance(sink, PostgresSink):
        rows = [tuple(row) for row in query(sink_url, sql)]
    else:
        with contextlib.closing(sqlite3.connect(sink_url)) as conn:
            rows = conn.execute(sql).fetchall()
    assert rows == [("1", "new"), ("2", "new"), ("3", "last")]


async def test_both_sinks_keep_integers_beyond_64_bits_exactly(sink_url: str) -> None:
    sink = make_sink(sink_url)
    big = 2**64 + 1
    records = [{"id": big, "seq": big}, {"id": big + 1, "seq": -(2**63) - 1}]
    await sink.open()
    try:
        if isinstance(sink, PostgresSink):
            await sink.join_round([("s", "orders")])
            assert await sink.claim([("s", "orders")]) == ("s", "orders")
        write = PageWrite(
            store="s",
            resource="orders",
            records=records,
            next_cursor="c1",
            new_run=True,
            run_params={"seqMin": big},
            run_from=big,
            incremental_field="seq",
        )
        await sink.commit_page(write)
        state = await sink.load_state("s", "orders")
    finally:
        await sink.aclose()
    assert (state.seen_max, state.run_from, state.run_params) == (big, big, {"seqMin": big})
    sql = "SELECT raw FROM orders WHERE store = 's' ORDER BY id"
    if isinstance(sink, PostgresSink):
        raw = [row[0] for row in query(sink_url, sql)]
    else:
        with contextlib.closing(sqlite3.connect(sink_url)) as conn:
            raw = [json.loads(row[0]) for row in conn.execute(sql)]
    assert raw == records


async def test_an_open_that_fails_leaves_no_pool_and_opens_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open that fails after its pool opened (the schema: a lock timeout, say) closes the
    pool: a service trying again leaked one each time, with its connections and tasks."""
    import asyncsubs.sync.postgres as postgres

    sink = PostgresSink(pg_url, timeout=5)
    monkeypatch.setattr(postgres, "_SCHEMA", ["SELECT * FROM no_such_table_here"])
    with pytest.raises(DatabaseError, match="no_such_table_here"):
        await sink.open()
    failed = sink._pool
    assert failed.closed
    monkeypatch.undo()
    async with sink:
        assert await sink.count("acme", "orders") == 0
    assert sink._pool is not failed


async def test_concurrent_first_runs_create_the_schema_once(pg_url: str) -> None:
    sinks = [PostgresSink(pg_url) for _ in range(6)]
    try:
        await asyncio.gather(*(sink.open() for sink in sinks))
    finally:
        await asyncio.gather(*(sink.aclose() for sink in sinks))
    tables = {r[0] for r in query(pg_url, "SELECT tablename FROM pg_tables")}
    assert {"orders", "asyncsubs_sync_state", "asyncsubs_sync_units", "webhook_inbox"} <= tables


async def test_postgres_inbox_keeps_entries_until_removed(pg_url: str) -> None:
    sink = PostgresSink(pg_url)
    await sink.open()
    try:
        inbox = PostgresInbox(sink)
        entry = InboxEntry("s", "e1", b'{"id": "e1"}', 1_700_000_000.5, attempts=2)
        assert await inbox.add(entry)
        assert not await inbox.add(entry)  # one per (store, event id)
        assert await inbox.add(InboxEntry("t", "e1", b"{}", 1_700_000_001.0))
        assert await inbox.pending("s") == [entry]
        await inbox.remove("s", "e1")
        assert await inbox.pending("s") == []
        assert len(await inbox.pending("t")) == 1
    finally:
        await sink.aclose()


# ---------------------------------------------------------------------------------------------
# Leases


async def test_a_lease_is_taken_over_only_once_expired_and_fences_the_old_holder(
    pg_url: str,
) -> None:
    first, second = PostgresSink(pg_url, holder="first"), PostgresSink(pg_url, holder="second")
    unit = ("s", "orders")
    await first.open()
    await second.open()
    try:
        assert await first.join_round([unit])
        assert not await second.join_round([unit])  # the round is open: joined, not restarted
        assert await first.claim([unit]) == unit
        assert await second.claim([unit]) is None  # held, lease running
        assert await second.pending_wait([unit]) == pytest.approx(first.lease, abs=1)
        await first.commit_page(page("s", [{"id": 1}], "c1", new=True))
        # The first worker stops renewing: its lease runs out (on the database's clock).
        query(pg_url, "UPDATE asyncsubs_sync_units SET lease_until = now() - interval '1s'")
        assert await second.pending_wait([unit]) == 0
        assert await second.claim([unit]) == unit
        # The old holder wakes up: its page is refused whole, its cursor not moved.
        with pytest.raises(LeaseLostError):
            await first.commit_page(page("s", [{"id": 2}], "c2", new=False))
        assert await first.renew([unit]) == [unit]  # the heartbeat sees it lost too
        state = await second.load_state(*unit)
        assert (state.cursor, state.run_records) == ("c1", 1)
        assert await second.count(*unit) == 1
        await second.commit_page(page("s", [{"id": 2}], None, new=False))
        assert units(pg_url) == {unit: ("done", None)}
        assert await first.pending_wait([unit]) is None
        # Every unit done: the next start begins a new round.
        assert await first.join_round([unit])
        assert units(pg_url) == {unit: ("pending", None)}
    finally:
        await first.aclose()
        await second.aclose()


def test_workers_split_the_units_and_each_unit_has_one_writer(
    server: FakeAdminServer,
    token_env: Mapping[str, str],
    tmp_path: Path,
    pg_url: str,
) -> None:
    configs = load_config(write_config(tmp_path, server), os.environ)
    writers: dict[tuple[str, str], set[str]] = {}

    class Recording(PostgresSink):
        async def commit_page(self, write: PageWrite) -> None:
            writers.setdefault((write.store, write.resource), set()).add(self.holder)
            await super().commit_page(write)

    async def worker(name: str) -> Progress:
        sink = Recording(pg_url, holder=name)
        progress = Progress()
        async with sink, SyncEngine(configs, sink, progress, max_stores=1) as engine:
            await run_round(engine)
        return progress

    async def three() -> list[Progress]:
        return await asyncio.gather(*(worker(f"w{i}") for i in range(3)))

    progresses = asyncio.run(three())
    assert_exact(pg_url, server)
    assert set(writers) == {(s, r) for s in STORES for r in RESOURCES}
    assert all(len(holders) == 1 for holders in writers.values()), writers
    # Each worker's progress shows the units it held; together, every unit once.
    held = [key for progress in progresses for key in progress.rows]
    assert sorted(held) == sorted(writers)
    assert all(state == "done" and holder is None for state, holder in units(pg_url).values())


# ---------------------------------------------------------------------------------------------
# The command


def test_sync_into_postgres_then_rerun_and_status(
    server: FakeAdminServer,
    token_env: Mapping[str, str],
    tmp_path: Path,
    pg_url: str,
    capsys: Any,
) -> None:
    config = write_config(tmp_path, server)
    args = ["sync", "--config", str(config), "--db", pg_url]
    assert main(args) == 0
    assert_exact(pg_url, server)
    out = capsys.readouterr().out
    assert f"into {pg_url}" in out
    server.clear_requests()
    assert main([*args, "--quiet"]) == 0  # a new round: everything pulled again, once
    assert_exact(pg_url, server)
    assert len({(r.store, r.path) for r in server.requests if "afterCursor" not in r.query}) == 9
    query(
        pg_url,
        "UPDATE asyncsubs_sync_units SET state = 'pending', holder = 'elsewhere',"
        " lease_until = now() + interval '20s' WHERE store = 'store-1' AND resource = 'orders'",
    )
    stream = io.StringIO()
    assert cmd_sync_status(main_args(pg_url), stream=stream) == 0
    text = stream.getvalue()
    line = next(x for x in text.splitlines() if x.startswith("store-1") and "orders" in x)
    for part in ("running", "elsewhere", "101"):
        assert part in line, text
    assert "9 units in" in text
    assert "8 done, 1 running" in text


def test_a_store_added_to_the_config_starts_a_round_of_every_unit(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path, pg_url: str
) -> None:
    """The units new to the database are pending, but no round is open for the others: the
    run pulls every store, as a rerun does, not the new one alone."""
    config = write_config(tmp_path, server)
    args = ["sync", "--config", str(config), "--db", pg_url, "--quiet"]
    assert main([*args, "--store", "store-1", "--store", "store-2"]) == 0
    server.clear_requests()
    assert main(args) == 0
    assert_exact(pg_url, server)
    assert {r.store for r in server.requests} == set(STORES)


def test_a_unit_another_worker_failed_is_said_by_every_worker(
    server: FakeAdminServer,
    token_env: Mapping[str, str],
    tmp_path: Path,
    pg_url: str,
    capsys: Any,
) -> None:
    """A unit failed in this round by another worker (its token wrong, say): the workers that
    did not pull it say so too, not only the one that did."""
    config = write_config(tmp_path, server)
    args = ["sync", "--config", str(config), "--db", pg_url, "--progress", "plain"]
    assert main(args) == 0
    capsys.readouterr()
    query(  # a round open, one unit failed in it by a worker now gone
        pg_url,
        "UPDATE asyncsubs_sync_units SET state = CASE WHEN store = 'store-1' AND resource ="
        " 'orders' THEN 'failed' ELSE 'pending' END, error = CASE WHEN store = 'store-1' AND"
        " resource = 'orders' THEN 'AuthError: HTTP 401' END",
    )
    assert main(args) == 0  # this worker's own pulls went well
    err = capsys.readouterr().err
    said = "store-1/orders: failed, and not pulled in this round (a new round will)"
    assert f"{said}: AuthError: HTTP 401" in err, err
    assert err.count("not pulled in this round") == 1


async def test_workers_killed_long_ago_are_forgotten_at_a_round(pg_url: str) -> None:
    """A worker killed without leaving (SIGKILL) left its row; a day unseen, it is dropped
    when a worker joins a round, while one seen lately stays."""
    one = PostgresSink(pg_url, holder="one")
    async with one:
        await one.join_round([("s1", "orders")])
        assert await one.claim([("s1", "orders")]) == ("s1", "orders")
        query(
            pg_url,
            "INSERT INTO asyncsubs_sync_workers (holder, stores, resources, wants, seen_at)"
            " VALUES ('killed', '{s1}', '{orders}', false, now() - interval '25 hours'),"
            " ('alive', '{s1}', '{orders}', false, now() - interval '1 minute')",
        )
        await one.join_round([("s1", "orders")])
        holders = {row[0] for row in query(pg_url, "SELECT holder FROM asyncsubs_sync_workers")}
    assert holders == {"one", "alive"}
    async with PostgresSink(pg_url, holder="patient", lease=10**9) as patient:  # an int, large
        await patient.join_round([("s1", "orders")])


async def test_a_worker_with_a_store_swapped_joins_the_round_open(pg_url: str) -> None:
    """A round is open (another worker pulls s2) when a worker whose config has s3 in place of
    s2 starts: it joins it, its new unit with it, and s1, done in this round, stays done (pulled
    twice in it, otherwise); with no round open anywhere, its units all start over."""
    one, other = PostgresSink(pg_url, holder="one"), PostgresSink(pg_url, holder="other")
    async with one, other:
        assert await one.join_round([("s1", "orders"), ("s2", "orders")])
        query(pg_url, "UPDATE asyncsubs_sync_units SET state = 'done' WHERE store = 's1'")
        assert await other.join_round([("s1", "orders"), ("s3", "orders")])  # s3 added
        assert units(pg_url)[("s1", "orders")][0] == "done"
        assert units(pg_url)[("s3", "orders")][0] == "pending"
        query(pg_url, "UPDATE asyncsubs_sync_units SET state = 'done'")
        assert await other.join_round([("s1", "orders"), ("s3", "orders"), ("s4", "orders")])
        assert {unit: state for unit, (state, _) in units(pg_url).items()} == {
            ("s1", "orders"): "pending",
            ("s2", "orders"): "done",
            ("s3", "orders"): "pending",
            ("s4", "orders"): "pending",
        }


async def test_the_tables_are_made_in_the_schema_the_worker_creates_in(pg_url: str) -> None:
    """An application's own "orders" elsewhere on the search path is not taken for the sync's:
    the tables, and the function, are looked for where the statements would make them."""
    query(pg_url, "CREATE TABLE public.orders (number int); CREATE SCHEMA tenant_a")
    url = f"{pg_url}?options=-csearch_path%3Dtenant_a,public"
    record = {"id": 1, "updatedAt": "2026-01-01T00:00:00Z"}
    async with PostgresSink(url) as sink:
        assert await sink.upsert_record("s1", "orders", record)
        assert await sink.count("s1", "orders") == 1
    sql = "SELECT table_schema FROM information_schema.tables WHERE table_name = %s ORDER BY 1"
    assert query(pg_url, sql, ("orders",)) == [("public",), ("tenant_a",)]
    functions = "SELECT pronamespace::regnamespace::text FROM pg_proc WHERE proname = %s"
    assert query(pg_url, functions, ("asyncsubs_older",)) == [("tenant_a",)]


def test_a_role_that_may_not_create_syncs_into_the_tables_made(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path, pg_url: str
) -> None:
    """A worker's role with rights on the tables and not on the schema (PostgreSQL 15's
    default for others than the owner; a least-privilege setup) uses what is there."""
    config = write_config(tmp_path, server)
    assert main(["sync", "--config", str(config), "--db", pg_url, "--quiet"]) == 0
    role = f"syncer_{uuid.uuid4().hex[:8]}"
    database = pg_url.rsplit("/", 1)[1]
    query(
        pg_url,
        f"CREATE ROLE {role} LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
        f" REVOKE CREATE ON DATABASE {database} FROM PUBLIC;"
        f" GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {role};"
        f" GRANT USAGE ON SCHEMA public TO {role}",
    )
    url = pg_url.replace("asyncsubs@", f"{role}@")
    server.clear_requests()
    assert main(["sync", "--config", str(config), "--db", url, "--quiet"]) == 0
    assert_exact(pg_url, server)
    assert {r.store for r in server.requests} == set(STORES)


async def test_a_transaction_left_waiting_ends_after_the_lease(pg_url: str) -> None:
    """A worker frozen inside a page's commit would keep its unit's rows locked, and every
    other worker out, however long ago its lease ran out: the server ends the transaction."""
    async with PostgresSink(pg_url, lease=12.0) as sink, sink.transaction() as conn:
        cur = await conn.execute("SHOW idle_in_transaction_session_timeout")
        assert (await cur.fetchone()) == ("12s",)
    async with PostgresSink(pg_url, lease=0.5) as sink, sink.transaction() as conn:
        cur = await conn.execute("SHOW idle_in_transaction_session_timeout")
        assert (await cur.fetchone()) == ("5s",)  # never less: a busy worker is no frozen one


def main_args(url: str) -> Any:
    import argparse

    return argparse.Namespace(db=url, json=False)


def test_postgres_password_never_printed(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "stores.toml"
    config.write_text('[stores.a]\nbase_url = "http://127.0.0.1:1/v1"\ntoken_env = "A_TOKEN"\n')
    url = "postgresql://user:s3cret@127.0.0.1:1/db"
    code = main(["sync", "--config", str(config), "--db", url, "--quiet"])
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert "s3cret" not in err
    assert repr(sink_for(url)).count("s3cret") == 0


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://user:s3cret@[::1/db",  # libpq quotes the whole URL
        "postgresql://user:s3cr%zzet@127.0.0.1:1/db",  # and here the password alone
        "postgresql://user@127.0.0.1:1/db?password=s3cr%zz&nosuchoption=1",
    ],
)
@pytest.mark.parametrize("command", ["sync-status", "sync"])
def test_a_url_libpq_cannot_read_is_a_usage_error_without_its_password(
    tmp_path: Path, capsys: Any, url: str, command: str
) -> None:
    """No wait mends it: said at once (exit 2), the password never shown."""
    config = tmp_path / "stores.toml"
    config.write_text('[stores.a]\nbase_url = "http://127.0.0.1:1/v1"\ntoken_env = "A_TOKEN"\n')
    args = ["sync-status"] if command == "sync-status" else ["sync", "--config", str(config)]
    started = time.monotonic()
    assert main([*args, "--db", url]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - started < DEFAULT_TIMEOUT / 2  # not waited for
    assert "libpq cannot read it" in err, err
    assert "s3cr" not in err, err


async def test_unreachable_postgres_is_one_line_saying_how_long_it_waited(
    clock: VirtualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """No server at the address: the sink retries for ``DEFAULT_TIMEOUT`` (a server starting
    up refuses connections for a while), then fails with one line naming why and how long it
    waited, and nothing is logged on the way (the pool logged each failed attempt)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    sink = PostgresSink(f"postgresql://user:s3cret@127.0.0.1:{port}/db")
    started = clock.now
    with caplog.at_level(logging.DEBUG), pytest.raises(DatabaseError) as info:
        await sink.open()
    text = str(info.value)
    assert "\n" not in text
    assert "s3cret" not in text
    assert text.startswith(f"database postgresql://user@127.0.0.1:{port}/db: "), text
    assert "Connection refused" in text
    waited = re.search(r"\(waited (\d+\.\d)s, \d+ attempts\)$", text)
    assert waited is not None, text
    assert DEFAULT_TIMEOUT - 2.5 <= float(waited[1]) <= DEFAULT_TIMEOUT
    assert clock.now - started <= DEFAULT_TIMEOUT
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []


# ---------------------------------------------------------------------------------------------
# Subprocess workers: SIGKILL, takeover, a database that goes away


@pytest.fixture
def slow_server() -> Iterator[FakeAdminServer]:
    # Pages of 10 at 20 ms: about a second per unit, so a second worker starts mid-run.
    counts = {"subscriptions": 500, "customers": 400, "orders": 600}
    with serve_in_thread(stores=3, records=counts, latency=0.01, rate_limits=None) as srv:
        yield srv


def slow_config(tmp_path: Path, fake: FakeAdminServer) -> Path:
    path = write_config(tmp_path, fake)
    path.write_text(path.read_text().replace("page_size = 25", "page_size = 10"))
    return path


def start_worker(
    config: Path, url: str, env: Mapping[str, str], *extra: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*SYNC_COMMAND, "--config", str(config), "--db", url, "--progress", "plain", *extra],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_until(url: str, sql: str, proc: subprocess.Popen[bytes]) -> None:
    """The one bounded wait: poll the database until ``sql`` answers true."""
    for _ in range(1000):
        if proc.poll() is not None:
            break
        with contextlib.suppress(psycopg.Error):
            if query(url, sql)[0][0]:
                return
        time.sleep(0.01)
    raise AssertionError(f"not reached: {sql} (exit code {proc.poll()})")


HOLDER_SQL = (
    "SELECT holder FROM asyncsubs_sync_units WHERE holder IS NOT NULL ORDER BY claimed_at LIMIT 1"
)


def test_sigkilled_worker_units_are_resumed_by_a_survivor_exactly(
    slow_server: FakeAdminServer, tmp_path: Path, pg_url: str
) -> None:
    env = {env_name(name): token for name, token in slow_server.tokens.items()}
    config = slow_config(tmp_path, slow_server)
    # One store at a time each, so both are mid-unit when one is killed; a short lease.
    lease = ("--lease", "1", "--max-stores", "1")
    victim = start_worker(config, pg_url, env, *lease)
    survivor: subprocess.Popen[bytes] | None = None
    try:
        wait_until(pg_url, "SELECT count(holder) > 0 FROM asyncsubs_sync_units", victim)
        (victim_holder,) = query(pg_url, HOLDER_SQL)[0]
        survivor = start_worker(config, pg_url, env, *lease)
        # Both hold units, and the victim has committed pages of one it has not finished.
        wait_until(pg_url, "SELECT count(DISTINCT holder) = 2 FROM asyncsubs_sync_units", survivor)
        wait_until(
            pg_url,
            "SELECT count(*) > 0 FROM asyncsubs_sync_units u"
            " JOIN asyncsubs_sync_state s USING (store, resource)"
            f" WHERE s.run_records > 0 AND NOT s.done AND u.holder = '{victim_holder}'",
            victim,
        )
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        # Units the victim held with pages committed, left mid-run.
        killed_units = {
            (r[0], r[1])
            for r in query(
                pg_url,
                "SELECT store, resource FROM asyncsubs_sync_units u"
                " JOIN asyncsubs_sync_state s USING (store, resource)"
                " WHERE u.holder = %s AND NOT s.done",
                (victim_holder,),
            )
        }
        _, err = survivor.communicate(timeout=120)
    finally:
        for proc in (victim, survivor):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert survivor.returncode == 0, err.decode()
    assert victim.returncode == -signal.SIGKILL
    assert killed_units
    assert_exact(pg_url, slow_server)
    assert all(state == "done" for state, _ in units(pg_url).values())
    # The survivor resumed the victim's units from their committed cursors.
    text = err.decode()
    for store, resource in killed_units:
        assert f"{store}/{resource}: resuming from its saved cursor" in text, text


def test_database_that_goes_away_mid_run_is_a_clear_error_and_nothing_half_written(
    slow_server: FakeAdminServer, tmp_path: Path, pg_url: str
) -> None:
    env = {env_name(name): token for name, token in slow_server.tokens.items()}
    config = slow_config(tmp_path, slow_server)
    proc = start_worker(config, pg_url, env)
    try:
        wait_until(pg_url, "SELECT sum(run_records) > 100 FROM asyncsubs_sync_state", proc)
        # Every connection of the worker is cut (a restart or failover looks the same to it),
        # and new ones are refused while the database is renamed away.
        name = pg_url.rsplit("/", 1)[1]
        admin = pg_url.rsplit("/", 1)[0] + "/postgres"
        query(admin, f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        query(admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s"
              " AND pid <> pg_backend_pid()", (name,))  # fmt: skip
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        query(pg_url.rsplit("/", 1)[0] + "/postgres",
              f"ALTER DATABASE {pg_url.rsplit('/', 1)[1]} ALLOW_CONNECTIONS true")  # fmt: skip
    text = err.decode()
    assert proc.returncode == 1, text
    assert "Traceback" not in text
    assert f"asyncsubs: error: database {pg_url}:" in text
    # Each unit holds exactly the pages its cursor accounts for.
    for store, resource, records in query(
        pg_url, "SELECT store, resource, run_records FROM asyncsubs_sync_state"
    ):
        assert len(pg_rows(pg_url, resource, store)) == records
    # The leases of the dead connection's worker expire; a rerun finishes exactly.
    query(pg_url, "UPDATE asyncsubs_sync_units SET lease_until = now() - interval '1s'")
    rerun = subprocess.run(
        [*SYNC_COMMAND, "--config", str(config), "--db", pg_url, "--quiet"],
        env={**os.environ, **env},
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert_exact(pg_url, slow_server)


def test_a_worker_joining_a_round_another_took_whole_gets_its_share(
    slow_server: FakeAdminServer, tmp_path: Path, pg_url: str
) -> None:
    """Two workers on 6 units, the second starting once the first holds all 6: the first hands
    it units at their next page commits, each resumed from its committed cursor, so both pull
    and no page is pulled twice."""
    env = {env_name(name): token for name, token in slow_server.tokens.items()}
    stores = ["store-1", "store-2"]
    configs = load_config(slow_config(tmp_path, slow_server), env, only_stores=stores)
    holds_all = asyncio.Event()

    class First(PostgresSink):
        claimed = 0

        async def claim(
            self, units: Sequence[tuple[str, str]], *, prefer: Sequence[str] = ()
        ) -> tuple[str, str] | None:
            unit = await super().claim(units, prefer=prefer)
            self.claimed += unit is not None
            if self.claimed == 6:  # every unit of the two stores
                holds_all.set()
            return unit

    async def worker(sink: PostgresSink) -> Progress:
        progress = Progress()
        async with sink, SyncEngine(configs, sink, progress) as engine:
            await run_round(engine)
        return progress

    async def both() -> tuple[Progress, Progress]:
        first = asyncio.create_task(worker(First(pg_url, holder="first")))
        await holds_all.wait()
        second = await worker(PostgresSink(pg_url, holder="second"))
        return await first, second

    first, second = asyncio.run(both())
    assert_exact(pg_url, slow_server, stores)
    pulled = {name: [key for key, row in p.rows.items() if row.records] for name, p in
              (("first", first), ("second", second))}  # fmt: skip
    assert len(pulled["second"]) >= 2, pulled
    assert len(pulled["first"]) >= 3, pulled
    # Every page once: the records both pulled add up to the stores' records.
    total = sum(len(slow_server.records(s, r)) for s in stores for r in RESOURCES)
    assert first.records + second.records == total
    assert second.idle is None


def test_an_idle_worker_says_why_it_pulled_nothing(
    slow_server: FakeAdminServer, tmp_path: Path, pg_url: str
) -> None:
    """One unit, held by the first worker: nothing to hand over (it holds one), so the second
    pulls nothing, and its summary says why."""
    env = {env_name(name): token for name, token in slow_server.tokens.items()}
    configs = load_config(
        slow_config(tmp_path, slow_server), env, only_stores=["store-1"], resources=["orders"]
    )
    claimed = asyncio.Event()

    class First(PostgresSink):
        async def claim(
            self, units: Sequence[tuple[str, str]], *, prefer: Sequence[str] = ()
        ) -> tuple[str, str] | None:
            unit = await super().claim(units, prefer=prefer)
            if unit is not None:
                claimed.set()
            return unit

    async def worker(sink: PostgresSink) -> Progress:
        progress = Progress()
        async with sink, SyncEngine(configs, sink, progress) as engine:
            await run_round(engine)
        return progress

    async def both() -> tuple[Progress, Progress]:
        first = asyncio.create_task(worker(First(pg_url, holder="first")))
        await claimed.wait()
        second = await worker(PostgresSink(pg_url, holder="second"))
        return await first, second

    first, second = asyncio.run(both())
    assert list(first.rows) == [("store-1", "orders")]
    assert (second.rows, second.records) == ({}, 0)
    stream = io.StringIO()
    sync_summary(second, 1.0, "db", stream=stream)
    text = " ".join(stream.getvalue().split())
    assert "0 records from 0 stores" in text
    assert "this worker pulled nothing: other workers held all 1 units of the round" in text


# ---------------------------------------------------------------------------------------------
# --listen and --redis with many workers


async def test_two_listening_workers_converge_on_the_servers_rows(
    tmp_path: Path, pg_url: str
) -> None:
    from test_sync_listen import SECRETS, fake_server, listen_configs, stepping_clock

    async with fake_server(seed=4) as server:
        configs = listen_configs(tmp_path, server)
        async with (
            ListenSync(configs, sink_for(pg_url), Progress()) as first,
            ListenSync(configs, sink_for(pg_url), Progress()) as second,
        ):
            urls = {"acme": (await first.listen("127.0.0.1", 0))["acme"]}
            urls["globex"] = (await second.listen("127.0.0.1", 0))["globex"]
            await asyncio.gather(first.pull(), second.pull())  # the initial sync, shared
            senders = [
                await server.deliver_webhooks(
                    urls[store], SECRETS[store], stores=[store], drop_fraction=0.2
                )
                for store in ("acme", "globex")
            ]
            for store in ("acme", "globex"):
                mutator = server.mutator(
                    store, seed=3, weights={"subscription_delete": 1.0}, clock=stepping_clock()
                )
                await mutator.run(steps=60)
            for sender in senders:
                await sender.join()
            await first.join()
            await second.join()
            # Each worker's receiver applied its store's webhooks to the shared tables.
            assert first.counts("acme").applied > 0
            assert second.counts("globex").applied > 0
            assert query(pg_url, "SELECT count(*) FROM webhook_inbox") == [(0,)]
            await asyncio.gather(first.pull(), second.pull())  # a reconciliation, shared
        for store in ("acme", "globex"):
            for resource in RESOURCES:
                rows = pg_rows(pg_url, resource, store)
                assert [r[5] for r in rows] == [
                    orjson.loads(orjson.dumps(rec)) for rec in server.records(store, resource)
                ]


def test_redis_key_paces_every_worker_through_redis(
    server: FakeAdminServer,
    token_env: Mapping[str, str],
    tmp_path: Path,
    pg_url: str,
    redis_server: Any,
) -> None:
    import redis

    url = f"redis://127.0.0.1:{redis_server.port}/0"
    config = write_config(tmp_path, server)
    config.write_text(config.read_text().replace("[defaults]", f'[defaults]\nredis = "{url}"'))
    assert main(["sync", "--config", str(config), "--db", pg_url, "--quiet"]) == 0
    assert_exact(pg_url, server)
    with contextlib.closing(redis.Redis(port=redis_server.port)) as client:
        keys = {key.decode() for key in client.keys("asyncsubs:*")}
    for store in STORES:
        assert any(key.startswith(f"asyncsubs:{{{store}}}:gcra:") for key in keys), keys


def test_bad_redis_url_is_a_usage_error_that_does_not_echo_it(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path, capsys: Any
) -> None:
    config = write_config(tmp_path, server)
    db = str(tmp_path / "subs.db")
    args = ["sync", "--config", str(config), "--db", db, "--redis", "http://u:pw@host"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--redis: expected a redis://, rediss:// or unix:// URL" in err
    assert "pw@" not in err


async def test_dead_letters_are_listed_and_requeued_from_postgres(pg_url: str, capsys: Any) -> None:
    from asyncsubs.cli._dead_letters import dead_letters
    from asyncsubs.sync.postgres import PostgresDeadLetters
    from asyncsubs.webhooks import DeadLetter

    sink = PostgresSink(pg_url)
    await sink.open()
    try:
        letter = DeadLetter("e1", "orders/update", b"{}", "boom", 3, 1_700_000_000.0, "acme")
        # Another store's letter with the same event id (ids are unique per store only).
        other = DeadLetter("e1", "orders/update", b"{}", "boom", 3, 1_700_000_000.0, "globex")
        await PostgresDeadLetters(sink).add(letter)
        await PostgresDeadLetters(sink).add(other)
        assert await PostgresDeadLetters(sink).all() == [letter, other]
    finally:
        await sink.aclose()
    found = await dead_letters(sink_for(pg_url), stores=["acme"], requeue=True)
    assert found == ([letter], 1)
    # Attempts add up over requeues (docs/webhooks.md): the letter's 3 go with it.
    assert query(pg_url, "SELECT store, event_id, attempts FROM webhook_inbox") == [
        ("acme", "e1", 3)
    ]
    assert query(pg_url, "SELECT store FROM webhook_dead_letters") == [("globex",)]
    # Purged: gone, and nothing handed to the inbox.
    assert await dead_letters(sink_for(pg_url), purge=True) == ([other], 1)
    assert query(pg_url, "SELECT count(*) FROM webhook_dead_letters") == [(0,)]
    assert query(pg_url, "SELECT count(*) FROM webhook_inbox") == [(1,)]
