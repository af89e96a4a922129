"""What a sync writes through: the ``Sink`` protocol, the values it takes and gives, and the
record rules both sinks share.

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

from ..errors import AsyncSubsError, ProtocolError
from ..json import dumps
from ..stores import RESOURCES
from ..webhooks import DeadLetterStore, Inbox

__all__ = [
    "DEFAULT_LEASE",
    "DELETED_TABLE",
    "LEARNED_TABLE",
    "LEARNED_UPDATE",
    "DatabaseError",
    "DeadLetters",
    "LeaseLostError",
    "Leases",
    "PageWrite",
    "RECORD_UPDATE",
    "RESOURCES",
    "STATE_COLUMNS",
    "STATE_TABLE",
    "STATE_UPDATE",
    "Sink",
    "SinkLifetime",
    "UnitState",
    "UnitStatus",
    "json_text",
    "newer",
    "record_columns",
    "schema",
    "text_value",
]

R = TypeVar("R")
STATE_TABLE: Final = "asyncsubs_sync_state"
#: The state table's columns ``UnitState.from_row`` reads, in its order.
STATE_COLUMNS: Final = (
    "cursor, done, run_params, run_from, next_from, seen_max, run_pages, run_records"
)


def _set_excluded(columns: str) -> str:
    return ", ".join(f"{column} = excluded.{column}" for column in columns.split(", "))


#: What an upsert writes over a record's older row (the sinks' rule says when it is older).
RECORD_UPDATE: Final = _set_excluded("status, customer_id, created_at, updated_at, raw, synced_at")
#: What committing a page writes over the unit's state (its run's start is the sink's to keep).
STATE_UPDATE: Final = _set_excluded(f"{STATE_COLUMNS}, run_finished_at, updated_at")
DELETED_TABLE: Final = "asyncsubs_deleted"
#: What each store's pools learned of the server (``AdminClient.export_learned()``), so that
#: the next sync starts at the learned rates and page sizes.
LEARNED_TABLE: Final = "asyncsubs_learned"
#: What saving a store's learned limits writes over the row saved before.
LEARNED_UPDATE: Final = _set_excluded("learned, updated_at")
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


class DatabaseError(AsyncSubsError):
    """The sync database failed (SQLite: cannot open, disk full, not a database, locked;
    PostgreSQL: unreachable, connection lost, refused)."""


class LeaseLostError(Exception):
    """Another worker took this unit over (this one's lease had expired): stop pulling it."""


def schema(*, json: str, time: str, flag: str, count: str, big: str) -> list[str]:
    """The tables both sinks keep, in a database's column types: one per resource (primary key
    ``(store, id)``, the record as received in ``raw``, typed columns as sent), the units'
    state, and the ids deleted by webhooks (ids are never reused, so a deleted id stays deleted:
    without this, a page read just before a delete and committed just after its webhook would
    bring the record back)."""
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


def text_value(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return json_text(value)


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
    typed = (next((record[n] for n in names if n in record), None) for _, names in _COLUMNS)
    return (store, text_value(record["id"]), *map(text_value, typed))


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
    def from_row(cls, row: Sequence[Any] | None, decode: Callable[[Any], Any]) -> UnitState:
        """The state in a row of ``STATE_COLUMNS`` (None: never run); ``decode`` reads the
        JSON columns as the database gives them."""
        if row is None:
            return cls()
        cursor, done, params, run_from, next_from, seen_max, pages, records = row
        return cls(
            exists=True,
            cursor=cursor,
            done=bool(done),
            run_params=decode(params) or {},
            run_from=decode(run_from),
            next_from=decode(next_from),
            seen_max=decode(seen_max),
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


class SinkLifetime:
    """``async with sink:`` opens the sink and closes it on leaving."""

    async def open(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Sink(Protocol):
    """Where a sync writes: ``sqlite.SQLiteSink`` (embedded, one writer) or
    ``postgres.PostgresSink`` (shared by many workers). Both keep the same tables and rules;
    ``sink_for(url)`` picks one. Use as ``async with sink:`` (``open`` and ``aclose``)."""

    #: The database, for messages (never a password).
    where: str

    @property
    def leases(self) -> Leases | None:
        """Units leased to workers sharing the database; None: one writer, one process."""
        ...

    async def open(self) -> None:
        """Connect and create the tables that do not exist yet."""

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Sink: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """Hold the database for this process while a sync writes it (ConfigError when another
        holds it); nothing to hold where workers share it through leases."""
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

    async def load_learned(self, store: str) -> Mapping[str, Any] | None:
        """What the store's pools learned, as its last sync saved it (None: nothing saved)."""
        ...

    async def save_learned(self, store: str, learned: Mapping[str, Any]) -> None:
        """Keep what the store's pools learned (``AdminClient.export_learned()``)."""

    async def status(self) -> list[UnitStatus]:
        """Every unit the database knows (``sync-status``); needs no ``open``, creates nothing."""
        ...

    async def webhook_stores(self) -> tuple[Inbox, DeadLetters]:
        """The inbox and the dead letters of ``sync --listen`` in this (open) database, tables
        ``webhook_inbox`` and ``webhook_dead_letters`` made if need be; closed with the sink."""
        ...

    async def has_webhook_tables(self) -> bool:
        """Whether ``sync --listen`` ever ran on this database; needs no ``open``."""
        ...


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
        """Take the lease of one pending unit nobody holds, stores in ``prefer`` first; None
        when there is none."""
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

    async def wait_for_release(self, timeout: float) -> None:
        """Return when a unit is released or finished by any worker, or after ``timeout``."""
