"""``asyncsubs sync``: every configured store into SQLite, or PostgreSQL shared by workers.

The command reads ``--db`` and the config file (every problem before any request), holds the
database (SQLite: one sync at a time), and runs one round of ``asyncsubs.sync`` with its
progress shown; ``--listen`` keeps it running with webhooks (``_listen``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Sequence
from logging import NullHandler
from pathlib import Path
from typing import Any

import attrs

from ..errors import ConfigError
from ..stores import DEFAULT_MAX_STORES, RESOURCES, check_redis_url, load_config
from ..sync import (
    DEFAULT_DB_TIMEOUT,
    DEFAULT_LEASE,
    DEFAULT_RECONCILE_EVERY,
    SyncEngine,
    run_round,
    sink_for,
)
from ._common import (
    CONFIG_FLAGS,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    USER_AGENT,
    CommandFailed,
    Runner,
    fraction,
    positive_float,
    positive_int,
)
from ._listen import listen, listen_address
from ._output import Output, logging_to
from ._summaries import summarise

__all__ = ["add_parser"]


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

    # psycopg's pool logs each failed connection attempt as a bare line; the command says what
    # they mean in its own lines, so they are shown only with --debug.
    drivers = contextlib.nullcontext() if args.debug else logging_to("psycopg", NullHandler())
    with sink.lock(), drivers:
        try:
            runner.run(listen(args, stores, sink, runner) if listening else sync)
        except CommandFailed as exc:
            if not args.quiet:
                runs = runner.progress.runs if listening else None
                summarise(runner.progress, started, sink.where, out, runs=runs)
            if exc.code in (EXIT_INTERRUPTED, EXIT_TERMINATED):
                out.note(
                    "stopped; accepted webhooks not applied yet are kept in webhook_inbox and "
                    "every committed page is kept: rerun the same command to continue"
                    if listening
                    else "interrupted; every committed page is kept: rerun the same command to "
                    "resume"
                )
            raise
    if not args.quiet:
        summarise(runner.progress, started, sink.where, out)
    runner.raise_failures()
    return 0
