"""The tables a sync ends with: per (store, resource), and per store's webhooks."""

from __future__ import annotations

from typing import IO, Any

import attrs

from ._display import row_figures
from ._progress import Progress, allowed_cell, learned_text, page_cell, plural
from ._tables import print_table
from ._webhooks import by_reason, refusals, refused, webhook_totals

__all__ = ["summary_fields", "sync_summary", "webhook_summary"]


def sync_summary(
    progress: Progress, elapsed: float, where: str, *, stream: IO[str], runs: int | None = None
) -> None:
    rows, learned = [], []
    for row in progress.rows.values():
        stats = row.stats
        if said := learned_text(stats):
            learned.append(f"{row.store}/{row.resource}: {said}")
        rows.append(
            [
                row.store,
                row.resource,
                row.state,
                row.records_cell(),
                f"{row.pages:,}",
                "" if row.rows is None else f"{row.rows:,}",
                f"{stats.requests:,}",
                allowed_cell(row) if row.started is not None else "",
                page_cell(row),
                f"{stats.rate_limited:,}",
                f"{stats.retries:,}",
                f"{row.elapsed():.1f}s",
            ]
        )
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
            "req/s (allowed)",
            "page",
            "429s",
            "retries",
            "time",
        ],
        rows,
        stream=stream,
        footer=[
            f"{done} (rows: this store's rows in the table; requests/429s/retries: the "
            "resource's pool; req/s: requests per second achieved, and the pool's rate: "
            "configured, announced by the server, or learned; page: records per page)",
            *(f"learned: {line}" for line in learned),
            *([progress.idle] if progress.idle else []),
        ],
    )


def webhook_summary(progress: Progress, *, stream: IO[str]) -> None:
    rows = [
        [
            store,
            f"{hook.receiver.accepted:,}",
            f"{hook.receiver.duplicates:,}",
            f"{hook.applied:,}",
            f"{hook.deletes:,}",
            f"{hook.stale:,}",
            f"{hook.ignored:,}",
            f"{refused(hook):,}",
            by_reason(refusals(hook)),
            f"{hook.receiver.dead_lettered:,}",
            f"{hook.receiver.unfinished:,}",
            f"{hook.receiver.unsaved:,}",
        ]
        for store, hook in progress.webhooks.items()
    ]
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
            "refused for",
            "dead letters",
            "kept",
            "lost",
        ],
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
    """What both tables show, as the fields of ``--log-format json``'s last event: taken once
    the command stopped, so nothing counted in its last moments is missing."""
    fields: dict[str, Any] = {
        "records": progress.records if runs is None else progress.pulled,
        "stores": len({row.store for row in progress.rows.values()}),
        "elapsed": round(elapsed, 3),
        "database": where,
        "units": [
            {"store": row.store, "resource": row.resource, **row_figures(row)}
            for row in progress.rows.values()
        ],
    }
    if runs is not None:
        fields["runs"] = runs
    if progress.webhooks:
        fields["webhooks"] = attrs.asdict(webhook_totals(progress.webhooks))
        fields["webhook_stores"] = {
            store: {
                "accepted": hook.receiver.accepted,
                "duplicates": hook.receiver.duplicates,
                "applied": hook.applied,
                "deletes": hook.deletes,
                "stale": hook.stale,
                "ignored": hook.ignored,
                "refused": refused(hook),
                "refusals": refusals(hook),
                "dead_letters": hook.receiver.dead_lettered,
                "kept": hook.receiver.unfinished,
                "lost": hook.receiver.unsaved,
            }
            for store, hook in progress.webhooks.items()
        }
    return fields
