"""One SQLite table of the webhook stores, on its own connection and worker thread."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final, TypeVar

from ..errors import ConfigError

__all__ = ["SQLiteTable"]

T = TypeVar("T")
_NAME_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


class SQLiteTable:
    """Pass a path (its own connection in WAL mode; it may be the sync database itself) or an
    open ``sqlite3.Connection`` made with ``check_same_thread=False`` that nothing else uses
    concurrently. All SQLite work runs on one worker thread, never on the event loop; the
    table is created by ``open()`` or on first use."""

    def __init__(self, path_or_conn: str | Path | sqlite3.Connection, *, table: str) -> None:
        if not table or not set(table) <= _NAME_CHARS or table[0].isdigit():
            raise ConfigError(f"table must be a plain SQL identifier, got {table!r}")
        self.table = table
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncsubs-webhooks")
        self._own = not isinstance(path_or_conn, sqlite3.Connection)
        self._target = path_or_conn
        self._conn: sqlite3.Connection | None = None

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
                conn = sqlite3.connect(self._target, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA busy_timeout = 10000")
                conn.execute("PRAGMA journal_mode = WAL")
                # WAL + NORMAL: a commit survives the process being killed (not a power cut).
                conn.execute("PRAGMA synchronous = NORMAL")
            self._create(conn)
            if conn.in_transaction:
                conn.commit()
            self._conn = conn
        return self._conn

    def _write(self, sql: str, params: tuple[object, ...]) -> int:
        conn = self._connect()
        cursor = conn.execute(sql, params)
        if conn.in_transaction:
            conn.commit()
        return cursor.rowcount

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def open(self) -> None:
        """Create the table now (rather than on first use), so it can be queried at once."""
        await self._run(self._connect)

    async def close(self) -> None:
        """Close the connection if this object opened it, and the worker thread."""
        conn, self._conn = self._conn, None
        if conn is not None and self._own:
            await self._run(conn.close)
        self._executor.shutdown(wait=True)
