"""Dead letters: events whose handler kept failing, kept for inspection and requeueing."""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol, TypeVar, runtime_checkable

import attrs

from ..errors import ConfigError

__all__ = [
    "DEAD_LETTER_TABLE",
    "DeadLetter",
    "DeadLetterStore",
    "MemoryDeadLetters",
    "SQLiteDeadLetters",
]

T = TypeVar("T")
log = logging.getLogger("asyncsubs.webhooks")

DEAD_LETTER_TABLE: Final = "webhook_dead_letters"
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


@attrs.frozen
class DeadLetter:
    """An accepted event that was never handled: the body exactly as received (signature already
    checked), the last error, how many attempts were made and when it was given up (epoch s)."""

    event_id: str
    topic: str | None
    body: bytes = attrs.field(repr=False)
    error: str
    attempts: int
    failed_at: float


@runtime_checkable
class DeadLetterStore(Protocol):
    """Where dead letters go. Async, so a store may write to disk or a remote service."""

    async def add(self, letter: DeadLetter) -> None: ...

    async def all(self) -> list[DeadLetter]: ...

    async def remove(self, event_id: str) -> int: ...


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


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


class SQLiteDeadLetters:
    """Dead letters in an SQLite table (default ``webhook_dead_letters``)::

        webhook_dead_letters(event_id TEXT, topic TEXT, body BLOB, error TEXT,
                             attempts INTEGER, failed_at TEXT)   -- failed_at: ISO-8601 UTC

    Pass a path (its own connection, WAL mode; it may be the sync database itself) or an open
    ``sqlite3.Connection`` made with ``check_same_thread=False`` that nothing else uses
    concurrently. All SQLite work runs on one worker thread, never on the event loop.
    """

    def __init__(
        self, path_or_conn: str | Path | sqlite3.Connection, *, table: str = DEAD_LETTER_TABLE
    ) -> None:
        if not table or not set(table) <= _NAME_CHARS or table[0].isdigit():
            raise ConfigError(f"table must be a plain SQL identifier, got {table!r}")
        self.table = table
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncsubs-dlq")
        self._own = not isinstance(path_or_conn, sqlite3.Connection)
        self._target = path_or_conn
        self._conn: sqlite3.Connection | None = None

    def __repr__(self) -> str:
        where = "connection" if not self._own else str(self._target)
        return f"<SQLiteDeadLetters {where} table={self.table}>"

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if isinstance(self._target, sqlite3.Connection):
                conn = self._target
            else:
                conn = sqlite3.connect(self._target, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA busy_timeout = 10000")
                conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {self.table} (
                    event_id TEXT NOT NULL,
                    topic TEXT,
                    body BLOB NOT NULL,
                    error TEXT NOT NULL,
                    attempts INTEGER NOT NULL,
                    failed_at TEXT NOT NULL
                )"""
            )
            if conn.in_transaction:
                conn.commit()
            self._conn = conn
        return self._conn

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def _add(self, letter: DeadLetter) -> None:
        conn = self._connect()
        conn.execute(
            f"INSERT INTO {self.table} (event_id, topic, body, error, attempts, failed_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                letter.event_id,
                letter.topic,
                letter.body,
                letter.error,
                letter.attempts,
                _iso(letter.failed_at),
            ),
        )
        if conn.in_transaction:
            conn.commit()

    def _all(self) -> list[DeadLetter]:
        rows = self._connect().execute(
            f"SELECT event_id, topic, body, error, attempts, failed_at FROM {self.table}"
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
            )
            for row in rows
        ]

    def _remove(self, event_id: str) -> int:
        conn = self._connect()
        removed = conn.execute(f"DELETE FROM {self.table} WHERE event_id = ?", (event_id,))
        if conn.in_transaction:
            conn.commit()
        return removed.rowcount

    async def add(self, letter: DeadLetter) -> None:
        await self._run(self._add, letter)

    async def all(self) -> list[DeadLetter]:
        return await self._run(self._all)

    async def remove(self, event_id: str) -> int:
        return await self._run(self._remove, event_id)

    async def close(self) -> None:
        """Close the connection if this object opened it, and the worker thread."""
        conn, self._conn = self._conn, None
        if conn is not None and self._own:
            await self._run(conn.close)
        self._executor.shutdown(wait=True)
