"""``python -m asyncsubs.dlt``: the embedded fake stores loaded into DuckDB, no setup.

The fake server runs in a process of its own, as ``asyncsubs demo``'s does; its stores' heavy
pools differ and the source is not told them, so each store's client discovers its rates and
page size (README, "Discovery"). Prints the rows of every table, and what the server counted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .. import Rate
from ..testing import FakeStoreConfig, ServerRateLimits, run_in_process
from ._stores import RESOURCES, Store

__all__ = ["main"]

#: Each store's heavy pools, as its server enforces them (the source finds them out).
_HEAVY: Final = (
    {"subscriptions": Rate(4), "customers": Rate(3), "orders": Rate(5)},
    {"subscriptions": Rate(3), "customers": Rate(2), "orders": Rate(4)},
    {"subscriptions": Rate(5), "customers": Rate(4), "orders": Rate(6)},
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m asyncsubs.dlt",
        description="Load embedded fake stores into DuckDB through the asyncsubs dlt source.",
    )
    parser.add_argument("--duckdb", metavar="PATH", help="keep the database here")
    parser.add_argument("--stores", type=int, default=3, metavar="N", help="fake stores")
    parser.add_argument(
        "--records", type=int, default=2_000, metavar="N", help="records per resource and store"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.stores < 1 or args.records < 0:
        _parser().error("--stores must be >= 1 and --records >= 0")
    # The demo talks to loopback only: no usage reports, and only dlt's errors on the console.
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "ERROR")
    import dlt
    import duckdb

    from ._source import subscription_service

    names = [f"store-{i + 1}" for i in range(args.stores)]
    configs = [
        FakeStoreConfig(
            name,
            records=args.records,
            rate_limits=ServerRateLimits(heavy=_HEAVY[i % len(_HEAVY)]),
        )
        for i, name in enumerate(names)
    ]
    with tempfile.TemporaryDirectory(prefix="asyncsubs-dlt-demo-") as tmp:
        database = Path(args.duckdb) if args.duckdb else Path(tmp) / "demo.duckdb"
        with run_in_process(make_records=True, stores=configs, max_page_size=100) as server:
            stores = [
                Store(name=name, base_url=server.base_url, token=server.tokens[name])
                for name in names
            ]
            pipeline = dlt.pipeline(
                pipeline_name="asyncsubs_demo",
                destination=dlt.destinations.duckdb(str(database)),
                pipelines_dir=str(Path(tmp) / "pipelines"),
                dataset_name="subs",
            )
            # The state of an earlier run into this database (the pipeline's working directory
            # is new each run): what its clients learned is where this run's start.
            pipeline.sync_destination()
            before = _learned(pipeline.state)
            started = time.monotonic()
            pipeline.run(subscription_service(stores=stores))
            elapsed = time.monotonic() - started
            rejected = sum(server.stats(name).rejected for name in names)
            learned = _learned(pipeline.state)
        with duckdb.connect(str(database), read_only=True) as conn:
            tables = [
                row[0]
                for row in conn.sql(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = 'subs' AND table_name NOT LIKE '_dlt%' ORDER BY 1"
                ).fetchall()
            ]
            counts = {
                t: conn.sql(f'SELECT count(*) FROM subs."{t}"').fetchall()[0][0] for t in tables
            }
        out = sys.stdout
        out.write(f"asyncsubs dlt demo: {len(names)} fake stores into DuckDB in {elapsed:.1f}s\n\n")
        width = max(len(t) for t in tables)
        out.write(f"{'table':<{width}}  {'rows':>8}\n")
        for table in tables:
            out.write(f"{table:<{width}}  {counts[table]:>8,}\n")
        total = sum(counts[r] for r in RESOURCES if r in counts)
        remembered = [name for name in names if name in before]
        how = (
            f"the clients started from what the last run learned ({len(remembered)} of "
            f"{len(names)} stores, kept in the pipeline's state) and did not probe again"
            if remembered
            else "the clients were told neither the heavy pools' rates nor the page size, and "
            "probed for them"
        )
        out.write(
            f"\n{total:,} records ({args.records:,} per resource and store), {rejected} x 429 "
            f"from the server: {how}\n"
        )
        out.write(
            "learned, kept in the source's state: the rate the next run starts at (the "
            "server's) and the page size:\n"
        )
        for i, name in enumerate(names):
            pools = learned[name]["pools"]
            found = ", ".join(
                f"{r} {_starts_at(pools[r]):.1f}/s ({_HEAVY[i % len(_HEAVY)][r].per_second:g}), "
                f"{pools[r]['page_size'] or '-'} a page"
                for r in RESOURCES
            )
            out.write(f"  {name}: {found}\n")
        where = database if args.duckdb else "a temporary file, now deleted"
        out.write(f"database: {where}\n")
    return 0


def _learned(state: Mapping[str, Any]) -> Mapping[str, Any]:
    source: Mapping[str, Any] = state.get("sources", {}).get("subscription_service", {})
    learned: Mapping[str, Any] = source.get("learned", {})
    return learned


def _starts_at(pool: dict[str, Any]) -> float:
    """The rate a run given this pool's record starts at: a probe not answered yet is no
    evidence, the rate that last ran clean is."""
    if pool["rate_by"] == "probe" and pool["good"]:
        return float(pool["good"])
    return float(pool["rate"] or 0.0)
