"""What the command line writes on stderr besides its live table: errors and notes, one line
each, as text (``asyncsubs: error: ...``) or, with ``--log-format json``, as JSON lines.

``json_line`` is the one place a JSON line is made: notes, errors, progress events and the
library's log records (``--debug``) all go through it.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import IO, Any, Final

from ..json import dumps

__all__ = [
    "JsonLogFormatter",
    "Output",
    "PROG",
    "json_line",
    "utc_now",
]

PROG: Final = "asyncsubs"


def utc_now() -> str:
    """Now as an ISO 8601 UTC timestamp with milliseconds."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def json_line(level: str, event: str, **fields: Any) -> str:
    """One JSON object on one line: ``time`` (UTC), ``level``, ``event``, then ``fields``."""
    return dumps({"time": utc_now(), "level": level, "event": event, **fields}).decode()


class JsonLogFormatter(logging.Formatter):
    """``--debug --log-format json``: the library's log records as JSON lines too."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            fields["traceback"] = self.formatException(record.exc_info)
        return json_line(record.levelname.lower(), "log", **fields)


class Output:
    """Lines on ``stream`` (stderr when None: the one in place when each line is written),
    as text or JSON lines; a stream that is gone (a closed pipe) loses them quietly."""

    def __init__(self, *, json: bool = False, stream: IO[str] | None = None) -> None:
        self.json = json
        self._stream = stream

    @property
    def stream(self) -> IO[str]:
        return sys.stderr if self._stream is None else self._stream

    def write(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(line + "\n")
            self.stream.flush()

    def _say(self, level: str, message: str) -> None:
        if self.json:
            self.write(json_line(level, level, message=message))
        elif level == "note":
            self.write(f"{PROG}: {message}")
        else:
            self.write(f"{PROG}: {level}: {message}")

    def error(self, message: str) -> None:
        self._say("error", message)

    def warning(self, message: str) -> None:
        self._say("warning", message)

    def note(self, message: str) -> None:
        self._say("note", message)

    def event(self, event: str, **fields: Any) -> None:
        """One JSON line of ``event`` with ``fields`` (``--log-format json`` only)."""
        if self.json:
            self.write(json_line("info", event, **fields))
