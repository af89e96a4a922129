"""What the command line writes on stderr besides its live table: errors and notes, one line
each, as text (``asyncsubs: error: ...``) or, with ``--log-format json``, as JSON lines made by
``json_line`` (notes, errors, progress events and, with ``--debug``, the library's log).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import IO, Any, Final

from ..json import dumps

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "PROG",
    "CommandFailed",
    "JsonLogFormatter",
    "Output",
    "json_line",
    "logging_to",
    "silence_stdout",
]

PROG: Final = "asyncsubs"

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_TERMINATED: Final = 143


class CommandFailed(Exception):
    """A command failed in a way already described by ``lines``; exit with ``code``."""

    def __init__(self, lines: Sequence[str], code: int = EXIT_FAILURE) -> None:
        super().__init__(tuple(lines), code)  # its arguments, so that it pickles
        self.lines = tuple(lines)
        self.code = code

    def __str__(self) -> str:
        return "; ".join(self.lines)


def json_line(level: str, event: str, **fields: Any) -> str:
    """One JSON object on one line: ``time`` (UTC, milliseconds), ``level``, ``event``, then
    ``fields``."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"
    return dumps({"time": stamp, "level": level, "event": event, **fields}).decode()


class JsonLogFormatter(logging.Formatter):
    """``--debug --log-format json``: the library's log records as JSON lines too."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            fields["traceback"] = self.formatException(record.exc_info)
        return json_line(record.levelname.lower(), "log", **fields)


@contextlib.contextmanager
def logging_to(name: str, handler: logging.Handler) -> Iterator[None]:
    """``handler`` on the logger ``name`` while the block runs (removed again, for in-process
    callers)."""
    logger = logging.getLogger(name)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def silence_stdout() -> None:
    """stdout's reader went away: keep the interpreter from failing again at exit."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


class Output:
    """Lines on ``stream`` (stderr when None: the one in place when each line is written),
    as text or JSON lines; a stream that is gone (a closed pipe) loses them quietly."""

    def __init__(self, *, json: bool = False, stream: IO[str] | None = None) -> None:
        self.json = json
        self._stream = stream

    def write(self, line: str) -> None:
        stream = sys.stderr if self._stream is None else self._stream
        with contextlib.suppress(OSError, ValueError):
            stream.write(line + "\n")
            stream.flush()

    def _say(self, level: str, message: str) -> None:
        if self.json:
            self.write(json_line(level, level, message=message))
        else:
            self.write(f"{PROG}: {message}" if level == "note" else f"{PROG}: {level}: {message}")

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
