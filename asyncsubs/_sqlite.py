"""SQLite off the event loop: a connection set up for durable writes, used from one thread.

Shared by the webhook stores (``asyncsubs.webhooks``) and the CLI's sync database.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["SQLiteWorker", "connect"]

T = TypeVar("T")


def connect(path: str | Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit, ``BEGIN IMMEDIATE``), WAL
    journal, waiting up to 10 s for another writer; usable from the worker's thread."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA busy_timeout = 10000")
        conn.execute("PRAGMA journal_mode = WAL")
        # WAL + NORMAL: a commit survives the process being killed; power loss may roll back
        # the last ones.
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


class SQLiteWorker:
    """One worker thread that runs blocking calls in order: a connection is only ever used
    from it, and a call queued behind a write runs after that write."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    def shutdown(self) -> None:
        """Wait for the calls queued so far, then end the thread."""
        self._executor.shutdown(wait=True)
