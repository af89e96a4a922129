"""Deletes for the warehouse: a record deleted on the server is absent from every later pull,
so only its delete webhook can say it is gone.

``DeleteLog`` keeps each delete a ``WebhookReceiver`` accepts in a SQLite file, in order; a
source given the file yields a row per delete logged since the resource's last run (how far it
read: its dlt state), ``DELETED_COLUMN`` true, hinted ``hard_delete``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Final

import attrs

from ..errors import ConfigError
from ..webhooks import Handler, WebhookEvent

__all__ = ["DELETED_COLUMN", "Delete", "DeleteLog"]

#: The column of a delete row, hinted ``hard_delete``: true deletes the row with its key.
DELETED_COLUMN: Final = "asyncsubs_deleted"

_SCHEMA: Final = """
    CREATE TABLE IF NOT EXISTS asyncsubs_deletes (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        store TEXT NOT NULL,
        resource TEXT NOT NULL,
        id TEXT NOT NULL,            -- JSON: the id as the webhook sent it
        deleted_at REAL NOT NULL     -- Unix time the delete was logged
    )"""


@attrs.frozen
class Delete:
    """One logged delete; ``seq`` orders them."""

    seq: int
    store: str
    resource: str
    id: Any


class DeleteLog:
    """Deletes in a SQLite file the receiver and the pipeline share (separate processes, as a
    rule: each call connects). docs/dlt.md shows both sides."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"deletes: {self.path} is a directory; name a database file")

    def __repr__(self) -> str:
        return f"<DeleteLog {str(self.path)!r}>"

    def _connect(self) -> contextlib.closing[sqlite3.Connection]:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
        return contextlib.closing(conn)

    def add(self, store: str, resource: str, record_id: Any) -> None:
        """Log one delete (blocking; ``record`` is the async form)."""
        if record_id is None or not store or not resource:
            raise ConfigError("a delete needs a store, a resource and an id")
        with self._connect() as conn:
            conn.execute(
                "INSERT INTO asyncsubs_deletes (store, resource, id, deleted_at) VALUES (?,?,?,?)",
                (store, resource, json.dumps(record_id), time.time()),
            )

    async def record(self, event: WebhookEvent, *, store: str | None = None) -> bool:
        """Log ``event`` if it is a delete (of ``event.store``, else of ``store``); True if it
        was one. Call it from your own handler."""
        if not event.is_delete or event.record_id is None:
            return False
        owner = event.store or store
        if owner is None:
            raise ConfigError(f"event {event.id}: a delete naming no store, and no store= given")
        await asyncio.to_thread(self.add, owner, event.resource, event.record_id)
        return True

    def handler(self, store: str | None = None) -> Handler:
        """A ``WebhookReceiver`` handler that logs deletes and ignores every other event."""

        async def log_deletes(event: WebhookEvent) -> None:
            await self.record(event, store=store)

        return log_deletes

    def since(self, seq: int, resource: str) -> list[Delete]:
        """The deletes of ``resource`` logged after ``seq``, oldest first (blocking)."""
        if not self.path.exists():
            return []
        with self._connect() as conn:
            found = conn.execute(
                "SELECT seq, store, resource, id FROM asyncsubs_deletes"
                " WHERE seq > ? AND resource = ? ORDER BY seq",
                (seq, resource),
            ).fetchall()
        return [Delete(s, store, r, json.loads(i)) for s, store, r, i in found]
