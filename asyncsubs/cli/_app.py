"""Argument parsing, the ``pull`` and ``sync`` commands, and exit codes.

Exit codes: 0 done; 1 API, transport or database failure; 2 usage or configuration error;
130 interrupted (Ctrl-C) and 143 terminated (SIGTERM), after committing what was done.
Errors are one line each, without a traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Final
from urllib.parse import urlsplit

import orjson

from .._client import BASE_URL_ENV, TOKEN_ENV, AdminClient
from .._config import DEFAULT_HEAVY, Limits, Rate, RetryPolicy
from .._pagination import DEFAULT_PREFETCH
from .._version import __version__
from ..errors import AsyncSubsError, ConfigError
from ._config_file import (
    RESOURCES,
    ConfigFileError,
    StoreConfig,
    load_config,
    parse_db_url,
    parse_rate,
)
from ._listen import DEFAULT_RECONCILE_EVERY, add_dead_letters_parser, parse_listen, run_listen
from ._progress import (
    DEFAULT_PLAIN_INTERVAL,
    Mode,
    Tracker,
    choose_mode,
    print_table,
    show_progress,
)
from ._sync import DEFAULT_MAX_STORES, DatabaseError, describe_error, run_sync

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]

EXIT_OK: Final = 0
EXIT_FAILURE: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_TERMINATED: Final = 143
PROG: Final = "asyncsubs"
log = logging.getLogger("asyncsubs.cli")


class CommandFailed(Exception):
    """A command failed in a way already described by ``lines``; exit with ``code``."""

    def __init__(self, lines: Sequence[str], code: int = EXIT_FAILURE) -> None:
        super().__init__("; ".join(lines))
        self.lines = tuple(lines)
        self.code = code


def error(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{PROG}: error: {message}\n")
        sys.stderr.flush()


def note(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()


# ---------------------------------------------------------------------------------------------
# Parsing


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _rate(text: str) -> Rate:
    try:
        return parse_rate(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _listen_address(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _resource_list(values: Sequence[str] | None) -> list[str] | None:
    # "--resources subscriptions orders" and "--resources subscriptions,orders" both work.
    if values is None:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def _output_options() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
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
        type=_positive_float,
        default=DEFAULT_PLAIN_INTERVAL,
        metavar="SECONDS",
        help=f"seconds between plain progress lines (default {DEFAULT_PLAIN_INTERVAL:g})",
    )
    group.add_argument(
        "--debug", action="store_true", help="tracebacks on errors and debug logging"
    )
    return parent


def build_parser() -> argparse.ArgumentParser:
    from ._demo import add_demo_parsers

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Pull from or sync the subscription service's admin interface.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    output = _output_options()

    pull = commands.add_parser(
        "pull",
        parents=[output],
        help="write one resource as JSON Lines",
        description=(
            "Write every record of RESOURCE as JSON Lines (one record per line, as received) "
            f"to stdout or FILE. Token and base URL default to ${TOKEN_ENV} and ${BASE_URL_ENV}."
        ),
    )
    pull.add_argument("resource", metavar="RESOURCE", choices=RESOURCES, help=", ".join(RESOURCES))
    pull.add_argument("--base-url", help=f"the service's base URL (default ${BASE_URL_ENV})")
    pull.add_argument(
        "--token",
        help=f"the admin API token (default ${TOKEN_ENV}; prefer the variable: "
        "command lines are visible to other users)",
    )
    pull.add_argument("--store", help="rate-limit identity of the store (default: derived)")
    pull.add_argument("--page-size", type=_positive_int, metavar="N", help="records per request")
    pull.add_argument("--after-cursor", metavar="C", help="resume after this cursor")
    pull.add_argument("--limit", type=_positive_int, metavar="N", help="stop after N records")
    pull.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    pull.add_argument(
        "--rate",
        type=_rate,
        metavar="N/Ss",
        help="the list endpoint's rate-limit pool, e.g. 2/s or 3/2s (default: the library's "
        "conservative 1/s)",
    )
    pull.add_argument("--api-version", default="2026-04", metavar="V", help="path version")
    pull.add_argument("--timeout", type=_positive_float, default=30.0, help="seconds per attempt")
    pull.add_argument(
        "--max-attempts", type=_positive_int, default=6, metavar="N", help="attempts per request"
    )
    pull.set_defaults(handler=cmd_pull)

    sync = commands.add_parser(
        "sync",
        parents=[output],
        help="sync many stores into SQLite, resumable",
        description=(
            "Pull the configured resources of every store in the config file concurrently into "
            "SQLite. Each page is committed together with its cursor, so a rerun after a crash "
            "or Ctrl-C resumes where it stopped; a finished resource starts over next time."
        ),
    )
    sync.add_argument("--config", required=True, metavar="FILE", help="stores.toml")
    sync.add_argument(
        "--db", required=True, metavar="URL", help="sqlite:///path.db (or a plain path)"
    )
    sync.add_argument(
        "--resources",
        nargs="+",
        metavar="RESOURCE",
        help=f"only these resources for every store ({', '.join(RESOURCES)})",
    )
    sync.add_argument(
        "--max-stores",
        type=_positive_int,
        default=DEFAULT_MAX_STORES,
        metavar="N",
        help=f"stores synced at once (default {DEFAULT_MAX_STORES})",
    )
    sync.add_argument(
        "--store",
        action="append",
        metavar="ID",
        help="only this store from the config (repeatable)",
    )
    listen = sync.add_argument_group("webhooks (keep running until Ctrl-C or SIGTERM)")
    listen.add_argument(
        "--listen",
        type=_listen_address,
        metavar="HOST:PORT",
        help="also receive each store's webhooks at http://HOST:PORT/webhooks/<store> and apply "
        "them to the database (secret: webhook_secret_env in the config); after the initial "
        "sync, pull incrementally every --reconcile-every seconds to catch missed webhooks",
    )
    listen.add_argument(
        "--reconcile-every",
        type=_positive_float,
        metavar="SECONDS",
        help=f"seconds between reconciliation pulls with --listen "
        f"(default {DEFAULT_RECONCILE_EVERY:g})",
    )
    sync.set_defaults(handler=cmd_sync)

    add_demo_parsers(commands, output)
    add_dead_letters_parser(commands)
    return parser


# ---------------------------------------------------------------------------------------------
# Running


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
                await coro_factory()
        finally:
            if installed:
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
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


def _client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    base_url = args.base_url if args.base_url is not None else os.environ.get(BASE_URL_ENV)
    if not token:
        raise ConfigError(f"no token: pass --token or set {TOKEN_ENV}")
    if not base_url:
        raise ConfigError(f"no base URL: pass --base-url or set {BASE_URL_ENV}")
    limits = None
    if args.rate is not None:
        limits = Limits(heavy={**DEFAULT_HEAVY, args.resource: args.rate})
    return {
        "limits": limits,
        "token": token,
        "base_url": base_url,
        "store": args.store,
        "version": args.api_version,
        "timeout": args.timeout,
        "retry": RetryPolicy(max_attempts=args.max_attempts),
        "user_agent": "asyncsubs-cli",
    }


def cmd_pull(args: argparse.Namespace) -> int:
    kwargs = _client_kwargs(args)
    # Validates token and URL now, so a usage error exits 2 before any request.
    AdminClient(**kwargs)
    label = args.store or urlsplit(kwargs["base_url"]).hostname or "store"
    tracker = Tracker()
    row = tracker.add(label, args.resource)
    resume: dict[str, str | None] = {"cursor": args.after_cursor}
    opened: IO[bytes] | None = None
    if args.output is not None:
        try:
            opened = open(args.output, "wb")  # noqa: SIM115 - closed in the finally below
        except OSError as exc:
            raise ConfigError(f"cannot write {args.output}: {exc.strerror}") from None
    out = opened if opened is not None else sys.stdout.buffer

    async def pull() -> None:
        async with AdminClient(**kwargs) as client:
            tracker.start(row, client)
            written = 0
            try:
                call = getattr(client, args.resource).list(
                    page_size=args.page_size,
                    after_cursor=args.after_cursor,
                    model=dict,
                    # With --limit, a page fetched ahead would likely be thrown away.
                    prefetch=0 if args.limit is not None else DEFAULT_PREFETCH,
                )
                async with contextlib.aclosing(call.pages()) as pages:
                    async for page in pages:
                        records = page.data
                        if args.limit is not None:
                            records = records[: args.limit - written]
                        # orjson writes the record back as it was sent (same keys, order, values).
                        out.write(
                            b"".join(
                                orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records
                            )
                        )
                        out.flush()
                        written += len(records)
                        tracker.page(row, len(records))
                        resume["cursor"] = (
                            page.next_cursor if len(records) == len(page.data) else None
                        )
                        if args.limit is not None and written >= args.limit:
                            break
            except AsyncSubsError as exc:
                log.debug("pull %s failed", args.resource, exc_info=True)
                tracker.fail(row, describe_error(exc))
                return
            finally:
                row.freeze_stats()
            tracker.finish(row)

    mode = choose_mode(sys.stderr, quiet=args.quiet, force=_force(args))
    if mode == "rich" and opened is None and sys.stdout.isatty():
        mode = "plain"  # records go to the same terminal: a live table would garble them
    try:
        run_async(pull, tracker, mode, args.progress_interval)
    except CommandFailed:
        if resume["cursor"] and row.pages:
            note(
                f"interrupted after {row.records:,} records; "
                f"resume with --after-cursor {resume['cursor']}"
            )
        raise
    except BrokenPipeError:
        # The reader went away (e.g. `| head`): not an error of ours.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    finally:
        if opened is not None:
            opened.close()
    if row.state == "failed":
        lines = [f"{row.store}, {row.resource}: {row.error}"]
        if resume["cursor"] and row.pages:
            lines.append(
                f"{row.records:,} records were written; "
                f"resume with --after-cursor {resume['cursor']}"
            )
        raise CommandFailed(lines)
    if not args.quiet:
        note(f"{row.records:,} {args.resource} in {row.pages:,} pages ({row.elapsed():.1f}s)")
    return EXIT_OK


def _force(args: argparse.Namespace) -> str | None:
    if args.debug:
        return "plain"  # log lines and a live table do not mix
    return None if args.progress == "auto" else str(args.progress)


def sync_summary(
    tracker: Tracker,
    elapsed: float,
    db: Path,
    *,
    stream: IO[str],
    passes: int | None = None,
) -> None:
    rows = []
    for row in tracker.rows.values():
        stats = row.pool_stats()
        rows.append(
            [
                row.store,
                row.resource,
                row.state,
                f"{row.records:,}",
                f"{row.pages:,}",
                "" if row.rows is None else f"{row.rows:,}",
                f"{stats.requests:,}",
                f"{stats.rate_limited:,}",
                f"{stats.retries:,}",
                f"{row.elapsed():.1f}s",
            ]
        )
    stores = len({row.store for row in tracker.rows.values()})
    if passes is None:
        done = f"{tracker.records:,} records from {stores} stores in {elapsed:.1f}s into {db}"
    else:  # --listen: the rows show the last pull; the total counts every one
        done = (
            f"{tracker.pulled:,} records pulled in {passes} runs from {stores} stores in "
            f"{elapsed:.1f}s into {db}; the rows show the last run"
        )
    print_table(
        "sync summary",
        [
            "store",
            "resource",
            "status",
            "records",
            "pages",
            "rows",
            "requests",
            "429s",
            "retries",
            "time",
        ],
        rows,
        stream=stream,
        footer=[
            f"{done} (rows: this store's rows in the table; requests/429s/retries: the "
            "resource's pool)"
        ],
    )


def webhook_summary(tracker: Tracker, *, stream: IO[str]) -> None:
    rows = []
    for hook in tracker.webhooks.values():
        stats = hook.stats()
        rows.append(
            [
                hook.store,
                f"{stats.accepted:,}",
                f"{stats.duplicates:,}",
                f"{hook.applied:,}",
                f"{hook.deletes:,}",
                f"{hook.stale:,}",
                f"{hook.ignored:,}",
                f"{stats.unauthorized + stats.bad_request + stats.too_large:,}",
                f"{stats.dead_lettered:,}",
                f"{stats.unfinished:,}",
                f"{stats.unsaved:,}",
            ]
        )
    print_table(
        "webhooks",
        [
            "store",
            "accepted",
            "duplicates",
            "applied",
            "deletes",
            "stale",
            "ignored",
            "refused",
            "dead letters",
            "kept",
            "lost",
        ],
        rows,
        stream=stream,
        footer=[
            "applied: rows written or deleted; stale: older than the stored row, or deleted; "
            "ignored: resources not synced; refused: bad signature, wrong store or not an event; "
            "dead letters: in the table webhook_dead_letters (asyncsubs dead-letters); "
            "kept: accepted, not applied yet, in webhook_inbox for the next start; "
            "lost: dead letters that could not be saved"
        ],
    )


def cmd_sync(args: argparse.Namespace) -> int:
    db_path = parse_db_url(args.db)
    if not db_path.parent.is_dir():
        raise ConfigError(f"--db: directory {db_path.parent} does not exist")
    if args.listen is None and args.reconcile_every is not None:
        raise ConfigError("--reconcile-every needs --listen")
    configs = load_config(
        Path(args.config),
        os.environ,
        resources=_resource_list(args.resources),
        only_stores=args.store,
        listen=args.listen is not None,
    )
    tracker = Tracker()
    mode = choose_mode(sys.stderr, quiet=args.quiet, force=_force(args))
    started = time.monotonic()
    if args.listen is not None:
        return _listen(args, configs, db_path, tracker, mode)
    try:
        run_async(
            lambda: run_sync(configs, db_path, tracker, max_stores=args.max_stores),
            tracker,
            mode,
            args.progress_interval,
        )
    except CommandFailed as exc:
        if not args.quiet:
            sync_summary(tracker, time.monotonic() - started, db_path, stream=sys.stdout)
        if exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            note("interrupted; every committed page is kept: rerun the same command to resume")
        raise
    if not args.quiet:
        sync_summary(tracker, time.monotonic() - started, db_path, stream=sys.stdout)
    failed = tracker.failed
    if failed:
        raise CommandFailed([f"store {row.store}, {row.resource}: {row.error}" for row in failed])
    return EXIT_OK


class _MessageLog(logging.Handler):
    """The receivers' warnings and errors (refused deliveries, failed and dead-lettered events)
    as one line each among the progress, like every other CLI message: no traceback (--debug
    has them), and printed through the live display rather than across it."""

    def __init__(self, tracker: Tracker) -> None:
        super().__init__(logging.WARNING)
        self.tracker = tracker

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = " ".join(record.getMessage().split())
            if self.tracker.has_display:
                self.tracker.message(f"{record.levelname.lower()}: {text}")
            elif record.levelno >= logging.ERROR:  # --quiet: errors only
                error(text)
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def _webhook_log(tracker: Tracker, *, enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    logger = logging.getLogger("asyncsubs.webhooks")
    handler = _MessageLog(tracker)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _listen(
    args: argparse.Namespace,
    configs: Sequence[StoreConfig],
    db_path: Path,
    tracker: Tracker,
    mode: Mode,
) -> int:
    """``sync --listen``: runs until stopped, so it only ends by a signal or a failure."""
    host, port = args.listen
    every = DEFAULT_RECONCILE_EVERY if args.reconcile_every is None else args.reconcile_every
    started = time.monotonic()
    try:
        with _webhook_log(tracker, enabled=not args.debug):
            run_async(
                lambda: run_listen(
                    configs,
                    db_path,
                    tracker,
                    host=host,
                    port=port,
                    reconcile_every=every,
                    max_stores=args.max_stores,
                ),
                tracker,
                mode,
                args.progress_interval,
            )
    except CommandFailed as exc:
        if not args.quiet:
            elapsed = time.monotonic() - started
            sync_summary(tracker, elapsed, db_path, stream=sys.stdout, passes=tracker.runs)
            webhook_summary(tracker, stream=sys.stdout)
        if exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            note(
                "stopped; accepted webhooks not applied yet are kept in webhook_inbox and every "
                "committed page is kept: rerun the same command to continue"
            )
        raise
    return EXIT_OK  # not reached: run_listen returns only by raising


# ---------------------------------------------------------------------------------------------
# Entry point


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help/--version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler
    with _debug_logging(args.debug):
        return _run(handler, args)


@contextlib.contextmanager
def _debug_logging(enabled: bool) -> Iterator[None]:
    """--debug: the library's debug log on stderr (removed again, for in-process callers)."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("asyncsubs")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _run(handler: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    try:
        return handler(args)
    except CommandFailed as exc:
        for line in exc.lines:
            error(line)
        return exc.code
    except ConfigFileError as exc:
        if args.debug:
            traceback.print_exc()
        for problem in exc.problems:
            error(problem)
        return EXIT_USAGE
    except ConfigError as exc:
        if args.debug:
            traceback.print_exc()
        error(str(exc))
        return EXIT_USAGE
    except (AsyncSubsError, DatabaseError) as exc:
        if args.debug:
            traceback.print_exc()
        error(str(exc))
        return EXIT_FAILURE
    except KeyboardInterrupt:  # outside the event loop, e.g. while reading the config
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # stdout's reader went away; keep the interpreter from failing again at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE
    except Exception as exc:
        if args.debug:
            raise
        error(f"internal error: {describe_error(exc)} (rerun with --debug for the traceback)")
        return EXIT_FAILURE
