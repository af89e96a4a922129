"""``python -m asyncsubs.dlt``: the dlt source's demo, its arguments; the demo itself is
``asyncsubs.dlt.demo``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


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
    from ..dlt.demo import load_demo  # dlt and DuckDB: imported once the arguments are good

    database = None if args.duckdb is None else Path(args.duckdb)
    load_demo(database, stores=args.stores, records=args.records)
    return 0
