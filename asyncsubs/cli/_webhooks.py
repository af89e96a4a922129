"""A sync's webhooks as the displays and summaries show them: every store's counters together,
refusals by store and reason, and the line that says what to check after a first refusal."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ..sync import WebhookCounts, WebhookRefused
from ._progress import plural

__all__ = ["WebhookTotals", "by_reason", "refusal_line", "refusals", "refused", "webhook_totals"]


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


def refusals(counts: WebhookCounts) -> dict[str, int]:
    """A store's refused deliveries by reason: a ``Refusal`` value (401, 403, 400), or
    ``too_large`` (413)."""
    stats = counts.receiver
    found = dict(stats.refusals)
    if stats.too_large:
        found["too_large"] = stats.too_large
    return found


def refused(counts: WebhookCounts) -> int:
    return sum(refusals(counts).values())


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
    counts = list(hooks.values())
    return WebhookTotals(
        accepted=sum(c.receiver.accepted for c in counts),
        duplicates=sum(c.receiver.duplicates for c in counts),
        applied=sum(c.applied for c in counts),
        deletes=sum(c.deletes for c in counts),
        stale=sum(c.stale for c in counts),
        ignored=sum(c.ignored for c in counts),
        dead_letters=sum(c.receiver.dead_lettered for c in counts),
        refused=sum(refused(c) for c in counts),
        refusals={c.store: refusals(c) for c in counts if refused(c)},
    )
