"""The newest version wins, in every door: a server that lists by ``updatedAt`` and changes
records while pages are served gives a run two versions of a record, the old one first; after
the run every row (and its child rows) holds the newest version the run received, and the next
run makes the destination equal to the server.

The server (``list_order="changed"``, a ``Reviser`` changing the records served longest ago
before every page, each change stamped later than any before) runs in a thread of its own, so
every change a run's pages cause is received by that run: the newest received is the server's.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dlt
import orjson
import psycopg
import pytest
from postgres_fixtures import PostgresServer, pg_url_fixture, postgres_server_fixture  # noqa: F401

from asyncsubs import Limits, Rate
from asyncsubs.__main__ import main
from asyncsubs.dlt import Store, subscription_service
from asyncsubs.dlt._records import SEQ_COLUMN, Served, older
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, Reviser, serve_in_thread

RESOURCES = ("subscriptions", "customers", "orders")
STORES = ("shop-0", "shop-1")
INCREMENTAL = {r: {"param": "updatedAtMin", "field": "updatedAt"} for r in RESOURCES}
FAST = Limits(global_rate=Rate(1_000), heavy={r: Rate(1_000) for r in RESOURCES})
PAGE = 10


@pytest.fixture(autouse=True)
def no_dlt_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME__DLTHUB_TELEMETRY", "false")


@pytest.fixture
def reviser() -> Reviser:
    return Reviser(per_page=2)


@pytest.fixture
def server(reviser: Reviser) -> Iterator[FakeAdminServer]:
    stores = [FakeStoreConfig(name, records=45) for name in STORES]
    with serve_in_thread(
        stores=stores, rate_limits=None, list_order="changed", before_page=reviser
    ) as srv:
        yield srv


def newest(server: FakeAdminServer, resource: str) -> dict[tuple[str, str], tuple[int, str]]:
    """(store, id) -> (revision, updatedAt) of every record the server holds now."""
    return {
        (name, str(r["id"])): (r.get("revision", 0), r["updatedAt"])
        for name in STORES
        for r in server.records(name, resource)
    }


def served_twice(server: FakeAdminServer, reviser: Reviser) -> int:
    """Records changed while their lists were pulled page by page: the oldest in change order,
    served on an earlier page, so each was served again, newer."""
    pages = [r for r in server.requests if r.method == "GET" and r.status == 200]
    assert len(pages) >= len(STORES) * len(RESOURCES) * 3  # several pages each
    return len(reviser.revised)


def change_more(server: FakeAdminServer, reviser: Reviser) -> None:
    """Changes between runs: two more revisions of each list's oldest records."""
    for name in STORES:
        for resource in RESOURCES:
            reviser(server.store(name), resource)


# ---------------------------------------------------------------------------------------------
# dlt, into DuckDB and PostgreSQL


def dlt_destination(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    if kind == "duckdb":
        return dlt.destinations.duckdb(str(tmp_path / "warehouse.duckdb"))
    # dlt asks for a password; the test server trusts loopback and ignores it.
    pg_url = request.getfixturevalue("pg_url").replace("asyncsubs@", "asyncsubs:trusted@")
    return dlt.destinations.postgres(pg_url)


def dlt_rows(pipeline: dlt.Pipeline, sql: str) -> list[tuple[Any, ...]]:
    with pipeline.sql_client() as client:
        return [tuple(row) for row in client.execute_sql(sql) or []]


def assert_dlt_newest(pipeline: dlt.Pipeline, server: FakeAdminServer) -> None:
    for resource in RESOURCES:
        rows = dlt_rows(
            pipeline,
            f"SELECT store, id, revision, updated_at, _dlt_id FROM {resource}",
        )
        keys = [(store, id_) for store, id_, *_ in rows]
        assert len(keys) == len(set(keys)), f"duplicate keys in {resource}"
        got = {
            (store, id_): (int(rev or 0), stamp.strftime("%Y-%m-%dT%H:%M:%SZ"))
            for store, id_, rev, stamp, _ in rows
        }
        assert got == newest(server, resource), resource
        # Child rows: exactly those of the version kept, one per revision it lists.
        children = dict(
            dlt_rows(
                pipeline,
                f"SELECT _dlt_parent_id, count(*) FROM {resource}__revisions GROUP BY 1",
            )
        )
        for store, id_, rev, _, row_id in rows:
            assert children.get(row_id, 0) == int(rev or 0), (resource, store, id_)
        assert sum(children.values()) == sum(int(r[2] or 0) for r in rows)


@pytest.mark.parametrize("incremental", [False, True], ids=["whole", "incremental"])
@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_dlt_keeps_the_newest_version_served_in_a_run(
    kind: str,
    incremental: bool,
    server: FakeAdminServer,
    reviser: Reviser,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    pipeline = dlt.pipeline(
        pipeline_name=f"newest_{uuid.uuid4().hex[:8]}",
        destination=dlt_destination(kind, tmp_path, request),
        pipelines_dir=str(tmp_path / "pipelines"),
        dataset_name="subs",
    )
    stores = [
        Store(
            name=name,
            base_url=server.base_url,
            token=server.store(name).token,
            limits=FAST,
            page_size=PAGE,
        )
        for name in STORES
    ]
    options: dict[str, Any] = {"incremental": INCREMENTAL} if incremental else {}

    pipeline.run(subscription_service(stores=stores, **options))
    assert served_twice(server, reviser) > 0
    assert_dlt_newest(pipeline, server)

    # Changes between runs, and more while the next run pulls: the next run catches up.
    change_more(server, reviser)
    pipeline.run(subscription_service(stores=stores, **options))
    assert_dlt_newest(pipeline, server)

    # A last run with the server at rest: the destination equals the server.
    reviser.enabled = False
    changed_before = dict(reviser.revised)
    pipeline.run(subscription_service(stores=stores, **options))
    assert dict(reviser.revised) == changed_before  # nothing changed during this run
    assert_dlt_newest(pipeline, server)


def test_dlt_lag_zero_keeps_a_change_within_the_high_water_second(
    tmp_path: Path, reviser: Reviser
) -> None:
    """dlt's boundary de-duplication (on at lag 0) would drop a record pulled again at the
    high-water mark as already seen, although it changed again within that second."""
    reviser.enabled = False
    with serve_in_thread(stores=[FakeStoreConfig("shop-0", records=30)], rate_limits=None) as srv:
        pipeline = dlt.pipeline(
            pipeline_name=f"lag0_{uuid.uuid4().hex[:8]}",
            destination=dlt.destinations.duckdb(str(tmp_path / "warehouse.duckdb")),
            pipelines_dir=str(tmp_path / "pipelines"),
            dataset_name="subs",
        )
        store = Store(
            name="shop-0", base_url=srv.base_url, token=srv.store("shop-0").token, limits=FAST
        )

        def run() -> None:
            pipeline.run(
                subscription_service(
                    stores=[store],
                    resources=["customers"],
                    incremental={"customers": INCREMENTAL["customers"]},
                    lag=0,
                )
            )

        run()
        mark = max(r["updatedAt"] for r in srv.records("shop-0", "customers"))
        at_mark = next(r for r in srv.records("shop-0", "customers") if r["updatedAt"] == mark)
        # Changed again within the same second: same stamp, new content.
        srv.store("shop-0").update_record("customers", at_mark["id"], {"revision": 7})
        run()
    rows = dlt_rows(pipeline, f"SELECT revision FROM customers WHERE id = '{at_mark['id']}'")
    assert rows == [(7,)]


# ---------------------------------------------------------------------------------------------
# asyncsubs sync, into SQLite and PostgreSQL: the same rule


def write_config(tmp_path: Path, server: FakeAdminServer, incremental: bool) -> Path:
    lines = [
        "[defaults]",
        f"page_size = {PAGE}",
        "[defaults.limits]",
        'global = "1000/s"',
        'heavy = { subscriptions = "1000/s", customers = "1000/s", orders = "1000/s" }',
    ]
    for name in STORES:
        lines += [f'[stores."{name}"]', f'base_url = "{server.base_url}"']
        lines += [f'token_env = "TOKEN_{name.replace("-", "_").upper()}"']
        if incremental:
            lines += [
                f'incremental.{r} = {{ param = "updatedAtMin", field = "updatedAt" }}'
                for r in RESOURCES
            ]
    path = tmp_path / "stores.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def sync_rows(db: str, resource: str) -> dict[tuple[str, str], tuple[int, str]]:
    if db.startswith("postgresql://"):
        with psycopg.connect(db) as conn:
            rows = conn.execute(f"SELECT store, id, raw FROM {resource}").fetchall()
    else:
        with contextlib.closing(sqlite3.connect(db.removeprefix("sqlite:///"))) as conn:
            rows = conn.execute(f"SELECT store, id, raw FROM {resource}").fetchall()
    # PostgreSQL's jsonb arrives decoded, SQLite's text as sent.
    records = {
        (store, id_): raw if isinstance(raw, dict) else orjson.loads(raw)
        for store, id_, raw in rows
    }
    assert len(records) == len(rows)
    return {key: (r.get("revision", 0), r["updatedAt"]) for key, r in records.items()}


@pytest.mark.parametrize("incremental", [False, True], ids=["whole", "incremental"])
@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_sync_keeps_the_newest_version_served_in_a_run(
    kind: str,
    incremental: bool,
    server: FakeAdminServer,
    reviser: Reviser,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in STORES:
        monkeypatch.setenv(f"TOKEN_{name.replace('-', '_').upper()}", server.store(name).token)
    if kind == "sqlite":
        db = f"sqlite:///{tmp_path / 'subs.db'}"
    else:
        db = request.getfixturevalue("pg_url")
    config = write_config(tmp_path, server, incremental)
    args = ["sync", "--config", str(config), "--db", db, "--quiet"]

    assert main(args) == 0
    assert served_twice(server, reviser) > 0
    for resource in RESOURCES:
        assert sync_rows(db, resource) == newest(server, resource), resource

    change_more(server, reviser)
    reviser.enabled = False
    assert main(args) == 0
    for resource in RESOURCES:
        assert sync_rows(db, resource) == newest(server, resource), resource


def test_a_version_older_by_the_incremental_field_is_not_yielded_after_a_newer_one() -> None:
    """A server may serve an older version after a newer one (a lagging replica behind a page):
    by the incremental field, the newer stays; without one, the last served wins."""
    by_field = Served("updatedAt")
    first = by_field.rows("s", [{"id": 1, "updatedAt": "2026-01-02T00:00:01Z", "v": "new"}])
    again = by_field.rows("s", [{"id": 1, "updatedAt": "2026-01-02T00:00:00Z", "v": "old"}])
    tie = by_field.rows("s", [{"id": 1, "updatedAt": "2026-01-02T01:00:01+01:00", "v": "tie"}])
    other_store = by_field.rows("t", [{"id": 1, "updatedAt": "2020-01-01T00:00:00Z"}])
    assert again == []
    assert by_field.dropped == 1
    assert [r["v"] for r in tie] == ["tie"]  # the same instant: the later served wins
    assert len(other_store) == 1
    assert first[0][SEQ_COLUMN] < tie[0][SEQ_COLUMN] < other_store[0][SEQ_COLUMN]

    by_order = Served(None)
    rows = by_order.rows("s", [{"id": 1, "v": "a"}]) + by_order.rows("s", [{"id": 1, "v": "b"}])
    assert [r["v"] for r in rows] == ["a", "b"]
    assert rows[0][SEQ_COLUMN] < rows[1][SEQ_COLUMN]


@pytest.mark.parametrize(
    ("a", "b", "is_older"),
    [
        ("2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", True),
        ("2026-01-01T01:00:00+01:00", "2026-01-01T00:00:00Z", False),
        (1, 2.5, True),
        (3, 2, False),
        ("b", "a", False),
        (None, "2026-01-01T00:00:00Z", False),
        (True, 2, False),
        (1, "2", True),  # a string of digits is a number (a database holds stamps as text)
        # Beyond what both Python and PostgreSQL read as numbers: never a raise.
        # Text, by code point, as a sink's column compares it.
        pytest.param(10**400, 10**401, True, id="ints-past-255-digits"),
        ("1", "1e131072", False),  # text, against a number: two kinds
        (1e308, 2e308, False),  # inf
        ("", "a", False),  # an empty stamp orders nothing
        # Nanoseconds and ticks: to the microsecond as instants, then by the digits beyond.
        ("2024-11-03T01:30:00.0000000-04:00", "2024-11-03T01:10:00.0000000-05:00", True),
        ("2026-01-01T10:00:00.12345678Z", "2026-01-01T10:00:00.123456789Z", True),
        ("2026-01-01T10:00:00.123456789Z", "2026-01-01T10:00:00.12345678Z", False),
        ("2026-01-01T10:00:00.1234567Z", "2026-01-01T10:00:00.123456700Z", False),
        ("2026-01-01T10:00:00.9999999Z", "2026-01-01T10:00:01Z", True),
        ("2026-01-01t09:00:00z", "2026-01-01T10:00:00Z", True),  # RFC 3339's lower case
    ],
)
def test_older(a: Any, b: Any, is_older: bool) -> None:
    assert older(a, b) is is_older


def test_the_mark_is_the_newest_stamp_that_orders() -> None:
    """An empty stamp or a boolean served first would stay the mark for good."""
    served = Served("updatedAt")
    stamps = ["", True, None, "2024-06-01T00:00:00Z", "2024-05-01T00:00:00Z"]
    served.rows("s", [{"id": i, "updatedAt": v} for i, v in enumerate(stamps)])
    assert served.newest == "2024-06-01T00:00:00Z"


def test_a_records_own_field_renamed_never_lands_on_another_of_its_fields() -> None:
    rows = Served().rows("s", [{"id": 1, "store": "theirs", "record_store": "also theirs"}])
    assert {k: v for k, v in rows[0].items() if k != SEQ_COLUMN} == {
        "id": 1,
        "record_record_store": "theirs",
        "record_store": "also theirs",
        "store": "s",
    }
