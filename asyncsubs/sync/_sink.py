"""What a sync writes through: the roles a sink plays (``Sink``: all of them), the values it
takes and gives, and ``SQLSink``, what both sinks do alike in their SQL dialects.

A sink keeps, per ``(store, resource)`` unit, the records (one table per resource, primary key
``(store, id)``) and the unit's state (the cursor to continue from, the run's pages and
records, the incremental high-water marks). ``commit_page`` writes a page's records and the
cursor after them in one transaction, so the database always holds whole pages and the cursor
that continues after the last of them. Webhooks write single records with the same rule:
newer-or-equal ``updatedAt`` wins, and a deleted id never comes back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol, Self, TypeVar

import attrs

from .._versions import newer
from ..errors import AsyncSubsError, ConfigError, ProtocolError
from ..json import dumps
from ..stores import RESOURCES, LearnedStore
from ..webhooks import DeadLetterStore, Inbox

__all__ = [
    "DEFAULT_LEASE",
    "DatabaseConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "DeadLetters",
    "Dialect",
    "LeaseLostError",
    "Leases",
    "OLDER",
    "PageWrite",
    "Records",
    "SQLSink",
    "STATE_TABLE",
    "Sink",
    "Statements",
    "UnitHandedOver",
    "UnitState",
    "UnitStatus",
    "WebhookTables",
    "json_text",
    "schema",
]

R = TypeVar("R")
STATE_TABLE: Final = "asyncsubs_sync_state"
#: The state table's columns ``UnitState.from_row`` reads, in its order.
STATE_COLUMNS: Final = (
    "cursor, done, run_params, run_from, next_from, seen_max, run_pages, run_records"
)
DELETED_TABLE: Final = "asyncsubs_deleted"
#: The SQL function of ``_versions.older`` both sinks define: whether stamp a is older than b.
OLDER: Final = "asyncsubs_older"
#: What each store's pools learned of the server (``AdminClient.export_learned()``), so that
#: the next sync starts at the learned rates and page sizes.
LEARNED_TABLE: Final = "asyncsubs_learned"
#: Seconds a worker's lease on a unit lasts unless renewed: how long a killed worker's units
#: wait before another worker takes them over.
DEFAULT_LEASE: Final = 30.0
Unit = tuple[str, str]

# Typed columns and the record fields they come from (camelCase as the service sends them;
# snake_case accepted too). Values are stored as sent; ids as TEXT so joins are type-stable.
_COLUMNS: Final = (
    ("status", ("status",)),
    ("customer_id", ("customerId", "customer_id")),
    ("created_at", ("createdAt", "created_at")),
    ("updated_at", ("updatedAt", "updated_at")),
)
_TYPED: Final = tuple(column for column, _ in _COLUMNS)


class DatabaseError(AsyncSubsError):
    """The sync database failed (SQLite: cannot open, disk full, not a database, locked;
    PostgreSQL: unreachable, connection lost, refused)."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be written now, through no fault of what was written (SQLite:
    locked by another process past the busy timeout; PostgreSQL: unreachable, restarting,
    the connection lost): the same write may succeed later."""


class DatabaseConfigError(ConfigError):
    """The database a sink was given (``sink_for``'s ``url``) cannot be used: ``problem`` says
    why (the command line names the database by its flag)."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem, key="database")


class LeaseLostError(Exception):
    """This worker no longer holds the unit: stop pulling it. ``why``: its lease expired and
    another worker took it over, or it was handed to a worker that had none."""

    def __init__(
        self, unit: str, why: str = "lease lost to another worker (this one was too slow)"
    ) -> None:
        super().__init__(unit, why)
        self.unit = unit
        self.why = why

    def __str__(self) -> str:
        return f"{self.unit}: {self.why}"


class UnitHandedOver(LeaseLostError):
    """The page was committed, then the unit handed to a worker that had none: stop pulling."""

    def __init__(self, unit: str, why: str = "handed to a worker that had none") -> None:
        super().__init__(unit, why)


def schema(*, json: str, time: str, flag: str, count: str, big: str) -> list[str]:
    """The tables both sinks keep, in a database's column types: one per resource, the units'
    state, the learned limits, and the ids deleted by webhooks (ids are never reused: without
    them, a page read just before a delete and committed just after its webhook would bring
    the record back)."""
    records = [
        f"""CREATE TABLE IF NOT EXISTS {resource} (
            store TEXT NOT NULL,
            id TEXT NOT NULL,
            status TEXT,
            customer_id TEXT,
            created_at TEXT,
            updated_at TEXT,
            raw {json} NOT NULL,
            synced_at {time} NOT NULL,
            PRIMARY KEY (store, id)
        )"""
        for resource in RESOURCES
    ]
    return [
        *records,
        f"""CREATE TABLE IF NOT EXISTS {STATE_TABLE} (
            store TEXT NOT NULL,
            resource TEXT NOT NULL,
            cursor TEXT,                -- afterCursor of the next page; NULL: from the start
            done {flag} NOT NULL,       -- the last run finished; the next one starts over
            run_params {json},          -- query filter of the current run (reused on resume)
            run_from {json},            -- incremental value the next run will start from
            next_from {json},           -- incremental value for the next run
            seen_max {json},            -- largest incremental field value committed
            run_pages {count} NOT NULL,
            run_records {big} NOT NULL,
            run_started_at {time} NOT NULL,
            run_finished_at {time},
            updated_at {time} NOT NULL,
            PRIMARY KEY (store, resource)
        )""",
        f"""CREATE TABLE IF NOT EXISTS {DELETED_TABLE} (
            store TEXT NOT NULL,
            resource TEXT NOT NULL,
            id TEXT NOT NULL,
            deleted_at {time} NOT NULL,
            PRIMARY KEY (store, resource, id)
        )""",
        f"""CREATE TABLE IF NOT EXISTS {LEARNED_TABLE} (
            store TEXT NOT NULL PRIMARY KEY,
            learned {json} NOT NULL,    -- AdminClient.export_learned() of the store's client
            updated_at {time} NOT NULL
        )""",
    ]


def json_text(value: Any) -> str:
    """``value`` as compact JSON text, integers beyond 64 bits exact, non-ASCII as itself."""
    return dumps(value).decode()


def _text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else json_text(value)


def _same(value: Any) -> Any:
    return value


def _set_excluded(columns: str) -> str:
    return ", ".join(f"{column} = excluded.{column}" for column in columns.split(", "))


@attrs.frozen
class Dialect:
    """How one database spells what both sinks run."""

    #: A named parameter, ``{}`` for its name: ``:{}`` (SQLite), ``%({})s`` (psycopg).
    param: str
    #: The time now, as the database writes it.
    now: str
    #: One row, whose first column is true, when table ``{}`` exists.
    has_table: str
    #: A value as a JSON column takes it (None is NULL), and back.
    dump: Callable[[Any], Any]
    load: Callable[[Any], Any] = _same


class Statements:
    """The statements both sinks run, in one ``Dialect``, their parameters by name."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = d = dialect
        p = d.param.format
        unit = f"store = {p('store')} AND resource = {p('resource')}"
        self.load_state = f"SELECT {STATE_COLUMNS} FROM {STATE_TABLE} WHERE {unit}"
        state = ", ".join(p(column) for column in STATE_COLUMNS.split(", "))
        # A run's start is the sink's to keep while it goes on.
        self.save_state = f"""INSERT INTO {STATE_TABLE} (store, resource, {STATE_COLUMNS},
                run_started_at, run_finished_at, updated_at)
            VALUES ({p("store")}, {p("resource")}, {state}, {d.now},
                CASE WHEN {p("done")} THEN {d.now} END, {d.now})
            ON CONFLICT (store, resource) DO UPDATE
                SET {_set_excluded(f"{STATE_COLUMNS}, run_finished_at, updated_at")},
                run_started_at = CASE WHEN {p("new_run")} THEN excluded.run_started_at
                                 ELSE {STATE_TABLE}.run_started_at END"""
        self.remember_deleted = (
            f"INSERT INTO {DELETED_TABLE} (store, resource, id, deleted_at)"
            f" VALUES ({p('store')}, {p('resource')}, {p('id')}, {d.now}) ON CONFLICT DO NOTHING"
        )
        self.load_learned = f"SELECT learned FROM {LEARNED_TABLE} WHERE store = {p('store')}"
        self.save_learned = (
            f"INSERT INTO {LEARNED_TABLE} (store, learned, updated_at)"
            f" VALUES ({p('store')}, {p('learned')}, {d.now})"
            f" ON CONFLICT (store) DO UPDATE SET {_set_excluded('learned, updated_at')}"
        )
        self._upserts: dict[tuple[str, str], str] = {}

    def count(self, resource: str) -> str:
        return f"SELECT count(*) FROM {resource} WHERE store = {self.dialect.param.format('store')}"

    def delete(self, resource: str) -> str:
        p = self.dialect.param.format
        return f"DELETE FROM {resource} WHERE store = {p('store')} AND id = {p('id')}"

    def upsert(self, resource: str, rows: str = "") -> str:
        # Newer-or-equal wins, so webhooks and pulls may land in any order: a stale page never
        # overwrites a fresher webhook, nor a late webhook a fresher page. Stamps compare by
        # ``_versions.older`` (``OLDER``, each database's function of it). Equal stamps
        # replace: the next (inclusive) incremental pull settles same-second changes. A
        # deleted id never comes back. ``rows``: a FROM item ``v`` (default: one record's).
        if (resource, rows) in self._upserts:
            return self._upserts[resource, rows]
        d, p = self.dialect, self.dialect.param.format
        columns = ", ".join(("id", *_TYPED, "raw"))
        source = rows or f"(SELECT {', '.join(f'{p(c)} AS {c}' for c in columns.split(', '))}) v"
        update = _set_excluded("status, customer_id, created_at, updated_at, raw, synced_at")
        self._upserts[resource, rows] = sql = f"""INSERT INTO {resource} AS t
                (store, {columns}, synced_at)
            SELECT {p("store")}, {columns}, {d.now} FROM {source}
            WHERE NOT EXISTS (SELECT 1 FROM {DELETED_TABLE}
                WHERE store = {p("store")} AND resource = '{resource}' AND id = v.id)
            ON CONFLICT (store, id) DO UPDATE SET {update}
            WHERE NOT {OLDER}(excluded.updated_at, t.updated_at)"""
        return sql

    def record(self, store: str, record: Mapping[str, Any]) -> dict[str, Any]:
        """The upsert's parameters for one record (which has an ``id``)."""
        typed = {
            column: _text(next((record[n] for n in names if n in record), None))
            for column, names in _COLUMNS
        }
        raw = self.dialect.dump(record)
        return {"store": store, "id": _text(record["id"]), **typed, "raw": raw}

    def state(
        self, write: PageWrite, old: Sequence[Any] | None, rows: int, page_max: Any
    ) -> dict[str, Any]:
        """``save_state``'s parameters: the unit's state after ``write`` over the row ``old``."""
        new = write.state_after(UnitState.from_row(old, self.dialect.load), rows, page_max)
        dump = self.dialect.dump
        return {
            "store": write.store,
            "resource": write.resource,
            "cursor": new.cursor,
            "done": new.done,
            "run_params": dump(dict(new.run_params)),
            "run_from": dump(new.run_from),
            "next_from": dump(new.next_from),
            "seen_max": dump(new.seen_max),
            "run_pages": new.run_pages,
            "run_records": new.run_records,
            "new_run": write.new_run,
        }


@attrs.frozen
class UnitState:
    """The saved state of one (store, resource)."""

    exists: bool = False
    cursor: str | None = None
    #: The last run finished: the next one starts over.
    done: bool = False
    #: The query filter of the current run, reused when it resumes.
    run_params: Mapping[str, Any] = attrs.field(factory=dict)
    #: Incremental: the value the next run filters from, once this run is done.
    run_from: Any = None
    next_from: Any = None
    #: Incremental: the largest value of the field committed so far.
    seen_max: Any = None
    run_pages: int = 0
    run_records: int = 0

    @property
    def in_progress(self) -> bool:
        """A run was started and not finished: resume it."""
        return self.exists and not self.done

    @classmethod
    def from_row(cls, row: Sequence[Any] | None, load: Callable[[Any], Any]) -> UnitState:
        """The state in a row of ``STATE_COLUMNS`` (None: never run), JSON read by ``load``."""
        if row is None:
            return cls()
        cursor, done, params, run_from, next_from, seen_max, pages, records = row
        return cls(
            exists=True,
            cursor=cursor,
            done=bool(done),
            run_params=load(params) or {},
            run_from=load(run_from),
            next_from=load(next_from),
            seen_max=load(seen_max),
            run_pages=pages,
            run_records=records,
        )


@attrs.frozen
class PageWrite:
    """One page to commit with the cursor after it (``None``: the run is done)."""

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

    def state_after(self, old: UnitState, rows: int, page_max: Any) -> UnitState:
        """The unit's state once this page is committed over ``old``."""
        done = self.next_cursor is None
        return UnitState(
            exists=True,
            cursor=self.next_cursor,
            done=done,
            run_params=self.run_params,
            run_from=self.run_from,
            next_from=self.run_from if done else old.next_from,
            seen_max=newer(old.seen_max, page_max),
            run_pages=1 if self.new_run else old.run_pages + 1,
            run_records=rows if self.new_run else old.run_records + rows,
        )


@attrs.frozen
class UnitStatus:
    """One unit as ``sync-status`` shows it (holder and lease: PostgreSQL's workers only)."""

    store: str
    resource: str
    state: str
    holder: str | None
    lease_left: float | None
    records: int | None
    pages: int | None
    cursor_age: float | None
    error: str | None


class SQLSink:
    """What both sinks do alike, in their ``Statements``, through four calls of their own:
    ``_one`` (a statement's first row), ``_write`` (statements in one transaction), ``_read``
    (without opening the sink) and, for ``status``, ``_STATUS``: the table it needs, its query.
    ``async with sink:`` opens it and closes it on leaving."""

    _SQL: Statements
    _STATUS: tuple[str, str]

    async def open(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _one(self, sql: str, params: Mapping[str, Any]) -> Any:
        raise NotImplementedError

    async def _write(self, *statements: tuple[str, Any]) -> int:
        """The rows ``statements``, run in one transaction, wrote."""
        raise NotImplementedError

    async def _read(self, sql: str) -> list[Any]:
        raise NotImplementedError

    async def load_state(self, store: str, resource: str) -> UnitState:
        row = await self._one(self._SQL.load_state, {"store": store, "resource": resource})
        return UnitState.from_row(row, self._SQL.dialect.load)

    async def upsert_record(self, store: str, resource: str, record: Mapping[str, Any]) -> bool:
        return await self._write((self._SQL.upsert(resource), self._SQL.record(store, record))) > 0

    async def delete_record(self, store: str, resource: str, record_id: Any) -> None:
        params = {"store": store, "resource": resource, "id": _text(record_id)}
        await self._write(
            (self._SQL.delete(resource), params), (self._SQL.remember_deleted, params)
        )

    async def count(self, store: str, resource: str) -> int:
        return int((await self._one(self._SQL.count(resource), {"store": store}))[0])

    async def load_learned(self, store: str) -> Mapping[str, Any] | None:
        row = await self._one(self._SQL.load_learned, {"store": store})
        return None if row is None else self._SQL.dialect.load(row[0])

    async def save_learned(self, store: str, learned: Mapping[str, Any]) -> None:
        learned = self._SQL.dialect.dump(dict(learned))
        await self._write((self._SQL.save_learned, {"store": store, "learned": learned}))

    async def _has_table(self, name: str) -> bool:
        rows = await self._read(self._SQL.dialect.has_table.format(name))
        return bool(rows and rows[0][0])

    async def status(self) -> list[UnitStatus] | None:
        table, sql = self._STATUS
        if not await self._has_table(table):
            return None
        return [UnitStatus(*row) for row in await self._read(sql)]

    async def has_webhook_tables(self) -> bool:
        return await self._has_table("webhook_dead_letters")


# The roles a sink plays; a sink implements those it stores.


class Records(Protocol):
    """Rows and cursors: the records of each unit and the state it continues from, in
    ``async with sink:``."""

    #: The database, for messages (never a password).
    where: str

    @property
    def leases(self) -> Leases | None:
        """Units leased to workers sharing the database; None: one writer, one process."""
        ...

    async def open(self) -> None:
        """Connect and create the tables that do not exist yet."""

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold the database for this process while a sync writes it (DatabaseConfigError when
        another holds it); nothing to hold where workers share it through leases."""
        ...

    async def load_state(self, store: str, resource: str) -> UnitState: ...

    async def commit_page(self, write: PageWrite) -> None:
        """The page's records and the cursor after them, in one transaction."""

    async def upsert_record(self, store: str, resource: str, record: Mapping[str, Any]) -> bool:
        """One record (a webhook's) under the pulls' rule; False when the stored row is newer
        or the id was deleted."""
        ...

    async def delete_record(self, store: str, resource: str, record_id: Any) -> None:
        """Delete one record and remember its id, so no later write brings it back."""

    async def count(self, store: str, resource: str) -> int: ...

    async def status(self) -> list[UnitStatus] | None:
        """Every unit the database knows (``sync-status``); None when no sync ever wrote to it.
        Needs no ``open``, creates nothing."""
        ...


class WebhookTables(Protocol):
    """The webhook inbox and dead letters of a ``ListenSync``, beside the records they update."""

    async def webhook_stores(self) -> tuple[Inbox, DeadLetters]:
        """The inbox and dead letters in this (open) database, made if need be; closed with
        the sink."""
        ...

    async def has_webhook_tables(self) -> bool:
        """Whether a ``ListenSync`` ever ran on this database; needs no ``open``."""
        ...


class Sink(Records, LearnedStore, WebhookTables, Protocol):
    """Where a sync writes, every role: ``sqlite.SQLiteSink`` (one writer) or
    ``postgres.PostgresSink`` (shared by workers through its ``Leases``); ``sink_for(url)``
    picks one."""


class DeadLetters(DeadLetterStore, Protocol):
    """A sink's dead letters, which can remove one store's letters of an event and leave other
    stores' with the same id (event ids are unique per store only)."""

    async def remove_for_store(self, store: str | None, event_id: str) -> int: ...


class Leases(Protocol):
    """Units of work shared by workers: a round of units, claimed one at a time under a lease
    that a heartbeat and every commit renew (``postgres.PostgresSink``)."""

    lease: float

    async def join_round(self, units: Sequence[Unit]) -> bool:
        """Join the current round of ``units``, or start a new one when every unit of the last
        is finished; True when this call started it (or added units never seen before)."""
        ...

    async def claim(self, units: Sequence[Unit], *, prefer: Sequence[str] = ()) -> Unit | None:
        """Take the lease of one pending unit nobody else holds, stores in ``prefer`` first;
        None when there is none."""
        ...

    async def renew(self, units: Sequence[Unit]) -> list[Unit]:
        """Extend every lease this worker holds; those of ``units`` it no longer holds."""
        ...

    async def release(self, unit: Unit, *, error: str | None = None) -> None:
        """Give up the lease of ``unit`` (failed with ``error``: not retried this round)."""

    async def release_all(self) -> None:
        """Give up every lease this worker holds (stopping), so others take them at once."""

    async def pending_wait(self, units: Sequence[Unit]) -> float | None:
        """None when no unit of ``units`` is pending; else the seconds until another worker's
        lease may expire."""
        ...

    async def failures(self, units: Sequence[Unit]) -> dict[Unit, str]:
        """The units of ``units`` left failed (by any worker, in this round or an earlier one
        that did not start them over), with their error."""
        ...

    async def wait_for_release(self, timeout: float) -> None:
        """Return when a unit is released or finished by any worker, or after ``timeout``."""
