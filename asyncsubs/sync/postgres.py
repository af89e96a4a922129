"""The PostgreSQL sink: the SQLite sink's tables and rules in a database many workers share.

The same tables (``raw`` JSONB, times ``timestamptz``), upsert rule and page commits as in
``sqlite``, and more: ``asyncsubs_sync_units``, one row per unit with its state in the current
round and the lease of the worker pulling it (the sink's ``Leases``, see ``_schedulers``);
``asyncsubs_sync_workers``, the workers of the round; ``webhook_inbox`` and
``webhook_dead_letters`` for a ``ListenSync``.

Built on psycopg 3, the reference driver: native asyncio, its pool, arrays (a page's
records are one ``unnest`` upsert), libpq's URLs and environment
(``PGPASSWORD``, ``.pgpass``, ``sslmode``), SQLSTATE codes, ``LISTEN``/``NOTIFY`` to wake
waiting workers. Every page commit checks, in its transaction, that this worker still holds
the unit's lease: one that lost it cannot write over its successor's pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from .. import _json
from .._versions import older_sql
from ..webhooks import DeadLetter, Inbox, InboxEntry
from ._sink import (
    DEFAULT_LEASE,
    OLDER,
    STATE_TABLE,
    DatabaseConfigError,
    DatabaseError,
    DatabaseUnavailable,
    DeadLetters,
    Dialect,
    LeaseLostError,
    PageWrite,
    SQLSink,
    Statements,
    UnitHandedOver,
    schema,
)

try:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.types.json import Jsonb
    from psycopg_pool import AsyncConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("PostgreSQL needs psycopg: pip install 'asyncsubs[postgres]'") from exc

__all__ = [
    "PostgresDeadLetters",
    "PostgresInbox",
    "PostgresSink",
    "UNITS_TABLE",
    "shown_url",
]

UNITS_TABLE: Final = "asyncsubs_sync_units"
WORKERS_TABLE: Final = "asyncsubs_sync_workers"
INBOX_TABLE: Final = "webhook_inbox"
DEAD_LETTER_TABLE: Final = "webhook_dead_letters"
#: The channel released and finished units are announced on.
CHANNEL: Final = "asyncsubs_units"
#: Connections per worker: page commits are short (a few statements per page), so a
#: few serve hundreds of units; the LISTEN connection is extra.
POOL_SIZE: Final = 4
#: Seconds an operation waits for a connection by default.
DEFAULT_TIMEOUT: Final = 10.0
#: Advisory lock keys: schema creation and the start of a round, serialized across workers.
_SCHEMA_LOCK: Final = 0x61737562_0001
_ROUND_LOCK: Final = 0x61737562_0002


_SCHEMA: Final = (
    *schema(json="jsonb", time="timestamptz", flag="boolean", count="integer", big="bigint"),
    f"""CREATE TABLE IF NOT EXISTS {UNITS_TABLE} (
        store text NOT NULL,
        resource text NOT NULL,
        state text NOT NULL,            -- pending, done or failed, in the current round
        holder text,                    -- the worker pulling it (NULL: nobody)
        lease_until timestamptz,        -- the holder's lease ends then unless renewed
        claimed_at timestamptz,
        error text,                     -- why it failed
        PRIMARY KEY (store, resource)
    )""",
    f"""CREATE TABLE IF NOT EXISTS {WORKERS_TABLE} (
        holder text PRIMARY KEY,
        stores text[] NOT NULL,         -- the units it runs: (stores[i], resources[i])
        resources text[] NOT NULL,
        wants boolean NOT NULL,         -- found no unit to claim, and finished none this round
        seen_at timestamptz NOT NULL    -- alive while seen within its lease
    )""",
    f"""CREATE TABLE IF NOT EXISTS {INBOX_TABLE} (
        store text NOT NULL,
        event_id text NOT NULL,
        body bytea NOT NULL,
        received_at timestamptz NOT NULL,
        attempts integer NOT NULL,
        PRIMARY KEY (store, event_id)
    )""",
    f"""CREATE TABLE IF NOT EXISTS {DEAD_LETTER_TABLE} (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        event_id text NOT NULL,
        topic text,
        body bytea NOT NULL,
        error text NOT NULL,
        attempts integer NOT NULL,
        failed_at timestamptz NOT NULL,
        store text
    )""",
    older_sql(OLDER),
)


def _jsonb(value: Any) -> Jsonb | None:
    # Written by orjson, every integer exact: a tenth of the standard library's time per record.
    return None if value is None else Jsonb(value, _json.dumps)


_SQL: Final = Statements(
    Dialect(
        param="%({})s",
        now="now()",
        has_table="SELECT to_regclass('{}')",
        dump=_jsonb,
    )
)


_PAGE_COLUMNS: Final = ("id", "status", "customer_id", "created_at", "updated_at", "raw")
#: A page's rows for ``Statements.upsert``: its records' parameters, a list per column, sent
#: binary (as array text, the JSON would be escaped character by character).
_PAGE: Final = (
    f"unnest({', '.join(f'%({c})b::text[]' for c in _PAGE_COLUMNS[:-1])}, %(raw)b::jsonb[])"
    f" AS v({', '.join(_PAGE_COLUMNS)})"
)
#: Whether a row is one of the units given as two arrays, parameters ``stores``, ``resources``.
_IN_UNITS: Final = (
    "(store, resource) IN (SELECT * FROM unnest(%(stores)s::text[], %(resources)s::text[]))"
)


def _held(holder: str) -> str:
    """How many pending units ``holder`` (an SQL expression) holds."""
    return (
        f"(SELECT count(*) FROM {UNITS_TABLE} h WHERE h.holder = {holder} AND h.state = 'pending')"
    )


def _owed(below: str) -> str:
    """Whether a worker is owed the unit ``(u.store, u.resource)`` by this one: alive, wanting
    a unit (it found none to claim and finished none this round), running that unit and no
    other free one, and holding fewer than ``below`` (an SQL expression)."""
    return f"""EXISTS (SELECT 1 FROM {WORKERS_TABLE} w
        WHERE w.wants AND w.holder <> %(holder)s
            AND w.seen_at > now() - make_interval(secs => %(lease)s)
            AND (u.store, u.resource) IN (SELECT * FROM unnest(w.stores, w.resources))
            AND {_held("w.holder")} < {below}
            AND NOT EXISTS (SELECT 1 FROM {UNITS_TABLE} f
                WHERE (f.store, f.resource) IN (SELECT * FROM unnest(w.stores, w.resources))
                    AND f.state = 'pending' AND (f.holder IS NULL OR f.lease_until < now())
                    AND (f.store, f.resource) <> (u.store, u.resource)))"""


def shown_url(url: str) -> str:
    """``scheme://user@host:port/db``, read by hand: a password holding '/' or '#' makes
    urlsplit take part of it for a port or a path. Up to the last '@' is credentials (the user
    shown, not the password); the query (libpq takes ``password=`` there too) is not shown, nor
    a "port" that is no number (``postgresql://user:secret/db``, the host left out)."""
    scheme, _, rest = url.partition("://")
    credentials, at, rest = rest.rpartition("@")
    user = credentials.partition(":")[0]
    host, slash, path = re.split(r"[?#]", rest, maxsplit=1)[0].partition("/")
    name, colon, port = host.rpartition(":")
    if colon and not port.isdigit() and not name.endswith("]") and ":" not in name:
        host = name
    return f"{scheme}://{user + '@' if at and user else ''}{host}{slash}{path}"


#: Seconds a worker's transaction may wait on the worker, at the least: one frozen (a VM paused,
#: SIGSTOP, a partition) inside a page's commit keeps its unit's rows locked, and so every
#: other worker out of the unit and the round, however long ago its lease ran out; the server
#: ends such a transaction after its lease, or this.
_IDLE_IN_TRANSACTION: Final = 5.0


_MADE_TABLE: Final = re.compile(r"\s*CREATE TABLE IF NOT EXISTS (\w+)")


async def _made(conn: psycopg.AsyncConnection[Any], statement: str) -> bool:
    """Whether what ``statement`` of the schema makes is there already, as it makes it: a
    worker whose role may not create in the schema, or does not own what another's made,
    uses it as it is (CREATE ... IF NOT EXISTS and CREATE OR REPLACE need those rights even
    where they would change nothing)."""
    # In the schema the statement would create it in, not anywhere on the search path (an
    # application's own "orders" in public, another deployment's schema).
    if table := _MADE_TABLE.match(statement):
        cur = await conn.execute(
            "SELECT to_regclass(format('%%I.%%I', current_schema(), %s::text)) IS NOT NULL",
            (table[1],),
        )
    elif statement.count("$$") == 2:  # the function: with this very body (not another's)
        cur = await conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = %s AND prosrc = %s"
            " AND pronamespace = to_regnamespace(current_schema()))",
            (OLDER, statement.split("$$")[1]),
        )
    else:
        return False
    row = await cur.fetchone()
    return bool(row and row[0])


#: What a server says of a connection it refuses for good (a database, role or credential that
#: is wrong), unlike one starting up or out of connection slots. It sends no SQLSTATE a client
#: can read then; a message in another language reads as a passing failure, and is retried.
_REFUSED_FOR_GOOD: Final = (
    "does not exist",
    "password authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "no password supplied",
    "connection is bad: invalid",  # libpq's own check of an option's value (sslmode=bogus)
)


def _refused_for_good(exc: psycopg.Error) -> bool:
    return any(words in str(exc) for words in _REFUSED_FOR_GOOD)


def _without_secrets(text: str, url: str) -> str:
    """``text`` (libpq's words, which may quote the URL or a part of it) with the URL's
    password, in its credentials or a ``password=`` of its query, as ``***``."""
    credentials = url.partition("://")[2].rpartition("@")[0]
    query = re.split(r"[?#]", url, maxsplit=1)[1:]
    secrets = [credentials.partition(":")[2]]
    secrets += re.findall(r"(?:^|&)password=([^&#]*)", query[0]) if query else []
    for secret in sorted(filter(None, secrets), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


class PostgresSink(SQLSink):
    """The ``Sink`` on PostgreSQL, and the ``Leases`` of its units for workers sharing it.

    ``holder`` names this worker in the units table (default: host, pid and a random part).
    ``timeout``: seconds an operation waits for a connection (the server down, restarting or
    unreachable) before it fails with a ``DatabaseError``.
    """

    _SQL = _SQL
    _STATUS = (
        UNITS_TABLE,
        f"""SELECT u.store, u.resource, u.state, u.holder,
                extract(epoch FROM u.lease_until - now())::float8, s.run_records,
                s.run_pages, extract(epoch FROM now() - s.updated_at)::float8, u.error
            FROM {UNITS_TABLE} u LEFT JOIN {STATE_TABLE} s
                ON s.store = u.store AND s.resource = u.resource
            ORDER BY u.store, u.resource""",
    )

    def __init__(
        self,
        url: str,
        *,
        lease: float = DEFAULT_LEASE,
        holder: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ):
        self.url = url
        self.timeout = timeout
        self.where = shown_url(url)
        try:  # what libpq cannot read, no wait mends (its words may quote the password)
            conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            problem = _without_secrets(" ".join(str(exc).split()), url)
            raise DatabaseConfigError(f"{self.where}: libpq cannot read it: {problem}") from None
        self.lease = lease
        self.leases = self
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._pool = self._new_pool()
        self._listen: psycopg.AsyncConnection[Any] | None = None
        #: Units this worker finished (done or failed) in the current round.
        self._finished = 0

    def __repr__(self) -> str:
        return f"<PostgresSink {self.where} holder={self.holder}>"

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        idle = min(round(max(self.lease, _IDLE_IN_TRANSACTION) * 1000), 2**31 - 1)  # an int4
        await conn.execute(f"SET TIME ZONE 'UTC'; SET idle_in_transaction_session_timeout = {idle}")

    def _new_pool(self) -> AsyncConnectionPool[Any]:
        # A pool opens once: each open() of the sink (a service trying again) makes its own.
        return AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=POOL_SIZE,
            open=False,
            kwargs={"autocommit": True},
            configure=self._configure,
            timeout=self.timeout,
            reconnect_timeout=self.timeout,
            name="asyncsubs",
        )

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # workers share the database through leases

    def _error(self, exc: BaseException) -> DatabaseError:
        text = _without_secrets(" ".join(str(exc).split()), self.url) or type(exc).__name__
        if isinstance(exc, PoolTimeout):
            text = f"no connection within {self.timeout:g}s (is the server up and reachable?)"
        # The connection's failures (refused, lost, the server shutting down), not the SQL's.
        unavailable = isinstance(exc, psycopg.OperationalError | PoolTimeout)
        error = DatabaseUnavailable if unavailable else DatabaseError
        return error(f"database {self.where}: {text}")

    @contextlib.asynccontextmanager
    async def transaction(
        self, *, timeout: float | None = None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A connection of the pool inside one transaction; psycopg errors as DatabaseError."""
        try:
            async with self._pool.connection(timeout) as conn, conn.transaction():
                yield conn
        except (psycopg.Error, PoolTimeout) as exc:
            raise self._error(exc) from None

    async def _reach(self) -> None:
        """Wait up to ``timeout`` for the server to take one connection (one starting up
        refuses them for a while); DatabaseError naming the last failure and the wait. The
        pool would log every failed attempt, then time out without saying why."""
        loop = asyncio.get_running_loop()
        start, delay, attempts = loop.time(), 0.25, 0
        while True:
            attempts += 1
            try:
                async with asyncio.timeout(self.timeout - (loop.time() - start)):
                    conn = await psycopg.AsyncConnection.connect(self.url)
                return await conn.close()
            except (psycopg.Error, TimeoutError) as exc:
                waited = loop.time() - start
                if isinstance(exc, psycopg.Error) and _refused_for_good(exc):
                    problem = str(self._error(exc))
                    break
                if waited + delay >= self.timeout:
                    why = f"database {self.where}: no answer"
                    if isinstance(exc, psycopg.Error):
                        why = str(self._error(exc))
                    raise DatabaseUnavailable(
                        f"{why} (waited {waited:.1f}s, {attempts} attempts)"
                    ) from None
                await asyncio.sleep(delay)
                delay = min(2 * delay, 2.0)
        raise DatabaseError(problem)  # no wait mends it: said at once, never tried again

    async def open(self) -> None:
        await self._reach()
        self._pool = self._new_pool()
        try:
            await self._pool.open(wait=True, timeout=self.timeout)
        except (psycopg.Error, PoolTimeout) as exc:
            await self._pool.close()
            raise self._error(exc) from None
        try:
            # Concurrent first runs: CREATE ... IF NOT EXISTS is not safe against itself, so
            # workers create the schema one after the other.
            async with self.transaction() as conn:
                await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                for statement in _SCHEMA:
                    if not await _made(conn, statement):
                        await conn.execute(statement)
        except BaseException:
            await self._pool.close()  # another open() makes its own
            raise

    async def aclose(self) -> None:
        if self._listen is not None:
            with contextlib.suppress(psycopg.Error):
                await self._listen.close()
            self._listen = None
        await self._pool.close()

    async def _one(self, sql: str, params: Any = ()) -> Any:
        return next(iter(await self._rows(sql, params)), None)

    async def _rows(self, sql: str, params: Any = ()) -> list[Any]:
        async with self.transaction() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall() if cur.description else []

    async def _write(self, *statements: tuple[str, Any]) -> int:
        async with self.transaction() as conn:
            return sum([(await conn.execute(sql, params)).rowcount for sql, params in statements])

    async def commit_page(self, w: PageWrite) -> None:
        rows, page_max = w.rows(_SQL.record)
        handed = False
        async with self.transaction() as conn:
            # The lease is checked (and renewed) first: its row lock keeps a takeover out
            # until this page and its cursor are committed.
            cur = await conn.execute(
                f"UPDATE {UNITS_TABLE} SET lease_until = now() + make_interval(secs => %s)"
                " WHERE store = %s AND resource = %s AND holder = %s",
                (self.lease, w.store, w.resource, self.holder),
            )
            if cur.rowcount == 0:
                raise LeaseLostError(f"{w.store}/{w.resource}")
            # A statement may update a row once: an id the page repeats goes in the next one.
            batches: list[dict[str, dict[str, Any]]] = []
            for row in rows:
                if all(row["id"] in b for b in batches):
                    batches.append({})
                next(b for b in batches if row["id"] not in b)[row["id"]] = row
            for batch in batches:
                columns = {c: [row[c] for row in batch.values()] for c in _PAGE_COLUMNS}
                await conn.execute(_SQL.upsert(w.resource, _PAGE), {"store": w.store, **columns})
            unit = {"store": w.store, "resource": w.resource}
            old = await (await conn.execute(_SQL.load_state + " FOR UPDATE", unit)).fetchone()
            state = _SQL.state(w, old, len(rows), page_max)
            await conn.execute(_SQL.save_state, state)
            if state["done"]:
                # The unit is done with its last page: no window in which a crash leaves it
                # finished but still pending (which would pull it again).
                await conn.execute(
                    f"UPDATE {UNITS_TABLE} SET state = 'done', holder = NULL, lease_until = NULL"
                    " WHERE store = %(store)s AND resource = %(resource)s",
                    unit,
                )
                await conn.execute(f"NOTIFY {CHANNEL}")
                self._finished += 1
            else:
                handed = await self._hand_over(conn, (w.store, w.resource))
        if handed:
            raise UnitHandedOver(f"{w.store}/{w.resource}")

    # -- units and leases (``Leases``) ---------------------------------------------------------
    #
    # A worker claims free units while it has room; one that finds none (all held) is a worker
    # that *wants* one (the workers table). A worker holding two units more than a wanting one
    # hands it a unit at that unit's next page commit (its cursor committed: nothing is pulled
    # twice), and does not claim a unit such a worker is owed. So a worker joining a round that
    # another has taken whole gets its share; a worker that has finished a unit of the round
    # wants no more (units are not moved back and forth as a round runs out).

    def _params(self, units: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        stores, resources = [s for s, _ in units], [r for _, r in units]
        return {
            "holder": self.holder,
            "lease": self.lease,
            "stores": stores,
            "resources": resources,
        }

    async def join_round(self, units: Sequence[tuple[str, str]]) -> bool:
        self._finished = 0
        params = self._params(units)
        async with self.transaction() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ROUND_LOCK,))
            # A worker killed (SIGKILL) leaves its row; one unseen a day (three leases if more)
            # is not coming back.
            await conn.execute(
                f"DELETE FROM {WORKERS_TABLE} WHERE seen_at < now()"
                " - greatest(interval '1 day', make_interval(secs => 3 * %(lease)s::float8))",
                params,
            )
            # Counted before units new to the table (a store added to the config) are: they
            # are pending, but no round is open for the others; unless one is open elsewhere
            # (a worker whose config lacks the new store), which they join.
            cur = await conn.execute(
                f"SELECT count(*) FILTER (WHERE {_IN_UNITS}), count(*) FROM {UNITS_TABLE}"
                " WHERE state = 'pending'",
                params,
            )
            mine, anywhere = await cur.fetchone() or (0, 0)
            cur = await conn.execute(
                f"INSERT INTO {UNITS_TABLE} (store, resource, state)"
                " SELECT s, r, 'pending' FROM unnest(%(stores)s::text[], %(resources)s::text[])"
                " AS u(s, r) ON CONFLICT DO NOTHING",
                params,
            )
            added = cur.rowcount > 0
            if mine or (added and anywhere):
                return added
            await conn.execute(
                f"UPDATE {UNITS_TABLE} SET state = 'pending', error = NULL WHERE {_IN_UNITS}",
                params,
            )
            return True

    async def claim(
        self, units: Sequence[tuple[str, str]], *, prefer: Sequence[str] = ()
    ) -> tuple[str, str] | None:
        # Leaving a worker that has none the units it is owed (see above). A unit of ``units``
        # this worker holds is one it is not pulling: an attempt that failed left it held.
        params = {**self._params(units), "prefer": list(prefer)}
        async with self.transaction() as conn:
            cur = await conn.execute(
                f"""UPDATE {UNITS_TABLE} t SET holder = %(holder)s, claimed_at = now(),
                        lease_until = now() + make_interval(secs => %(lease)s)
                    FROM (SELECT store, resource FROM {UNITS_TABLE} u
                          WHERE {_IN_UNITS} AND state = 'pending'
                            AND (holder IS NULL OR holder = %(holder)s OR lease_until < now())
                            AND NOT {_owed(_held("%(holder)s"))}
                          ORDER BY store = ANY(%(prefer)s) DESC, store, resource
                          LIMIT 1 FOR UPDATE SKIP LOCKED) AS free
                    WHERE t.store = free.store AND t.resource = free.resource
                    RETURNING t.store, t.resource""",
                params,
            )
            row = await cur.fetchone()
            await conn.execute(
                f"""INSERT INTO {WORKERS_TABLE} (holder, stores, resources, wants, seen_at)
                    VALUES (%(holder)s, %(stores)s, %(resources)s, %(wants)s, now())
                    ON CONFLICT (holder) DO UPDATE SET stores = excluded.stores,
                        resources = excluded.resources, wants = excluded.wants, seen_at = now()""",
                {**params, "wants": row is None and not self._finished},
            )
            return None if row is None else (row[0], row[1])

    async def _hand_over(self, conn: psycopg.AsyncConnection[Any], unit: tuple[str, str]) -> bool:
        """Release ``unit`` (a page of it just committed) when a worker is owed it."""
        cur = await conn.execute(
            f"""UPDATE {UNITS_TABLE} u SET holder = NULL, lease_until = NULL
                WHERE store = %(store)s AND resource = %(resource)s
                    AND {_owed(f"{_held('%(holder)s')} - 1")}""",
            {**self._params(), "store": unit[0], "resource": unit[1]},
        )
        if cur.rowcount:
            await conn.execute(f"NOTIFY {CHANNEL}")
        return cur.rowcount > 0

    async def renew(self, units: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        async with self.transaction() as conn:
            await conn.execute(
                f"UPDATE {UNITS_TABLE} SET lease_until = now() + make_interval(secs => %(lease)s)"
                " WHERE holder = %(holder)s AND state = 'pending'",
                self._params(),
            )
            await conn.execute(
                f"UPDATE {WORKERS_TABLE} SET seen_at = now() WHERE holder = %(holder)s",
                self._params(),
            )
            cur = await conn.execute(
                f"SELECT store, resource FROM {UNITS_TABLE} WHERE {_IN_UNITS}"
                " AND state = 'pending' AND holder IS DISTINCT FROM %(holder)s",
                self._params(units),
            )
            return [(row[0], row[1]) for row in await cur.fetchall()]

    async def release(self, unit: tuple[str, str], *, error: str | None = None) -> None:
        self._finished += error is not None
        release = (
            f"UPDATE {UNITS_TABLE} SET holder = NULL, lease_until = NULL,"
            " state = CASE WHEN %s::text IS NULL THEN state ELSE 'failed' END, error = %s"
            " WHERE store = %s AND resource = %s AND holder = %s"
        )
        await self._write((release, (error, error, *unit, self.holder)), (f"NOTIFY {CHANNEL}", ()))

    async def release_all(self) -> None:
        # On a connection of its own: the pool's may be ones a restart of the server cut, and
        # the leases would stay held until they expire. Not for long: after a database error,
        # they may as well expire.
        try:
            async with asyncio.timeout(2.0):
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                async with conn, conn.transaction():
                    await conn.execute(
                        f"UPDATE {UNITS_TABLE} SET holder = NULL, lease_until = NULL"
                        " WHERE holder = %s",
                        (self.holder,),
                    )
                    await conn.execute(
                        f"DELETE FROM {WORKERS_TABLE} WHERE holder = %s", (self.holder,)
                    )
                    await conn.execute(f"NOTIFY {CHANNEL}")
        except psycopg.Error as exc:
            raise self._error(exc) from None

    async def pending_wait(self, units: Sequence[tuple[str, str]]) -> float | None:
        row = await self._one(
            f"""SELECT count(*), extract(epoch FROM min(lease_until) FILTER
                    (WHERE holder IS DISTINCT FROM %(holder)s) - now())
                FROM {UNITS_TABLE} WHERE {_IN_UNITS} AND state = 'pending'""",
            self._params(units),
        )
        if row is None or not row[0]:
            return None
        return self.lease if row[1] is None else max(0.0, float(row[1]))

    async def failures(self, units: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
        rows = await self._rows(
            f"SELECT store, resource, error FROM {UNITS_TABLE}"
            f" WHERE {_IN_UNITS} AND state = 'failed'",
            self._params(units),
        )
        return {(row[0], row[1]): row[2] or "" for row in rows}

    async def wait_for_release(self, timeout: float) -> None:
        try:
            if self._listen is None:
                self._listen = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                await self._listen.execute(f"LISTEN {CHANNEL}")
            async for _ in self._listen.notifies(timeout=timeout, stop_after=1):
                pass
        except psycopg.Error as exc:
            # A connection cut (a server restart) stays broken: the next wait connects anew.
            listen, self._listen = self._listen, None
            if listen is not None:
                with contextlib.suppress(psycopg.Error):
                    await listen.close()
            raise self._error(exc) from None

    async def _read(self, sql: str) -> list[Any]:
        """Rows of ``sql`` on a connection of its own (no pool, no schema created)."""
        try:
            async with await psycopg.AsyncConnection.connect(self.url, connect_timeout=10) as conn:
                await conn.execute("SET TIME ZONE 'UTC'")
                return await (await conn.execute(sql)).fetchall()
        except psycopg.Error as exc:
            raise self._error(exc) from None

    async def webhook_stores(self) -> tuple[Inbox, DeadLetters]:
        # One pool: an inbox write takes a connection of its own, never waiting for a page.
        return PostgresInbox(self), PostgresDeadLetters(self)


def _instant(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


class _Table:
    """A webhook store in a table of the sink's database, on its pool: writes return once
    committed."""

    def __init__(self, sink: PostgresSink) -> None:
        self.sink = sink

    async def _write(self, sql: str, *params: Any) -> int:
        return await self.sink._write((sql, params))


class PostgresInbox(_Table):
    """``asyncsubs.webhooks.Inbox`` in the sink's ``webhook_inbox`` table."""

    async def add(self, e: InboxEntry) -> bool:
        return (
            await self._write(
                f"INSERT INTO {INBOX_TABLE} (store, event_id, body, received_at, attempts)"
                " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                *(e.store, e.event_id, e.body, _instant(e.received_at), e.attempts),
            )
            > 0
        )

    async def pending(self, store: str) -> list[InboxEntry]:
        rows = await self.sink._rows(
            f"SELECT event_id, body, received_at, attempts FROM {INBOX_TABLE}"
            " WHERE store = %s ORDER BY received_at, event_id",
            (store,),
        )
        return [InboxEntry(store, r[0], bytes(r[1]), r[2].timestamp(), r[3]) for r in rows]

    async def remove(self, store: str, event_id: str) -> None:
        sql = f"DELETE FROM {INBOX_TABLE} WHERE store = %s AND event_id = %s"
        await self._write(sql, store, event_id)


class PostgresDeadLetters(_Table):
    """``asyncsubs.webhooks.DeadLetterStore`` in the sink's ``webhook_dead_letters`` table."""

    async def add(self, x: DeadLetter) -> None:
        await self._write(
            f"INSERT INTO {DEAD_LETTER_TABLE}"
            " (event_id, topic, body, error, attempts, failed_at, store)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            *(x.event_id, x.topic, x.body, x.error, x.attempts, _instant(x.failed_at), x.store),
        )

    async def all(self) -> list[DeadLetter]:
        rows = await self.sink._rows(
            "SELECT event_id, topic, body, error, attempts, failed_at, store"
            f" FROM {DEAD_LETTER_TABLE} ORDER BY seq"
        )
        return [
            DeadLetter(r[0], r[1], bytes(r[2]), r[3], r[4], r[5].timestamp(), r[6]) for r in rows
        ]

    async def remove(self, event_id: str) -> int:
        return await self._write(f"DELETE FROM {DEAD_LETTER_TABLE} WHERE event_id = %s", event_id)

    async def remove_for_store(self, store: str | None, event_id: str) -> int:
        sql = (
            f"DELETE FROM {DEAD_LETTER_TABLE} WHERE event_id = %s AND store IS NOT DISTINCT FROM %s"
        )
        return await self._write(sql, event_id, store)
