"""The tables a sync ends with: per (store, resource), and per store's webhooks; the same
figures as ``--log-format json``'s last event; and the webhooks' totals and first-refusal line
the displays show meanwhile."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import IO, Any, Final

import attrs

from ..stores import WebhookCounts, WebhookRefused
from ._output import Output
from ._progress import COLUMNS, Progress, cells, learned_text, plural
from ._tables import print_table

__all__ = [
    "WebhookTotals",
    "refusal_line",
    "summarise",
    "summary_fields",
    "sync_summary",
    "webhook_summary",
    "webhook_totals",
]

_HEADERS: Final = tuple(c for c in COLUMNS if c not in ("records/s", "last error"))
_ALLOWED: Final = _HEADERS.index("req/s (allowed)")


@attrs.frozen
class WebhookTotals:
    """Every store's webhooks together."""

    accepted: int = 0
    duplicates: int = 0
    applied: int = 0
    deletes: int = 0
    stale: int = 0
    ignored: int = 0
    dead_letters: int = 0
    #: Refused deliveries: not signed as configured, wrong store, not an event, too large.
    refused: int = 0
    #: Store -> reason -> deliveries refused, for the stores that refused any.
    refusals: Mapping[str, Mapping[str, int]] = attrs.field(factory=dict)

    def line(self) -> str:
        line = (
            f"webhooks: {self.accepted:,} accepted, {plural(self.duplicates, 'duplicate')}, "
            f"{self.applied:,} applied ({plural(self.deletes, 'delete')}), {self.stale:,} stale, "
            f"{self.ignored:,} ignored, {plural(self.dead_letters, 'dead letter')}, "
            f"{self.refused:,} refused"
        )
        if self.refusals:
            line += f" ({'; '.join(f'{s}: {by_reason(r)}' for s, r in self.refusals.items())})"
        return line


def webhook_figures(counts: WebhookCounts) -> dict[str, Any]:
    """One store's webhooks, as its summary row and JSON show them; ``refusals``: by reason, a
    ``Refusal`` value (401, 403, 400) or ``too_large`` (413)."""
    receiver = counts.receiver
    refusals = dict(receiver.refusals)
    if receiver.too_large:
        refusals["too_large"] = receiver.too_large
    return {
        "accepted": receiver.accepted,
        "duplicates": receiver.duplicates,
        "applied": counts.applied,
        "deletes": counts.deletes,
        "stale": counts.stale,
        "ignored": counts.ignored,
        "refused": sum(refusals.values()),
        "refusals": refusals,
        "dead_letters": receiver.dead_lettered,
        "kept": receiver.unfinished,
        "lost": receiver.unsaved,
    }


def by_reason(counts: Mapping[str, int]) -> str:
    """``100 bad_signature, 3 wrong_store``: the most frequent first."""
    return ", ".join(f"{n:,} {reason}" for reason, n in sorted(counts.items(), key=lambda c: -c[1]))


def refusal_line(event: WebhookRefused) -> str:
    """The first delivery of a store refused for a reason, and what to check."""
    return (
        f"warning: webhook delivery for store {event.store} refused: {event.detail} "
        f"[{event.reason}, HTTP {event.status}]. Check {event.check}. Further {event.reason} "
        "refusals of this store are counted in the webhooks line and the summary, not shown"
    )


def webhook_totals(hooks: Mapping[str, WebhookCounts]) -> WebhookTotals:
    figures = {store: webhook_figures(counts) for store, counts in hooks.items()}
    totals: dict[str, Any] = {
        field.name: sum(f[field.name] for f in figures.values())
        for field in attrs.fields(WebhookTotals)[:-1]
    }
    refusals = {store: f["refusals"] for store, f in figures.items() if f["refused"]}
    return WebhookTotals(**totals, refusals=refusals)


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
        "configured, announced by the server, learned, probing (a raise not tried yet) or "
        "start (the rate a pool finding its own starts at); page: records per page)",
        # Only what was found: a pool still on its starting rate has learned nothing yet.
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
    figures as the last JSON event: taken once the command stopped, so nothing is missing.
    The event is told even when stdout cannot take the tables (``CommandFailed``: a full disk)."""
    elapsed = time.monotonic() - started
    try:
        sync_summary(progress, elapsed, where, stream=sys.stdout, runs=runs)
        if runs is not None:
            webhook_summary(progress, stream=sys.stdout)
    finally:
        out.event("summary", **summary_fields(progress, elapsed, where, runs=runs))
