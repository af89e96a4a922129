"""One writer per sync database: ``DB.asyncsubs-lock`` beside it, held with ``flock``.

Two syncs on one database would resume each other's cursors and share its stores' rate
limits without knowing it. The lock is the kernel's: it goes with the process however that
ends (SIGKILL included), so a stale file never blocks the next run; the file only says who
holds it (pid, host, since when) for the error the second command prints. It lies beside the
database's real path, symlinks resolved as SQLite resolves them; a hard link is a second name
SQLite cannot tell either (its "How To Corrupt An SQLite Database File", 2.4).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import orjson

from ..errors import ConfigError

__all__ = ["SUFFIX", "hold_database"]

SUFFIX: Final = ".asyncsubs-lock"


def _holder(fd: int) -> str:
    with contextlib.suppress(OSError, orjson.JSONDecodeError, KeyError, TypeError):
        data = orjson.loads(os.pread(fd, 4096, 0))
        return f"pid {data['pid']} on host {data['host']}, since {data['since']}"
    return "a process that has not said who it is yet"


@contextlib.contextmanager
def hold_database(db: Path) -> Iterator[None]:
    """Hold ``db``'s lock for the block; ConfigError (exit 2) naming the holder when another
    process has it."""
    if sys.platform == "win32":  # no flock; one sync per database is then the user's rule
        yield
        return
    import fcntl

    real = db.resolve()  # one lock however the database is named through symlinks
    path = real.with_name(real.name + SUFFIX)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ConfigError(f"--db: cannot create {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"--db: {db} is in use by another asyncsubs command ({_holder(fd)}); run one "
                "sync per database at a time"
            ) from None
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.ftruncate(fd, 0)
        os.pwrite(
            fd, orjson.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since}), 0
        )
        yield
    finally:
        os.close(fd)  # releases the lock
