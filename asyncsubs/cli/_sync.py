"""``asyncsubs sync``: every configured store into SQLite, or PostgreSQL shared by workers.

The command reads ``--db`` and the config file (every problem before any request), holds the
database (SQLite: one sync at a time), and runs one round of ``asyncsubs.sync`` with its
progress shown; ``--listen`` keeps it running with webhooks (``asyncsubs.sync.ListenSync``),
the receivers' warnings shown among the progress.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError
from ..stores import DEFAULT_MAX_STORES, RESOURCES, Message, check_redis_url, load_config
from ..sync import (
    DEFAULT_DB_TIMEOUT,
    DEFAULT_LEASE,
    DEFAULT_RECONCILE_EVERY,
    ListenSync,
    SyncEngine,
    run_round,
    sink_for,
)
from ._common import (
    CONFIG_FLAGS,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    USER_AGENT,
    CommandFailed,
    Runner,
    fraction,
    positive_float,
    positive_int,
)
from ._output import Output, logging_to
from ._summaries import summarise

__all__ = ["add_parser", "parse_listen"]


def _resource_list(values: Sequence[str] | None) -> list[str] | None:
    # "--resources subscriptions orders" and "--resources subscriptions,orders" both work.
    if values is None:
        return None
    return [name.strip() for value in values for name in value.split(",") if name.strip()]


def add_parser(commands: Any, output: argparse.ArgumentParser) -> None:
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
        "--redis-fallback",
        type=fraction,
        metavar="FRACTION",
        help="while that Redis fails, pace each worker alone at FRACTION of each rate (0.25 "
        "for 4 workers) instead of failing its requests (or the config key redis_fallback)",
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
        "--db-timeout",
        type=positive_float,
        default=DEFAULT_DB_TIMEOUT,
        metavar="SECONDS",
        help="how long a database operation waits before it fails: SQLite, while another "
        "process holds the write lock; PostgreSQL, for a connection (the server down or "
        "restarting). With --listen the pull is tried again and a delivery answered 503; "
        "without, the command ends with the error (default: %(default)g)",
    )
    sync.add_argument(
        "--resources",
        nargs="+",
        metavar="RESOURCE",
        help=f"only these resources for every store ({', '.join(RESOURCES)}; default: each "
        "store's resources key, else all three)",
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
        help="only this store from the config (repeatable; default: every store in it)",
    )
    listen = sync.add_argument_group("webhooks (keep running until Ctrl-C or SIGTERM)")
    listen.add_argument(
        "--listen",
        type=listen_address,
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


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; port 0: any free port) -> (host, port)."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"--listen takes HOST:PORT (e.g. 0.0.0.0:8080), got {text!r}")
    return host, int(port_text)


def listen_address(text: str) -> tuple[str, int]:
    try:
        return parse_listen(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _ReceiverLog(logging.Handler):
    """The receivers' warnings and errors (failed and dead-lettered events, bodies too large)
    as one line each among the progress, without traceback (--debug has them). They stay log
    records: that is how the receivers speak to any application. A refused delivery is left
    out: the display shows its ``WebhookRefused`` event, with the keys to check."""

    def __init__(self, runner: Runner) -> None:
        super().__init__(logging.WARNING)
        self.runner = runner

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "webhook_refusal", None) is not None:
            return
        try:
            text = " ".join(record.getMessage().split())
            if self.runner.progress.shown:
                self.runner.progress(Message(f"{record.levelname.lower()}: {text}"))
            elif record.levelno >= logging.ERROR:  # --quiet: errors only
                self.runner.out.error(text)
        except Exception:
            self.handleError(record)


def cmd_sync(args: argparse.Namespace, out: Output) -> int:
    sink = sink_for(args.db, lease=args.lease, timeout=args.db_timeout)
    if args.listen is None and args.reconcile_every is not None:
        raise ConfigError("--reconcile-every needs --listen")
    redis = None if args.redis is None else check_redis_url(args.redis, where="--redis")
    stores = load_config(
        Path(args.config),
        os.environ,
        resources=_resource_list(args.resources),
        only_stores=args.store,
        listen=args.listen is not None,
        names=CONFIG_FLAGS,
    )
    if redis is not None:
        stores = [attrs.evolve(store, redis=redis) for store in stores]
    if args.redis_fallback is not None:
        if not any(store.redis for store in stores):
            raise ConfigError("--redis-fallback needs --redis (or the config key redis)")
        stores = [attrs.evolve(store, redis_fallback=args.redis_fallback) for store in stores]
    runner, started, listening = Runner(args, out), time.monotonic(), args.listen is not None

    async def sync() -> None:
        progress, most = runner.progress, args.max_stores
        engine = SyncEngine(stores, sink, progress, max_stores=most, user_agent=USER_AGENT)
        async with sink, engine:
            await run_round(engine)

    async def listen() -> None:  # runs until stopped: it ends only by a signal or a failure
        host, port = args.listen
        every = DEFAULT_RECONCILE_EVERY if args.reconcile_every is None else args.reconcile_every
        listening = ListenSync(
            stores, sink, runner.progress, max_stores=args.max_stores, user_agent=USER_AGENT
        )
        # With --debug the library's own log lines show the receivers'.
        log = _ReceiverLog(runner)
        with contextlib.nullcontext() if args.debug else logging_to("asyncsubs.webhooks", log):
            async with listening:
                try:
                    await listening.run(host, port, every)
                except ConfigError as exc:
                    if exc.key != "listen":
                        raise
                    raise ConfigError(exc.problem, key="--listen", sep=" ") from None

    # psycopg's pool logs each failed connection attempt as a bare line; the command says what
    # they mean in its own lines, so they are shown only with --debug.
    drivers = (
        contextlib.nullcontext() if args.debug else logging_to("psycopg", logging.NullHandler())
    )

    def summary(runs: int | None = None) -> bool:
        """The summary on stdout, unless --quiet; False when stdout could not take it (a full
        disk): its line is said then, and what stopped the sync (Ctrl-C, SIGTERM, a failed
        unit) keeps its own lines and exit code after it."""
        if args.quiet:
            return True
        try:
            summarise(runner.progress, started, sink.where, out, runs=runs)
        except CommandFailed as unwritten:
            for line in unwritten.lines:
                out.error(line)
            return False
        return True

    with sink.lock(), drivers:
        try:
            runner.run(listen if listening else sync)
        except CommandFailed as exc:
            summary(runner.progress.runs if listening else None)
            if exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
                out.note(
                    "stopped; accepted webhooks not applied yet are kept in webhook_inbox and "
                    "every committed page is kept: rerun the same command to continue"
                    if listening
                    else "interrupted; every committed page is kept: rerun the same command to "
                    "resume"
                )
            raise
    written = summary()
    runner.raise_failures()
    return EXIT_OK if written else EXIT_FAILURE
