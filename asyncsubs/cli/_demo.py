"""``asyncsubs demo``: the embedded fake service, synced.

A fake server in a process of its own serves several stores, each with its own heavy pools'
rates, window flavour and largest page, none of which the client is told: the demo syncs them
into SQLite with ``sync``'s engine and defaults, and prints what it learned and achieved
against what was allowed, as the server measured it.
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
from ..limiting import PoolStats
from ..stores import DEFAULT_PAGE_SIZE, RESOURCES, Store
from ..sync import Sink, SyncEngine, run_round, sink_for
from ._common import (
    EXIT_FAILURE,
    EXIT_OK,
    USER_AGENT,
    CommandFailed,
    Runner,
    non_negative_int,
    positive_int,
)
from ._output import Output
from ._progress import Progress, cells, plural
from ._tables import print_table, writing_to

if TYPE_CHECKING:
    from ..testing import RemoteFakeServer

__all__ = ["DEMO_STORES", "DemoStore", "add_parser"]

GLOBAL_RATE: Final = Rate(50, per=1.0)
DEMO_LATENCY: Final = (0.005, 0.03)  # seconds, drawn per answer


@attrs.frozen
class DemoStore:
    name: str
    records: Mapping[str, int]
    #: The server's heavy pools: the client is not told them, and finds them.
    heavy: Mapping[str, Rate]
    #: The server's window flavour (see ServerRateLimits): the client must hold against each.
    window: Literal["sliding", "fixed", "leaky"]
    #: The server's largest page, and what a larger pageSize gets (the client is not told).
    page: int = 250
    over_max: Literal["clamp", "reject"] = "clamp"


# Sized so the slowest pool needs ~20 s: long enough to watch, short enough to wait.
DEMO_STORES: Final = (
    DemoStore(
        "acme-coffee",
        {"subscriptions": 12_000, "customers": 8_000, "orders": 20_000},
        {"subscriptions": Rate(2), "customers": Rate(2), "orders": Rate(3)},
        "sliding",
        page=500,
    ),
    DemoStore(
        "globex-pets",
        {"subscriptions": 6_000, "customers": 3_000, "orders": 9_000},
        {"subscriptions": Rate(2), "customers": Rate(1), "orders": Rate(2)},
        "fixed",
        page=250,
        over_max="reject",
    ),
    DemoStore(
        "initech-razors",
        {"subscriptions": 3_000, "customers": 2_000, "orders": 6_000},
        {"subscriptions": Rate(3, per=2.0), "customers": Rate(1), "orders": Rate(2)},
        "leaky",
        page=200,
        over_max="reject",
    ),
    DemoStore(
        "umbrella-vitamins",
        {"subscriptions": 2_000, "customers": 1_500, "orders": 3_000},
        {"subscriptions": Rate(2), "customers": Rate(2), "orders": Rate(2)},
        "sliding",
        page=100,
    ),
)


def add_parser(commands: Any, output: argparse.ArgumentParser) -> None:
    demo = commands.add_parser(
        "demo",
        parents=[output],
        help="sync embedded fake stores into SQLite (no setup, no network)",
        description=(
            "Start a fake admin server in a process of its own with several stores, each with "
            "its own rate limits and largest page, none of which the client is told; sync them "
            "into SQLite with live progress, finding each pool's rate and page size, and "
            "summarise what was learned, requests, 429s and achieved against allowed rates. A "
            "rerun with the same --db starts from what the first learned."
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
        type=non_negative_int,
        metavar="N",
        help="records per resource in every store (default: a realistic mix, ~20 s)",
    )
    demo.add_argument("--quick", action="store_true", help="a tenth of the records (a few seconds)")
    demo.add_argument(
        "--page-size",
        type=positive_int,
        metavar="N",
        help="records per request, fixed (default: the largest page each store serves, learned)",
    )
    demo.set_defaults(handler=cmd_demo)


def demo_stores(count: int, records: int | None, quick: bool) -> list[DemoStore]:
    stores = []
    for i in range(count):
        base = DEMO_STORES[i % len(DEMO_STORES)]
        name = base.name if i < len(DEMO_STORES) else f"{base.name}-{i // len(DEMO_STORES) + 1}"
        counts = dict(base.records) if records is None else dict.fromkeys(RESOURCES, records)
        if quick:
            counts = {r: max(1, n // 10) if n else 0 for r, n in counts.items()}
        stores.append(attrs.evolve(base, name=name, records=counts))
    return stores


@contextlib.contextmanager
def _database(url: str | None) -> Iterator[Sink]:
    if url is not None:
        sink = sink_for(url)
        if sink.leases is not None:  # a database shared by workers is not the demo's
            raise ConfigError("--db: demo works on a SQLite database only")
        yield sink
        return
    with tempfile.TemporaryDirectory(prefix="asyncsubs-demo-") as tmp:
        yield sink_for(str(Path(tmp) / "demo.db"))


@attrs.frozen
class _PoolReport:
    """One heavy pool as the server saw it."""

    achieved: float | None  # accepted starts per second
    peak: int  # most starts the server's window held at once, counted its way (<= its limit)


def cmd_demo(args: argparse.Namespace, out: Output) -> int:
    from ..testing import FakeStoreConfig, ServerRateLimits, run_in_process

    stores = demo_stores(args.stores, args.records, args.quick)
    runner = Runner(args, out)
    server_stores = [
        FakeStoreConfig(
            s.name,
            records=dict(s.records),
            rate_limits=ServerRateLimits(global_rate=GLOBAL_RATE, heavy=s.heavy, window=s.window),
            max_page_size=s.page,
            over_max=s.over_max,
        )
        for s in stores
    ]
    launched = time.monotonic()
    # The server runs in a process of its own, as a real one does elsewhere: sharing this
    # process, it would stamp requests late by the client's own work (parsing pages, writing
    # rows), and read as a server whose limiter lags by tens of milliseconds now and then.
    with (
        _database(args.db) as sink,
        sink.lock(),
        run_in_process(make_records=True, stores=server_stores, latency=DEMO_LATENCY) as server,
    ):
        configs = [
            Store(
                name=s.name,
                base_url=server.base_url,
                token=server.tokens[s.name],
                page_size=args.page_size or DEFAULT_PAGE_SIZE,
                # As sync's defaults: the global pool's documented 50/s, the heavy pools found.
                limits=Limits(global_rate=GLOBAL_RATE, discover=True),
            )
            for s in stores
        ]
        #: The stores that start from what an earlier demo on this database learned.
        remembered: list[str] = []

        async def sync() -> None:
            engine = SyncEngine(configs, sink, runner.progress, user_agent=USER_AGENT)
            async with sink, engine:
                remembered.extend([c.name for c in configs if await sink.load_learned(c.name)])
                await run_round(engine)

        # The sync's time, as its rows count theirs: the server's start comes before.
        started, stopped = time.monotonic(), None
        try:
            runner.run(sync)
        except CommandFailed as exc:
            stopped = exc
        # Not after an error that stopped the demo (a bad --db): its line says it all.
        written = True
        if not args.quiet:
            reports, elapsed = _server_reports(server, stores), time.monotonic() - started
            where = "a temporary file, now deleted" if args.db is None else f"kept at {sink.where}"
            try:
                _summary(stores, runner.progress, reports, elapsed, started - launched, remembered)
                with writing_to(sys.stdout):
                    sys.stdout.write(f"database: {where}\n")
                    sys.stdout.flush()
            except CommandFailed as unwritten:  # a full stdout: said here; Ctrl-C keeps its code
                for line in unwritten.lines:
                    out.error(line)
                written = False
        if stopped is not None:
            out.note("interrupted" + ("; rerun with the same --db to resume" if args.db else ""))
            raise stopped
    runner.raise_failures()
    return EXIT_OK if written else EXIT_FAILURE


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
                peak=pool.peak(s.heavy[resource], s.window),
            )
    return reports


def learned_rate(stats: PoolStats) -> float | None:
    """The rate a discovering pool found: the one it settled at after a 429 (or remembered,
    or was told), else the highest that ran clean; a raise not yet tried is not found."""
    if stats.rate_by == "probe":
        return stats.good
    return None if stats.rate_by in ("configured", "start") else stats.rate


def _summary(
    stores: Sequence[DemoStore],
    progress: Progress,
    reports: Mapping[tuple[str, str], _PoolReport],
    elapsed: float,
    startup: float,
    remembered: Sequence[str],
) -> None:
    rows = []
    for store in stores:
        for resource in RESOURCES:
            row = progress.rows.get((store.name, resource))
            if row is None:
                continue
            report, rate = reports.get((store.name, resource)), store.heavy[resource]
            achieved = None if report is None else report.achieved
            learned, page = learned_rate(row.stats), row.stats.page_size
            rows.append(
                [
                    *cells(row, ("store", "resource", "records", "rows", "requests", "429s")),
                    "-" if achieved is None else f"{achieved:.2f}",
                    "-" if learned is None else f"{learned:.2f}",
                    f"{rate.per_second:.2f} ({rate.n}/{rate.per:g}s {store.window})",
                    "-" if report is None else f"{report.peak}/{rate.n}",
                    f"{page:,}" if page else "-",
                    f"{store.page:,} ({store.over_max})",
                    *cells(row, ("time",)),
                ]
            )
    requests = sum(row.stats.requests for row in progress.rows.values())
    refused = sum(row.stats.rate_limited for row in progress.rows.values())
    before = progress.records_before
    resumed = f" (+{before:,} before resuming)" if before else ""
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
            "learned",
            "allowed",
            "peak/limit",
            "page learned",
            "page allowed",
            "time",
        ],
        rows,
        stream=sys.stdout,
        footer=[
            f"{plural(progress.records, 'record')}{resumed}, {plural(requests, 'request')}, "
            f"{plural(refused, '429')} in {elapsed:.1f}s (the fake server started in "
            f"{startup:.1f}s before)",
            "req/s achieved: accepted request starts per second, as the server measured them; "
            "learned: the rate the client found, refused by the server or run clean (a raise "
            "not yet tried is not; it was told neither rate nor page size); allowed: the "
            "server's, and how its window counts",
            "429s: a pool raises its rate after clean time and, refused, settles just under "
            "what the server accepted; a rerun with the same --db starts there, without "
            "searching again, and holds it five minutes from its start (longer after each "
            "refusal in a row) before a step up, which may meet a 429",
            *(
                [
                    f"this run started from what the last one learned ({len(remembered)} of "
                    f"{len(stores)} stores, kept in the database): rates and page sizes known, "
                    "not probed again"
                ]
                if remembered
                else []
            ),
            "windows: sliding: at most n starts in any trailing window; fixed: n in each window "
            "aligned to the clock (n more may start just after its end); leaky: a bucket of n "
            "refilled at n per window (full, it lets n through at once, so a rate above the "
            "refill runs clean until the bucket empties)",
            "peak/limit: the most starts the server's window held at once, counted as that "
            "window counts, against its n: never above it (the server answers 429 instead)",
            "page allowed: the server's largest page, and what a larger one gets (clamp: cut "
            "short; reject: a 400)",
        ],
    )
