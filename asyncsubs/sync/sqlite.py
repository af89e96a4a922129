"""The SQLite sink: the embedded sync database, one writer at a time.

The tables of ``_sink.schema`` with JSON and times as text; a ``ListenSync`` adds
``webhook_inbox`` and ``webhook_dead_letters``, kept by ``asyncsubs.webhooks``' SQLite stores
on connections of their own, so acknowledging a delivery never waits for a page's transaction.
All the sink's own work runs on one thread holding its one connection: writes are serialized
without locks, and the event loop never blocks on disk. One process writes a database at a
time: ``lock()`` holds ``DB.asyncsubs-lock`` beside it (``hold_database``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from .._sqlite import DEFAULT_BUSY_TIMEOUT, connect_sqlite
from .._versions import older
from ..json import dumps, loads
from ..webhooks import Inbox, SQLiteDeadLetters, SQLiteInbox
from ._sink import (
    OLDER,
    STATE_TABLE,
    DatabaseConfigError,
    DatabaseError,
    DatabaseUnavailable,
    DeadLetters,
    Dialect,
    PageWrite,
    SQLSink,
    Statements,
    json_text,
    schema,
)

__all__ = [
    "LOCK_SUFFIX",
    "SQLiteSink",
    "hold_database",
]

T = TypeVar("T")
LOCK_SUFFIX: Final = ".asyncsubs-lock"
SCHEMA_VERSION: Final = 2
_BUSY: Final = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _busy(exc: sqlite3.Error) -> bool:
    """Busy or locked (extended codes too): another connection's lock, not this write's fault."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _BUSY


_SCHEMA: Final = schema(json="TEXT", time="TEXT", flag="INTEGER", count="INTEGER", big="INTEGER")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _dump(value: Any) -> str | None:
    return None if value is None else json_text(value)


def _load(value: str | None) -> Any:
    return None if value is None else loads(value)


_SQL: Final = Statements(
    Dialect(
        param=":{}",
        now="strftime('%Y-%m-%dT%H:%M:%SZ', 'now')",
        has_table="SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{}'",
        dump=_dump,
        load=_load,
    )
)


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        data = loads(os.pread(fd, 4096, 0))
        return f"pid {data['pid']} on host {data['host']}, since {data['since']}"
    return "a process that has not said who it is yet"


@contextlib.contextmanager
def hold_database(db: Path) -> Iterator[None]:
    """Hold ``db`` for this process for the block; DatabaseConfigError naming the holder when
    another process has it (two syncs on one database would resume each other's cursors).

    The lock is the kernel's ``flock``: it goes with the process however that ends, so a file
    left behind never blocks the next run; the file only says who holds it, and is removed on
    leaving. It lies beside the database's real path, symlinks resolved as SQLite does.
    """
    if sys.platform == "win32":  # no flock; one sync per database is then the user's rule
        yield
        return
    if not db.parent.is_dir():
        raise DatabaseConfigError(f"directory {db.parent} does not exist")
    if db.exists() and not os.access(db, os.R_OK | os.W_OK):  # else found at the first write
        raise DatabaseConfigError(f"cannot write {db}: permission denied")
    real = db.resolve()  # one lock however the database is named through symlinks
    path = real.with_name(real.name + LOCK_SUFFIX)
    fd = _lock(path, db)
    try:
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, dumps(holder), 0)
        yield
    finally:
        # Removed while still locked: a process that opened it meanwhile finds, once it has
        # the lock, that the name no longer leads to its file, and locks the new one.
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)  # releases the lock


def _lock(path: Path, db: Path) -> int:
    """A descriptor of ``path`` holding its lock; DatabaseConfigError when another has it."""
    import fcntl

    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DatabaseConfigError(f"cannot create {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise DatabaseConfigError(
                f"{db} is in use by another asyncsubs command ({holder}); run one sync per "
                "database at a time"
            ) from None
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                return fd
        os.close(fd)  # the file its holder removed on leaving: lock the one there now


def _writer_thread() -> ThreadPoolExecutor:
    # One thread runs every call in order: a write queued behind another runs after it.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="asyncsubs-sqlite")


class SQLiteSink(SQLSink):
    """The ``Sink`` in an SQLite file: one connection, used only from one worker thread.
    ``busy_timeout``: seconds a write waits for another process's lock on the file before it
    fails (a ``DatabaseError``), on every connection of the sink."""

    #: One writer: a sync holds the database (``lock``) instead of sharing it.
    leases = None
    _SQL = _SQL
    _STATUS = (
        STATE_TABLE,
        "SELECT store, resource, CASE WHEN done THEN 'done' ELSE 'pending' END, NULL, NULL,"
        " run_records, run_pages, (julianday('now') - julianday(updated_at)) * 86400, NULL"
        f" FROM {STATE_TABLE} ORDER BY store, resource",
    )

    def __init__(self, path: Path, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.where = str(path)
        self._thread = _writer_thread()
        self._conn: sqlite3.Connection | None = None
        self._locked_at = -math.inf  # when a call last failed on another connection's lock
        self._webhook_stores: tuple[SQLiteInbox, SQLiteDeadLetters] | None = None

    def __repr__(self) -> str:
        return f"<SQLiteSink {self.where}>"

    def lock(self) -> contextlib.AbstractContextManager[None]:
        return hold_database(self.path)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        queued = time.monotonic()

        def call() -> T:
            # A call queued while the one ahead of it waited out another connection's lock
            # would wait as long again for the same lock: it fails with it. Each unit's write
            # waiting its own busy timeout in turn kept a sync silent, and deaf to SIGTERM, for
            # (units x busy timeout).
            if queued < self._locked_at:
                raise DatabaseUnavailable(
                    f"database {self.path}: database is locked (a write ahead of this one "
                    f"waited {self.busy_timeout:g}s for it)"
                )
            try:
                return fn(*args)
            except sqlite3.Error as exc:
                if _busy(exc):
                    self._locked_at = time.monotonic()
                raise

        try:
            return await loop.run_in_executor(self._thread, call)
        except sqlite3.Error as exc:
            error = DatabaseUnavailable if _busy(exc) else DatabaseError
            raise error(f"database {self.path}: {exc}") from exc

    @property
    def conn(self) -> sqlite3.Connection:
        assert self._conn is not None, "SQLiteSink.open() first"
        return self._conn

    async def open(self) -> None:
        try:
            await self._run(self._open)
        except BaseException:
            self._thread.shutdown(wait=False)
            self._thread = _writer_thread()  # for another open(); it starts no thread yet
            raise

    def _open(self) -> None:
        # Transactions are explicit (BEGIN IMMEDIATE ... COMMIT), so a page and its cursor are
        # committed together.
        conn = connect_sqlite(self.path, busy_timeout=self.busy_timeout)
        try:
            conn.create_function(OLDER, 2, older, deterministic=True)  # the upserts' rule
            with _transaction(conn):
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    async def aclose(self) -> None:
        stores, self._webhook_stores = self._webhook_stores, None
        for store in stores or ():
            await store.aclose()
        if self._conn is not None:
            # Queued behind any write still running, so that write finishes first; never failed
            # with a lock that write waited out (closing takes none).
            loop = asyncio.get_running_loop()
            with contextlib.suppress(sqlite3.Error):
                await loop.run_in_executor(self._thread, self.conn.close)
            self._conn = None
        self._thread.shutdown(wait=True)
        self._thread = _writer_thread()

    async def _one(self, sql: str, params: Mapping[str, Any]) -> Any:
        return await self._run(lambda: self.conn.execute(sql, params).fetchone())

    async def _write(self, *statements: tuple[str, Any]) -> int:
        return await self._run(self._write_now, statements)

    def _write_now(self, statements: Iterable[tuple[str, Any]]) -> int:
        with _transaction(self.conn) as conn:
            return sum(conn.execute(sql, params).rowcount for sql, params in statements)

    async def commit_page(self, write: PageWrite) -> None:
        await self._run(self._commit_page, write)

    def _commit_page(self, w: PageWrite) -> None:
        rows, page_max = w.rows(_SQL.record)
        with _transaction(self.conn) as conn:
            conn.executemany(_SQL.upsert(w.resource), rows)
            old = conn.execute(_SQL.load_state, {"store": w.store, "resource": w.resource})
            conn.execute(_SQL.save_state, _SQL.state(w, old.fetchone(), len(rows), page_max))

    async def _read(self, sql: str) -> list[Any]:
        """Rows of ``sql`` from the database opened read-only (no table is created; a missing
        database is a ConfigError)."""
        if not self.path.is_file():
            raise DatabaseConfigError(f"{self.path} does not exist")

        def read() -> list[Any]:
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
                return conn.execute(sql).fetchall()

        try:
            return await asyncio.to_thread(read)
        except sqlite3.Error as exc:
            hint = ""
            if not os.access(self.path.parent, os.W_OK):  # read-only: SQLite cannot make -shm
                hint = " (SQLite reads a WAL database through a file it makes beside it:"
                hint += f" {self.path.parent} must be writable)"
            raise DatabaseError(f"database {self.path}: {exc}{hint}") from None

    async def webhook_stores(self) -> tuple[Inbox, DeadLetters]:
        if self._webhook_stores is None:
            # Connections of their own: acknowledging a delivery must not wait for a page's
            # transaction on the writer thread. Both tables exist from here on, so monitoring
            # queries work before the first event.
            self._webhook_stores = (
                SQLiteInbox(self.path, busy_timeout=self.busy_timeout),
                SQLiteDeadLetters(self.path, busy_timeout=self.busy_timeout),
            )
            for store in self._webhook_stores:
                try:
                    await store.open()
                except sqlite3.Error as exc:
                    error = DatabaseUnavailable if _busy(exc) else DatabaseError
                    raise error(f"database {self.path}: {exc}") from exc
        return self._webhook_stores


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
