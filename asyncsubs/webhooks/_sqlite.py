"""One SQLite table of the webhook stores, on its own connection and worker thread."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, TypeVar

from .._sqlite import DEFAULT_BUSY_TIMEOUT, connect_sqlite
from ..errors import ConfigError

__all__ = ["SQLiteTable"]

T = TypeVar("T")
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class SQLiteTable:
    """Pass a path (its own connection in WAL mode; it may be the sync database itself) or an
    open ``sqlite3.Connection`` made with ``check_same_thread=False`` that nothing else uses
    concurrently. All SQLite work runs on one worker thread, never on the event loop; the
    table is created by ``open()`` or on first use. ``busy_timeout``: seconds a write on a
    path's own connection waits for another's lock before it fails.

    Writes are group-committed: those made while a transaction is being written go together
    into the next one, so concurrent deliveries share commits instead of queueing for one
    each; every write still returns only once its transaction is committed.
    """

    def __init__(
        self,
        path_or_conn: str | Path | sqlite3.Connection,
        *,
        table: str,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT,
    ) -> None:
        if not table or not set(table) <= _NAME_CHARS or table[0].isdigit():
            raise ConfigError(f"table must be a plain SQL identifier, got {table!r}")
        self.table = table
        # One thread runs every call in order, so the connection is only ever used from it.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncsubs-webhooks")
        self._own = not isinstance(path_or_conn, sqlite3.Connection)
        self._target = path_or_conn
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._batch: list[tuple[str, tuple[object, ...], asyncio.Future[int]]] = []
        self._flushing: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        where = "connection" if not self._own else str(self._target)
        return f"<{type(self).__name__} {where} table={self.table}>"

    def _create(self, conn: sqlite3.Connection) -> None:
        raise NotImplementedError

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if isinstance(self._target, sqlite3.Connection):
                conn = self._target
            else:
                conn = connect_sqlite(self._target, busy_timeout=self._busy_timeout)
            try:
                self._create(conn)
                if conn.in_transaction:
                    conn.commit()
            except BaseException:
                if self._own:  # a lock met creating the table: the next use connects again
                    conn.close()
                raise
            self._conn = conn
        return self._conn

    async def _write(self, sql: str, params: tuple[object, ...]) -> int:
        """Run one statement in the next committed transaction; its rowcount."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._batch.append((sql, params, future))
        if self._flushing is None:
            self._flushing = asyncio.create_task(self._flush())
        return await asyncio.shield(future)

    async def _flush(self) -> None:
        try:
            while self._batch:
                batch, self._batch = self._batch, []
                try:
                    counts = await self._run(self._write_all, [(q, p) for q, p, _ in batch])
                except Exception as exc:  # the transaction rolled back: none of them is written
                    for *_, future in batch:
                        future.set_exception(exc)
                else:
                    for (*_, future), count in zip(batch, counts, strict=True):
                        future.set_result(count)
        finally:
            self._flushing = None

    def _write_all(self, statements: list[tuple[str, tuple[object, ...]]]) -> list[int]:
        conn = self._connect()
        conn.execute("BEGIN IMMEDIATE")
        try:
            counts = [conn.execute(sql, params).rowcount for sql, params in statements]
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return counts

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    async def open(self) -> None:
        """Create the table now (rather than on first use), so it can be queried at once."""
        await self._run(self._connect)

    async def aclose(self) -> None:
        """Close the connection if this object opened it, and the worker thread."""
        if self._flushing is not None:
            await asyncio.shield(self._flushing)
        conn, self._conn = self._conn, None
        if conn is not None and self._own:
            await self._run(conn.close)
        self._thread.shutdown(wait=True)
