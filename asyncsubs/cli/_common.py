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
import re
import signal
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, NoReturn

from ..errors import ConfigError
from ..stores import parse_rate
from ._display import DEFAULT_INTERVAL, Mode, choose_mode, show_progress
from ._output import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    CommandFailed,
    Output,
)
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
    "non_negative_float",
    "non_negative_int",
    "output_options",
    "port",
    "positive_float",
    "positive_int",
    "rate",
    "report_options",
]

#: What the command line's clients say they are, before the library's own user agent.
USER_AGENT: Final = "asyncsubs-cli"

#: The flags that set ``load_config``'s parameters, to name them in its messages.
CONFIG_FLAGS: Final = {"resources": "--resources", "only_stores": "--store", "listen": "--listen"}


# -- arguments -------------------------------------------------------------------------------


def _number(kind: type[Any], what: str, ok: Callable[[Any], bool]) -> Callable[[str], Any]:
    """An argparse ``type``: ``kind`` of the text, when ``ok``; else "expected ``what``"."""

    def convert(text: str) -> Any:
        with contextlib.suppress(ValueError):
            if ok(value := kind(text)):
                return value
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")

    return convert


positive_int: Callable[[str], int] = _number(int, "a positive integer", lambda v: v > 0)
non_negative_int: Callable[[str], int] = _number(int, "an integer >= 0", lambda v: v >= 0)
positive_float: Callable[[str], float] = _number(
    float, "a positive number", lambda v: 0 < v < float("inf")
)
fraction: Callable[[str], float] = _number(float, "a fraction in (0, 1]", lambda v: 0 < v <= 1)
non_negative_float: Callable[[str], float] = _number(
    float, "a number >= 0", lambda v: 0 <= v < float("inf")
)
port: Callable[[str], int] = _number(int, "a port, 0-65535", lambda v: 0 <= v <= 65_535)


def rate(text: str) -> Any:
    try:
        return parse_rate(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _HelpFormatter(argparse.HelpFormatter):
    """Help that shows each option's default where it has one (not None, not a flag's off)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text, default = action.help or "", action.default
        if "%(default)" in text or default is None or default is False or not action.option_strings:
            return text
        return text if default == argparse.SUPPRESS else f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        # argparse quotes what it cannot place, values and all: a token or a Redis URL's
        # password given where it is not read.
        message = re.sub(r"^(ambiguous option: [^=\s]+)=\S+", r"\1=...", message)
        message = re.sub(r"ignored explicit argument .*$", "ignored explicit argument", message)
        unknown, sep, extra = message.partition("unrecognized arguments: ")
        if sep and not unknown:
            message = _unrecognized(extra.split(" "))
        super().error(message)


def _unrecognized(extra: Sequence[str]) -> str:
    """Arguments no command takes, as an error shows them: options by name, no value (it may
    be a token given to a command that reads tokens from the environment)."""
    shown = []
    for arg in extra:
        name, equals, _ = arg.partition("=")
        if re.fullmatch(r"--[A-Za-z][\w-]*", name):
            shown.append(name + "=..." * bool(equals))
        elif re.fullmatch(r"-[A-Za-z]", arg):
            shown.append(arg)
        else:  # "-tVALUE", "-VALUE", a bare word: a value, or one stuck to its option
            shown.append(arg[:2] + "..." if re.match(r"-[A-Za-z]", arg) else "...")
    hidden = " (values not shown)" if "..." in " ".join(shown) else ""
    return f"unrecognized arguments: {' '.join(shown)}{hidden}"


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
    _log_format(
        group,
        "json: progress, notes and errors on stderr as one JSON object per line (time, level, "
        "store, resource, event and figures), never a live table",
    )
    group.add_argument(
        "--debug", action="store_true", help="tracebacks on errors and debug logging"
    )
    return parent


def report_options(parser: argparse.ArgumentParser) -> None:
    """``--json`` and ``--log-format``, for a command whose output is its table."""
    parser.add_argument(
        "--json", action="store_true", help="the table's figures as one JSON document on stdout"
    )
    _log_format(parser, "json: notes and errors on stderr as one JSON object per line, as for sync")


def _log_format(parser: argparse.ArgumentParser | argparse._ArgumentGroup, help: str) -> None:
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help=help)


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
        self.args, self.out = args, out
        self.progress = Progress()
        self.mode = choose_mode(args) if mode is None else mode

    def run(self, coro_factory: Callable[[], Awaitable[None]]) -> None:
        """Run the coroutine with the progress shown; Ctrl-C and SIGTERM raise CommandFailed
        (130, 143) after the coroutine's own cleanup ran."""
        progress, args = self.progress, self.args
        done = False  # the work finished: a signal during the display's last frame stops nothing

        async def body() -> None:
            nonlocal done
            # SIGTERM (a scheduler stopping the job) ends the command like Ctrl-C: cleanup runs
            # and what was committed stays committed.
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            installed = False
            if task is not None:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(signal.SIGTERM, task.cancel)
                    installed = True
            try:
                shown = show_progress(
                    progress, self.mode, interval=args.progress_interval, verbose=args.verbose
                )
                async with shown:
                    try:
                        await coro_factory()
                        done = True
                    except (asyncio.CancelledError, KeyboardInterrupt):
                        progress.stop()  # before the display's last refresh
                        raise
            finally:
                if installed:
                    loop.remove_signal_handler(signal.SIGTERM)

        try:
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(body())
        except (KeyboardInterrupt, asyncio.CancelledError) as exc:
            progress.stop()
            if done:  # "interrupted, rerun to resume" would start a finished pull over
                return
            code = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_TERMINATED
            raise CommandFailed([], code) from None

    def raise_failures(self) -> None:
        """CommandFailed (exit 1) when any unit failed, with one line each, unless the plain
        or JSON lines already printed each failure as it happened."""
        failed = self.progress.failed
        if failed:
            lines = [f"store {row.store}, {row.resource}: {row.error}" for row in failed]
            raise CommandFailed([] if self.mode in ("plain", "json") else lines)
