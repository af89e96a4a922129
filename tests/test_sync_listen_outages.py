"""``sync --listen`` is a service: it outlives its database's bad moments, and tells its totals.

Each test runs the command as a child process and reads its stderr line by line, waiting on
what it says (with a deadline), never on time: an SQLite database locked by another process
past the busy timeout (``--db-timeout`` set low), a PostgreSQL server stopped and started
under it. Afterwards it still runs, a new delivery is accepted and applied, and every
delivery it acknowledged is in the database. With ``--log-format json`` its last event carries
the totals the summary tables show.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from postgres_fixtures import postgres_server_fixture
from redis_fixtures import RedisServer, own_redis_server_fixture
from test_sync_listen import SECRETS, environment, fake_server, listen_configs, write_config

from asyncsubs.stores import Message
from asyncsubs.sync import DatabaseError, DatabaseUnavailable, ListenSync, sink_for
from asyncsubs.testing import FakeAdminServer, no_waiting
from asyncsubs.testing._ports import free_port
from asyncsubs.testing._postgres import PostgresServer
from asyncsubs.webhooks import WebhookReceiver, signature_header_value

__all__ = ["own_redis_server_fixture", "postgres_server_fixture"]


#: Deliveries are changes of acme's customers, stamped later than anything the server has: a
#: reconciliation pull never overwrites them, so each one's row shows whether it was applied.
def stamp(i: int) -> str:
    """The ``updatedAt`` of change ``i``: one second after change ``i - 1``'s."""
    moment = datetime.datetime(2031, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=i)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


class Listening:
    """A ``sync --listen`` child process and the stderr lines it wrote so far."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.urls: dict[str, str] = {}

    async def until(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """Read stderr until a line matches ``pattern``; fails if the process ends first."""
        assert self.proc.stderr is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = (await self.proc.stderr.readline()).decode()
                    assert line, f"sync --listen ended: {''.join(self.lines)}"
                    self.lines.append(line)
                    if url := re.search(r"webhooks of store (\w+): POST (http://[^\s\"]+)", line):
                        self.urls[url[1]] = url[2]
                    if match := re.search(pattern, line):
                        return match
        except TimeoutError:
            raise AssertionError(f"{pattern!r} not said: {''.join(self.lines)}") from None

    async def stop(self) -> tuple[str, str]:
        """SIGTERM, then its stdout and the rest of its stderr."""
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            out, err = await self.proc.communicate()
        self.lines.append(err.decode())
        return out.decode(), "".join(self.lines)


@contextlib.asynccontextmanager
async def sync_listen(
    config: Path, db: str, env: Mapping[str, str], *options: str, ready: str | None = None
) -> AsyncIterator[Listening]:
    """``sync --listen`` on ``db``, reconciling every 0.2 s, once its initial sync is done
    (``ready``: once it said that, instead)."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "asyncsubs", "sync", "--config", str(config), "--db", db),
        *("--listen", "127.0.0.1:0", "--reconcile-every", "0.2", *options),
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    listening = Listening(proc)
    try:
        await listening.until(ready or "initial sync done")
        yield listening
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


class Sender:
    """Acme's sender: one change at a time, each retried while answered 503 (as a real sender
    retries), until told to stop; ``acknowledged`` maps customer ids to the stamps of the
    changes answered 200."""

    def __init__(self, url: str, customers: list[dict[str, Any]]) -> None:
        self.url = url
        self.customers = customers
        self.acknowledged: dict[str, str] = {}
        self.unavailable = 0
        self._sent = 0

    async def send(self, session: aiohttp.ClientSession) -> None:
        """The next change, until it is acknowledged."""
        i = self._sent
        self._sent += 1
        # Round the customers again for a long outage: each change is newer than the last.
        record = {**self.customers[i % len(self.customers)], "updatedAt": stamp(i)}
        body = orjson.dumps(
            {"id": f"evt-{i}", "topic": "customers/update", "store": "acme", "data": record}
        )
        headers = {"X-Service-Signature": signature_header_value(SECRETS["acme"], body)}
        while True:
            async with session.post(self.url, data=body, headers=headers) as resp:
                if resp.status == 200:
                    self.acknowledged[str(record["id"])] = record["updatedAt"]
                    return
                assert resp.status == 503, await resp.text()
                self.unavailable += 1
                await asyncio.sleep(0.05)  # a sender's pause before its retry

    async def run(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                await self.send(session)
                await asyncio.sleep(0.05)


async def applied(read: Callable[[], Mapping[str, str | None]], want: Mapping[str, str]) -> None:
    """Wait (30 s at most) until every acknowledged change is in the database."""
    missing: dict[str, str] = {}
    try:
        async with asyncio.timeout(30):
            while True:
                have = await asyncio.to_thread(read)
                missing = {i: stamp for i, stamp in want.items() if have.get(i) != stamp}
                if not missing:
                    return
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"acknowledged, not applied: {missing}") from None


async def survive(
    listening: Listening,
    server: FakeAdminServer,
    read: Callable[[], Mapping[str, str | None]],
    fault: Callable[[], Awaitable[None]],
    repair: Callable[[], Awaitable[None]],
    said: str,
) -> str:
    """Deliveries go on while ``fault`` breaks the database until the command says ``said``
    (twice: it went on after the first), and after ``repair``: the command is still running,
    accepts and applies a new delivery, and has applied every change it acknowledged. Returns
    what the command wrote on stderr."""
    sender = Sender(listening.urls["acme"], server.records("acme", "customers")[:60])
    stop = asyncio.Event()
    async with aiohttp.ClientSession() as session:
        await sender.send(session)
        await applied(read, sender.acknowledged)
        sending = asyncio.create_task(sender.run(stop))
        try:
            await fault()
            await listening.until(said)
            await listening.until(said)
            await repair()
            await listening.until(r"reconciliation \d+ done after \d+ failed attempts?")
        finally:
            stop.set()
            await sending
        assert listening.proc.returncode is None
        await sender.send(session)  # a new delivery, after the database is back
    await applied(read, sender.acknowledged)
    assert sender.unavailable > 0  # the database's failure was answered 503, not 200
    print(f"acknowledged {len(sender.acknowledged)}, answered 503 {sender.unavailable} times")
    out, text = await listening.stop()
    assert listening.proc.returncode == 143, text
    assert "Traceback" not in text
    assert "asyncsubs: error:" not in text, text
    assert re.search(r"^acme\s+\d", out, re.M)  # the summary, as after any stop
    return text


def sqlite_customers(db: Path) -> dict[str, str | None]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT id, updated_at FROM customers WHERE store = 'acme'")
        return dict(rows.fetchall())


class LockHolder:
    """Another process holding an SQLite database's write lock: a write transaction left open
    from ``lock`` until ``unlock``."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.proc: asyncio.subprocess.Process | None = None

    async def lock(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "import sqlite3, sys\n"
            "conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)\n"
            "conn.execute('BEGIN IMMEDIATE')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n",
            str(self.db),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        assert await self.proc.stdout.readline() == b"locked\n"

    async def unlock(self) -> None:
        assert self.proc is not None
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"\n")
        await self.proc.stdin.drain()
        assert await self.proc.wait() == 0


async def started_while_broken(
    tmp_path: Path,
    db: str,
    read: Callable[[], Mapping[str, str | None]],
    fault: Callable[[], Awaitable[None]],
    repair: Callable[[], Awaitable[None]],
    *options: str,
) -> str:
    """``sync --listen`` started while ``fault`` keeps its database from opening: it says so
    (twice: it went on after the first) and waits; after ``repair`` it runs its initial sync and
    applies a delivery. Returns what it wrote on stderr."""
    await fault()
    said = r"opening the database failed: database \S+: .*; trying again in"
    async with (
        fake_server(seed=33) as server,
        sync_listen(
            write_config(tmp_path, server), db, environment(server), *options, ready=said
        ) as listening,
    ):
        await listening.until(said)
        await repair()
        await listening.until(r"database \S+ opened after \d+ failed attempts")
        await listening.until("initial sync done")
        sender = Sender(listening.urls["acme"], server.records("acme", "customers")[:1])
        async with aiohttp.ClientSession() as session:
            await sender.send(session)
        await applied(read, sender.acknowledged)
        out, text = await listening.stop()
    assert listening.proc.returncode == 143, text
    assert "Traceback" not in text
    assert "asyncsubs: error:" not in text, text
    assert re.search(r"^acme\s+\d", out, re.M)  # the summary, as after any stop
    return text


async def test_a_database_locked_at_start_is_waited_for(tmp_path: Path) -> None:
    """Started while another process holds the SQLite write lock past the busy timeout, the
    service says so and tries again until the lock is released, then goes on."""
    db = tmp_path / "subs.db"
    holder = LockHolder(db)
    read = lambda: sqlite_customers(db)  # noqa: E731
    options = ("--db-timeout", "0.3")
    text = await started_while_broken(tmp_path, str(db), read, holder.lock, holder.unlock, *options)
    assert f"opening the database failed: database {db}: database is locked; trying" in text


async def test_a_postgresql_down_at_start_is_waited_for(
    tmp_path: Path, own_postgres: PostgresServer
) -> None:
    """Started while its PostgreSQL server is down, the service says so and tries again until
    the server is back, then goes on."""
    import psycopg

    url = own_postgres.create_database()

    def customers() -> dict[str, str | None]:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute("SELECT id, updated_at FROM customers WHERE store = 'acme'")
            return dict(rows.fetchall())

    text = await started_while_broken(
        tmp_path,
        url,
        customers,
        lambda: asyncio.to_thread(own_postgres.pause),
        lambda: asyncio.to_thread(own_postgres.resume),
        "--db-timeout",
        "0.5",
    )
    assert "no answer" in text or "connection" in text, text


@pytest.mark.parametrize("wrong", ["database", "role"])
async def test_a_database_no_wait_mends_is_not_waited_for(
    tmp_path: Path, postgres_server: PostgresServer, wrong: str
) -> None:
    """A database or role that does not exist is a mistake in the URL, not an outage: the
    service says so at once and exits 1, as before it waited for databases at its start."""
    url = postgres_server.url("no_such_database")
    if wrong == "role":
        url = postgres_server.url().replace("asyncsubs@", "no_such_role@")
    async with fake_server(seed=38) as server:
        config = write_config(tmp_path, server)
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "asyncsubs", "sync", "--config", str(config), "--db", url),
            *("--listen", "127.0.0.1:0", "--db-timeout", "30"),
            env={**os.environ, **environment(server)},
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(20):  # well before the 30 s it would wait in vain
                _, raw = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    err = raw.decode()
    assert proc.returncode == 1, err
    assert f'"no_such_{wrong}" does not exist' in err
    assert "trying again" not in err


async def test_a_database_locked_past_the_busy_timeout_fails_pulls_not_the_service(
    tmp_path: Path,
) -> None:
    """Another process holds the SQLite write lock past the busy timeout: each pull meanwhile
    fails with one line and is tried again, deliveries are answered 503, and once the lock is
    released the command goes on."""
    db = tmp_path / "subs.db"
    holder = LockHolder(db)
    async with fake_server(seed=31) as server:
        config = write_config(tmp_path, server)
        env = environment(server)
        async with sync_listen(config, str(db), env, "--db-timeout", "0.3") as listening:
            text = await survive(
                listening,
                server,
                lambda: sqlite_customers(db),
                holder.lock,
                holder.unlock,
                r"reconciliation \d+ failed: database \S+: database is locked; trying again in",
            )
    assert f"database {db}: database is locked; trying again in 0.2s" in text
    # The receiver says once that deliveries are answered 503, and once that they are not
    # (an outage is two lines however many deliveries it refuses).
    failing = text.count("not written to the inbox (OperationalError: database is locked)")
    back = len(re.findall(r"inbox is written again, after \d+ deliveries answered 503", text))
    assert failing == back >= 1, text


@pytest.fixture(name="own_postgres")
def own_postgres_fixture(postgres_server: PostgresServer) -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own, to stop and start (the session's one serves
    the other tests); where the session's is missing, the test skips as theirs do."""
    server = PostgresServer(postgres_server.bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


def test_a_restarted_servers_port_is_not_one_the_kernel_hands_out() -> None:
    """The PostgreSQL and Redis servers these tests restart are down for a moment: their port
    must lie below the range from which the kernel picks the ports of port-0 binds and outgoing
    connections, or one of those may hold it when the server comes back."""
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if not ephemeral.exists():
        pytest.skip("no ephemeral port range to keep out of")
    start = int(ephemeral.read_text().split()[0])
    assert all(free_port() < start for _ in range(50))
    cluster = PostgresServer(Path("/nonexistent"))  # not started: its port is chosen already
    shutil.rmtree(cluster.root)
    assert cluster.port < start


async def test_a_postgresql_restart_fails_pulls_not_the_service(
    tmp_path: Path, own_postgres: PostgresServer
) -> None:
    """The PostgreSQL server is stopped (every connection cut, new ones refused) and started
    again: each pull meanwhile fails with one line and is tried again, deliveries are answered
    503, and once the server is back the command goes on on new connections."""
    import psycopg

    url = own_postgres.create_database()

    def customers() -> dict[str, str | None]:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute("SELECT id, updated_at FROM customers WHERE store = 'acme'")
            return dict(rows.fetchall())

    async with fake_server(seed=32) as server:
        config = write_config(tmp_path, server)
        env = environment(server)
        async with sync_listen(config, url, env, "--db-timeout", "1") as listening:
            text = await survive(
                listening,
                server,
                customers,
                lambda: asyncio.to_thread(own_postgres.pause),
                lambda: asyncio.to_thread(own_postgres.resume),
                rf"(initial sync|reconciliation \d+) failed: database {re.escape(url)}: ",
            )
    # One line per failed pull, none of psycopg's own about each reconnection attempt.
    assert "error connecting in 'asyncsubs'" not in text
    assert "reconnection attempt" not in text


async def test_the_last_json_event_carries_the_totals_the_summary_shows(tmp_path: Path) -> None:
    """Deliveries accepted just before the stop, long before the next periodic ``webhooks``
    event: the ``summary`` event at the stop counts them, as the tables on stdout do."""
    db = tmp_path / "subs.db"
    async with fake_server(seed=33) as server:
        config = write_config(tmp_path, server)
        env = environment(server)
        options = ("--log-format", "json", "--progress-interval", "3600")
        async with sync_listen(config, str(db), env, *options) as listening:
            sender = Sender(listening.urls["acme"], server.records("acme", "customers")[:20])
            async with aiohttp.ClientSession() as session:
                for _ in range(20):
                    await sender.send(session)
            out, text = await listening.stop()
    assert listening.proc.returncode == 143, text
    events = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    assert not [e for e in events if e["event"] == "webhooks" and e["accepted"]]  # none sampled
    summary = events[-2]  # before the note that says how to continue
    assert summary["event"] == "summary", events[-3:]
    assert events[-1]["event"] == "note"
    assert summary["webhooks"]["accepted"] == summary["webhooks"]["applied"] == 20
    acme = summary["webhook_stores"]["acme"]
    assert (acme["accepted"], acme["applied"], acme["kept"], acme["lost"]) == (20, 20, 0, 0)
    assert summary["webhook_stores"]["globex"]["accepted"] == 0
    # The tables on stdout say the same.
    table = re.search(r"^acme\s+(\d+)\s+(\d+)\s+(\d+)\s", out, re.M)
    assert table is not None, out
    assert [int(n) for n in table.groups()] == [20, 0, 20]
    pulled = re.search(r"^([\d,]+) records? pulled in (\d+) runs?", out, re.M)
    assert pulled is not None, out
    assert summary["records"] == int(pulled[1].replace(",", "")) >= 560
    assert summary["runs"] == int(pulled[2])
    assert {(u["store"], u["resource"]) for u in summary["units"]} == {
        (store, resource)
        for store in ("acme", "globex")
        for resource in ("subscriptions", "customers", "orders")
    }
    assert summary["database"] == str(db)


async def test_a_sync_ends_with_a_json_summary_event(tmp_path: Path, capsys: Any) -> None:
    from asyncsubs.__main__ import main

    db = tmp_path / "subs.db"
    async with fake_server(seed=34) as server:
        config = write_config(tmp_path, server)
        env = environment(server)
        command = ["sync", "--config", str(config), "--db", str(db), "--log-format", "json"]
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            assert await asyncio.to_thread(main, command) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.err.splitlines()[-1])
    assert summary["event"] == "summary"
    assert summary["records"] == 560  # 120 * 3 + 70 + 40 + 90
    assert {u["state"] for u in summary["units"]} == {"done"}
    assert "webhooks" not in summary
    assert "560 records from 2 stores" in captured.out


async def test_a_redis_restart_fails_units_not_the_service(
    tmp_path: Path, own_redis_server: RedisServer
) -> None:
    """Redis pacing every store stops and starts: the units of the pulls meanwhile fail (no
    request goes out unpaced) and are pulled again by a later reconciliation; deliveries do
    not need Redis and are applied throughout."""
    db = tmp_path / "subs.db"
    async with fake_server(seed=35) as server:
        config = write_config(tmp_path, server)
        env = environment(server)
        options = ("--redis", own_redis_server.url)
        async with sync_listen(config, str(db), env, *options) as listening:
            sender = Sender(listening.urls["acme"], server.records("acme", "customers")[:10])
            async with aiohttp.ClientSession() as session:
                await asyncio.to_thread(own_redis_server.stop)
                await listening.until(r"reconciliation \d+ done: .*, 6 failed \(retried next")
                await sender.send(session)
                await applied(lambda: sqlite_customers(db), sender.acknowledged)
                await asyncio.to_thread(own_redis_server.start)
                await listening.until(r"reconciliation \d+ done: [\d,]+ records pulled; next")
                await sender.send(session)
            await applied(lambda: sqlite_customers(db), sender.acknowledged)
            _, text = await listening.stop()
    assert listening.proc.returncode == 143, text
    assert "Traceback" not in text
    assert "asyncsubs: error:" not in text
    assert "LimiterUnavailableError" in text


class Said:
    """The ``Message`` lines a ``ListenSync`` told (its observer), to wait on."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, event: object) -> None:
        if isinstance(event, Message):
            self.lines.append(event.text)

    def saying(self, pattern: str) -> Callable[[], re.Match[str] | None]:
        return lambda: next(filter(None, (re.search(pattern, t) for t in self.lines)), None)


async def until(check: Callable[[], object]) -> Any:
    """What ``check`` finds, polled (30 s at most)."""
    async with asyncio.timeout(30):
        while True:
            if found := check():
                return found
            await asyncio.sleep(0.01)


async def test_events_wait_for_a_database_that_cannot_be_written_now(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event acknowledged before the database became unavailable (locked, restarting) waits
    for it however long that takes, instead of spending its handler attempts (retried at
    once here) and being dead-lettered; it is applied once the database takes writes again."""
    db = tmp_path / "subs.db"
    said = Said()

    async def locked(*args: object) -> None:
        raise DatabaseUnavailable(f"database {db}: database is locked")

    async with fake_server(seed=37) as server:
        engine = ListenSync(listen_configs(tmp_path, server), sink_for(str(db)), said)
        with no_waiting():
            async with engine:
                url = (await engine.listen("127.0.0.1", 0))["acme"]
                await engine.pull()
                monkeypatch.setattr(engine.sink, "upsert_record", locked)
                sender = Sender(url, server.records("acme", "customers")[:1])
                async with aiohttp.ClientSession() as session:
                    await sender.send(session)
                await until(said.saying("acme: .*database is locked; events wait until"))
                monkeypatch.undo()
                await until(said.saying("webhooks of store acme: applied again"))
                await engine.join()
                counts = engine.counts("acme")
                assert (counts.applied, counts.receiver.failed_attempts) == (1, 0)
                assert counts.receiver.dead_lettered == 0
    assert sqlite_customers(db)[next(iter(sender.acknowledged))] == stamp(0)


async def test_dead_letters_of_a_database_failure_are_requeued_once_pulls_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event acknowledged while every write fails for a cause that is not a lock or a lost
    connection (a full disk) is dead-lettered after its handler attempts; the first pull that
    succeeds afterwards requeues it, and it is applied without a restart."""
    db = tmp_path / "subs.db"
    said = Said()

    async def full(*args: object) -> None:
        raise DatabaseError(f"database {db}: database or disk is full")

    async with fake_server(seed=36) as server:
        engine = ListenSync(listen_configs(tmp_path, server), sink_for(str(db)), said)
        with no_waiting():
            async with engine:
                running = asyncio.create_task(engine.run("127.0.0.1", 0, reconcile_every=0.05))
                url = (await until(said.saying(r"webhooks of store acme: POST (\S+)")))[1]
                await until(said.saying("initial sync done"))
                monkeypatch.setattr(engine.sink, "commit_page", full)
                monkeypatch.setattr(engine.sink, "upsert_record", full)
                await until(said.saying("failed: .*: database or disk is full; trying again in"))
                sender = Sender(url, server.records("acme", "customers")[:1])
                async with aiohttp.ClientSession() as session:
                    await sender.send(session)
                await until(lambda: engine.counts("acme").receiver.dead_lettered)
                monkeypatch.undo()
                await until(said.saying(r"done after \d+ failed attempts?"))
                await until(said.saying("webhooks of store acme: dead letters requeued: 1"))
                await applied(lambda: sqlite_customers(db), sender.acknowledged)
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT count(*) FROM webhook_dead_letters").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM webhook_inbox").fetchone() == (0,)


async def test_dead_letters_the_start_could_not_requeue_are_requeued_after_the_first_pull(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database failing between its opening and the start's requeue of dead letters does
    not end the service: it says so, and requeues them once the initial sync is done."""
    db = tmp_path / "subs.db"
    said = Said()
    calls: list[str] = []
    requeue = WebhookReceiver.requeue_dead_letters

    async def locked_once(receiver: WebhookReceiver, **kwargs: Any) -> int:
        calls.append(receiver.store)
        if len(calls) == 1:
            raise DatabaseUnavailable(f"database {db}: database is locked")
        return await requeue(receiver, **kwargs)

    monkeypatch.setattr(WebhookReceiver, "requeue_dead_letters", locked_once)
    async with fake_server(seed=37) as server:
        engine = ListenSync(listen_configs(tmp_path, server), sink_for(str(db)), said)
        with no_waiting():
            async with engine:
                running = asyncio.create_task(engine.run("127.0.0.1", 0, reconcile_every=60))
                await until(said.saying("dead letters not requeued yet: .*database is locked"))
                await until(said.saying("initial sync done"))
                await until(lambda: len(calls) == 3)  # both stores, after the pull
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
    assert sorted(calls) == ["acme", "acme", "globex"]


async def test_the_sinks_tell_a_database_unavailable_now_from_other_failures(
    tmp_path: Path,
) -> None:
    """Locked (SQLite) or unreachable (PostgreSQL): ``DatabaseUnavailable``, which waits;
    not a database: a plain ``DatabaseError``, which does not."""
    db = tmp_path / "subs.db"
    record = {"id": 1, "updatedAt": "2031-01-01T00:00:00Z"}
    async with sink_for(str(db), timeout=0.05) as sink:
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(DatabaseUnavailable, match="database is locked"):
                await sink.upsert_record("acme", "customers", record)
        assert await sink.upsert_record("acme", "customers", record)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    with pytest.raises(DatabaseError) as raised:
        await sink_for(str(garbage)).open()
    assert not isinstance(raised.value, DatabaseUnavailable)
    pytest.importorskip("psycopg")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(DatabaseUnavailable):
        await sink_for(f"postgresql://asyncsubs@127.0.0.1:{port}/none", timeout=0.5).open()
