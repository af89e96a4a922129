"""``sink_for(url)``: the one place that knows there are two sinks, and which URL is which.

``postgresql://`` (or ``postgres://``) is PostgreSQL, shared by any number of workers (extra
``asyncsubs[postgres]``); ``sqlite:///relative.db``, ``sqlite:////absolute.db`` (SQLAlchemy's
style) or a plain path is an SQLite file, one writer at a time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from ._sink import DEFAULT_LEASE, DatabaseConfigError, Sink
from .sqlite import SQLiteSink

__all__ = ["DEFAULT_DB_TIMEOUT", "sink_for"]

#: Seconds a database operation waits for the database (a lock, a connection) by default.
DEFAULT_DB_TIMEOUT: Final = 10.0


def sink_for(
    url: str, *, lease: float = DEFAULT_LEASE, timeout: float = DEFAULT_DB_TIMEOUT
) -> Sink:
    """The sink of ``url``, not connected yet; DatabaseConfigError (a ConfigError) for a URL that
    names no database. ``lease``: PostgreSQL's, see ``Leases``. ``timeout``: seconds an
    operation waits for the database before it fails: SQLite, for another process's write
    lock (``SQLiteSink``'s ``busy_timeout``); PostgreSQL, for a connection."""
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresSink
        except ImportError as exc:
            raise DatabaseConfigError(str(exc)) from None
        return PostgresSink(url, lease=lease, timeout=timeout)
    return SQLiteSink(_sqlite_path(url), busy_timeout=timeout)


def _sqlite_path(url: str) -> Path:
    if "://" not in url:
        path = url
    elif url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if "?" in path or "#" in path:  # else part of the file's name
            raise DatabaseConfigError(
                f"a SQLite URL names a file and nothing more (no ?query or #fragment), got {url!r}"
            )
    elif url.startswith("sqlite://"):
        rest = url[len("sqlite://") :]
        raise DatabaseConfigError(
            f"a SQLite URL has three slashes before a relative path "
            f"(sqlite:///{rest}) and four before an absolute one (sqlite:////abs/{rest})"
        )
    else:
        scheme = url.split("://", 1)[0]
        raise DatabaseConfigError(
            f"SQLite (sqlite:///path.db) or PostgreSQL (postgresql://user@host/db), "
            f"got a {scheme}:// URL"
        )
    if not path or path == ":memory:":
        # An in-memory database would vanish with the process, defeating resume.
        raise DatabaseConfigError(f"name a file, got {url!r}")
    if Path(path).is_dir():
        raise DatabaseConfigError(f"{path} is a directory; name a database file in it")
    if Path(path).exists() and not Path(path).is_file():
        # A device or a pipe: SQLite would write a journal, and the sync its lock, beside it.
        raise DatabaseConfigError(f"{path} is not a regular file; name a database file")
    return Path(path)
