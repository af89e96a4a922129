"""``asyncsubs sync --listen``: webhooks applied to the sync database, reconciled by pulls.

The engine (``ListenSync``) runs in the test's own loop next to the fake server, so every step
is awaited rather than waited for: webhooks are drained with ``join()``, and exactly one
reconciliation pull runs when the test says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import os
import re
import signal
import socket
import sqlite3
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import orjson
import pytest

from asyncsubs import Rate
from asyncsubs.__main__ import main
from asyncsubs.cli._common import CONFIG_FLAGS
from asyncsubs.cli._display import PlainLines
from asyncsubs.cli._progress import Progress
from asyncsubs.cli._sync import parse_listen
from asyncsubs.errors import ConfigError
from asyncsubs.limiting import PoolStats
from asyncsubs.stores import (
    ConfigFileError,
    Message,
    PageCommitted,
    PoolLearned,
    RunStarted,
    UnitDone,
    UnitFailed,
    UnitStarted,
    WebhookCounts,
    load_config,
)
from asyncsubs.stores import Store as StoreConfig
from asyncsubs.sync import DatabaseError, ListenSync, PageWrite, sink_for
from asyncsubs.sync.sqlite import SQLiteSink
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig
from asyncsubs.webhooks import ReceiverStats, signature_header_value

RESOURCES = ("subscriptions", "customers", "orders")
STORES = ("acme", "globex")
SECRETS = {"acme": "acme-webhook-secret", "globex": "globex-webhook-secret"}
START = 1_900_000_000.0  # 2030: mutation stamps later than every generated record


def stepping_clock(start: float = START, step: float = 0.3) -> Callable[[], float]:
    """Several changes per second, so equal ``updatedAt`` stamps happen."""
    ticks = itertools.count()
    return lambda: start + step * next(ticks)


def fake_server(**kwargs: Any) -> FakeAdminServer:
    stores = [
        FakeStoreConfig("acme", records=120),
        FakeStoreConfig("globex", records={"subscriptions": 70, "customers": 40, "orders": 90}),
    ]
    return FakeAdminServer(stores=stores, rate_limits=None, **kwargs)


def env_name(store: str, what: str) -> str:
    return f"{store.upper()}_{what}"


def environment(server: FakeAdminServer) -> dict[str, str]:
    env = {env_name(s, "TOKEN"): token for s, token in server.tokens.items()}
    env.update({env_name(s, "WEBHOOK_SECRET"): secret for s, secret in SECRETS.items()})
    return env


def write_config(tmp_path: Path, server: FakeAdminServer, *, secrets: bool = True) -> Path:
    lines = [
        "[defaults]",
        "page_size = 25",
        "[defaults.limits]",
        'global = "1000/s"',
        'heavy = { subscriptions = "1000/s", customers = "1000/s", orders = "1000/s" }',
    ]
    for store in server.tokens:
        lines += [f"[stores.{store}]", f'base_url = "{server.base_url}"']
        lines.append(f'token_env = "{env_name(store, "TOKEN")}"')
        if secrets:
            lines.append(f'webhook_secret_env = "{env_name(store, "WEBHOOK_SECRET")}"')
    path = tmp_path / "stores.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def listen_configs(tmp_path: Path, server: FakeAdminServer) -> list[StoreConfig]:
    return load_config(write_config(tmp_path, server), environment(server), listen=True)


def listening(
    configs: Sequence[StoreConfig], db: Path, progress: Progress | None = None
) -> ListenSync:
    """``sync --listen``'s engine on the SQLite database ``db``, telling ``progress``."""
    return ListenSync(configs, sink_for(str(db)), progress or Progress())


def table(db: Path, store: str, resource: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            f"SELECT id, status, customer_id, created_at, updated_at, raw FROM {resource}"
            " WHERE store = ? ORDER BY CAST(id AS INTEGER)",
            (store,),
        ).fetchall()


def expected(server: FakeAdminServer, store: str, resource: str) -> list[tuple[Any, ...]]:
    """The rows a record should have: id as text, typed columns, and the JSON as served."""
    return [
        (
            str(r["id"]),
            r.get("status"),
            None if "customerId" not in r else str(r["customerId"]),
            r.get("createdAt"),
            r.get("updatedAt"),
            orjson.dumps(r).decode(),
        )
        for r in server.records(store, resource)
    ]


def differences(db: Path, server: FakeAdminServer) -> list[tuple[str, str, int]]:
    """(store, resource, rows that differ) wherever the database is not the server's state."""
    found = []
    for store in STORES:
        for resource in RESOURCES:
            have, want = set(table(db, store, resource)), set(expected(server, store, resource))
            if have != want:
                found.append((store, resource, len(have ^ want)))
    return found


def assert_exact(db: Path, server: FakeAdminServer) -> None:
    for store in STORES:
        for resource in RESOURCES:
            assert table(db, store, resource) == expected(server, store, resource), (
                store,
                resource,
            )


# ---------------------------------------------------------------------------------------------
# End to end


async def test_lossy_webhooks_then_one_incremental_pull_equal_the_servers_state(
    tmp_path: Path,
) -> None:
    db = tmp_path / "subs.db"
    async with fake_server(seed=3) as server:
        progress = Progress()
        async with listening(listen_configs(tmp_path, server), db, progress) as engine:
            urls = await engine.listen("127.0.0.1", 0)
            assert set(urls) == set(STORES)
            await engine.pull()  # the initial sync
            # A fresh database's first run gives no point in time that is safe to filter from
            # (see docs/cli.md, Resume), so the first reconciliation is a full pull as well.
            await engine.pull()
            assert_exact(db, server)
            newest = {
                (store, resource): max(r["updatedAt"] for r in server.records(store, resource))
                for store in STORES
                for resource in RESOURCES
            }

            senders = [
                await server.deliver_webhooks(
                    urls[store], SECRETS[store], stores=[store], drop_fraction=0.1, seed=i
                )
                for i, store in enumerate(STORES)
            ]
            mutators = [
                server.mutator(store, seed=5 + i, clock=stepping_clock())
                for i, store in enumerate(STORES)
            ]
            for mutator in mutators:
                await mutator.run(steps=200, interval=0)
            for sender in senders:
                await sender.join()
            await engine.join()

            dropped = sum(s.stats.dropped for s in senders)
            delivered = sum(s.stats.delivered for s in senders)
            assert dropped > 0
            assert delivered + dropped == sum(s.stats.events for s in senders)
            # Every delivered event was applied (or found older than the row), none lost.
            for store, sender in zip(STORES, senders, strict=True):
                hook = engine.counts(store)
                stats = hook.receiver
                assert stats.accepted == sender.stats.delivered
                assert hook.applied + hook.stale == stats.accepted
                assert (hook.ignored, stats.dead_lettered, stats.unauthorized) == (0, 0, 0)
            # The dropped changes are missing: the reconciliation has something to do.
            assert differences(db, server)

            server.clear_requests()
            await engine.pull()  # exactly one reconciliation pull
            list_requests = [r for r in server.requests if r.path.rsplit("/", 1)[-1] in RESOURCES]
            # Filtered from the newest stamp stored before the previous pull began.
            assert {
                (r.store, r.path.rsplit("/", 1)[-1], r.query["updatedAtMin"]) for r in list_requests
            } >= {(store, resource, stamp) for (store, resource), stamp in newest.items()}

        assert_exact(db, server)
        total = sum(len(server.records(s, r)) for s in STORES for r in RESOURCES)
        pulled = sum(row.records for row in progress.rows.values())
        changed = sum(
            r["updatedAt"] >= newest[(store, resource)]
            for store in STORES
            for resource in RESOURCES
            for r in server.records(store, resource)
        )
        assert 0 < pulled == changed < total  # what changed, not whole lists
        # Rows count this run's requests, not the store's since the process started.
        assert all(row.stats.requests == row.pages for row in progress.rows.values())


async def test_deletes_arrive_by_webhook_and_stay_deleted(tmp_path: Path) -> None:
    db = tmp_path / "subs.db"
    async with fake_server(seed=4) as server:
        async with listening(listen_configs(tmp_path, server), db) as engine:
            urls = await engine.listen("127.0.0.1", 0)
            await engine.pull()
            sender = await server.deliver_webhooks(
                urls["acme"], SECRETS["acme"], stores=["acme"], drop_fraction=0.0
            )
            mutator = server.mutator(
                "acme", seed=2, weights={"subscription_delete": 3.0}, clock=stepping_clock()
            )
            await mutator.run(steps=120)
            await sender.join()
            await engine.join()
            assert mutator.counts["subscription_delete"] > 10
            assert engine.counts("acme").deletes == mutator.counts["subscription_delete"]
            assert_exact(db, server)  # no pull needed when nothing was dropped
            await engine.pull()
        assert_exact(db, server)


async def test_upserts_keep_the_newest_version_and_deleted_ids_stay_deleted(
    tmp_path: Path,
) -> None:
    db = SQLiteSink(tmp_path / "subs.db")
    await db.open()
    try:
        old = {"id": 7, "status": "ACTIVE", "updatedAt": "2030-01-01T00:00:05Z"}
        new = {"id": 7, "status": "PAUSED", "updatedAt": "2030-01-01T00:00:06Z"}
        assert await db.upsert_record("acme", "subscriptions", new)
        assert not await db.upsert_record("acme", "subscriptions", old)  # a late webhook
        # A page read before the change, committed after its webhook: the row keeps `new`.
        page = PageWrite("acme", "subscriptions", [old], None, True, {}, None, None)
        await db.commit_page(page)
        same_second = {**new, "status": "CANCELLED"}
        assert await db.upsert_record("acme", "subscriptions", same_second)  # equal stamps win
        # Offsets and fractions compare as instants, not as text.
        later = {**new, "status": "ACTIVE", "updatedAt": "2030-01-01T01:00:06.5+01:00"}
        assert await db.upsert_record("acme", "subscriptions", later)
        rows = table(db.path, "acme", "subscriptions")
        assert [(r[0], r[1]) for r in rows] == [("7", "ACTIVE")]

        await db.delete_record("acme", "subscriptions", 7)
        assert not await db.upsert_record("acme", "subscriptions", new)
        await db.commit_page(PageWrite("acme", "subscriptions", [new], None, True, {}, None, None))
        assert table(db.path, "acme", "subscriptions") == []
        # The same id in another store or resource is another record.
        assert await db.upsert_record("globex", "subscriptions", new)
        assert await db.upsert_record("acme", "orders", new)
    finally:
        await db.aclose()


async def test_reconciles_periodically_until_cancelled(tmp_path: Path) -> None:
    """No webhook arrives at all here: the periodic pulls alone catch the changes."""
    db = tmp_path / "subs.db"
    async with fake_server(seed=6) as server:
        mutators = [server.mutator(s, seed=1, clock=stepping_clock()) for s in STORES]
        progress = Progress()
        messages: list[str] = []
        caught_up = asyncio.Event()

        def on_message(event: object, row: object) -> None:
            if not isinstance(event, Message):
                return
            text = event.text
            messages.append(text)
            # Called between pulls, so the changes land after one pull and before the next.
            if text.startswith("reconciliation 1 done"):
                for mutator in mutators:
                    for _ in range(30):
                        mutator.step()
            if text.startswith("reconciliation 2 done"):
                caught_up.set()

        progress.watch(on_message)

        async def run_listen() -> None:
            async with listening(listen_configs(tmp_path, server), db, progress) as engine:
                await engine.run("127.0.0.1", 0, reconcile_every=0.001)

        task = asyncio.create_task(run_listen())
        try:
            async with asyncio.timeout(10):
                await caught_up.wait()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        assert task.cancelled()
        assert_exact(db, server)
        assert progress.runs >= 3
        assert any("updatedAtMin" in r.query for r in server.requests)
        urls = [t for t in messages if t.startswith("webhooks of store")]
        assert len(urls) == 2
        assert re.fullmatch(
            r"webhooks of store acme: POST http://127\.0\.0\.1:\d+/webhooks/acme", urls[0]
        )
        assert any(t.startswith("initial sync done: ") for t in messages)
        # Closed: the database is free and the port no longer listens.
        with contextlib.closing(sqlite3.connect(db)) as conn:
            conn.execute("BEGIN EXCLUSIVE")
        port = int(urls[0].split(":")[-1].split("/")[0])
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.post(f"http://127.0.0.1:{port}/webhooks/acme", data=b"{}")


def test_later_reconciliations_say_of_a_unit_what_changed() -> None:
    """A service's lines: every unit's start, pace and end in the first run; in later ones
    only a pace learned anew (the records pulled are the run's own line; with -v, every line)."""
    units = (("acme", "orders"), ("acme", "customers"))
    learning = PoolStats(rate=2.0, rate_by="probe", good=1.0)

    def run(progress: Progress, number: int, pulled: int, stats: PoolStats) -> None:
        progress(RunStarted(number, units))
        for store, resource in units:
            progress(UnitStarted(store, resource, False, 0, Rate(2)))
            progress(PoolLearned(store, resource, stats))
            progress(PageCommitted(store, resource, pulled if resource == "orders" else 0, stats))
            progress(UnitDone(store, resource, stats, None))

    said: dict[bool, list[str]] = {}
    for verbose in (False, True):
        progress, out = Progress(), io.StringIO()
        progress.watch(PlainLines(progress, out, 1.0, verbose=verbose))
        run(progress, 1, 5, learning)
        run(progress, 2, 3, learning)
        run(progress, 3, 0, attrs.evolve(learning, rate=4.0, good=2.0))
        said[verbose] = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert said[False] == [
        "acme/orders: starting",
        "acme/orders: 2.00 req/s probing (1.00 ran clean)",
        "acme/orders: done, 5 records in 1 page (0.0s)",
        "acme/customers: starting",
        "acme/customers: 2.00 req/s probing (1.00 ran clean)",
        "acme/customers: done, 0 records in 1 page (0.0s)",
        "acme/orders: 4.00 req/s probing (2.00 ran clean)",
        "acme/customers: 4.00 req/s probing (2.00 ran clean)",
    ]
    assert len(said[True]) == 3 * 2 * 3


def test_a_later_reconciliation_says_a_unit_recovered_and_a_resumed_run_ended() -> None:
    progress, out = Progress(), io.StringIO()
    progress.watch(PlainLines(progress, out, 1.0))
    stats, unit = PoolStats(), ("acme", "orders")
    progress(RunStarted(1, (unit,)))
    progress(UnitStarted(*unit, False, 0, Rate(2)))
    progress(UnitFailed(*unit, "TransportError: connection refused", stats, None))
    progress(RunStarted(2, (unit,)))
    progress(UnitStarted(*unit, False, 0, Rate(2)))
    progress(UnitDone(*unit, stats, None))  # recovered: said, though nothing was pulled
    progress(RunStarted(3, (unit,)))
    progress(UnitStarted(*unit, True, 0, Rate(2)))
    progress(UnitDone(*unit, stats, None))  # a resumed run's end: said, as its resume was
    progress(RunStarted(4, (unit,)))
    progress(UnitStarted(*unit, False, 0, Rate(2)))
    progress(UnitDone(*unit, stats, None))  # nothing new
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "acme/orders: starting",
        "acme/orders: FAILED: TransportError: connection refused",
        "acme/orders: done, 0 records in 0 pages (0.0s)",
        "acme/orders: resuming from its saved cursor",
        "acme/orders: done, 0 records in 0 pages (0.0s)",
    ]


def test_plain_progress_shows_webhook_counters_when_they_change() -> None:
    progress = Progress()
    out = io.StringIO()
    display = PlainLines(progress, out, 1.0)
    progress.watch(display)
    receiver = ReceiverStats(accepted=12, duplicates=2, dead_lettered=1)
    progress(WebhookCounts("acme", receiver, applied=10, deletes=3, stale=1))
    progress(WebhookCounts("globex", applied=5))
    progress(Message("webhooks of store acme: POST http://h:1/webhooks/acme"))
    display.tick()
    display.tick()  # nothing changed: no line
    progress(WebhookCounts("globex", applied=5, ignored=1))
    display.tick()
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "webhooks of store acme: POST http://h:1/webhooks/acme",
        "webhooks: 12 accepted, 2 duplicates, 15 applied (3 deletes), 1 stale, 0 ignored, "
        "1 dead letter, 0 refused",
        "webhooks: 12 accepted, 2 duplicates, 15 applied (3 deletes), 1 stale, 1 ignored, "
        "1 dead letter, 0 refused",
    ]


# ---------------------------------------------------------------------------------------------
# Refused deliveries


async def test_bad_signatures_are_401_and_nothing_is_applied(tmp_path: Path) -> None:
    db = tmp_path / "subs.db"
    async with fake_server(seed=8) as server:
        configs = listen_configs(tmp_path, server)
        async with listening(configs, db) as engine:
            urls = await engine.listen("127.0.0.1", 0)
            await engine.pull()
            record = {**server.records("acme", "customers")[0], "updatedAt": "2031-01-01T00:00:00Z"}
            body = orjson.dumps(
                {"id": "e-1", "topic": "customers/update", "store": "acme", "data": record}
            )

            def signed(secret: str) -> dict[str, str]:
                return {"X-Service-Signature": signature_header_value(secret, body)}

            async with aiohttp.ClientSession() as session:
                statuses = []
                # No signature, a wrong one, and another store's valid one: stores are apart.
                for headers in ({}, signed("wrong"), signed(SECRETS["globex"])):
                    async with session.post(urls["acme"], data=body, headers=headers) as resp:
                        statuses.append(resp.status)
                assert statuses == [401, 401, 401]
                unknown = urls["acme"].replace("/acme", "/initech")
                async with session.post(unknown, data=body, headers=signed("x")) as resp:
                    assert resp.status == 404
                await engine.join()
                hook = engine.counts("acme")
                refused = hook.receiver.unauthorized
                assert (refused, hook.receiver.accepted, hook.applied) == (3, 0, 0)
                assert_exact(db, server)

                # The same delivery, signed right, is applied.
                async with session.post(
                    urls["acme"], data=body, headers=signed(SECRETS["acme"])
                ) as resp:
                    assert resp.status == 200
                await engine.join()
                hook = engine.counts("acme")
            rows = table(db, "acme", "customers")
            assert rows[0][4] == "2031-01-01T00:00:00Z"
            assert hook.applied == 1


async def test_events_that_cannot_be_applied_are_dead_lettered_with_their_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "subs.db"
    async with fake_server(seed=10) as server:
        async with listening(listen_configs(tmp_path, server), db) as engine:
            urls = await engine.listen("127.0.0.1", 0)

            async def broken(*args: Any) -> bool:
                raise DatabaseError("database subs.db: disk I/O error")

            monkeypatch.setattr(engine.sink, "upsert_record", broken)
            events = [
                ("e-1", "orders/update", {"id": 1, "updatedAt": "2031-01-01T00:00:00Z"}),
                ("e-2", "refunds/create", {"id": 2}),  # not a synced resource
            ]
            async with aiohttp.ClientSession() as session:
                for event_id, topic, data in events:
                    event = {"id": event_id, "topic": topic, "store": "globex", "data": data}
                    body = orjson.dumps(event)
                    headers = {
                        "X-Service-Signature": signature_header_value(SECRETS["globex"], body)
                    }
                    async with session.post(urls["globex"], data=body, headers=headers) as resp:
                        assert resp.status == 200
            await engine.join()
            hook = engine.counts("globex")
            assert (hook.applied, hook.ignored, hook.receiver.dead_lettered) == (0, 1, 1)
        with contextlib.closing(sqlite3.connect(db)) as conn:
            letters = conn.execute(
                "SELECT event_id, topic, error, store FROM webhook_dead_letters"
            ).fetchall()
            inbox = conn.execute("SELECT count(*) FROM webhook_inbox").fetchone()[0]
        assert letters == [
            (
                "e-1",
                "orders/update",
                "WebhookApplyError: store globex: DatabaseError: database subs.db: disk I/O error",
                "globex",
            )
        ]
        assert inbox == 0  # applied or dead-lettered: nothing left to resume


# ---------------------------------------------------------------------------------------------
# Configuration and the command line


def test_missing_webhook_secret_is_a_config_error_only_with_listen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        '[stores.acme]\nbase_url = "http://127.0.0.1:9"\ntoken_env = "ACME_TOKEN"\n'
        'webhook_secret_env = "ACME_WEBHOOK_SECRET"\n',
        encoding="utf-8",
    )
    monkeypatch.setenv("ACME_TOKEN", "t-1")
    monkeypatch.delenv("ACME_WEBHOOK_SECRET", raising=False)
    db = tmp_path / "subs.db"
    args = ["sync", "--config", str(config), "--db", str(db), "--listen", "127.0.0.1:0"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        "asyncsubs: error: stores.acme.webhook_secret_env: environment variable "
        "ACME_WEBHOOK_SECRET is not set\n"
    )
    assert not db.exists()  # nothing was opened, nothing was sent

    # Without --listen the secret is never read; with it, unset resources default to
    # incremental reconciliation.
    (plain,) = load_config(config, {"ACME_TOKEN": "t-1"})
    assert (plain.webhook, plain.incremental) == (None, {})
    (listening,) = load_config(
        config, {"ACME_TOKEN": "t-1", "ACME_WEBHOOK_SECRET": "s3cret"}, listen=True
    )
    assert listening.webhook is not None
    assert listening.webhook.secret == b"s3cret"
    assert listening.webhook.shared_secret is False  # its own: store-less bodies are its
    assert "s3cret" not in repr(listening)
    assert {r: (i.param, i.field) for r, i in listening.incremental.items()} == dict.fromkeys(
        RESOURCES, ("updatedAtMin", "updatedAt")
    )


def test_listen_needs_a_secret_variable_per_store(tmp_path: Path) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        '[defaults]\nincremental.orders = { param = "changedSince", field = "modifiedAt" }\n'
        '[stores.acme]\nbase_url = "http://127.0.0.1:9"\ntoken_env = "T"\n'
        '[stores.globex]\nbase_url = "http://127.0.0.1:9"\ntoken_env = "T"\n'
        'webhook_secret_env = "not a name"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(config, {"T": "t"}, listen=True, names=CONFIG_FLAGS)
    assert info.value.problems == (
        "stores.acme: webhook_secret_env is required with --listen (the name of the "
        "environment variable holding the store's webhook secret)",
        "stores.globex.webhook_secret_env: must be the NAME of an environment variable, like "
        "ACME_TOKEN (what it holds is not shown: it may be the secret itself)",
    )
    config.write_text(config.read_text().replace("not a name", "G_SECRET"), encoding="utf-8")
    config.write_text(
        config.read_text().replace(
            'token_env = "T"\n', 'token_env = "T"\nwebhook_secret_env = "A_SECRET"\n', 1
        ),
        encoding="utf-8",
    )
    acme, _ = load_config(config, {"T": "t", "G_SECRET": "g", "A_SECRET": "a"}, listen=True)
    assert acme.incremental["orders"].param == "changedSince"  # configured filters are kept
    assert acme.incremental["customers"].param == "updatedAtMin"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--listen", "8080"], "--listen takes HOST:PORT"),
        (["--listen", "127.0.0.1:99999"], "--listen takes HOST:PORT"),
        (["--reconcile-every", "60"], "--reconcile-every needs --listen"),
        (["--listen", "127.0.0.1:0", "--reconcile-every", "0"], "expected a positive number"),
    ],
)
def test_listen_usage_errors_exit_2(
    tmp_path: Path, capsys: Any, extra: list[str], message: str
) -> None:
    config = tmp_path / "stores.toml"
    config.write_text('[stores.a]\nbase_url = "http://127.0.0.1:9"\ntoken_env = "T"\n')
    assert main(["sync", "--config", str(config), "--db", str(tmp_path / "x.db"), *extra]) == 2
    assert message in capsys.readouterr().err


def test_an_address_in_use_exits_2(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "stores.toml"
    config.write_text(
        '[stores.a]\nbase_url = "http://127.0.0.1:9"\ntoken_env = "T"\nwebhook_secret_env = "S"\n'
    )
    db = tmp_path / "x.db"
    with socket.socket() as taken, pytest.MonkeyPatch.context() as env:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env.setenv("T", "t")
        env.setenv("S", "s")
        port = taken.getsockname()[1]
        args = ["sync", "--config", str(config), "--db", str(db), "--listen", f"127.0.0.1:{port}"]
        assert main([*args, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asyncsubs: error: --listen 127.0.0.1:{port}: cannot listen (")
    assert err.count("\n") == 1


def test_parse_listen() -> None:
    assert parse_listen("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen("localhost:65535") == ("localhost", 65535)
    for bad in ("", ":80", "host:", "host:x", "host:-1", "host"):
        with pytest.raises(ConfigError):
            parse_listen(bad)


async def test_command_applies_webhooks_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    db = tmp_path / "subs.db"
    async with fake_server(seed=9) as server:
        config = write_config(tmp_path, server)
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "asyncsubs", "sync", "--config", str(config)),
            *("--db", str(db), "--listen", "127.0.0.1:0", "--progress", "plain"),
            env={**os.environ, **environment(server)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert proc.stderr is not None
            urls: dict[str, str] = {}
            err_lines: list[str] = []
            async with asyncio.timeout(20):
                while True:
                    line = (await proc.stderr.readline()).decode()
                    assert line, f"exited early: {''.join(err_lines)}"
                    err_lines.append(line)
                    if match := re.search(r"webhooks of store (\w+): POST (\S+)$", line):
                        urls[match[1]] = match[2]
                    if "initial sync done: " in line:
                        break
            assert set(urls) == set(STORES)
            senders = [
                await server.deliver_webhooks(
                    urls[store], SECRETS[store], stores=[store], drop_fraction=0.0
                )
                for store in STORES
            ]
            for i, store in enumerate(STORES):
                await server.mutator(store, seed=i, clock=stepping_clock()).run(steps=40)
            for sender in senders:
                await sender.join()
                assert sender.stats.delivered == sender.stats.events > 0
            async with (
                aiohttp.ClientSession() as session,
                session.post(urls["acme"], data=b"{}") as resp,
            ):
                assert resp.status == 401
            # Accepted is enough: stopping applies whatever is still queued.
            out, err = await terminate(proc)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 143, err.decode()
        text = "".join(err_lines) + err.decode()
        assert "Traceback" not in text
        assert "stopped; accepted webhooks not applied yet are kept in webhook_inbox" in text
        # The receiver's warning is one progress line, not a bare log record.
        assert re.search(
            r"^\[\s*[\d.]+s\] warning: webhook delivery for store acme refused: missing or",
            text,
            re.M,
        )
        assert re.search(r"^webhooks\n", out.decode(), re.M)
        assert re.search(r"^acme\s+\d+\s+0\s+\d+", out.decode(), re.M)
        assert_exact(db, server)


async def terminate(proc: Any) -> tuple[bytes, bytes]:
    """SIGTERM ``proc`` and wait (20 s at most) for it to exit: (its stdout, its stderr)."""
    proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(20):
        out, err = await proc.communicate()
    return out, err


async def start_listen(
    db: Path,
    config: Path,
    env: Mapping[str, str],
    *output: str,
    stdout: int = asyncio.subprocess.DEVNULL,
) -> tuple[Any, dict[str, str], list[str]]:
    """``sync --listen`` in a child process with ``output`` options (plain lines unless said),
    once its initial sync is done: (process, urls, its stderr lines so far)."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "asyncsubs", "sync", "--config", str(config)),
        *("--db", str(db), "--listen", "127.0.0.1:0", *(output or ("--progress", "plain"))),
        env={**os.environ, **env},
        stdout=stdout,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    urls: dict[str, str] = {}
    lines: list[str] = []
    async with asyncio.timeout(20):
        while "initial sync done: " not in (lines[-1] if lines else ""):
            line = (await proc.stderr.readline()).decode()
            assert line, f"exited early: {''.join(lines)}"
            lines.append(line)
            if match := re.search(r"webhooks of store (\w+): POST (http://[^\s\"]+)", line):
                urls[match[1]] = match[2]
    return proc, urls, lines


async def test_sigkill_after_acknowledging_loses_no_update_and_no_delete(tmp_path: Path) -> None:
    """Updates and deletes answered 200, the process SIGKILLed at once: the restart applies
    every one of them from the inbox. A delete matters most: no pull can see it."""
    db = tmp_path / "subs.db"
    async with fake_server(seed=12) as server:
        config = write_config(tmp_path, server)
        proc, urls, _ = await start_listen(db, config, environment(server))
        changes: list[Any] = []
        server.store("acme").listeners.append(changes.append)
        mutator = server.mutator(
            "acme", seed=5, weights={"subscription_delete": 3.0}, clock=stepping_clock()
        )
        await mutator.run(steps=150)
        assert mutator.counts["subscription_delete"] >= 20
        bodies = [
            orjson.dumps(
                {
                    "id": f"evt-{i}",
                    "topic": f"{c.resource}/{c.kind}",
                    "store": "acme",
                    "data": c.record,
                }
            )
            for i, c in enumerate(changes)
        ]
        try:
            async with aiohttp.ClientSession() as session:

                async def post(body: bytes) -> int:
                    sig = {"X-Service-Signature": signature_header_value(SECRETS["acme"], body)}
                    async with session.post(urls["acme"], data=body, headers=sig) as resp:
                        return resp.status

                # All at once, in order per record is not needed: newer-or-equal and deleted
                # ids settle any order.
                statuses = await asyncio.gather(*(post(b) for b in bodies))
            assert statuses == [200] * len(bodies)
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        with contextlib.closing(sqlite3.connect(db)) as conn:
            kept = conn.execute("SELECT count(*) FROM webhook_inbox").fetchone()[0]
        print(f"acknowledged {len(bodies)}, unapplied at SIGKILL (in the inbox): {kept}")
        assert kept > 0  # the crash did hit acknowledged, unapplied events (~210 of 219 here)

        # The restart resumes the inbox; SIGTERM then drains it before exiting.
        proc, _, _ = await start_listen(db, config, environment(server))
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            await proc.communicate()
        assert_exact(db, server)
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT count(*) FROM webhook_inbox").fetchone()[0] == 0


async def test_dead_letters_are_requeued_on_start_and_by_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """A database failure dead-letters events; the next start requeues them (while they have
    had fewer than REQUEUE_BELOW_ATTEMPTS attempts); ``asyncsubs dead-letters`` lists them and
    ``--requeue`` hands the rest back to the inbox."""
    db = tmp_path / "subs.db"
    record = {"id": 7, "updatedAt": "2031-01-01T00:00:00Z"}

    async def broken(*args: Any) -> bool:
        raise DatabaseError("database subs.db: database is locked")

    async def post_updates(url: str, ids: Sequence[str]) -> None:
        async with aiohttp.ClientSession() as session:
            for event_id in ids:
                event = {"id": event_id, "topic": "orders/update", "store": "acme"}
                body = orjson.dumps({**event, "data": record})
                sig = {"X-Service-Signature": signature_header_value(SECRETS["acme"], body)}
                async with session.post(url, data=body, headers=sig) as resp:
                    assert resp.status == 200

    async def failing_run(ids: Sequence[str]) -> None:
        async with listening(listen_configs(tmp_path, server), db) as engine:
            monkeypatch.setattr(engine.sink, "upsert_record", broken)
            urls = await engine.listen("127.0.0.1", 0)
            await post_updates(urls["acme"], ids)
            await engine.join()
            monkeypatch.undo()

    async with fake_server(seed=13) as server:
        await failing_run(["d-1"])  # 5 attempts
        # The command runs its own event loop: in a thread, beside this test's.
        assert await asyncio.to_thread(main, ["dead-letters", "--db", str(db)]) == 0
        listed = capsys.readouterr().out
        assert re.search(r"^acme\s+d-1\s+orders/update\s+5\s", listed, re.M), listed
        assert f"1 dead letter in {db}" in listed

        # Still failing at the next two starts: 10, then 15 attempts; then no more on start.
        for _ in range(2):
            async with listening(listen_configs(tmp_path, server), db) as engine:
                monkeypatch.setattr(engine.sink, "upsert_record", broken)
                await engine.listen("127.0.0.1", 0)
                await engine.join()
                monkeypatch.undo()
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT attempts FROM webhook_dead_letters").fetchall() == [(15,)]
        async with listening(listen_configs(tmp_path, server), db) as engine:
            await engine.listen("127.0.0.1", 0)
            await engine.join()
            assert engine.counts("acme").applied == 0  # the bound: not requeued on start

        # By hand, whatever the attempts: back to the inbox, applied at the next start.
        assert await asyncio.to_thread(main, ["dead-letters", "--db", str(db), "--requeue"]) == 0
        assert "1 moved to webhook_inbox" in capsys.readouterr().out
        async with listening(listen_configs(tmp_path, server), db) as engine:
            await engine.listen("127.0.0.1", 0)
            await engine.join()
            assert engine.counts("acme").applied == 1
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT count(*) FROM webhook_dead_letters").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM webhook_inbox").fetchone() == (0,)
            assert conn.execute(
                "SELECT updated_at FROM orders WHERE store = 'acme' AND id = '7'"
            ).fetchone() == ("2031-01-01T00:00:00Z",)

        # One no attempt will apply: purged by the command, never applied.
        await failing_run(["d-2"])
        purge = ["dead-letters", "--db", str(db), "--store", "acme", "--purge"]
        assert await asyncio.to_thread(main, purge) == 0
        assert "1 deleted" in capsys.readouterr().out
        assert await asyncio.to_thread(main, [*purge, "--json"]) == 0
        assert orjson.loads(capsys.readouterr().out)["deleted"] == 0
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT count(*) FROM webhook_dead_letters").fetchone() == (0,)
            assert conn.execute("SELECT count(*) FROM webhook_inbox").fetchone() == (0,)
        both = ["dead-letters", "--db", str(db), "--requeue", "--purge"]
        assert main(both) == 2
        assert "--purge: not allowed with argument --requeue" in capsys.readouterr().err


async def test_attempts_add_up_over_a_requeue_by_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """``dead-letters --requeue`` keeps a letter's attempts in the inbox, so one that fails
    again is dead-lettered with the attempts of both runs (as the start-up requeue does)."""
    db = tmp_path / "subs.db"
    event = {"id": "d-2", "topic": "orders/update", "store": "acme"}
    body = orjson.dumps({**event, "data": {"id": 8, "updatedAt": "2031-01-01T00:00:00Z"}})
    sig = {"X-Service-Signature": signature_header_value(SECRETS["acme"], body)}

    async def broken(*args: Any) -> bool:
        raise DatabaseError("database subs.db: database is locked")

    def attempts(table: str) -> list[tuple[int]]:
        with contextlib.closing(sqlite3.connect(db)) as conn:
            return conn.execute(f"SELECT attempts FROM {table}").fetchall()

    async with fake_server(seed=15) as server:
        async with listening(listen_configs(tmp_path, server), db) as engine:
            monkeypatch.setattr(engine.sink, "upsert_record", broken)
            urls = await engine.listen("127.0.0.1", 0)
            async with (
                aiohttp.ClientSession() as session,
                session.post(urls["acme"], data=body, headers=sig) as resp,
            ):
                assert resp.status == 200
            await engine.join()
            monkeypatch.undo()
        assert attempts("webhook_dead_letters") == [(5,)]

        # By hand: the inbox keeps the 5 attempts made.
        argv = ["dead-letters", "--db", str(db), "--requeue"]
        assert await asyncio.to_thread(main, argv) == 0
        assert "1 moved" in capsys.readouterr().out
        assert attempts("webhook_inbox") == [(5,)]

        # Still failing at the next start: 5 more, 10 in all.
        async with listening(listen_configs(tmp_path, server), db) as engine:
            monkeypatch.setattr(engine.sink, "upsert_record", broken)
            await engine.listen("127.0.0.1", 0)
            await engine.join()
            monkeypatch.undo()
        assert attempts("webhook_dead_letters") == [(10,)]
        assert attempts("webhook_inbox") == []


async def test_the_webhook_tables_exist_before_the_first_event(tmp_path: Path) -> None:
    db = tmp_path / "subs.db"
    async with (
        fake_server(seed=14) as server,
        listening(listen_configs(tmp_path, server), db) as engine,
    ):
        await engine.listen("127.0.0.1", 0)
        with contextlib.closing(sqlite3.connect(db)) as conn:
            for name in ("webhook_dead_letters", "webhook_inbox"):
                assert conn.execute(f"SELECT count(*) FROM {name}").fetchone() == (0,)
