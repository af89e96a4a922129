"""Resumable multi-store sync into a ``Sink``: SQLite here (``SyncDB``, the embedded default),
PostgreSQL in ``_postgres`` (shared by many workers, see ``_workers``), with the same tables
and rules. This docstring describes SQLite's.

Tables: one per resource (``subscriptions``, ``customers``, ``orders``), primary key
``(store, id)``, the record's JSON as received in ``raw`` plus typed columns for the common
fields; ``asyncsubs_sync_state``, one row per ``(store, resource)``; and ``asyncsubs_deleted``,
the ids deleted by webhooks (``sync --listen``). With ``--listen`` the same database holds
``webhook_inbox`` and ``webhook_dead_letters``, made by ``asyncsubs.webhooks``' SQLite stores on
connections of their own (see ``_listen``).

Pulls and webhooks write the same rows, in any order: a write replaces a row only when its
``updated_at`` is not older than the stored one, and never brings back a deleted id.

Resume: each page's records and the cursor after it are committed in one transaction, so the
database always holds a prefix of the run plus the cursor that continues it. A process killed
at any point (even SIGKILL mid-commit) leaves either the whole page and its cursor or neither;
the next run continues from the cursor and upserts, so nothing is lost or doubled.

All SQLite work runs on one dedicated thread holding the one connection: writes are serialized
without locks, and the event loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import attrs

from .. import AdminClient
from .._sqlite import connect_sqlite
from ..errors import AsyncSubsError, BadRequestError, ConfigError, ProtocolError
from ..limiting import Limiter
from ._config_file import RESOURCES, Incremental, StoreConfig
from ._progress import ResourceProgress, Tracker

__all__ = [
    "DEFAULT_LEASE",
    "DELETED_TABLE",
    "STATE_TABLE",
    "DatabaseError",
    "LeaseLostError",
    "PageWrite",
    "ResourceState",
    "Sink",
    "SyncDB",
    "count_rows",
    "json_text",
    "make_client",
    "newer",
    "record_columns",
    "redis_limiters",
    "run_sync",
    "sync_pass",
    "text_value",
]

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger("asyncsubs.cli")

STATE_TABLE: Final = "asyncsubs_sync_state"
DELETED_TABLE: Final = "asyncsubs_deleted"
DEFAULT_MAX_STORES: Final = 32
#: Seconds a worker's lease on a unit (PostgreSQL) lasts unless a heartbeat or a commit renews
#: it: how long a killed worker's units wait before another worker takes them over.
DEFAULT_LEASE: Final = 30.0
SCHEMA_VERSION: Final = 2

# Typed columns and the record fields they come from (camelCase as the service sends them;
# snake_case accepted too). Values are stored as sent; ids as TEXT so joins are type-stable.
_COLUMNS: Final = (
    ("status", ("status",)),
    ("customer_id", ("customerId", "customer_id")),
    ("created_at", ("createdAt", "created_at")),
    ("updated_at", ("updatedAt", "updated_at")),
)


class LeaseLostError(Exception):
    """Another worker took this unit over (this one's lease had expired): stop pulling it."""


class DatabaseError(AsyncSubsError):
    """The sync database failed (SQLite: cannot open, disk full, not a database, locked;
    PostgreSQL: unreachable, connection lost, refused)."""


def _table_sql(resource: str) -> str:
    return f"""
        CREATE TABLE IF NOT EXISTS {resource} (
            store TEXT NOT NULL,
            id TEXT NOT NULL,
            status TEXT,
            customer_id TEXT,
            created_at TEXT,
            updated_at TEXT,
            raw TEXT NOT NULL,
            synced_at TEXT NOT NULL,
            PRIMARY KEY (store, id)
        )"""


_STATE_SQL: Final = f"""
    CREATE TABLE IF NOT EXISTS {STATE_TABLE} (
        store TEXT NOT NULL,
        resource TEXT NOT NULL,
        cursor TEXT,                    -- afterCursor of the next page; NULL: from the start
        done INTEGER NOT NULL,          -- 1: the last run finished; the next one starts over
        run_params TEXT,                -- JSON query filter of the current run (reused on resume)
        run_from TEXT,                  -- JSON: incremental value the next run will start from
        next_from TEXT,                 -- JSON: incremental value for the next run
        seen_max TEXT,                  -- JSON: largest incremental field value committed
        run_pages INTEGER NOT NULL,
        run_records INTEGER NOT NULL,
        run_started_at TEXT NOT NULL,
        run_finished_at TEXT,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (store, resource)
    )"""


# Ids are never reused, so a deleted id stays deleted: without this, a pull page read just
# before a delete and committed just after its webhook would bring the record back.
_DELETED_SQL: Final = f"""
    CREATE TABLE IF NOT EXISTS {DELETED_TABLE} (
        store TEXT NOT NULL,
        resource TEXT NOT NULL,
        id TEXT NOT NULL,
        deleted_at TEXT NOT NULL,
        PRIMARY KEY (store, resource, id)
    )"""


def _upsert_sql(resource: str) -> str:
    # Newer-or-equal wins, so webhooks and pulls may land in any order: a stale page never
    # overwrites a fresher webhook, nor a late webhook a fresher page. Timestamps compare as
    # instants when SQLite can parse them (``Z`` and offsets mix), as text otherwise. Equal
    # stamps replace: the next (inclusive) incremental pull settles same-second changes.
    return f"""
        INSERT INTO {resource}
            (store, id, status, customer_id, created_at, updated_at, raw, synced_at)
        SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8
        WHERE NOT EXISTS (
            SELECT 1 FROM {DELETED_TABLE}
            WHERE store = ?1 AND resource = '{resource}' AND id = ?2)
        ON CONFLICT (store, id) DO UPDATE SET
            status = excluded.status,
            customer_id = excluded.customer_id,
            created_at = excluded.created_at,
            updated_at = excluded.updated_at,
            raw = excluded.raw,
            synced_at = excluded.synced_at
        WHERE {resource}.updated_at IS NULL OR excluded.updated_at IS NULL
            OR coalesce(julianday(excluded.updated_at) >= julianday({resource}.updated_at),
                        excluded.updated_at >= {resource}.updated_at)"""


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


#: Records and values as compact JSON text: the standard library's, which writes integers
#: beyond 64 bits exactly (orjson refuses them), and non-ASCII text as itself.
_JSON: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def json_text(value: Any) -> str:
    return _JSON.encode(value)


def text_value(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return json_text(value)


def _field(record: Mapping[str, Any], names: Sequence[str]) -> str | None:
    for name in names:
        if name in record:
            return text_value(record[name])
    return None


def newer(a: Any, b: Any) -> Any:
    """The larger of two incremental values (numbers with numbers, strings with strings)."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, str) and isinstance(b, str):
        return max(a, b)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b)):
        return max(a, b)
    return b


def record_columns(store: str, record: Mapping[str, Any]) -> tuple[str | None, ...]:
    """``store``, ``id`` and the typed columns of one record (which has an ``id``)."""
    return (store, text_value(record["id"]), *(_field(record, names) for _, names in _COLUMNS))


def record_row(store: str, record: Mapping[str, Any], now: str) -> tuple[str | None, ...]:
    """The upsert's parameters for one record (which has an ``id``)."""
    return (*record_columns(store, record), json_text(record), now)


def _dump(value: Any) -> str | None:
    return None if value is None else json_text(value)


def _load(value: str | None) -> Any:
    return None if value is None else json.loads(value)


@attrs.frozen
class ResourceState:
    """The saved state of one (store, resource)."""

    exists: bool = False
    cursor: str | None = None
    done: bool = False
    run_params: Mapping[str, Any] = attrs.field(factory=dict)
    run_from: Any = None
    next_from: Any = None
    seen_max: Any = None
    run_pages: int = 0
    run_records: int = 0

    @property
    def in_progress(self) -> bool:
        """A run was started and not finished: resume it."""
        return self.exists and not self.done


@attrs.frozen
class PageWrite:
    store: str
    resource: str
    records: list[Any]
    next_cursor: str | None
    new_run: bool
    run_params: Mapping[str, Any]
    run_from: Any
    incremental_field: str | None

    def rows(self, to_row: Callable[[str, Mapping[str, Any]], R]) -> tuple[list[R], Any]:
        """The page's records as ``to_row(store, record)`` rows, and the page's newest value of
        the incremental field; ProtocolError for a record without an id (it cannot be stored)."""
        rows = []
        page_max = None
        for record in self.records:
            if not isinstance(record, dict) or record.get("id") is None:
                raise ProtocolError(
                    f"GET {self.resource}: a record without an 'id' cannot be stored",
                    method="GET",
                    path=self.resource,
                )
            if self.incremental_field is not None:
                page_max = newer(page_max, record.get(self.incremental_field))
            rows.append(to_row(self.store, record))
        return rows, page_max


class Sink(Protocol):
    """Where ``sync`` writes: ``SyncDB`` (SQLite, embedded, one writer) or ``PostgresSink``
    (``_postgres``: shared by many workers). Both keep the same tables and the same rules."""

    #: The database, for messages (never a password).
    where: str

    async def open(self) -> None:
        """Connect and create the tables that do not exist yet."""

    async def aclose(self) -> None: ...

    async def load_state(self, store: str, resource: str) -> ResourceState: ...

    async def commit_page(self, write: PageWrite) -> None:
        """The page's records and the cursor after them, in one transaction."""

    async def upsert_record(self, store: str, resource: str, record: Mapping[str, Any]) -> bool:
        """One record (a webhook's) under the pulls' rule; False when the stored row is newer
        or the id was deleted."""
        ...

    async def delete_record(self, store: str, resource: str, record_id: Any) -> None:
        """Delete one record and remember its id, so no later write brings it back."""

    async def count(self, store: str, resource: str) -> int: ...


class SyncDB:
    """The SQLite sink: one connection, used only from one worker thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)
        # One thread runs every call in order: a write queued behind another runs after it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncsubs-sqlite")
        self._conn: sqlite3.Connection | None = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, functools.partial(fn, *args))
        except sqlite3.Error as exc:
            raise DatabaseError(f"database {self.path}: {exc}") from exc

    @property
    def conn(self) -> sqlite3.Connection:
        assert self._conn is not None, "SyncDB.open() first"
        return self._conn

    async def open(self) -> None:
        await self._run(self._open)

    def _open(self) -> None:
        # Transactions are explicit (BEGIN IMMEDIATE ... COMMIT) below, so a page and its
        # cursor are committed together. Used from self._thread only.
        conn = connect_sqlite(self.path)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for resource in RESOURCES:
                conn.execute(_table_sql(resource))
            conn.execute(_STATE_SQL)
            conn.execute(_DELETED_SQL)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def aclose(self) -> None:
        if self._conn is not None:
            # Queued behind any write still running, so that write finishes first.
            with contextlib.suppress(DatabaseError):
                await self._run(self.conn.close)
        self._thread.shutdown(wait=True)

    async def load_state(self, store: str, resource: str) -> ResourceState:
        return await self._run(self._load_state, store, resource)

    def _load_state(self, store: str, resource: str) -> ResourceState:
        row = self.conn.execute(
            f"SELECT cursor, done, run_params, run_from, next_from, seen_max, run_pages,"
            f" run_records FROM {STATE_TABLE} WHERE store = ? AND resource = ?",
            (store, resource),
        ).fetchone()
        if row is None:
            return ResourceState()
        return ResourceState(
            exists=True,
            cursor=row[0],
            done=bool(row[1]),
            run_params=_load(row[2]) or {},
            run_from=_load(row[3]),
            next_from=_load(row[4]),
            seen_max=_load(row[5]),
            run_pages=row[6],
            run_records=row[7],
        )

    async def commit_page(self, write: PageWrite) -> None:
        await self._run(self._commit_page, write)

    def _commit_page(self, w: PageWrite) -> None:
        now = _now()
        rows, page_max = w.rows(lambda store, record: record_row(store, record, now))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(_upsert_sql(w.resource), rows)
            old = self._load_state(w.store, w.resource)
            done = w.next_cursor is None
            pages = 1 if w.new_run else old.run_pages + 1
            records = len(rows) if w.new_run else old.run_records + len(rows)
            conn.execute(
                f"""INSERT INTO {STATE_TABLE} (store, resource, cursor, done, run_params,
                        run_from, next_from, seen_max, run_pages, run_records, run_started_at,
                        run_finished_at, updated_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    ON CONFLICT (store, resource) DO UPDATE SET
                        cursor = excluded.cursor,
                        done = excluded.done,
                        run_params = excluded.run_params,
                        run_from = excluded.run_from,
                        next_from = excluded.next_from,
                        seen_max = excluded.seen_max,
                        run_pages = excluded.run_pages,
                        run_records = excluded.run_records,
                        run_started_at = CASE WHEN ? THEN excluded.run_started_at
                                         ELSE run_started_at END,
                        run_finished_at = excluded.run_finished_at,
                        updated_at = excluded.updated_at""",
                (
                    w.store,
                    w.resource,
                    w.next_cursor,
                    int(done),
                    _dump(dict(w.run_params)),
                    _dump(w.run_from),
                    _dump(w.run_from if done else old.next_from),
                    _dump(newer(old.seen_max, page_max)),
                    pages,
                    records,
                    now,
                    now if done else None,
                    now,
                    int(w.new_run),
                ),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    async def upsert_record(self, store: str, resource: str, record: Mapping[str, Any]) -> bool:
        """Write one record (a webhook's) with the same rule as pulls; False when the stored
        row is newer or the id was deleted."""
        return await self._run(self._upsert_record, store, resource, record)

    def _upsert_record(self, store: str, resource: str, record: Mapping[str, Any]) -> bool:
        # One statement: its own transaction in autocommit mode.
        cursor = self.conn.execute(_upsert_sql(resource), record_row(store, record, _now()))
        return cursor.rowcount > 0

    async def delete_record(self, store: str, resource: str, record_id: Any) -> None:
        """Delete one record and remember its id, so no later write brings it back."""
        await self._run(self._delete_record, store, resource, text_value(record_id))

    def _delete_record(self, store: str, resource: str, record_id: str) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(f"DELETE FROM {resource} WHERE store = ? AND id = ?", (store, record_id))
            conn.execute(
                f"INSERT INTO {DELETED_TABLE} (store, resource, id, deleted_at)"
                " VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (store, resource, record_id, _now()),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    async def count(self, store: str, resource: str) -> int:
        return await self._run(self._count, store, resource)

    def _count(self, store: str, resource: str) -> int:
        row = self.conn.execute(
            f"SELECT count(*) FROM {resource} WHERE store = ?", (store,)
        ).fetchone()
        return int(row[0])


def count_rows(tracker: Tracker, db_path: Path) -> None:
    """Fill in the rows in the table of every (store, resource) that started and has no count
    (one that failed or was interrupted), read from the closed database, for the summary."""
    missing = [r for r in tracker.rows.values() if r.rows is None and r.started is not None]
    if not missing:
        return
    try:
        uri = f"{db_path.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            for row in missing:
                (row.rows,) = conn.execute(
                    f"SELECT count(*) FROM {row.resource} WHERE store = ?", (row.store,)
                ).fetchone()
    except sqlite3.Error:
        pass  # the summary leaves them blank; the error that stopped the sync says why


def describe_error(exc: BaseException) -> str:
    """One line for an error: the library's messages already name method and path."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


async def _sync_resource(
    client: AdminClient,
    config: StoreConfig,
    resource: str,
    db: Sink,
    tracker: Tracker,
    row: ResourceProgress,
) -> None:
    state = await db.load_state(config.store, resource)
    incremental: Incremental | None = config.incremental.get(resource)
    restarted = False
    while True:
        if state.in_progress:
            # Resume the interrupted run with its own filter, whatever the config says now.
            resumed = True
            cursor = state.cursor
            params: Mapping[str, Any] = state.run_params
            run_from = state.run_from
        else:
            resumed = False
            cursor = None
            params = {}
            if incremental is not None and state.next_from is not None:
                params = {incremental.param: state.next_from}
            # Records changed while this run goes on are newer than anything stored now, so
            # the next run may start from here (inclusive filters catch equal timestamps).
            run_from = state.seen_max if incremental is not None else None
        if not restarted:
            tracker.start(
                row, client, resumed=resumed, resumed_records=state.run_records if resumed else 0
            )
        new_run = not resumed
        call = getattr(client, resource).list(
            page_size=config.page_size,
            after_cursor=cursor,
            params=params or None,
            model=dict,
        )
        try:
            async with contextlib.aclosing(call.pages()) as pages:
                async for page in pages:
                    await db.commit_page(
                        PageWrite(
                            store=config.store,
                            resource=resource,
                            records=page.data,
                            next_cursor=page.next_cursor,
                            new_run=new_run,
                            run_params=params,
                            run_from=run_from,
                            incremental_field=None if incremental is None else incremental.field,
                        )
                    )
                    new_run = False
                    tracker.page(row, len(page.data))
        except BadRequestError as exc:
            # A saved cursor the server no longer accepts (expired, server reset): start the
            # run over. Upserts make the re-read harmless.
            if resumed and row.pages == 0 and not restarted:
                tracker.note(
                    row, f"saved cursor rejected ({exc.code or exc.status}); starting over"
                )
                state = attrs.evolve(state, done=True)
                restarted = True
                continue
            raise
        break
    tracker.finish(row, rows=await db.count(config.store, resource))


def make_client(config: StoreConfig, limiters: Mapping[str, Limiter] | None = None) -> AdminClient:
    """The client of one store; ``limiters``: by Redis URL, the limiter of stores configured
    to pace through that Redis (``StoreConfig.redis``)."""
    limiter = None if config.redis is None or limiters is None else limiters[config.redis]
    return AdminClient(
        token=config.token,
        base_url=config.base_url,
        store=config.store,
        limits=config.limits,
        retry=config.retry,
        timeout=config.timeout,
        allow_insecure=config.allow_insecure,
        user_agent="asyncsubs-cli",
        limiter=limiter,
        version=config.version,
    )


async def _sync_store(
    config: StoreConfig, db: Sink, tracker: Tracker, limiters: Mapping[str, Limiter] | None
) -> None:
    rows = {resource: tracker.add(config.store, resource) for resource in config.resources}
    async with make_client(config, limiters) as client:

        async def one(resource: str) -> None:
            row = rows[resource]
            try:
                await _sync_resource(client, config, resource, db, tracker, row)
            except DatabaseError:
                raise
            except AsyncSubsError as exc:
                # One store's failure (bad token, missing entitlement) must not stop the rest.
                log.debug("store %s, %s failed", config.store, resource, exc_info=True)
                row.client = client
                tracker.fail(row, describe_error(exc))

        try:
            async with asyncio.TaskGroup() as group:
                for resource in config.resources:
                    group.create_task(one(resource))
        finally:
            for row in rows.values():
                row.freeze_stats()


async def run_sync(
    configs: Sequence[StoreConfig],
    db_path: Path,
    tracker: Tracker,
    *,
    max_stores: int = DEFAULT_MAX_STORES,
    limiters: Mapping[str, Limiter] | None = None,
) -> None:
    """Sync every configured store into ``db_path``, ``max_stores`` stores at a time;
    progress and failures go to ``tracker``.

    Raises DatabaseError when SQLite fails (that stops everything); API and transport failures
    are recorded per (store, resource) in the tracker and the others carry on.
    """
    for config in configs:
        for resource in config.resources:
            tracker.add(config.store, resource)
    db = SyncDB(db_path)
    await db.open()
    try:
        await sync_pass(configs, db, tracker, max_stores=max_stores, limiters=limiters)
    finally:
        await db.aclose()


async def sync_pass(
    configs: Sequence[StoreConfig],
    db: Sink,
    tracker: Tracker,
    *,
    max_stores: int = DEFAULT_MAX_STORES,
    limiters: Mapping[str, Limiter] | None = None,
) -> None:
    """One run of every configured (store, resource) into the open ``db``; as ``run_sync``."""
    # Each store holds a few connections; unbounded, hundreds of stores would exhaust file
    # descriptors. Waiting stores show as "waiting".
    slots = asyncio.Semaphore(max_stores)

    async def store_task(config: StoreConfig) -> None:
        async with slots:
            await _sync_store(config, db, tracker, limiters)

    try:
        async with asyncio.TaskGroup() as group:
            for config in configs:
                group.create_task(store_task(config))
    except BaseExceptionGroup as group_exc:
        # Surface the first real error rather than a group (a DatabaseError, or a bug).
        raise _first(group_exc) from None
    finally:
        tracker.interrupt_running()


@contextlib.asynccontextmanager
async def redis_limiters(configs: Sequence[StoreConfig]) -> AsyncIterator[dict[str, Limiter]]:
    """A ``RedisLimiter`` per Redis URL the stores pace through (``redis`` key, ``--redis``),
    closed on leaving."""
    urls = sorted({config.redis for config in configs if config.redis is not None})
    if not urls:
        yield {}
        return
    try:
        from ..redis import RedisLimiter
    except ImportError:
        raise ConfigError("--redis needs redis-py: pip install 'asyncsubs[redis]'") from None
    limiters: dict[str, Limiter] = {url: RedisLimiter(url) for url in urls}
    try:
        yield limiters
    finally:
        for limiter in limiters.values():
            assert isinstance(limiter, RedisLimiter)
            await limiter.aclose()


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if isinstance(exc, DatabaseError):
            return exc
    inner = group.exceptions[0]
    return _first(inner) if isinstance(inner, BaseExceptionGroup) else inner
