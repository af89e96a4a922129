"""How asyncsubs opens an SQLite file: the sync database and the webhook stores share one."""

from __future__ import annotations

import sqlite3
from pathlib import Path

__all__ = ["connect_sqlite"]


def connect_sqlite(path: str | Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit, ``BEGIN IMMEDIATE``), for
    use from one worker thread other than the one that opened it."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        # Up to 10 s for another writer's commit: sync and --listen's webhook stores share a file.
        conn.execute("PRAGMA busy_timeout = 10000")
        # Readers (webhook stores replayed or listed, the sync summary's count) never block the
        # writer, nor it them.
        conn.execute("PRAGMA journal_mode = WAL")
        # With WAL, a commit survives the process being killed (power loss may undo it).
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn
