"""The tables a sync ends with: per (store, resource), and per store's webhooks; and the same
figures as ``--log-format json``'s last event."""

from __future__ import annotations

import sys
import time
from typing import IO, Any, Final

import attrs

from ..stores import WebhookCounts
from ._output import Output
from ._progress import COLUMNS, Progress, cells, learned_text, plural
from ._tables import print_table
from ._webhooks import by_reason, webhook_figures, webhook_totals

__all__ = ["summarise", "summary_fields", "sync_summary", "webhook_summary"]

_HEADERS: Final = tuple(c for c in COLUMNS if c not in ("records/s", "last error"))
_ALLOWED: Final = _HEADERS.index("req/s (allowed)")


def sync_summary(
    progress: Progress, elapsed: float, where: str, *, stream: IO[str], runs: int | None = None
) -> None:
    rows, now = [], time.monotonic()
    for row in progress.rows.values():
        rows.append(cells(row, _HEADERS, now))
        if row.started is None:
            rows[-1][_ALLOWED] = ""
    stores = plural(len({row.store for row in progress.rows.values()}), "store")
    before = progress.records_before
    resumed = f" (+{before:,} before resuming)" if before else ""
    if runs is None:
        done = (
            f"{plural(progress.records, 'record')}{resumed} from {stores} in {elapsed:.1f}s "
            f"into {where}"
        )
    else:  # --listen: the rows show the last pull; the total counts every one
        done = (
            f"{plural(progress.pulled, 'record')} pulled in {plural(runs, 'run')} from "
            f"{stores} in {elapsed:.1f}s into {where}; the rows show the last run"
        )
    learned = [(row.key, learned_text(row.stats)) for row in progress.rows.values()]
    footer = [
        f"{done} (rows: this store's rows in the table; requests/429s/retries: the "
        "resource's pool; req/s: requests per second achieved, and the pool's rate: "
        "configured, announced by the server, or learned; page: records per page)",
        *(f"learned: {key}: {said}" for key, said in learned if said),
        *([progress.idle] if progress.idle else []),
    ]
    print_table("sync summary", _HEADERS, rows, stream=stream, footer=footer)


def webhook_summary(progress: Progress, *, stream: IO[str]) -> None:
    figures = {store: webhook_figures(hook) for store, hook in progress.webhooks.items()}
    rows = [
        [store, *(by_reason(v) if isinstance(v, dict) else f"{v:,}" for v in f.values())]
        for store, f in figures.items()
    ]
    names = {"refusals": "refused for", "dead_letters": "dead letters"}
    headers = ["store", *(names.get(key, key) for key in webhook_figures(WebhookCounts("")))]
    print_table(
        "webhooks",
        headers,
        rows,
        stream=stream,
        footer=[
            "applied: rows written or deleted; stale: older than the stored row, or deleted; "
            "ignored: resources not synced; refused: not signed as configured, wrong store, not "
            "an event or too large (refused for: by reason); "
            "dead letters: in the table webhook_dead_letters (asyncsubs dead-letters); "
            "kept: accepted, not applied yet, in webhook_inbox for the next start; "
            "lost: dead letters that could not be saved",
            *(f"{reason}: check {check}" for reason, check in progress.refusal_checks.items()),
        ],
    )


def summary_fields(
    progress: Progress, elapsed: float, where: str, *, runs: int | None = None
) -> dict[str, Any]:
    """What both tables show, as the fields of ``--log-format json``'s last event."""
    fields: dict[str, Any] = {
        "records": progress.records if runs is None else progress.pulled,
        "stores": len({row.store for row in progress.rows.values()}),
        "elapsed": round(elapsed, 3),
        "database": where,
        "units": [
            {"store": row.store, "resource": row.resource, **row.figures()}
            for row in progress.rows.values()
        ],
    }
    if runs is not None:
        fields["runs"] = runs
    if progress.webhooks:
        fields["webhooks"] = attrs.asdict(webhook_totals(progress.webhooks))
        fields["webhook_stores"] = {
            store: webhook_figures(hook) for store, hook in progress.webhooks.items()
        }
    return fields


def summarise(
    progress: Progress, started: float, where: str, out: Output, *, runs: int | None = None
) -> None:
    """The tables on stdout (the webhooks' too with ``runs``: ``sync --listen``), and their
    figures as the last JSON event: taken once the command stopped, so nothing is missing."""
    elapsed = time.monotonic() - started
    sync_summary(progress, elapsed, where, stream=sys.stdout, runs=runs)
    if runs is not None:
        webhook_summary(progress, stream=sys.stdout)
    out.event("summary", **summary_fields(progress, elapsed, where, runs=runs))
