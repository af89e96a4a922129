"""What every command shares: exit codes, one-line errors and notes, argument types, and
running a command's coroutine with progress shown (Ctrl-C and SIGTERM handled)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import orjson

from ._progress import Mode, Tracker, capture_retries, show_progress, utc_now

__all__ = [
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "PROG",
    "CommandFailed",
    "display_mode",
    "error",
    "event_loop_factory",
    "note",
    "positive_float",
    "positive_int",
    "raise_failures",
    "run_async",
    "set_json_lines",
]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_TERMINATED: Final = 143
PROG: Final = "asyncsubs"


class CommandFailed(Exception):
    """A command failed in a way already described by ``lines``; exit with ``code``."""

    def __init__(self, lines: Sequence[str], code: int = EXIT_FAILURE) -> None:
        super().__init__("; ".join(lines))
        self.lines = tuple(lines)
        self.code = code


#: ``--log-format json`` for the command running now: errors and notes as JSON lines too.
_json_lines = False


def set_json_lines(enabled: bool) -> None:
    global _json_lines
    _json_lines = enabled


def json_lines() -> bool:
    return _json_lines


def _say(level: str, message: str) -> None:
    if _json_lines:
        record = {"time": utc_now(), "level": level, "event": level, "message": message}
        text = orjson.dumps(record).decode()
    else:
        text = f"{PROG}: error: {message}" if level == "error" else f"{PROG}: {message}"
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


def error(message: str) -> None:
    _say("error", message)


def note(message: str) -> None:
    _say("note", message)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def run_async(
    coro_factory: Callable[[], Awaitable[None]],
    tracker: Tracker,
    mode: Mode,
    interval: float,
) -> None:
    """Run a command's coroutine with progress shown; Ctrl-C and SIGTERM raise CommandFailed
    after the coroutine's own cleanup ran."""

    async def body() -> None:
        # SIGTERM (a scheduler stopping the job) ends the command like Ctrl-C: cleanup runs
        # and what was committed stays committed.
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        installed = False
        if task is not None:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
                installed = True
        try:
            async with show_progress(tracker, mode, interval=interval):
                try:
                    await coro_factory()
                except (asyncio.CancelledError, KeyboardInterrupt):
                    # Before the display's last refresh, so it shows them as interrupted.
                    tracker.interrupt_running()
                    raise
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        with capture_retries(tracker), asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(body())
    except KeyboardInterrupt:
        tracker.interrupt_running()
        raise CommandFailed([], EXIT_INTERRUPTED) from None
    except asyncio.CancelledError:
        tracker.interrupt_running()
        raise CommandFailed([], EXIT_TERMINATED) from None


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (the `uvloop` extra), else asyncio's.

    ``ASYNCSUBS_LOOP=asyncio`` forces the standard loop (e.g. to compare, or to debug)."""
    if os.environ.get("ASYNCSUBS_LOOP", "auto") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def display_mode(args: argparse.Namespace) -> str | None:
    if args.log_format == "json":
        return "json"
    if args.debug:
        return "plain"  # log lines and a live table do not mix
    return None if args.progress == "auto" else str(args.progress)


def raise_failures(tracker: Tracker, mode: Mode) -> None:
    """CommandFailed (exit 1) when any (store, resource) failed, with one line each, unless
    the plain display already printed each failure as a line of its own."""
    failed = tracker.failed
    if failed:
        lines = [f"store {row.store}, {row.resource}: {row.error}" for row in failed]
        raise CommandFailed([] if mode in ("plain", "json") else lines)
