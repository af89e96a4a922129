"""``python -m asyncsubs.dlt``: the dlt source's demo, fake stores loaded into DuckDB.

The fake server runs in a process of its own; its stores' heavy pools differ and the source is
not told them, so each store's client discovers its rates and page size (README, "Discovery").
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from .. import Rate
from ..stores import RESOURCES, Store
from ._common import EXIT_INTERRUPTED

__all__ = ["load_demo", "main"]


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
    parser = _parser()
    args = parser.parse_args(argv)
    if args.stores < 1 or args.records < 0:
        parser.error("--stores must be >= 1 and --records >= 0")
    database = None if args.duckdb is None else Path(args.duckdb)
    try:
        load_demo(database, stores=args.stores, records=args.records)
    except Exception as exc:
        if not _interrupted(exc):
            raise
    except KeyboardInterrupt:
        pass
    else:
        return 0
    # dlt's pull of an async generator stopped by Ctrl-C may leave a coroutine of its own never
    # awaited; Python would say so as the process exits, a line that means nothing to the user.
    warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
    print(f"{parser.prog}: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` is dlt's failure of a step that Ctrl-C stopped (its cause)."""
    cause = exc.__cause__ or exc.__context__
    return isinstance(cause, KeyboardInterrupt) or (cause is not None and _interrupted(cause))


#: Each store's heavy pools, as its server enforces them (the source finds them out). From 1/s,
#: a pool doubles to 2 and 4/s: each of these refuses a step of that search within the default
#: records, so a rerun starts from every pool's rate (a 5/s pool would be probed at 8/s only
#: near the end, and the rerun would search on).
_HEAVY: Final = (
    {"subscriptions": Rate(4), "customers": Rate(3), "orders": Rate(2)},
    {"subscriptions": Rate(3), "customers": Rate(2), "orders": Rate(4)},
    {"subscriptions": Rate(2), "customers": Rate(4), "orders": Rate(3)},
)


def load_demo(database: Path | None = None, *, stores: int = 3, records: int = 2_000) -> None:
    """Load ``stores`` fake stores, ``records`` records per resource each, into the DuckDB
    file ``database`` (None: a temporary one), and print the tables and what was learned."""
    # The demo talks to loopback only: no usage reports, and only dlt's errors on the console.
    # What it needs beyond the arguments is imported here, once they are good.
    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "ERROR")
    import dlt
    import duckdb

    from ..dlt import subscription_service
    from ..testing import FakeStoreConfig, ServerRateLimits, run_in_process

    names = [f"store-{i + 1}" for i in range(stores)]
    configs = [
        FakeStoreConfig(name, records=records, rate_limits=ServerRateLimits(heavy=_HEAVY[i % 3]))
        for i, name in enumerate(names)
    ]
    with tempfile.TemporaryDirectory(prefix="asyncsubs-dlt-demo-") as tmp:
        path = str(database or Path(tmp) / "demo.duckdb")
        with run_in_process(make_records=True, stores=configs, max_page_size=100) as server:
            pipeline = dlt.pipeline(
                pipeline_name="asyncsubs_demo",
                destination=dlt.destinations.duckdb(path),
                pipelines_dir=str(Path(tmp) / "pipelines"),
                dataset_name="subs",
            )
            # An earlier run's state, from the database: what its clients learned, this run's.
            pipeline.sync_destination()
            before = _learned(pipeline.state)
            started = time.monotonic()
            given = [Store(name, server.base_url, server.tokens[name]) for name in names]
            pipeline.run(subscription_service(stores=given))
            elapsed = time.monotonic() - started
            rejected = sum(server.stats(name).rejected for name in names)
            learned = _learned(pipeline.state)
        with duckdb.connect(path, read_only=True) as conn:
            tables = conn.sql(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'subs' AND table_name NOT LIKE '_dlt%' ORDER BY 1"
            ).fetchall()
            counts = {
                t: conn.sql(f'SELECT count(*) FROM subs."{t}"').fetchall()[0][0] for (t,) in tables
            }
    print(f"asyncsubs dlt demo: {len(names)} fake stores into DuckDB in {elapsed:.1f}s\n")
    width = max(map(len, counts))
    print(f"{'table':<{width}}  {'rows':>8}")
    for table, count in counts.items():
        print(f"{table:<{width}}  {count:>8,}")
    total = sum(counts.get(r, 0) for r in RESOURCES)
    remembered = [name for name in names if name in before]
    how = (
        f"the clients started from what the last run learned ({len(remembered)} of "
        f"{len(names)} stores, kept in the pipeline's state) and did not search for the rates "
        "and page sizes again (a pool holds its rate five minutes from the run's start before a "
        "step up, which may meet a 429)"
        if remembered
        else "the clients were told neither the heavy pools' rates nor the page size, and "
        "probed for them"
    )
    print(
        f"\n{total:,} records ({records:,} per resource and store), {rejected} x 429 from the "
        f"server: {how}\nlearned, kept in the source's state: the rate the next run starts at "
        "(the server's) and the page size:"
    )
    for i, name in enumerate(names):
        pools = learned[name]["pools"]
        found = ", ".join(
            f"{r} {_starts_at(pools[r]):.1f}/s ({_HEAVY[i % 3][r].per_second:g}), "
            f"{pools[r]['page_size'] or '-'} a page"
            for r in RESOURCES
        )
        print(f"  {name}: {found}")
    print(f"database: {database or 'a temporary file, now deleted'}")


def _learned(state: Mapping[str, Any]) -> Any:
    return state.get("sources", {}).get("subscription_service", {}).get("learned", {})


def _starts_at(pool: dict[str, Any]) -> float:
    """The rate a run given this pool's record starts at: a probe not answered yet is no
    evidence, the rate that last ran clean is."""
    if pool["rate_by"] == "probe" and pool["good"]:
        return float(pool["good"])
    return float(pool["rate"] or 0.0)
