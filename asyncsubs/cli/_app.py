"""The entry point: the parser, made of each command's own, and exit codes.

A command is a module that registers its parser (``add_parser``) with a handler taking the
parsed arguments and the command's ``Output``; a handler returns an exit code or raises.
Errors are one line each, without a traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import re
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence

from .. import __version__
from ..errors import AsyncSubsError, ConfigError
from ..stores import ConfigFileError, describe_error
from ..sync import DatabaseConfigError
from . import _dead_letters, _demo, _fake_server, _pull, _status, _sync
from ._common import EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, CommandFailed, Parser
from ._common import output_options as _output_options
from ._output import PROG, JsonLogFormatter, Output, logging_to, silence_stdout

__all__ = ["build_parser", "main"]

Handler = Callable[[argparse.Namespace, Output], int]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Pull from or sync the subscription service's admin interface.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=Parser
    )
    output = _output_options()
    _pull.add_parser(commands, output)
    _sync.add_parser(commands, output)
    _status.add_parser(commands)
    _demo.add_parser(commands, output)
    _fake_server.add_parser(commands)
    _dead_letters.add_parser(commands)
    return parser


def _attach_negative_values(argv: Sequence[str]) -> list[str]:
    """``--rate -1/s`` as ``--rate=-1/s``: argparse takes a word starting with "-" for an
    option ("expected one argument") unless it is a plain negative number. No option here
    starts with "-" and a digit, so attached, such a value reaches its option's own check."""
    result: list[str] = []
    for arg in argv:
        previous = result[-1] if result else ""
        if re.match(r"-[\d.]", arg) and previous.startswith("--") and "=" not in previous:
            result[-1] = f"{previous}={arg}"
        else:
            result.append(arg)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    with _standard_streams():
        parser = build_parser()
        try:
            args = parser.parse_args(
                _attach_negative_values(sys.argv[1:] if argv is None else argv)
            )
        except SystemExit as exc:  # argparse: --help/--version (0) or a usage error (2)
            return exc.code if isinstance(exc.code, int) else EXIT_USAGE
        out = Output(json=getattr(args, "log_format", "text") == "json")
        with _library_logging(args.debug, out, quiet=getattr(args, "quiet", False)):
            return _run(args.handler, args, out)


@contextlib.contextmanager
def _standard_streams() -> Iterator[None]:
    """stdin, stdout and stderr as a command needs them, while it runs. One closed (``>&-``) is
    opened on /dev/null before a socket or file takes its number: records would go into that
    socket, and uvloop aborts the process as it closes one numbered 1 or 2. A stream Python
    left None (closed at its start) writes to /dev/null: the command still does its work. And
    stdout escapes what its encoding cannot say (a store's name on a C locale), as stderr
    does."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: fd itself
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            os.set_inheritable(fd, True)  # a standard stream: a child process's too
    saved = sys.stdout, sys.stderr
    nowhere = None
    if sys.stdout is None or sys.stderr is None:
        nowhere = open(os.devnull, "w", errors="backslashreplace")  # noqa: SIM115 - closed below
        sys.stdout = nowhere if sys.stdout is None else sys.stdout
        sys.stderr = nowhere if sys.stderr is None else sys.stderr
    stdout = sys.stdout
    text = stdout if isinstance(stdout, io.TextIOWrapper) and not stdout.closed else None
    errors = None if text is None else text.errors
    if text is not None:
        with contextlib.suppress(OSError):  # its flush: what a full disk did not take, again
            text.reconfigure(errors="backslashreplace")
    try:
        yield
    finally:
        if text is not None:
            with contextlib.suppress(OSError, ValueError):
                text.reconfigure(errors=errors)
        sys.stdout, sys.stderr = saved
        if nowhere is not None:
            nowhere.close()


class _OutputHandler(logging.Handler):
    """The library's warnings and errors as the command's own lines (``asyncsubs: warning:
    ...``, or JSON lines); errors only with --quiet. A logger with a handler of its own is one
    a command shows its own way (sync --listen's receivers): not said twice."""

    def __init__(self, out: Output, *, quiet: bool) -> None:
        super().__init__(logging.ERROR if quiet else logging.WARNING)
        self.out = out

    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger(record.name).handlers and super().filter(record)

    def emit(self, record: logging.LogRecord) -> None:
        say = self.out.error if record.levelno >= logging.ERROR else self.out.warning
        say(record.getMessage())


@contextlib.contextmanager
def _library_logging(debug: bool, out: Output, *, quiet: bool) -> Iterator[None]:
    """The library's log on stderr while the command runs: its warnings as the command's
    lines; with --debug, everything, timestamped."""
    logger = logging.getLogger("asyncsubs")
    handler: logging.Handler = _OutputHandler(out, quiet=quiet)
    level = logger.level
    if debug:
        handler = logging.StreamHandler(sys.stderr)
        fields = "%(asctime)s %(name)s %(levelname)s %(message)s"
        handler.setFormatter(JsonLogFormatter() if out.json else logging.Formatter(fields))
        logger.setLevel(logging.DEBUG)
    try:
        with logging_to("asyncsubs", handler):
            yield
    finally:
        logger.setLevel(level)


def _run(handler: Handler, args: argparse.Namespace, out: Output) -> int:
    try:
        return handler(args, out)
    except CommandFailed as exc:
        for line in exc.lines:
            out.error(line)
        return exc.code
    except AsyncSubsError as exc:  # ConfigError and DatabaseError among them
        if args.debug:
            traceback.print_exc()
        problems = exc.problems if isinstance(exc, ConfigFileError) else [str(exc)]
        if isinstance(exc, DatabaseConfigError):  # the database is --db on the command line
            problems = [f"--db: {exc.problem}"]
        for problem in problems:
            out.error(problem)
        return EXIT_USAGE if isinstance(exc, ConfigError) else EXIT_FAILURE
    except KeyboardInterrupt:  # outside the event loop, e.g. while reading the config
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        silence_stdout()
        return EXIT_FAILURE
    except Exception as exc:
        if args.debug:
            raise
        out.error(f"internal error: {describe_error(exc)} (rerun with --debug for the traceback)")
        return EXIT_FAILURE
