"""Argument parsing, the ``pull`` and ``sync`` commands, and exit codes.

Exit codes: 0 done; 1 API, transport or database failure; 2 usage or configuration error;
130 interrupted (Ctrl-C) and 143 terminated (SIGTERM), after committing what was done.
Errors are one line each, without a traceback unless ``--debug``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs
import orjson

from .. import AdminClient, Limits, Rate, RetryPolicy, __version__
from .._client import store_fingerprint
from .._protocol import DEFAULT_VERSION
from ..errors import AsyncSubsError, ConfigError
from ._checkpoint import PullCheckpoint
from ._config_file import (
    DEFAULT_PAGE_SIZE,
    RESOURCES,
    ConfigFileError,
    PostgresURL,
    StoreConfig,
    check_client,
    check_redis_url,
    load_config,
    parse_db_url,
    parse_rate,
)
from ._demo import add_demo_parsers
from ._listen import DEFAULT_RECONCILE_EVERY, add_dead_letters_parser, parse_listen, run_listen
from ._lock import hold_database
from ._progress import (
    DEFAULT_PLAIN_INTERVAL,
    Mode,
    Tracker,
    choose_mode,
    plural,
    print_table,
    utc_now,
)
from ._running import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    PROG,
    CommandFailed,
    display_mode,
    error,
    json_lines,
    note,
    positive_float,
    positive_int,
    raise_failures,
    run_async,
    set_json_lines,
)
from ._sync import (
    DEFAULT_LEASE,
    DEFAULT_MAX_STORES,
    DatabaseError,
    count_rows,
    describe_error,
    json_text,
    redis_limiters,
    run_sync,
)
from ._workers import run_workers

if TYPE_CHECKING:
    from ..limiting import Limiter
    from ._postgres import PostgresSink, UnitStatus

__all__ = ["EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "main"]

log = logging.getLogger("asyncsubs.cli")


# ---------------------------------------------------------------------------------------------
# Parsing


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


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)


def _output_options() -> _Parser:
    parent = _Parser(add_help=False)
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
        default=DEFAULT_PLAIN_INTERVAL,
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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Pull from or sync the subscription service's admin interface.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )
    output = _output_options()

    pull = commands.add_parser(
        "pull",
        parents=[output],
        help="write one resource as JSON Lines",
        description=(
            "Write every record of RESOURCE as JSON Lines (one record per line, as received) "
            "to stdout or FILE. Token and base URL default to $ASYNCSUBS_TOKEN and "
            "$ASYNCSUBS_BASE_URL."
        ),
    )
    pull.add_argument("resource", metavar="RESOURCE", choices=RESOURCES, help=", ".join(RESOURCES))
    pull.add_argument("--base-url", help="the service's base URL (default $ASYNCSUBS_BASE_URL)")
    pull.add_argument(
        "--token",
        help="the admin API token (default $ASYNCSUBS_TOKEN; prefer the variable: "
        "command lines are visible to other users)",
    )
    pull.add_argument("--store", help="rate-limit identity of the store (default: derived)")
    pull.add_argument(
        "--page-size",
        type=positive_int,
        default=DEFAULT_PAGE_SIZE,
        metavar="N",
        help="records per request (the server may clamp it)",
    )
    pull.add_argument("--after-cursor", metavar="C", help="resume after this cursor")
    pull.add_argument("--limit", type=positive_int, metavar="N", help="stop after N records")
    pull.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE instead of stdout; a rerun of the same command continues after the "
        "last whole page written (checkpoint: FILE.asyncsubs-checkpoint)",
    )
    pull.add_argument(
        "--restart",
        action="store_true",
        help="with -o: start over even if FILE has a checkpoint to continue from",
    )
    pull.add_argument(
        "--allow-insecure",
        action="store_true",
        help="allow a plain http:// base URL that is not loopback (a trusted network only: "
        "the token travels unencrypted)",
    )
    pull.add_argument(
        "--rate",
        type=_rate,
        metavar="N/Ss",
        help="the list endpoint's rate-limit pool, e.g. 2/s or 3/2s (default: the library's "
        "conservative 1/s)",
    )
    pull.add_argument(
        "--api-version",
        metavar="V",
        default=DEFAULT_VERSION,
        help="the interface version in the path (default: %(default)s, the one implemented)",
    )
    pull.add_argument("--timeout", type=positive_float, default=30.0, help="seconds per attempt")
    pull.add_argument(
        "--max-attempts", type=positive_int, default=6, metavar="N", help="attempts per request"
    )
    pull.set_defaults(handler=cmd_pull)

    sync = commands.add_parser(
        "sync",
        parents=[output],
        help="sync many stores into SQLite or PostgreSQL (many workers), resumable",
        description=(
            "Pull the configured resources of every store in the config file concurrently into "
            "SQLite, or PostgreSQL shared by any number of workers running the same command "
            "(docs/cli.md, Many workers). Each page is committed together with its cursor, so a "
            "rerun after a crash or Ctrl-C resumes where it stopped; a finished resource starts "
            "over next time."
        ),
    )
    sync.add_argument("--config", required=True, metavar="FILE", help="stores.toml")
    sync.add_argument(
        "--db",
        required=True,
        metavar="URL",
        help="sqlite:///path.db (or a plain path), or postgresql://user@host:port/db to share "
        "the work with every other worker running the same command on that database",
    )
    sync.add_argument(
        "--redis",
        metavar="URL",
        help="pace every store through RedisLimiter on this Redis (redis://host:6379/0), so "
        "its budget holds across workers (or the config key redis)",
    )
    sync.add_argument(
        "--lease",
        type=positive_float,
        default=DEFAULT_LEASE,
        metavar="SECONDS",
        help="with PostgreSQL: how long a unit stays claimed by a worker that stopped "
        "renewing it (killed, lost) before another worker takes it over",
    )
    sync.add_argument(
        "--resources",
        nargs="+",
        metavar="RESOURCE",
        help=f"only these resources for every store ({', '.join(RESOURCES)})",
    )
    sync.add_argument(
        "--max-stores",
        type=positive_int,
        default=DEFAULT_MAX_STORES,
        metavar="N",
        help="stores synced at once",
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
        type=positive_float,
        metavar="SECONDS",
        help="seconds between reconciliation pulls with --listen "
        f"(default: {DEFAULT_RECONCILE_EVERY:g})",
    )
    sync.set_defaults(handler=cmd_sync)

    status = commands.add_parser(
        "sync-status",
        help="every unit of a PostgreSQL sync: state, holder, records, cursor age",
        description=(
            "Show every (store, resource) of a sync database shared by workers: its state in "
            "the current round, the worker holding it and its lease, the records and pages of "
            "its run, and how long ago its cursor was committed."
        ),
    )
    status.add_argument("--db", required=True, metavar="URL", help="postgresql://user@host/db")
    status.set_defaults(handler=cmd_sync_status, debug=False)

    add_demo_parsers(commands, output)
    add_dead_letters_parser(commands)
    return parser


# ---------------------------------------------------------------------------------------------
# Running


def _client(args: argparse.Namespace) -> AdminClient:
    """The pull's client. Token and base URL not given as flags are the client's to find
    (``ASYNCSUBS_TOKEN``, ``ASYNCSUBS_BASE_URL``); constructing it checks every setting, so a
    usage error exits 2 before any request."""
    limits = None
    if args.rate is not None:
        limits = Limits(heavy={**Limits().heavy, args.resource: args.rate})
    settings: dict[str, Any] = {
        "limits": limits,
        "token": args.token,
        "base_url": args.base_url,
        "store": args.store,
        "timeout": args.timeout,
        "retry": RetryPolicy(max_attempts=args.max_attempts),
        "allow_insecure": args.allow_insecure,
        "user_agent": "asyncsubs-cli",
        "version": args.api_version,
    }
    return check_client(settings, insecure_hint="or --allow-insecure")


def _open_output(
    args: argparse.Namespace, base_url: str, credentials: str
) -> tuple[IO[bytes], PullCheckpoint | None]:
    """``-o FILE`` opened to write at the end of its checkpointed prefix (a rerun continues),
    or from the start (no checkpoint, or ``--restart``)."""
    output = Path(args.output)
    checkpoint = None if args.restart else PullCheckpoint.load(output)
    if checkpoint is not None:
        this_pull = (args.resource, base_url, credentials, args.after_cursor)
        that = checkpoint
        if (that.resource, that.base_url, that.credentials, that.after_cursor) != this_pull:
            after = "" if checkpoint.after_cursor is None else " after another cursor"
            token = "" if checkpoint.credentials == credentials else " with another token"
            raise ConfigError(
                f"{output} has a checkpoint of a pull of {checkpoint.resource} from "
                f"{checkpoint.base_url}{token}{after}; pass --restart to start over"
            )
    try:
        if checkpoint is None:
            PullCheckpoint.remove(output)
            return open(output, "wb"), None
        out = open(output, "r+b")  # noqa: SIM115 - the caller closes it
    except FileNotFoundError:
        if checkpoint is None:  # no such directory
            raise ConfigError(f"cannot write {output}: no such directory") from None
        raise ConfigError(
            f"{output} is gone but its checkpoint is not; pass --restart to start over"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot write {output}: {exc.strerror}") from None
    size = out.seek(0, os.SEEK_END)
    if size < checkpoint.offset:
        out.close()
        raise ConfigError(
            f"{output} is shorter than its checkpoint says ({size:,} < {checkpoint.offset:,} "
            "bytes); pass --restart to start over"
        )
    # Bytes after the checkpoint belong to a page whose checkpoint was never written.
    out.truncate(checkpoint.offset)
    out.seek(checkpoint.offset)
    return out, checkpoint


def cmd_pull(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.restart and args.output is None:
        raise ConfigError("--restart needs -o FILE (a pull to stdout keeps no checkpoint)")
    label = args.store or urlsplit(client.base_url).hostname or "store"
    tracker = Tracker(verbose=args.verbose)
    row = tracker.add(label, args.resource)
    resume: dict[str, str | None] = {"cursor": args.after_cursor}
    opened: IO[bytes] | None = None
    checkpoint: PullCheckpoint | None = None
    output = None if args.output is None else Path(args.output)
    credentials = store_fingerprint(client.base_url, client._token)  # one way: no token
    if args.output is not None:
        opened, checkpoint = _open_output(args, client.base_url, credentials)
    out = opened if opened is not None else sys.stdout.buffer
    before = 0 if checkpoint is None else checkpoint.records
    pages_before = 0 if checkpoint is None else checkpoint.pages
    if checkpoint is not None:
        resume["cursor"] = checkpoint.cursor

    def save(cursor: str | None) -> None:
        if output is None:
            return
        if cursor is None:
            PullCheckpoint.remove(output)  # complete: nothing to continue
            return
        PullCheckpoint(
            resource=args.resource,
            base_url=client.base_url,
            credentials=credentials,
            after_cursor=args.after_cursor,
            cursor=cursor,
            offset=out.tell(),
            records=before + row.records,
            pages=pages_before + row.pages,
        ).save(output)

    async def pull() -> None:
        async with client:
            tracker.start(row, client, resumed=checkpoint is not None, resumed_records=before)
            written = before
            try:
                # With --limit, a page fetched ahead would likely be thrown away.
                ahead: dict[str, Any] = {} if args.limit is None else {"prefetch": 0}
                call = getattr(client, args.resource).list(
                    page_size=args.page_size, after_cursor=resume["cursor"], model=dict, **ahead
                )
                if args.limit is not None and written >= args.limit:
                    resume["cursor"] = None
                    save(None)
                    tracker.finish(row)
                    return
                async with contextlib.aclosing(call.pages()) as pages:
                    async for page in pages:
                        records = page.data
                        if args.limit is not None:
                            records = records[: args.limit - written]
                        # Each record as it was sent (same keys, order, values; integers exact).
                        out.write("".join(json_text(r) + "\n" for r in records).encode())
                        out.flush()
                        written += len(records)
                        tracker.page(row, len(records))
                        done = args.limit is not None and written >= args.limit
                        resume["cursor"] = None if done else page.next_cursor
                        save(resume["cursor"])
                        if done:
                            break
            except ConfigError:
                raise  # a usage error the client found only now: exit 2, not a failed pull
            except AsyncSubsError as exc:
                log.debug("pull %s failed", args.resource, exc_info=True)
                tracker.fail(row, describe_error(exc))
                return
            finally:
                row.freeze_stats()
            tracker.finish(row)

    mode = choose_mode(sys.stderr, quiet=args.quiet, force=display_mode(args))
    if mode == "rich" and opened is None and sys.stdout.isatty():
        mode = "plain"  # records go to the same terminal: a live table would garble them
    try:
        run_async(pull, tracker, mode, args.progress_interval)
    except CommandFailed:
        if resume["cursor"] and (row.pages or checkpoint is not None):
            note(
                f"interrupted after {plural(before + row.records, 'record')}; "
                f"{_how_to_continue(args, resume['cursor'])}"
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
        # The plain and JSON displays printed the failure when it happened.
        lines = [] if mode in ("plain", "json") else [f"{row.store}, {row.resource}: {row.error}"]
        if resume["cursor"] and (row.pages or checkpoint is not None):
            lines.append(
                f"{plural(before + row.records, 'record')} written; "
                f"{_how_to_continue(args, resume['cursor'])}"
            )
        raise CommandFailed(lines)
    if not args.quiet:
        total = before + row.records
        note(
            f"{plural(total, args.resource[:-1])} in "
            f"{plural(pages_before + row.pages, 'page')} ({row.elapsed():.1f}s)"
            + (f", {plural(before, 'record')} of them before resuming" if before else "")
        )
    return EXIT_OK


def _how_to_continue(args: argparse.Namespace, cursor: str | None) -> str:
    if args.output is not None:
        return "rerun the same command to continue (--restart starts over)"
    return f"resume with --after-cursor {cursor}"


def sync_summary(
    tracker: Tracker,
    elapsed: float,
    db: Path | PostgresURL,
    *,
    stream: IO[str],
    passes: int | None = None,
) -> None:
    if isinstance(db, Path):
        count_rows(tracker, db)
    where = db if isinstance(db, Path) else db.where
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
    stores = plural(len({row.store for row in tracker.rows.values()}), "store")
    if passes is None:
        done = f"{plural(tracker.records, 'record')} from {stores} in {elapsed:.1f}s into {where}"
    else:  # --listen: the rows show the last pull; the total counts every one
        done = (
            f"{plural(tracker.pulled, 'record')} pulled in {plural(passes, 'run')} from "
            f"{stores} in {elapsed:.1f}s into {where}; the rows show the last run"
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
    db = parse_db_url(args.db)
    if isinstance(db, Path) and not db.parent.is_dir():
        raise ConfigError(f"--db: directory {db.parent} does not exist")
    if args.listen is None and args.reconcile_every is not None:
        raise ConfigError("--reconcile-every needs --listen")
    redis = None if args.redis is None else check_redis_url(args.redis, where="--redis")
    configs = load_config(
        Path(args.config),
        os.environ,
        resources=_resource_list(args.resources),
        only_stores=args.store,
        listen=args.listen is not None,
    )
    if redis is not None:
        configs = [attrs.evolve(config, redis=redis) for config in configs]
    if isinstance(db, PostgresURL):
        # Workers share the database through leases: no lock file, any number may run.
        return _sync(args, configs, db)
    with hold_database(db):
        return _sync(args, configs, db)


def _sync(args: argparse.Namespace, configs: Sequence[StoreConfig], db: Path | PostgresURL) -> int:
    tracker = Tracker(verbose=args.verbose)
    mode = choose_mode(sys.stderr, quiet=args.quiet, force=display_mode(args))
    started = time.monotonic()
    if args.listen is not None:
        return _listen(args, configs, db, tracker, mode)

    async def sync() -> None:
        async with redis_limiters(configs) as limiters:
            if isinstance(db, Path):
                await run_sync(configs, db, tracker, max_stores=args.max_stores, limiters=limiters)
            else:
                await run_postgres(
                    configs,
                    db,
                    tracker,
                    lease=args.lease,
                    max_stores=args.max_stores,
                    limiters=limiters,
                )

    try:
        run_async(sync, tracker, mode, args.progress_interval)
    except CommandFailed as exc:
        if not args.quiet:
            sync_summary(tracker, time.monotonic() - started, db, stream=sys.stdout)
        if exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
            note("interrupted; every committed page is kept: rerun the same command to resume")
        raise
    if not args.quiet:
        sync_summary(tracker, time.monotonic() - started, db, stream=sys.stdout)
    raise_failures(tracker, mode)
    return EXIT_OK


async def run_postgres(
    configs: Sequence[StoreConfig],
    db: PostgresURL,
    tracker: Tracker,
    *,
    lease: float = DEFAULT_LEASE,
    max_stores: int = DEFAULT_MAX_STORES,
    limiters: Mapping[str, Limiter] | None = None,
) -> None:
    """This worker's share of a sync into PostgreSQL (see ``_workers``)."""
    sink = _postgres_sink(db, lease)
    await sink.open()
    try:
        await run_workers(configs, sink, tracker, max_stores=max_stores, limiters=limiters)
    finally:
        await sink.aclose()


def _postgres_sink(db: PostgresURL, lease: float) -> PostgresSink:
    try:
        from ._postgres import PostgresSink
    except ImportError as exc:
        raise ConfigError(str(exc)) from None
    return PostgresSink(db.url, lease=lease)


def cmd_sync_status(args: argparse.Namespace, *, stream: IO[str] | None = None) -> int:
    stream = stream or sys.stdout
    db = parse_db_url(args.db)
    if not isinstance(db, PostgresURL):
        raise ConfigError("--db: sync-status reads a PostgreSQL sync database (postgresql://)")

    async def read() -> list[UnitStatus]:
        sink = _postgres_sink(db, DEFAULT_LEASE)
        await sink.open()
        try:
            return await sink.status()
        finally:
            await sink.aclose()

    units = asyncio.run(read())
    rows = [
        [
            unit.store,
            unit.resource,
            "running" if unit.holder is not None and unit.state == "pending" else unit.state,
            unit.holder or "",
            "" if unit.lease_left is None else f"{unit.lease_left:.0f}s",
            "" if unit.records is None else f"{unit.records:,}",
            "" if unit.pages is None else f"{unit.pages:,}",
            "" if unit.cursor_age is None else _age(unit.cursor_age),
            unit.error or "",
        ]
        for unit in units
    ]
    counts = collections.Counter(row[2] for row in rows)
    print_table(
        "sync units",
        [
            "store",
            "resource",
            "state",
            "holder",
            "lease",
            "records",
            "pages",
            "cursor age",
            "error",
        ],
        rows,
        stream=stream,
        footer=[
            f"{plural(len(rows), 'unit')} in {db.where}: "
            + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
            + " (records, pages: the unit's current or last run; lease: left before another "
            "worker may take it over, negative: expired; cursor age: since its last commit)"
        ],
    )
    return EXIT_OK


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


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
    db_path: Path | PostgresURL,
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
                    lease=args.lease,
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


def _attach_negative_values(argv: Sequence[str]) -> list[str]:
    """``--rate -1/s`` as ``--rate=-1/s``: argparse takes a word starting with "-" for an
    option (and says "expected one argument"), unless it is a plain negative number. No
    option here starts with "-" and a digit, so such a word is always a value, and attached
    to its option it reaches the option's own check and its message."""
    result: list[str] = []
    for arg in argv:
        previous = result[-1] if result else ""
        if re.match(r"-[\d.]", arg) and previous.startswith("--") and "=" not in previous:
            result[-1] = f"{previous}={arg}"
        else:
            result.append(arg)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(_attach_negative_values(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:  # argparse: --help/--version (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Callable[[argparse.Namespace], int] = args.handler
    set_json_lines(getattr(args, "log_format", "text") == "json")
    try:
        with _debug_logging(args.debug):
            return _run(handler, args)
    finally:
        set_json_lines(False)


class _JsonLogFormatter(logging.Formatter):
    """``--debug --log-format json``: the library's log records as JSON lines too."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": utc_now(),
            "level": record.levelname.lower(),
            "event": "log",
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


@contextlib.contextmanager
def _debug_logging(enabled: bool) -> Iterator[None]:
    """--debug: the library's debug log on stderr (removed again, for in-process callers)."""
    if not enabled:
        yield
        return
    logger = logging.getLogger("asyncsubs")
    handler = logging.StreamHandler(sys.stderr)
    if json_lines():
        handler.setFormatter(_JsonLogFormatter())
    else:
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
