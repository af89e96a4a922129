"""``asyncsubs sync-status``: every unit of a sync database, SQLite or PostgreSQL."""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
from typing import IO, Any, Final

import attrs

from ..sync import sink_for
from ._common import report_options
from ._output import Output
from ._progress import plural
from ._tables import print_json, print_table

__all__ = ["add_parser", "cmd_sync_status"]


def add_parser(commands: Any) -> None:
    status = commands.add_parser(
        "sync-status",
        help="every unit of a sync database: state, holder, records, cursor age",
        description=(
            "Show every (store, resource) of a sync database: its state in the current round, "
            "the worker holding it and its lease (PostgreSQL, shared by workers), the records "
            "and pages of its run, and how long ago its cursor was committed."
        ),
    )
    status.add_argument(
        "--db", required=True, metavar="URL", help="sqlite:///path.db or postgresql://user@host/db"
    )
    report_options(status)
    status.set_defaults(handler=cmd_sync_status, debug=False)


_HEADERS: Final = (
    "store",
    "resource",
    "state",
    "holder",
    "lease",
    "records",
    "pages",
    "cursor age",
    "error",
)


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def cmd_sync_status(
    args: argparse.Namespace, out: Output | None = None, *, stream: IO[str] | None = None
) -> int:
    sink = sink_for(args.db)
    units = asyncio.run(sink.status())
    if units is None:
        (out or Output()).note(
            f"no units: {sink.where} is not a sync database (no sync has written to it)"
        )
        return 0
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
    if args.json:
        units_json = [
            {**attrs.asdict(unit), "state": row[2]} for unit, row in zip(units, rows, strict=True)
        ]
        document = {"database": sink.where, "units": units_json, "states": dict(counts)}
        print_json(document, stream=stream or sys.stdout)
        return 0
    footer = (
        f"{plural(len(rows), 'unit')} in {sink.where}: "
        + ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        + " (records, pages: the unit's current or last run; lease: left before another "
        "worker may take it over, negative: expired; cursor age: since its last commit)"
    )
    print_table("sync units", _HEADERS, rows, stream=stream or sys.stdout, footer=[footer])
    return 0
