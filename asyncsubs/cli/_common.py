"""What every command shares: exit codes, the option helpers each command's parser is built
from, and running a command's coroutine with its progress shown (Ctrl-C and SIGTERM handled).

Exit codes: 0 done; 1 API, transport, database or output failure; 2 usage or configuration
error; 130 interrupted (Ctrl-C) and 143 terminated (SIGTERM), after committing what was done.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

from ..errors import ConfigError
from ..stores import parse_rate
from ._display import DEFAULT_INTERVAL, Mode, choose_mode, show_progress
from ._output import Output
from ._progress import Progress

__all__ = [
    "CONFIG_FLAGS",
    "CommandFailed",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "Parser",
    "Runner",
    "USER_AGENT",
    "event_loop_factory",
    "fraction",
    "non_negative_int",
    "output_options",
    "positive_float",
    "positive_int",
    "rate",
]

#: What the command line's clients say they are, before the library's own user agent.
USER_AGENT: Final = "asyncsubs-cli"

#: The flags that set ``load_config``'s parameters, to name them in its messages.
CONFIG_FLAGS: Final = {"resources": "--resources", "only_stores": "--store", "listen": "--listen"}

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_TERMINATED: Final = 143


class CommandFailed(Exception):
    """A command failed in a way already described by ``lines``; exit with ``code``."""

    def __init__(self, lines: Sequence[str], code: int = EXIT_FAILURE) -> None:
        super().__init__("; ".join(lines))
        self.lines = tuple(lines)
        self.code = code


# -- arguments -------------------------------------------------------------------------------


def _number(text: str, kind: Callable[[str], Any], what: str, ok: Callable[[Any], bool]) -> Any:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return int(_number(text, int, "a positive integer", lambda v: v > 0))


def non_negative_int(text: str) -> int:
    return int(_number(text, int, "an integer >= 0", lambda v: v >= 0))


def positive_float(text: str) -> float:
    return float(_number(text, float, "a positive number", lambda v: 0 < v < float("inf")))


def fraction(text: str) -> float:
    return float(_number(text, float, "a fraction in (0, 1]", lambda v: 0 < v <= 1))


def rate(text: str) -> Any:
    try:
        return parse_rate(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _HelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default where it has one (not None, not a flag's off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            "%(default)" in text
            or action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def output_options() -> Parser:
    """The progress and output options of the commands that show progress."""
    parent = Parser(add_help=False)
    group = parent.add_argument_group("output")
    group.add_argument(
        "-q", "--quiet", action="store_true", help="no progress and no summary (errors only)"
    )
    group.add_argument(
        "--progress",
        choices=("auto", "rich", "plain"),
        default="auto",
        help="progress style on stderr: a live table on a terminal (auto), or periodic lines",
    )
    group.add_argument(
        "--progress-interval",
        type=positive_float,
        default=DEFAULT_INTERVAL,
        metavar="SECONDS",
        help="seconds between plain progress lines",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also a line for every failed attempt that is retried, with its error",
    )
    group.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: progress, notes and errors on stderr as one JSON object per line (time, "
        "level, store, resource, event and figures), never a live table",
    )
    group.add_argument(
        "--debug", action="store_true", help="tracebacks on errors and debug logging"
    )
    return parent


# -- running ---------------------------------------------------------------------------------


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


class Runner:
    """A command's progress, how it is shown, and running its coroutine under it."""

    def __init__(self, args: argparse.Namespace, out: Output, *, mode: Mode | None = None) -> None:
        self.args = args
        self.out = out
        self.progress = Progress()
        if mode is None:
            force = "json" if args.log_format == "json" else None
            # Log lines and a live table do not mix.
            force = force or ("plain" if args.debug else None)
            force = force or (None if args.progress == "auto" else str(args.progress))
            mode = choose_mode(sys.stderr, quiet=args.quiet, force=force)
        self.mode = mode

    def run(self, coro_factory: Callable[[], Awaitable[None]]) -> None:
        """Run the coroutine with the progress shown; Ctrl-C and SIGTERM raise CommandFailed
        (130, 143) after the coroutine's own cleanup ran."""
        progress = self.progress

        async def body() -> None:
            # SIGTERM (a scheduler stopping the job) ends the command like Ctrl-C: cleanup runs
            # and what was committed stays committed.
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            installed = False
            if task is not None:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(signal.SIGTERM, task.cancel)
                    installed = True
            try:
                async with show_progress(
                    progress,
                    self.mode,
                    interval=self.args.progress_interval,
                    verbose=self.args.verbose,
                ):
                    try:
                        await coro_factory()
                    except (asyncio.CancelledError, KeyboardInterrupt):
                        progress.stop()  # before the display's last refresh
                        raise
            finally:
                if installed:
                    loop.remove_signal_handler(signal.SIGTERM)

        try:
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(body())
        except KeyboardInterrupt:
            progress.stop()
            raise CommandFailed([], EXIT_INTERRUPTED) from None
        except asyncio.CancelledError:
            progress.stop()
            raise CommandFailed([], EXIT_TERMINATED) from None

    def raise_failures(self) -> None:
        """CommandFailed (exit 1) when any unit failed, with one line each, unless the plain
        or JSON lines already printed each failure as it happened."""
        failed = self.progress.failed
        if failed:
            lines = [f"store {row.store}, {row.resource}: {row.error}" for row in failed]
            raise CommandFailed([] if self.mode in ("plain", "json") else lines)
