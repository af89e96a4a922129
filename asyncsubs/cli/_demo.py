"""``asyncsubs demo`` and ``asyncsubs fake-server``: the embedded fake service.

The demo starts ``FakeAdminServer`` in a process of its own with several stores whose server-side
rate limits equal the client's limits (each store with a different window flavour: sliding, fixed,
leaky bucket), syncs them all into SQLite with the same engine as ``sync``, and prints what was
achieved against what was allowed, as the server measured it. No network, no setup.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import attrs

from .. import Limits, Rate
from ..errors import ConfigError
from ._config_file import RESOURCES, StoreConfig, parse_sqlite_url
from ._lock import hold_database
from ._progress import Tracker, choose_mode, plural, print_table
from ._running import CommandFailed, display_mode, note, positive_int, raise_failures, run_async

if TYPE_CHECKING:
    from ..testing import RemoteFakeServer

__all__ = ["DEMO_STORES", "DemoStore", "add_demo_parsers"]

GLOBAL_RATE: Final = Rate(50, per=1.0)
DEMO_PAGE_SIZE: Final = 250  # the fake server's maximum
DEMO_LATENCY: Final = (0.005, 0.03)  # seconds, drawn per answer


@attrs.frozen
class DemoStore:
    name: str
    records: Mapping[str, int]
    heavy: Mapping[str, Rate]
    #: The server's window flavour (see ServerRateLimits): the client must hold against each.
    window: Literal["sliding", "fixed", "leaky"]


# Sized so the slowest pool needs ~20 s at its rate: long enough to watch, short enough to wait.
DEMO_STORES: Final = (
    DemoStore(
        "acme-coffee",
        {"subscriptions": 9_000, "customers": 6_000, "orders": 14_000},
        {"subscriptions": Rate(2), "customers": Rate(2), "orders": Rate(3)},
        "sliding",
    ),
    DemoStore(
        "globex-pets",
        {"subscriptions": 6_000, "customers": 4_000, "orders": 9_000},
        {"subscriptions": Rate(2), "customers": Rate(1), "orders": Rate(2)},
        "fixed",
    ),
    DemoStore(
        "initech-razors",
        {"subscriptions": 3_000, "customers": 2_000, "orders": 5_000},
        {"subscriptions": Rate(3, per=2.0), "customers": Rate(1), "orders": Rate(2)},
        "leaky",
    ),
    DemoStore(
        "umbrella-vitamins",
        {"subscriptions": 1_500, "customers": 1_000, "orders": 2_500},
        {"subscriptions": Rate(2), "customers": Rate(2), "orders": Rate(2)},
        "sliding",
    ),
)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def add_demo_parsers(commands: Any, output: argparse.ArgumentParser) -> None:
    demo = commands.add_parser(
        "demo",
        parents=[output],
        help="sync embedded fake stores into SQLite (no setup, no network)",
        description=(
            "Start a fake admin server in this process with several stores and realistic rate "
            "limits, sync them into SQLite with live progress, and summarise requests, 429s "
            "and achieved against allowed rates."
        ),
    )
    demo.add_argument(
        "--db", metavar="URL", help="keep the database here (default: a temporary file)"
    )
    demo.add_argument(
        "--stores",
        type=positive_int,
        default=len(DEMO_STORES),
        metavar="N",
        help="number of fake stores",
    )
    demo.add_argument(
        "--records",
        type=_non_negative_int,
        metavar="N",
        help="records per resource in every store (default: a realistic mix, ~20 s)",
    )
    demo.add_argument("--quick", action="store_true", help="a tenth of the records (a few seconds)")
    demo.add_argument(
        "--page-size",
        type=positive_int,
        default=DEMO_PAGE_SIZE,
        metavar="N",
        help="records per request",
    )
    demo.set_defaults(handler=cmd_demo)

    fake = commands.add_parser(
        "fake-server",
        help="run the fake admin server for your own development",
        description=(
            "Serve the admin interface on loopback with deterministic records, cursor "
            "pagination, auth and rate limits; prints each store's base URL and token. "
            "Ctrl-C stops it."
        ),
    )
    fake.add_argument("--host", default="127.0.0.1", help="address to listen on")
    fake.add_argument("--port", type=_non_negative_int, default=8080, help="0 = any free port")
    fake.add_argument("--stores", type=positive_int, default=2, metavar="N", help="stores")
    fake.add_argument(
        "--records", type=_non_negative_int, default=1000, metavar="N", help="records per resource"
    )
    fake.add_argument("--seed", type=int, default=0, help="data seed (same seed, same records)")
    fake.add_argument(
        "--latency-ms", type=float, default=0.0, metavar="MS", help="added to every answer"
    )
    fake.add_argument(
        "--no-rate-limits", action="store_true", help="never answer 429 (default: 50/s global)"
    )
    fake.add_argument("--debug", action="store_true", help="tracebacks on errors")
    fake.set_defaults(handler=cmd_fake_server)


# ---------------------------------------------------------------------------------------------
# demo


def demo_stores(count: int, records: int | None, quick: bool) -> list[DemoStore]:
    stores = []
    for i in range(count):
        base = DEMO_STORES[i % len(DEMO_STORES)]
        name = base.name if i < len(DEMO_STORES) else f"{base.name}-{i // len(DEMO_STORES) + 1}"
        counts = dict(base.records)
        if records is not None:
            counts = dict.fromkeys(RESOURCES, records)
        if quick:
            counts = {r: max(1, n // 10) if n else 0 for r, n in counts.items()}
        stores.append(attrs.evolve(base, name=name, records=counts))
    return stores


@contextlib.contextmanager
def _database(url: str | None) -> Iterator[tuple[Path, bool]]:
    if url is not None:
        path = parse_sqlite_url(url, what="demo")
        if not path.parent.is_dir():
            raise ConfigError(f"--db: directory {path.parent} does not exist")
        yield path, True
        return
    with tempfile.TemporaryDirectory(prefix="asyncsubs-demo-") as tmp:
        yield Path(tmp) / "demo.db", False


@attrs.frozen
class _PoolReport:
    """One heavy pool as the server saw it."""

    achieved: float | None  # accepted starts per second
    peak: int  # most accepted starts in any window of the pool's length


def cmd_demo(args: argparse.Namespace) -> int:
    from ..testing import FakeStoreConfig, ServerRateLimits, run_in_process
    from ._sync import run_sync

    stores = demo_stores(args.stores, args.records, args.quick)
    tracker = Tracker(verbose=args.verbose)
    mode = choose_mode(sys.stderr, quiet=args.quiet, force=display_mode(args))
    started = time.monotonic()
    server_stores = [
        FakeStoreConfig(
            s.name,
            records=dict(s.records),
            rate_limits=ServerRateLimits(global_rate=GLOBAL_RATE, heavy=s.heavy, window=s.window),
        )
        for s in stores
    ]

    # The server runs in a process of its own, as a real one does elsewhere: sharing this
    # process, it would stamp requests late by the client's own work (parsing pages, writing
    # rows), and read as a server whose limiter lags by tens of milliseconds now and then.
    with (
        _database(args.db) as (db_path, kept),
        hold_database(db_path),
        run_in_process(
            make_records=True,
            stores=server_stores,
            latency=DEMO_LATENCY,
            max_page_size=max(DEMO_PAGE_SIZE, args.page_size),
        ) as server,
    ):
        configs = [
            StoreConfig(
                store=s.name,
                base_url=server.base_url,
                token=server.tokens[s.name],
                page_size=args.page_size,
                # The client's limits are the server's: the demo shows pacing at the edge.
                limits=Limits(global_rate=GLOBAL_RATE, heavy=s.heavy),
            )
            for s in stores
        ]
        interrupted = ran = False
        try:
            run_async(
                lambda: run_sync(configs, db_path, tracker), tracker, mode, args.progress_interval
            )
            ran = True
        except CommandFailed:
            interrupted = True
            raise
        finally:
            # Not after an error that stopped the demo (a bad --db): its line says it all.
            if not args.quiet and (ran or interrupted):
                reports = _server_reports(server, stores)
                _summary(stores, tracker, reports, time.monotonic() - started)
                where = f"kept at {db_path}" if kept else "a temporary file, now deleted"
                sys.stdout.write(f"database: {where}\n")
                sys.stdout.flush()
            if interrupted:
                note("interrupted" + ("; rerun with the same --db to resume" if kept else ""))
    raise_failures(tracker, mode)
    return 0


def _server_reports(
    server: RemoteFakeServer, stores: Sequence[DemoStore]
) -> dict[tuple[str, str], _PoolReport]:
    """Each heavy pool as the server counted it; none if its process is gone (it ignores the
    Ctrl-C that stopped the demo, but may have died)."""
    reports = {}
    for s in stores:
        try:
            stats = server.stats(s.name)
        except OSError:
            return {}
        for resource in RESOURCES:
            pool = stats.pool(resource)
            starts = pool.starts
            span = starts[-1] - starts[0] if len(starts) > 1 else 0.0
            reports[(s.name, resource)] = _PoolReport(
                achieved=(len(starts) - 1) / span if span > 0 else None,
                peak=pool.max_in_window(s.heavy[resource].per),
            )
    return reports


def _summary(
    stores: Sequence[DemoStore],
    tracker: Tracker,
    reports: Mapping[tuple[str, str], _PoolReport],
    elapsed: float,
) -> None:
    rows = []
    total_requests = total_429 = 0
    for store in stores:
        for resource in RESOURCES:
            progress = tracker.rows.get((store.name, resource))
            report = reports.get((store.name, resource))
            if progress is None:
                continue
            stats = progress.pool_stats()
            rate = store.heavy[resource]
            total_requests += stats.requests
            total_429 += stats.rate_limited
            achieved = (
                "-" if report is None or report.achieved is None else f"{report.achieved:.2f}"
            )
            peak = "-" if report is None else f"{report.peak}/{rate.n}"
            rows.append(
                [
                    store.name,
                    resource,
                    f"{progress.records:,}",
                    "" if progress.rows is None else f"{progress.rows:,}",
                    f"{stats.requests:,}",
                    f"{stats.rate_limited:,}",
                    achieved,
                    f"{rate.per_second:.2f}",
                    peak,
                    f"{progress.elapsed():.1f}s",
                ]
            )
    windows = ", ".join(f"{s.name}: {s.window}" for s in stores)
    print_table(
        "asyncsubs demo: records per store and resource",
        [
            "store",
            "resource",
            "records",
            "rows in db",
            "requests",
            "429s",
            "req/s achieved",
            "req/s allowed",
            "peak/window",
            "time",
        ],
        rows,
        stream=sys.stdout,
        footer=[
            f"{plural(tracker.records, 'record')}, {plural(total_requests, 'request')}, "
            f"{total_429:,} 429s in {elapsed:.1f}s",
            "req/s achieved: accepted request starts per second, as the server measured them",
            "peak/window: most starts the server saw in any window of the pool's length / limit",
            f"server rate-limit windows: {windows}",
        ],
    )


# ---------------------------------------------------------------------------------------------
# fake-server


def _env_name(store: str) -> str:
    return "FAKE_" + "".join(c if c.isalnum() else "_" for c in store).upper() + "_TOKEN"


def cmd_fake_server(args: argparse.Namespace) -> int:
    from ..testing import FakeAdminServer, ServerRateLimits, serve_forever

    limits = None if args.no_rate_limits else ServerRateLimits()

    def ready(server: FakeAdminServer) -> None:
        server.make_records()
        envs = {name: _env_name(name) for name in server.tokens}
        first, first_token = next(iter(server.tokens.items()))
        pull_rate = "" if limits is None else f" --rate {limits.heavy['subscriptions']}"
        lines = [
            f"fake admin server on {server.base_url} (API base {server.api_url}); Ctrl-C stops it",
            "",
            *(f"store {name}: token {token}" for name, token in server.tokens.items()),
            "",
            f"# pull from {first}:",
            f"export ASYNCSUBS_BASE_URL={server.base_url}",
            f"export ASYNCSUBS_TOKEN={first_token}",
            f"asyncsubs pull subscriptions --store {first} --limit 5{pull_rate}",
            "",
            "# sync every store: save the TOML below as stores.toml, then",
            *(f"export {envs[name]}={token}" for name, token in server.tokens.items()),
            "asyncsubs sync --config stores.toml --db sqlite:///fake.db",
            "",
            "[defaults]",
            f"page_size = {server.max_page_size}  # the fake server's largest page",
            "",
        ]
        if limits is not None:
            heavy = ", ".join(f'{path} = "{rate}"' for path, rate in limits.heavy.items())
            lines += [
                "[defaults.limits]  # the limits the fake server enforces",
                f'global = "{limits.global_rate}"',
                f"heavy = {{ {heavy} }}",
                "",
            ]
        for name in server.tokens:
            lines += [f"[stores.{name}]", f'base_url = "{server.base_url}"']
            lines += [f'token_env = "{envs[name]}"', ""]
        sys.stdout.write("\n".join(lines))
        sys.stdout.flush()

    try:
        serve_forever(
            ready=ready,
            stores=args.stores,
            records=args.records,
            seed=args.seed,
            host=args.host,
            port=args.port,
            latency=args.latency_ms / 1000.0 if args.latency_ms > 0 else None,
            rate_limits=limits,
        )
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        raise CommandFailed([f"cannot listen on {args.host}:{args.port}: {exc.strerror}"]) from None
    return 0
