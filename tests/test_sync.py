"""``asyncsubs sync``: SQLite contents, resume after SIGKILL and Ctrl-C, restarts, config.

The fake server runs on its own event loop in a thread of the test process, so the command can
run in-process (``main([...])``) or as a subprocess that is killed; the records to compare with
come straight from the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import pickle
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest

import asyncsubs
from asyncsubs import Rate
from asyncsubs.__main__ import main
from asyncsubs.cli._display import PlainLines, live_row
from asyncsubs.cli._progress import Progress
from asyncsubs.cli._summaries import sync_summary
from asyncsubs.errors import ConfigError
from asyncsubs.limiting import PoolStats
from asyncsubs.stores import (
    ConfigFileError,
    PageCommitted,
    UnitDone,
    UnitStarted,
    load_config,
    parse_rate,
)
from asyncsubs.sync import DatabaseUnavailable, PageWrite, SyncEngine, run_round, sink_for
from asyncsubs.sync.sqlite import SQLiteSink, hold_database
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, serve_in_thread

RESOURCES = ("subscriptions", "customers", "orders")
SYNC_COMMAND = (sys.executable, "-m", "asyncsubs", "sync")
STORES = ("store-1", "store-2", "store-3")
# Loose client limits: these tests are about correctness, not pacing.
FAST_LIMITS = """
[defaults.limits]
global = "1000/s"
heavy = { subscriptions = "1000/s", customers = "1000/s", orders = "1000/s" }
"""


@pytest.fixture
def server() -> Iterator[FakeAdminServer]:
    stores = [
        FakeStoreConfig("store-1", records={"subscriptions": 130, "customers": 70, "orders": 101}),
        FakeStoreConfig("store-2", records={"subscriptions": 45, "customers": 0, "orders": 88}),
        FakeStoreConfig("store-3", records={"subscriptions": 60, "customers": 59, "orders": 61}),
    ]
    with serve_in_thread(stores=stores, rate_limits=None) as srv:
        yield srv


def write_config(
    tmp_path: Path, server: FakeAdminServer, extra: str = "", **store_extra: str
) -> Path:
    lines = ["[defaults]", "page_size = 25", FAST_LIMITS]
    for name in server.tokens:
        lines += [f'[stores."{name}"]', f'base_url = "{server.base_url}"']
        lines += [f'token_env = "{env_name(name)}"', store_extra.get(name, ""), ""]
    path = tmp_path / "stores.toml"
    path.write_text("\n".join(lines) + extra, encoding="utf-8")
    return path


def env_name(store: str) -> str:
    return "TOKEN_" + store.replace("-", "_").upper()


@pytest.fixture
def token_env(server: FakeAdminServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {env_name(name): token for name, token in server.tokens.items()}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def db_rows(db: Path, resource: str, store: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(
            f"SELECT id, status, customer_id, created_at, updated_at, raw FROM {resource}"
            " WHERE store = ? ORDER BY CAST(id AS INTEGER)",
            (store,),
        ).fetchall()


def state(db: Path) -> dict[tuple[str, str], dict[str, Any]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM asyncsubs_sync_state").fetchall()
    return {(r["store"], r["resource"]): dict(r) for r in rows}


def assert_exact(db: Path, server: FakeAdminServer, stores: Sequence[str] = STORES) -> None:
    """The database holds exactly the server's records: same ids, once each, raw as served."""
    for store in stores:
        for resource in RESOURCES:
            expected = server.records(store, resource)
            rows = db_rows(db, resource, store)
            assert [r[0] for r in rows] == [str(rec["id"]) for rec in expected], (store, resource)
            for row, record in zip(rows, expected, strict=True):
                assert row[5] == orjson.dumps(record).decode()
                assert row[1] == record.get("status")
                assert row[2] == (None if "customerId" not in record else str(record["customerId"]))
                assert row[3] == record.get("createdAt")
                assert row[4] == record.get("updatedAt")


# ---------------------------------------------------------------------------------------------
# In-process runs


def test_sync_three_stores_matches_the_server(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path, capsys: Any
) -> None:
    db = tmp_path / "subs.db"
    config = write_config(tmp_path, server)
    assert main(["sync", "--config", str(config), "--db", f"sqlite:///{db}"]) == 0
    assert_exact(db, server)
    saved = state(db)
    assert len(saved) == 9
    assert all(s["done"] == 1 and s["cursor"] is None for s in saved.values())
    out = capsys.readouterr().out
    total = sum(len(server.records(s, r)) for s in STORES for r in RESOURCES)
    assert f"{total:,} records from 3 stores" in out
    assert re.search(r"store-2\s+customers\s+done\s+0\s+1\s+0\b", out)


def test_the_command_lines_clients_say_so_and_the_librarys_do_not(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path
) -> None:
    """The user agent is the door's: ``sync`` names the command line before the library's."""
    config = write_config(tmp_path, server)
    server.clear_requests()
    assert main(["sync", "--config", str(config), "--db", str(tmp_path / "a.db"), "-q"]) == 0
    agents = {r.headers["User-Agent"] for r in server.requests}
    assert agents == {f"asyncsubs-cli asyncsubs/{asyncsubs.__version__}"}

    async def sync() -> None:
        configs = load_config(config, token_env)
        sink = sink_for(str(tmp_path / "b.db"))
        async with sink, SyncEngine(configs, sink, lambda event: None) as engine:
            await run_round(engine)

    server.clear_requests()
    asyncio.run(sync())
    assert {r.headers["User-Agent"] for r in server.requests} == {
        f"asyncsubs/{asyncsubs.__version__}"
    }


def test_finished_sync_starts_over_without_duplicates(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path
) -> None:
    db = tmp_path / "subs.db"
    config = write_config(tmp_path, server)
    args = ["sync", "--config", str(config), "--db", str(db), "--quiet"]
    assert main(args) == 0
    server.clear_requests()
    assert main(args) == 0
    assert_exact(db, server)
    first_requests = {}
    for request in server.requests:
        first_requests.setdefault((request.store, request.path.rsplit("/", 1)[-1]), request)
    assert len(first_requests) == 9
    assert all("afterCursor" not in r.query for r in first_requests.values())
    assert state(db)[("store-1", "subscriptions")]["run_pages"] == 6  # 130 records / 25


def test_resources_and_store_filters(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path
) -> None:
    db = tmp_path / "subs.db"
    config = write_config(tmp_path, server)
    args = ["sync", "--config", str(config), "--db", str(db), "--quiet", "--store", "store-3"]
    assert main([*args, "--resources", "orders,customers", "--max-stores", "1"]) == 0
    assert set(state(db)) == {("store-3", "orders"), ("store-3", "customers")}
    assert len(db_rows(db, "orders", "store-3")) == 61


@pytest.mark.parametrize(
    ("refusal", "said"), [(None, "INVALID_CURSOR"), (404, "NOT_FOUND"), (410, "GONE")]
)
def test_rejected_saved_cursor_starts_the_run_over(
    server: FakeAdminServer,
    token_env: Mapping[str, str],
    tmp_path: Path,
    capsys: Any,
    refusal: int | None,
    said: str,
) -> None:
    """A saved cursor the server refuses, as the fake server does (400) or as others may (404,
    410 Gone), starts the run over once."""
    db = tmp_path / "subs.db"
    config = write_config(tmp_path, server)
    args = ["sync", "--config", str(config), "--db", str(db), "--progress", "plain"]
    assert main(args) == 0
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "UPDATE asyncsubs_sync_state SET done = 0, cursor = 'not-a-cursor'"
            " WHERE store = 'store-1' AND resource = 'orders'"
        )
    if refusal is not None:
        body = {"success": False, "code": said, "message": "cursor expired", "data": None}
        server.enqueue(refusal, body, path="orders", store="store-1")
    capsys.readouterr()
    assert main(args) == 0
    assert f"store-1/orders: saved cursor rejected ({said}); starting over" in (
        capsys.readouterr().err
    )
    assert_exact(db, server)


def test_sync_stores_integers_beyond_64_bits_exactly(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path
) -> None:
    body = (
        b'{"success": true, "data": [{"id": 18446744073709551617, "n": -9223372036854775809},'
        b' {"id": 18446744073709551618, "n": "\xc3\xa9"}], "pageInfo": {"hasNextPage": false}}'
    )
    server.enqueue(200, body, path="orders", store="store-1")
    db = tmp_path / "subs.db"
    args = ["sync", "--config", str(write_config(tmp_path, server)), "--db", str(db), "-q"]
    try:
        assert main([*args, "--store", "store-1", "--resources", "orders"]) == 0
    finally:
        server.clear_scripted()
    assert [(row[0], row[5]) for row in db_rows(db, "orders", "store-1")] == [
        ("18446744073709551617", '{"id":18446744073709551617,"n":-9223372036854775809}'),
        ("18446744073709551618", '{"id":18446744073709551618,"n":"é"}'),  # as sent, not \u00e9
    ]


def test_incremental_filter_comes_from_the_previous_run(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path
) -> None:
    db = tmp_path / "subs.db"
    extra = {
        "store-1": 'incremental.subscriptions = { param = "updatedAtMin", field = "updatedAt" }'
    }
    config = write_config(tmp_path, server, **extra)
    args = ["sync", "--config", str(config), "--db", str(db), "--quiet", "--store", "store-1"]

    def subscription_queries() -> list[Mapping[str, str]]:
        return [r.query for r in server.requests if r.path.endswith("/subscriptions")]

    newest = max(r["updatedAt"] for r in server.records("store-1", "subscriptions"))
    # Run 1 knows nothing; run 2 starts from what was stored before run 1 began (nothing);
    # run 3 from what was stored before run 2 began. So changes during a run are never missed.
    for expected in (None, None, newest):
        server.clear_requests()
        assert main(args) == 0
        queries = subscription_queries()
        assert queries
        assert all(q.get("updatedAtMin") == expected for q in queries)
    assert_exact(db, server, stores=["store-1"])


# ---------------------------------------------------------------------------------------------
# Subprocesses: SIGKILL and Ctrl-C mid-way, then resume


def start_sync(config: Path, db: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*SYNC_COMMAND, "--config", str(config), "--db", str(db), "--progress-interval", "0.1"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def wait_for_progress(db: Path, proc: subprocess.Popen[bytes], records: int) -> None:
    """The one bounded wait: poll the database until some pages are committed (the bound is
    generous: a busy machine may take seconds to start the command)."""
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with contextlib.suppress(sqlite3.Error):
            with contextlib.closing(sqlite3.connect(db, timeout=1)) as conn:
                row = conn.execute("SELECT sum(run_records) FROM asyncsubs_sync_state").fetchone()
            if row[0] is not None and row[0] >= records:
                return
        time.sleep(0.01)
    raise AssertionError(f"no progress in the database (exit code {proc.poll()})")


@pytest.fixture
def slow_server() -> Iterator[FakeAdminServer]:
    counts = {"subscriptions": 300, "customers": 200, "orders": 400}
    with serve_in_thread(stores=3, records=counts, latency=0.015, rate_limits=None) as srv:
        yield srv


def check_committed_prefix(db: Path) -> None:
    """After a kill, each (store, resource) holds exactly the pages its cursor accounts for."""
    for (store, resource), saved in state(db).items():
        assert len(db_rows(db, resource, store)) == saved["run_records"]


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT", "SIGTERM"])
def test_killed_sync_resumes_with_exactly_the_servers_records(
    slow_server: FakeAdminServer, tmp_path: Path, how: str
) -> None:
    server = slow_server
    env = {env_name(name): token for name, token in server.tokens.items()}
    db = tmp_path / "subs.db"
    config = tmp_path / "stores.toml"
    config.write_text(write_config(tmp_path, server).read_text().replace("= 25", "= 10"))

    proc = start_sync(config, db, env)
    try:
        wait_for_progress(db, proc, 300)
        proc.send_signal(getattr(signal, how))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    saved = state(db)
    assert not all(s["done"] for s in saved.values()), "the run finished before it was stopped"
    check_committed_prefix(db)
    if how == "SIGKILL":
        assert proc.returncode == -signal.SIGKILL
    else:  # stopped cleanly: what was done is committed, a one-line note, no traceback
        assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143}[how]
        assert b"interrupted; every committed page is kept" in err
        assert b"Traceback" not in err
        # The summary counts the rows in the table of what was interrupted, too.
        lines = out.decode().splitlines()
        header = next(line for line in lines if line.startswith("store "))
        rows = slice(header.index("rows"), header.index("requests"))
        interrupted = [line for line in lines if re.match(r"store-\d\s+\w+\s+interrupted", line)]
        assert interrupted, out
        assert all(line[rows].strip().replace(",", "").isdigit() for line in interrupted), out
        # And the pages its state holds, the one committed as the signal came included.
        for line in interrupted:
            store, resource, _, records, pages, *_ = line.split()
            unit = saved[(store, resource)]
            assert (int(records.replace(",", "")), int(pages)) == (
                unit["run_records"],
                unit["run_pages"],
            ), out

    rerun = subprocess.run(
        [*SYNC_COMMAND, "--config", str(config), "--db", str(db)],
        env={**os.environ, **env},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert rerun.returncode == 0, rerun.stderr.decode()
    assert_exact(db, server)
    # Non-TTY progress: plain timestamped lines, no terminal control codes.
    err_text = rerun.stderr.decode()
    assert "\x1b[" not in err_text
    assert re.search(
        r"^\[\s*\d+\.\ds\] store-\d/\w+: resuming from its saved cursor$", err_text, re.M
    )
    assert re.search(
        r"^\[\s*\d+\.\ds\] store-\d/\w+: done, [\d,]+ records in \d+ pages", err_text, re.M
    )
    resumed_total = sum(
        int(m.replace(",", "")) for m in re.findall(r"done, ([\d,]+) records", err_text)
    )
    assert resumed_total < 3 * 900  # resumed, not pulled again from the start


async def test_a_page_committed_as_the_sync_is_stopped_is_counted(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path
) -> None:
    """The SQLite sink writes on a thread of its own, which a cancellation does not stop: the
    page being committed when Ctrl-C lands is in the database, and so in the progress."""
    configs = load_config(
        write_config(tmp_path, server), token_env, only_stores=["store-1"], resources=["orders"]
    )
    in_commit, release = threading.Event(), threading.Event()

    class Slow(SQLiteSink):
        def _commit_page(self, write: PageWrite) -> None:
            if (
                write.records
                and write.records[0]["id"] == server.records("store-1", "orders")[25]["id"]
            ):
                in_commit.set()
                release.wait(10)  # the second page: committed after the cancellation
            super()._commit_page(write)

    sink, progress = Slow(tmp_path / "subs.db"), Progress()

    async def sync() -> None:
        async with sink, SyncEngine(configs, sink, progress) as engine:
            await run_round(engine)

    task = asyncio.create_task(sync())
    assert await asyncio.to_thread(in_commit.wait, 10)
    task.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    row = progress.rows[("store-1", "orders")]
    saved = state(tmp_path / "subs.db")[("store-1", "orders")]
    assert (row.state, row.pages, row.records, row.rows) == ("interrupted", 2, 50, 50)
    assert (saved["run_pages"], saved["run_records"], saved["done"]) == (2, 50, 0)


# ---------------------------------------------------------------------------------------------
# Progress lines


def test_plain_progress_lines() -> None:
    progress = Progress()
    out = io.StringIO()
    display = PlainLines(progress, out, 1.0)
    progress.watch(display)
    progress(UnitStarted("acme", "orders", True, 40, Rate(1)))
    progress(PageCommitted("acme", "orders", 25, PoolStats()))
    progress(PageCommitted("acme", "orders", 25, PoolStats()))
    row = progress.rows[("acme", "orders")]
    display.tick()
    progress(UnitDone("acme", "orders", PoolStats(), 90))
    progress(UnitStarted("acme", "customers", False, 0, Rate(1)))
    progress(PageCommitted("acme", "customers", 1, PoolStats()))
    progress(UnitDone("acme", "customers", PoolStats(), 1))
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines[-1].startswith("acme/customers: done, 1 record in 1 page (")
    assert lines[-1].endswith("s); 1 row in the table for this store")
    assert lines[0] == "acme/orders: resuming from its saved cursor"
    assert lines[1].startswith("acme/orders: running (resumed), 50 records, 2 pages, ")
    assert lines[1].endswith("0 requests, 0 429s, 0 retries (+40 before resuming)")
    assert lines[2].startswith("acme/orders: done, 50 records in 2 pages (")
    assert lines[2].endswith("; 90 rows in the table for this store")
    # The live table's records cell says what the interrupted process committed, too.
    assert live_row(row, time.monotonic())[3] == "50 (+40 before)"
    # And so does the summary, in its row and its total.
    summary = io.StringIO()
    sync_summary(progress, 2.0, "subs.db", stream=summary)
    assert re.search(r"^acme\s+orders\s+done\s+50 \(\+40 before\)\s+2\s", summary.getvalue(), re.M)
    assert "51 records (+40 before resuming) from 1 store in 2.0s" in summary.getvalue()


# ---------------------------------------------------------------------------------------------
# Configuration


def test_config_file_full_example(tmp_path: Path) -> None:
    path = tmp_path / "stores.toml"
    path.write_text(
        """
[defaults]
page_size = 200
max_attempts = 4
[defaults.limits]
global = "40/s"
heavy = { subscriptions = "2/3s", orders = { n = 2, per = 3.0 } }

[stores.acme]
base_url = "https://acme.example"
token_env = "ACME_TOKEN"

[stores.globex]
base_url = "https://globex.example/"
token_env = "GLOBEX_TOKEN"
resources = ["orders"]
page_size = 50
timeout = 10
limits = { max_in_flight = 8, heavy = { orders = "1/s" } }
incremental.orders = { param = "updatedAtMin", field = "updatedAt" }
""",
        encoding="utf-8",
    )
    acme, globex = load_config(path, {"ACME_TOKEN": "a-1", "GLOBEX_TOKEN": "g-2"})
    assert (acme.store, acme.token, acme.page_size, acme.resources) == (
        "acme",
        "a-1",
        200,
        RESOURCES,
    )
    assert acme.retry.max_attempts == 4
    assert acme.limits.global_rate == parse_rate("40/1s")
    assert acme.limits.heavy["subscriptions"] == parse_rate("2/3s")
    assert acme.limits.heavy["customers"] == Rate.discover()  # not set: discovered
    assert globex.resources == ("orders",)
    assert (globex.page_size, globex.timeout, globex.limits.max_in_flight) == (50, 10.0, 8)
    assert globex.limits.heavy["orders"] == parse_rate("1/s")
    assert globex.limits.heavy["subscriptions"] == parse_rate("2/3s")
    assert globex.incremental["orders"].param == "updatedAtMin"
    assert "g-2" not in repr(globex)


def test_config_page_size_max_learns_where_defaults_pin_a_size(tmp_path: Path) -> None:
    path = tmp_path / "stores.toml"
    path.write_text(
        """
[defaults]
page_size = 200
[stores.acme]
base_url = "https://acme.example"
token_env = "ACME_TOKEN"
[stores.globex]
base_url = "https://globex.example"
token_env = "ACME_TOKEN"
page_size = "max"
[stores.initech]
base_url = "https://initech.example"
token_env = "ACME_TOKEN"
page_size = "largest"
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {"ACME_TOKEN": "a-1"})
    assert info.value.problems == (
        'stores.initech.page_size: must be a whole number >= 1 or "max" (the largest page, '
        "learned), got 'largest'",
    )
    path.write_text(path.read_text().replace('"largest"', "50"), encoding="utf-8")
    sizes = [c.page_size for c in load_config(path, {"ACME_TOKEN": "a-1"})]
    assert sizes == [200, "max", 50]


def test_config_collects_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "stores.toml"
    path.write_text(
        """
[defaults]
page_sise = 10
timeout = 0
[defaults.limits]
heavy = "abc"

[stores.a]
base_url = "http://example.com"
token_env = "A_TOKEN"
resources = ["orders", "refunds"]

[stores.b]
base_url = "https://b.example"
token_env = "B_TOKEN"
max_attempts = 0
limits = { global = "fast", heavy = { subscription = "3/s", orders = "0/s" }, max_in_flight = -1 }

[stores."c d"]
base_url = "http://127.0.0.1:notaport"
token_env = "A_TOKEN"
limits = { global = { per = 2.0 } }

[stores.".."]
base_url = "https://up.example"
token_env = "A_TOKEN"

[stores."a\\nb"]
base_url = "https://up.example"
token_env = "A_TOKEN"

[stores."x\\u001b[31m"]
base_url = "https://up.example"
token_env = "A_TOKEN"
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {"A_TOKEN": "x"})
    rate = 'a rate looks like "50/s", "2/3s", 50 (per second) or { n = 2, per = 3.0 }'
    assert info.value.problems == (
        "defaults.page_sise: unknown key (did you mean 'page_size'?)",
        "defaults.timeout: must be a number of seconds > 0, got 0",
        "defaults.limits.heavy: must be a table of resource = rate, got 'abc'",
        "stores.a.resources: unknown resource 'refunds' (known: subscriptions, customers, orders)",
        "stores.a.base_url: plain http:// would send the token unencrypted; use https:// (or "
        "allow_insecure = true on a trusted network)",
        "stores.b.max_attempts: must be a whole number >= 1, got 0",
        f"stores.b.limits.global: {rate}, got 'fast'",
        "stores.b.limits.heavy.subscription: unknown key (did you mean 'subscriptions'?)",
        "stores.b.limits.heavy.orders: a rate needs a whole number of requests >= 1, got '0/s'",
        "stores.b.limits.max_in_flight: must be a whole number >= 1, got -1",
        "stores.b.token_env: environment variable B_TOKEN is not set",
        "stores.\"c d\".limits.global: a rate table has exactly the keys n and per, got ['per']",
        'stores."c d".base_url: base_url is not a valid URL (check the port, 1-65535, and any '
        "[IPv6] brackets): got 'http://127.0.0.1:notaport'",
        'stores."..": a store id must not be . or ..',
        'stores."a\\nb": a store id must be printable (no control characters)',
        'stores."x\\u001b[31m": a store id must be printable (no control characters)',
    )
    # Never the library's internal names.
    assert not re.search(r"Rate\.|Limits\.|RetryPolicy\.", "\n".join(info.value.problems))


def test_a_secret_pasted_for_its_variables_name_is_not_shown(tmp_path: Path) -> None:
    """``token_env`` names a variable: a value that does not read as a name (upper-case words
    joined by ``_``) may be the secret itself, in upper case too, and is not repeated."""
    path = tmp_path / "stores.toml"
    secret = "SK7F3Q9ZL2M8X4HJ1"
    path.write_text(
        f'[stores.a]\nbase_url = "https://a.example"\ntoken_env = "{secret}"\n'
        '[stores.b]\nbase_url = "https://b.example"\ntoken_env = "B_TOKEN"\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {})
    assert info.value.problems == (
        "stores.a.token_env: environment variable (a name not like NAME_OF_VARIABLE, not shown: "
        "it may be a secret) is not set",
        "stores.b.token_env: environment variable B_TOKEN is not set",
    )


def test_config_problems_say_their_key_and_problem_and_pickle(tmp_path: Path) -> None:
    path = tmp_path / "stores.toml"
    path.write_text(
        '[stores.a]\nbase_url = "https://a.example"\ntoken_env = "A_TOKEN"\ntimeout = 0\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {"A_TOKEN": "x"}, resources=["refunds"])
    keyed = [(e.key, e.problem) for e in info.value.errors]
    assert keyed == [
        ("resources", "unknown resource 'refunds' (known: subscriptions, customers, orders)"),
        ("stores.a.timeout", "must be a number of seconds > 0, got 0"),
    ]
    assert info.value.problems == tuple(f"{key}: {problem}" for key, problem in keyed)
    # The command line names the parameters by its flags.
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {}, resources=["refunds"], names={"resources": "--resources"})
    assert info.value.problems[0].startswith("--resources: unknown resource 'refunds'")
    again = pickle.loads(pickle.dumps(info.value))
    assert (str(again), again.problems) == (str(info.value), info.value.problems)
    assert [(e.key, e.problem) for e in again.errors] == [
        (e.key, e.problem) for e in info.value.errors
    ]


def test_config_reports_each_key_of_a_store_that_is_wrong_in_several(tmp_path: Path) -> None:
    # Each setting is checked by AdminClient on its own: a bad URL is found while the token
    # variable is unset, and a plain http:// URL that is allowed leaves the token's problem.
    path = tmp_path / "stores.toml"
    path.write_text(
        """
[stores.a]
base_url = "http://a.example"
token_env = "A_TOKEN"
version = "04/2026"

[stores.b]
base_url = "https://b.example"
token_env = "B_TOKEN"

[stores.c]
base_url = "http://c.example"
token_env = "C_TOKEN"
allow_insecure = true
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {"B_TOKEN": "", "C_TOKEN": "t\n"})
    assert info.value.problems == (
        "stores.a.version: version must look like '2026-04', got '04/2026'",
        "stores.a.base_url: plain http:// would send the token unencrypted; use https:// (or "
        "allow_insecure = true on a trusted network)",
        "stores.a.token_env: environment variable A_TOKEN is not set",
        "stores.b.token_env: environment variable B_TOKEN is empty",
        "stores.c.token_env: C_TOKEN: token contains control characters (CR/LF?); check how it "
        "was loaded",
    )


def test_rate_tables_need_both_keys_and_values_in_range() -> None:
    assert parse_rate({"n": 2, "per": 3.0}) == parse_rate("2/3s")
    assert parse_rate(5) == parse_rate("5/s")
    for bad in ({"n": 2}, {"per": 2.0}, {"n": 0, "per": 1}, "0/s", "1/0s", -1, 2.5, True, "abc"):
        with pytest.raises(ConfigError) as info:
            parse_rate(bad)
        assert "Rate." not in str(info.value)


def sqlite_path(url: str) -> Path:
    sink = sink_for(url)
    assert isinstance(sink, SQLiteSink)
    return sink.path


def test_db_urls() -> None:
    assert sqlite_path("sqlite:///subs.db") == Path("subs.db")
    assert sqlite_path("sqlite:////tmp/subs.db") == Path("/tmp/subs.db")
    assert sqlite_path("plain/path.db") == Path("plain/path.db")
    assert sink_for("postgresql://u:pw@host/db").where == "postgresql://u@host/db"
    assert sink_for("postgres://u:pw@host:5433/db").where == "postgres://u@host:5433/db"
    # A password with '/', '#', '?' or '@' in it, a password in the query, no host: never shown.
    for url, where in [
        ("postgresql://sync:2024/Secret@127.0.0.1:1/subs", "postgresql://sync@127.0.0.1:1/subs"),
        ("postgresql://sync:7#Secret@db.example/subs", "postgresql://sync@db.example/subs"),
        ("postgresql://sync:a?b@Secret@db.example/subs", "postgresql://sync@db.example/subs"),
        ("postgresql://db.example/subs?password=Secret", "postgresql://db.example/subs"),
        ("postgresql://sync:Secret/subs", "postgresql://sync/subs"),
        ("postgresql://[::1]:5432/subs", "postgresql://[::1]:5432/subs"),
        ("postgresql:///subs?host=/tmp", "postgresql:///subs"),
    ]:
        assert sink_for(url).where == where
        assert "Secret" not in repr(sink_for(url))
    for bad in ("mysql://host/db", "sqlite:///", "sqlite:///:memory:"):
        with pytest.raises(ConfigError):
            sink_for(bad)


def test_a_db_that_is_a_directory_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory; name a database file in it"):
        sink_for(f"sqlite:///{tmp_path}")


@pytest.mark.parametrize("url", ["sqlite:///subs.db?mode=ro", "sqlite:///subs.db#x"])
def test_a_sqlite_url_with_a_query_is_a_usage_error(url: str) -> None:
    """It was part of the file's name: ``sqlite:///?mode=ro`` synced into a file "?mode=ro"."""
    with pytest.raises(ConfigError, match=r"names a file and nothing more \(no \?query"):
        sink_for(url)


_NOT_ROOT = "setpriv", "--bounding-set", "-dac_override,-dac_read_search"


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root, and no setpriv"
)
def test_a_db_that_cannot_be_written_is_a_usage_error(tmp_path: Path) -> None:
    """Found before any request (exit 2, as the table of exit codes says), not at the first
    page's write (exit 1)."""
    db = tmp_path / "subs.db"
    db.touch(mode=0o444)
    config = tmp_path / "stores.toml"
    config.write_text('[stores.a]\nbase_url = "http://127.0.0.1:1/v1"\ntoken_env = "A_T"\n')
    command = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config), "--db", str(db)]
    as_user = [*_NOT_ROOT, *command] if os.geteuid() == 0 else command  # root writes anything
    done = subprocess.run(
        as_user, env={**os.environ, "A_T": "t"}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == f"asyncsubs: error: --db: cannot write {db}: permission denied\n"


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None, reason="root, and no setpriv"
)
def test_sync_status_in_a_read_only_directory_says_what_sqlite_needs(tmp_path: Path) -> None:
    """A WAL database is read through a -shm file SQLite makes beside it: in a directory that
    cannot be written, the error says so rather than "attempt to write" alone."""
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "subs.db"
    asyncio.run(_made(db))
    folder.chmod(0o555)
    command = [sys.executable, "-m", "asyncsubs", "sync-status", "--db", str(db)]
    as_user = [*_NOT_ROOT, *command] if os.geteuid() == 0 else command
    try:
        done = subprocess.run(as_user, capture_output=True, text=True, timeout=60)
    finally:
        folder.chmod(0o755)
    assert done.returncode == 1, done.stderr
    assert f"{folder} must be writable)" in done.stderr, done.stderr


async def _made(db: Path) -> None:
    sink = SQLiteSink(db)
    await sink.open()
    await sink.aclose()


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_db_that_is_a_device_fails_before_anything_is_created(
    tmp_path: Path, capsys: Any
) -> None:
    made = [Path("/dev/full" + suffix) for suffix in (".asyncsubs-lock", "-journal")]
    before = [path.exists() for path in made]
    config = tmp_path / "stores.toml"
    config.write_text('[stores.a]\nbase_url = "http://127.0.0.1:1/v1"\ntoken_env = "A_T"\n')
    try:
        assert main(["sync", "--config", str(config), "--db", "/dev/full"]) == 2
        err = capsys.readouterr().err
        assert (
            err == "asyncsubs: error: --db: /dev/full is not a regular file; name a database file\n"
        )
        assert [path.exists() for path in made] == before
    finally:
        for path, existed in zip(made, before, strict=True):
            if not existed:
                path.unlink(missing_ok=True)


async def test_writes_queued_behind_one_that_waited_out_a_lock_fail_with_it(
    tmp_path: Path,
) -> None:
    """Another connection holds the write lock: the write ahead waits the busy timeout and
    fails, and those queued behind it meanwhile fail with it instead of waiting as long again
    each (a sync of many units would be silent, and deaf to SIGTERM, for units x timeout)."""
    db = tmp_path / "subs.db"
    sink = SQLiteSink(db, busy_timeout=0.3)
    await sink.open()
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        writes = (sink.upsert_record("s", "orders", {"id": i}) for i in range(5))
        failures = await asyncio.gather(*writes, return_exceptions=True)
        holder.execute("ROLLBACK")
        assert all(isinstance(f, DatabaseUnavailable) for f in failures), failures
        ahead = [f for f in failures if "a write ahead of this one waited 0.3s" not in str(f)]
        assert len(ahead) == 1, failures
        # A write queued once the lock is gone waits its own busy timeout, and goes through.
        assert await sink.upsert_record("s", "orders", {"id": 9})
        assert await sink.count("s", "orders") == 1
        # Closing, queued behind a write waiting out a lock, closes (it takes no lock).
        conn = sink.conn
        holder.execute("BEGIN IMMEDIATE")
        write = asyncio.ensure_future(sink.upsert_record("s", "orders", {"id": 10}))
        await asyncio.sleep(0)  # the write queued first
        await sink.aclose()
        with pytest.raises(DatabaseUnavailable):
            await write
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")
    finally:
        holder.close()
        await sink.aclose()


def test_the_lock_file_goes_with_its_holder_and_never_locks_a_removed_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "subs.db"
    lock = tmp_path / "subs.db.asyncsubs-lock"
    with hold_database(db):
        assert lock.exists()
        with (
            pytest.raises(ConfigError, match="in use by another asyncsubs command"),
            hold_database(db),
        ):
            pass
        late = os.open(lock, os.O_RDWR)  # opened just before its holder leaves
    assert not lock.exists()
    # The late opener then gets the lock of the removed file: it must lock the one there now.
    real_open = os.open
    opened: list[str] = []

    def late_first(path: Any, flags: int, mode: int = 0o777) -> int:
        opened.append(str(path))
        return os.dup(late) if len(opened) == 1 else real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", late_first)
    try:
        with hold_database(db):
            monkeypatch.undo()
            assert opened == [str(lock), str(lock)]
            assert orjson.loads(lock.read_bytes())["pid"] == os.getpid()
            with (
                pytest.raises(ConfigError, match="in use by another asyncsubs command"),
                hold_database(db),
            ):
                pass
    finally:
        os.close(late)
    assert not lock.exists()


def test_sync_status_on_a_database_no_sync_wrote_says_so(tmp_path: Path, capsys: Any) -> None:
    db = tmp_path / "other.db"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    assert main(["sync-status", "--db", str(db)]) == 0
    out = capsys.readouterr()
    assert out.err == (
        f"asyncsubs: no units: {db} is not a sync database (no sync has written to it)\n"
    )
    assert "0 units" not in out.out
    with contextlib.closing(sqlite3.connect(db)) as conn:  # nothing created
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]


@pytest.mark.parametrize(
    ("toml", "env", "message"),
    [
        ("[stores.a\n", {}, "invalid TOML"),
        ('[stores.a]\nbase_url = "{url}"\ntoken_env = "NOPE_TOKEN"\n', {}, "NOPE_TOKEN"),
        (
            '[stores.a]\nbase_url = "{url}"\ntoken_env = "A_TOKEN"\nresources = ["refunds"]\n',
            {"A_TOKEN": "t"},
            "unknown resource 'refunds'",
        ),
        (
            '[defaults.limits]\nheavy = "abc"\n',
            {},
            "asyncsubs: error: defaults.limits.heavy: must be a table of resource = rate",
        ),
    ],
)
def test_config_errors_exit_2_before_any_request(
    server: FakeAdminServer,
    tmp_path: Path,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
    toml: str,
    env: dict[str, str],
    message: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = tmp_path / "stores.toml"
    good = f'\n[stores.store-1]\nbase_url = "{server.base_url}"\ntoken_env = "T1"\n'
    monkeypatch.setenv("T1", server.store("store-1").token)
    path.write_text(toml.replace("{url}", server.base_url) + good, encoding="utf-8")
    server.clear_requests()
    assert main(["sync", "--config", str(path), "--db", str(tmp_path / "x.db")]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert all(line.startswith("asyncsubs: error: ") for line in err.splitlines())
    assert server.requests == []
    assert not (tmp_path / "x.db").exists()


def test_database_that_is_not_sqlite_exits_1(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path, capsys: Any
) -> None:
    db = tmp_path / "not.db"
    db.write_bytes(b"this is not a database, just text " * 100)
    config = write_config(tmp_path, server)
    assert main(["sync", "--config", str(config), "--db", str(db), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"asyncsubs: error: database {db}: ")
    assert main(["sync", "--config", str(config), "--db", str(tmp_path / "no" / "x.db")]) == 2


def test_second_sync_on_a_database_in_use_exits_2_naming_the_holder(
    server: FakeAdminServer, token_env: Mapping[str, str], tmp_path: Path, capsys: Any
) -> None:
    db = tmp_path / "subs.db"
    config = write_config(tmp_path, server)
    args = ["sync", "--config", str(config), "--db", f"sqlite:///{db}", "--quiet"]
    server.clear_requests()
    with hold_database(db):  # as a first sync still running would
        assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        f"asyncsubs: error: --db: {db} is in use by another asyncsubs command (pid "
        f"{os.getpid()} on host {socket.gethostname()}, since {err.split('since ')[1]}"
    )
    assert err.endswith("); run one sync per database at a time\n")
    assert server.requests == []  # nothing resumed, nothing sent
    assert main(args) == 0  # the lock goes with its holder
    assert_exact(db, server)
    assert not (tmp_path / "subs.db.asyncsubs-lock").exists()  # and its file with a clean exit


def test_a_database_in_use_is_in_use_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real.db").touch()
    (tmp_path / "alias.db").symlink_to(tmp_path / "real.db")
    with (
        hold_database(tmp_path / "real.db"),
        pytest.raises(ConfigError, match="in use"),
        hold_database(tmp_path / "alias.db"),
    ):
        pass


@pytest.mark.parametrize("pasted", ["tok_SECRET_123", "tok-SECRET-123"])
def test_a_token_pasted_as_token_env_is_not_shown(tmp_path: Path, pasted: str) -> None:
    path = tmp_path / "stores.toml"
    path.write_text(
        f'[stores.a]\nbase_url = "https://a.example"\ntoken_env = "{pasted}"\n', encoding="utf-8"
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {})
    assert pasted not in str(info.value)
    assert "stores.a.token_env" in str(info.value)


def test_config_sets_the_pacer_margins_and_server_limits(tmp_path: Path) -> None:
    path = tmp_path / "stores.toml"
    path.write_text(
        """
[defaults.limits]
max_margin = 0.2
server_limits = "follow"

[stores.a]
base_url = "https://a.example"
token_env = "A_TOKEN"
limits = { safety_margin = 0.01 }

[stores.b]
base_url = "https://b.example"
token_env = "A_TOKEN"
limits = { safety_margin = 0.5, server_limits = "always" }
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {"A_TOKEN": "x"})
    assert info.value.problems == (
        "stores.b.limits.server_limits: must be one of lower, follow, ignore, got 'always'",
    )
    path.write_text(path.read_text().replace('"always"', '"ignore"'), encoding="utf-8")
    with pytest.raises(ConfigFileError) as info:
        load_config(path, {"A_TOKEN": "x"})
    assert info.value.problems == ("stores.b.limits: max_margin must be >= safety_margin",)
    path.write_text(path.read_text().replace("0.5", "0.1"), encoding="utf-8")
    a, b = load_config(path, {"A_TOKEN": "x"})
    assert (a.limits.safety_margin, a.limits.max_margin) == (0.01, 0.2)
    assert (a.limits.server_limits, b.limits.server_limits) == ("follow", "ignore")
