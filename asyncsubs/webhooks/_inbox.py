"""The durable inbox: accepted deliveries written down before they are acknowledged.

A receiver with an inbox answers 200 only once the delivery is in it; it hands events to the
handler from memory, removes each from the inbox once handled (or dead-lettered), and on start
queues again whatever a crash or a shutdown left there. So an acknowledged event survives
SIGKILL, and handlers must be idempotent (an event handled just before a crash, but not yet
removed, is handled again).

``Inbox`` is the small interface a store implements (``SQLiteInbox`` here; a PostgreSQL sink can
implement the same three calls). Entries are keyed by ``(store, event_id)``: one table can
serve the receivers of many stores.
"""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

import attrs

from .._sqlite import DEFAULT_BUSY_TIMEOUT
from ._sqlite import SQLiteTable

__all__ = ["INBOX_TABLE", "Inbox", "InboxEntry", "SQLiteInbox"]

INBOX_TABLE: Final = "webhook_inbox"


@attrs.frozen
class InboxEntry:
    """An accepted delivery: the body exactly as received (signature checked), the store of the
    receiver that accepted it (``""`` when not bound to one), when it was accepted (epoch s) and
    the handler attempts already spent on it (non-zero for a requeued dead letter)."""

    store: str
    event_id: str
    body: bytes = attrs.field(repr=False)
    received_at: float
    attempts: int = 0


@runtime_checkable
class Inbox(Protocol):
    """Where accepted deliveries wait until handled. ``add`` must be durable when it returns."""

    async def add(self, entry: InboxEntry) -> bool:
        """Keep ``entry``; False when an entry with its store and event id is already kept."""
        ...

    async def pending(self, store: str) -> list[InboxEntry]:
        """The store's entries, oldest first."""
        ...

    async def remove(self, store: str, event_id: str) -> None: ...


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds")


class SQLiteInbox(SQLiteTable):
    """The inbox in an SQLite table (default ``webhook_inbox``)::

        webhook_inbox(store TEXT, event_id TEXT, body BLOB, received_at TEXT, attempts INTEGER,
                      PRIMARY KEY (store, event_id))     -- received_at: ISO-8601 UTC

    Each ``add`` is its own committed transaction (WAL, ``synchronous=NORMAL``): it survives the
    process being killed; a power cut may lose the last commits. A path gets its own
    connection (it may be the sync database itself); see ``SQLiteTable`` for connections.
    """

    def __init__(
        self,
        path_or_conn: str | Path | sqlite3.Connection,
        *,
        table: str = INBOX_TABLE,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        super().__init__(path_or_conn, table=table, busy_timeout=busy_timeout)

    def _create(self, conn: sqlite3.Connection) -> None:
        conn.execute(
            f"""CREATE TABLE IF NOT EXISTS {self.table} (
                store TEXT NOT NULL,
                event_id TEXT NOT NULL,
                body BLOB NOT NULL,
                received_at TEXT NOT NULL,
                attempts INTEGER NOT NULL,
                PRIMARY KEY (store, event_id)
            )"""
        )

    async def add(self, entry: InboxEntry) -> bool:
        added = await self._write(
            f"INSERT INTO {self.table} (store, event_id, body, received_at, attempts)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            (entry.store, entry.event_id, entry.body, _iso(entry.received_at), entry.attempts),
        )
        return added > 0

    def _pending(self, store: str) -> list[InboxEntry]:
        rows = self._connect().execute(
            f"SELECT event_id, body, received_at, attempts FROM {self.table}"
            " WHERE store = ? ORDER BY rowid",
            (store,),
        )
        return [
            InboxEntry(
                store=store,
                event_id=row[0],
                body=bytes(row[1]),
                received_at=datetime.fromisoformat(row[2]).timestamp(),
                attempts=row[3],
            )
            for row in rows
        ]

    async def pending(self, store: str) -> list[InboxEntry]:
        return await self._run(self._pending, store)

    async def remove(self, store: str, event_id: str) -> None:
        await self._write(
            f"DELETE FROM {self.table} WHERE store = ? AND event_id = ?",
            (store, event_id),
        )
