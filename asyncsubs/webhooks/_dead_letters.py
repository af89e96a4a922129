"""Dead letters: events whose handler kept failing, kept for inspection and requeueing."""

from __future__ import annotations

import collections
import logging
import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

import attrs

from .._sqlite import DEFAULT_BUSY_TIMEOUT
from ..errors import ConfigError
from ._sqlite import SQLiteTable

__all__ = [
    "DEAD_LETTER_TABLE",
    "DeadLetter",
    "DeadLetterStore",
    "MemoryDeadLetters",
    "SQLiteDeadLetters",
    "StoreScopedRemoval",
    "remove_store_letters",
]

log = logging.getLogger("asyncsubs.webhooks")

DEAD_LETTER_TABLE: Final = "webhook_dead_letters"


@attrs.frozen
class DeadLetter:
    """An accepted event that was never handled: the body exactly as received (signature already
    checked), the last error, how many attempts were made (over every requeue) and when it was
    given up (epoch s); ``store``: the store of the receiver that accepted it, if bound to one."""

    event_id: str
    topic: str | None
    body: bytes = attrs.field(repr=False)
    error: str
    attempts: int
    failed_at: float
    store: str | None = None


@runtime_checkable
class DeadLetterStore(Protocol):
    """Where dead letters go. Async, so a store may write to disk or a remote service.

    ``remove(event_id)`` removes that event's letters of every store. A store should also have
    ``remove_for_store(store, event_id)`` (``StoreScopedRemoval``): requeueing one store's
    letters uses it, so that other stores' letters with the same event id stay. It is not
    required here, so stores written before it still fit (see ``remove_store_letters``)."""

    async def add(self, letter: DeadLetter) -> None: ...

    async def all(self) -> list[DeadLetter]: ...

    async def remove(self, event_id: str) -> int: ...


@runtime_checkable
class StoreScopedRemoval(Protocol):
    """A dead-letter store that can remove one store's letters of an event (``store`` None:
    the letters of a receiver bound to no store), leaving other stores' with the same id."""

    async def remove_for_store(self, store: str | None, event_id: str) -> int: ...


async def remove_store_letters(dead: DeadLetterStore, store: str | None, event_id: str) -> int:
    """Remove ``store``'s letters of ``event_id`` from ``dead``, and only those; returns how many.

    Event ids are only unique per store, so a store without ``remove_for_store`` has its
    ``remove(event_id)`` take every store's letters of that id, and the other stores' are
    added back (not atomic: use ``remove_for_store`` where stores share event ids)."""
    if isinstance(dead, StoreScopedRemoval):
        return await dead.remove_for_store(store, event_id)
    others = [x for x in await dead.all() if x.event_id == event_id and x.store != store]
    removed = await dead.remove(event_id)
    for letter in others:
        try:
            await dead.add(letter)
        except Exception:
            log.exception(
                "dead letter %s of store %s removed with another store's and not added back",
                letter.event_id,
                letter.store,
            )
            raise
    return max(0, removed - len(others))


class MemoryDeadLetters:
    """In-process dead letters (the default), at most ``max_entries``; beyond that the oldest
    is dropped with an error logged, so memory stays bounded and nothing goes silently."""

    def __init__(self, max_entries: int = 10_000) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigError(f"max_entries must be a positive int, got {max_entries!r}")
        self._letters: collections.deque[DeadLetter] = collections.deque()
        self.max_entries = max_entries

    def __len__(self) -> int:
        return len(self._letters)

    def __repr__(self) -> str:
        return f"<MemoryDeadLetters {len(self._letters)}>"

    async def add(self, letter: DeadLetter) -> None:
        self._letters.append(letter)
        while len(self._letters) > self.max_entries:
            lost = self._letters.popleft()
            log.error(
                "dead-letter store full (%d); dropping the oldest, event %s (%s)",
                self.max_entries,
                lost.event_id,
                lost.topic,
            )

    async def all(self) -> list[DeadLetter]:
        return list(self._letters)

    async def remove(self, event_id: str) -> int:
        before = len(self._letters)
        self._letters = collections.deque(x for x in self._letters if x.event_id != event_id)
        return before - len(self._letters)

    async def remove_for_store(self, store: str | None, event_id: str) -> int:
        before = len(self._letters)
        self._letters = collections.deque(
            x for x in self._letters if (x.store, x.event_id) != (store, event_id)
        )
        return before - len(self._letters)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


class SQLiteDeadLetters(SQLiteTable):
    """Dead letters in an SQLite table (default ``webhook_dead_letters``)::

        webhook_dead_letters(event_id TEXT, topic TEXT, body BLOB, error TEXT,
                             attempts INTEGER, failed_at TEXT, store TEXT)
        -- failed_at: ISO-8601 UTC; store: the receiver's store (NULL when not bound to one)

    Pass a path (its own connection, WAL mode; it may be the sync database itself) or an open
    ``sqlite3.Connection`` made with ``check_same_thread=False`` that nothing else uses
    concurrently. All SQLite work runs on one worker thread, never on the event loop.
    """

    def __init__(
        self,
        path_or_conn: str | Path | sqlite3.Connection,
        *,
        table: str = DEAD_LETTER_TABLE,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        super().__init__(path_or_conn, table=table, busy_timeout=busy_timeout)

    def _create(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {self.table} (
                event_id TEXT NOT NULL,
                topic TEXT,
                body BLOB NOT NULL,
                error TEXT NOT NULL,
                attempts INTEGER NOT NULL,
                failed_at TEXT NOT NULL,
                store TEXT
            )"""
        )
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({self.table})")}
        if "store" not in columns:  # made before letters named their store
            conn.execute(f"ALTER TABLE {self.table} ADD COLUMN store TEXT")

    def _all(self) -> list[DeadLetter]:
        rows = self._connect().execute(
            f"SELECT event_id, topic, body, error, attempts, failed_at, store FROM {self.table}"
            " ORDER BY rowid"
        )
        return [
            DeadLetter(
                event_id=row[0],
                topic=row[1],
                body=bytes(row[2]),
                error=row[3],
                attempts=row[4],
                failed_at=_epoch(row[5]),
                store=row[6],
            )
            for row in rows
        ]

    async def add(self, letter: DeadLetter) -> None:
        await self._write(
            f"INSERT INTO {self.table}"
            " (event_id, topic, body, error, attempts, failed_at, store)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                letter.event_id,
                letter.topic,
                letter.body,
                letter.error,
                letter.attempts,
                _iso(letter.failed_at),
                letter.store,
            ),
        )

    async def all(self) -> list[DeadLetter]:
        return await self._run(self._all)

    async def remove(self, event_id: str) -> int:
        return await self._write(f"DELETE FROM {self.table} WHERE event_id = ?", (event_id,))

    async def remove_for_store(self, store: str | None, event_id: str) -> int:
        # ``IS``: equal when both are NULL (letters of a receiver bound to no store).
        return await self._write(
            f"DELETE FROM {self.table} WHERE event_id = ? AND store IS ?", (event_id, store)
        )
