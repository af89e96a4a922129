"""A sync's webhooks as the displays and summaries show them: each store's figures, every
store's together, and the line that says what to check after a first refusal."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..stores import WebhookCounts, WebhookRefused
from ._progress import plural

__all__ = ["WebhookTotals", "by_reason", "refusal_line", "webhook_figures", "webhook_totals"]


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
