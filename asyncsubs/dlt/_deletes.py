"""Deletes for the warehouse: the ids the service's delete webhooks name, kept until a pipeline
run hands them to dlt as hard deletes.

A record deleted on the server is absent from every later list pull, so a pull can never tell
the warehouse it is gone. Its delete webhook can: ``DeleteLog`` writes each delete a
``WebhookReceiver`` accepts (its handler, or a call from yours) to a small SQLite file, in order;
a source given the file yields, for every resource, a row per delete logged since its last run
carrying ``asyncsubs_deleted = true``, the column dlt's ``hard_delete`` hint names, and the merge
deletes the row with that (``store``, ``id``). How far each resource has read is kept in its
dlt state, committed with the load, so a failed run applies the same deletes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import attrs

from ..errors import ConfigError
from ..webhooks import WebhookEvent

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
    """Deletes the webhooks announced, in a SQLite file the receiver and the pipeline share.

    ::

        log = DeleteLog("deletes.db")
        receiver = WebhookReceiver(WebhookConfig(secret), log.handler("acme"), store="acme")
        ...
        pipeline.run(subscription_service(stores=..., deletes="deletes.db"))

    The receiver acknowledges a delivery once its handler returns, so a delete is acknowledged
    only once it is written down. Each call opens and closes its own connection (a receiver
    and a pipeline are usually separate processes).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ConfigError(f"deletes: {self.path} is a directory; name a database file")

    def __repr__(self) -> str:
        return f"<DeleteLog {str(self.path)!r}>"

    @contextlib.contextmanager
    def _connect(self) -> Any:
        conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(_SCHEMA)
            yield conn
        finally:
            conn.close()

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

    def handler(self, store: str | None = None) -> Callable[[WebhookEvent], Awaitable[None]]:
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
