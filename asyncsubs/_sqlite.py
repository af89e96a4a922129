"""How asyncsubs opens an SQLite file: the sync database and the webhook stores share one."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Final

__all__ = ["DEFAULT_BUSY_TIMEOUT", "connect_sqlite"]

#: Seconds a statement waits for another connection's write lock before it fails with
#: "database is locked": the sync and its webhook stores share a file, and commits are short.
DEFAULT_BUSY_TIMEOUT: Final = 10.0


def connect_sqlite(
    path: str | Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT
) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit, ``BEGIN IMMEDIATE``), for
    use from one worker thread other than the one that opened it; a write waits up to
    ``busy_timeout`` seconds for another connection's (or process's) lock."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute(f"PRAGMA busy_timeout = {round(busy_timeout * 1000)}")
        # Readers (webhook stores replayed or listed, the sync summary's count) never block the
        # writer, nor it them.
        conn.execute("PRAGMA journal_mode = WAL")
        # With WAL, a commit survives the process being killed (power loss may undo it).
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn
