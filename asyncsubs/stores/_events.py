"""What a door's run tells its observer (``pull``'s, ``sync``'s): typed events, each frozen.

A unit is one ``(store, resource)``: ``UnitStarted``, then any number of ``PageCommitted``,
``PoolLearned``, ``Retrying`` and ``UnitNote``, then one of ``UnitDone``, ``UnitFailed`` or
``UnitStopped``. ``stats`` are the unit's rate-limit pool (``asyncsubs.limiting.PoolStats``): its
counters since the unit started, the pace in force as it stands. ``RunStarted`` opens each round
(``sync --listen`` runs one after another); ``Message`` is a line about the whole sync,
``WebhookCounts`` a store's webhook counters when they change, ``WebhookRefused`` the first
delivery of a store refused for each reason. An observer is any callable taking an event; it
runs in the event loop, between the sync's own steps, so it must not block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import attrs

from .. import Rate
from ..limiting import PoolStats
from ..webhooks import ReceiverStats

__all__ = [
    "Event",
    "Message",
    "Observer",
    "PageCommitted",
    "PoolLearned",
    "Retrying",
    "RunStarted",
    "UnitDone",
    "UnitFailed",
    "UnitNote",
    "UnitStarted",
    "UnitStopped",
    "WebhookCounts",
    "WebhookRefused",
    "WorkerIdle",
    "learned_changed",
]


@attrs.frozen
class _UnitEvent:
    store: str
    resource: str


@attrs.frozen
class UnitStarted(_UnitEvent):
    """A unit's pull began; ``resumed``: it continues a run an earlier process left, which
    committed ``records_before`` records. ``allowed``: the pool's configured rate."""

    resumed: bool
    records_before: int
    allowed: Rate


@attrs.frozen
class PageCommitted(_UnitEvent):
    """A page of ``records`` records and the cursor after it are the door's now."""

    records: int
    stats: PoolStats


@attrs.frozen
class PoolLearned(_UnitEvent):
    """What the unit's pool knows of the server changed, told once per change: the rate it
    paces at (``stats.rate``, set by ``stats.rate_by``: a probe, a 429, an announcement or an
    earlier run) or the largest page the server serves (``stats.page_size``)."""

    stats: PoolStats


def learned_changed(before: PoolStats | None, now: PoolStats) -> bool:
    """Whether ``now`` tells something new about the server's limits since ``before``: a rate
    found (not a fixed one) or a page size."""
    if now.rate_by == "configured" and now.page_size is None:
        return False
    if before is None:
        return now.rate_by != "start" or now.page_size is not None
    return (before.rate, before.rate_by, before.page_size) != (now.rate, now.rate_by, now.page_size)


@attrs.frozen
class Retrying(_UnitEvent):
    """A request of the unit failed and is retried; ``error``: why, in one line."""

    error: str
    stats: PoolStats


@attrs.frozen
class UnitNote(_UnitEvent):
    """Something worth a line about the unit (a rejected cursor, a page size the server cut)."""

    message: str


@attrs.frozen
class UnitDone(_UnitEvent):
    """The unit's run finished; ``rows``: the store's rows in the resource's table."""

    stats: PoolStats
    rows: int | None


@attrs.frozen
class UnitFailed(_UnitEvent):
    """The API or the transport refused the unit (``error``, one line); the others go on."""

    error: str
    stats: PoolStats
    rows: int | None


@attrs.frozen
class UnitStopped(_UnitEvent):
    """The unit's run was stopped (Ctrl-C, SIGTERM, its lease lost) after what it committed."""

    stats: PoolStats
    rows: int | None


@attrs.frozen
class RunStarted:
    """Round ``number`` (from 1) of every unit began; ``units``: those this process runs, when
    known beforehand (in one process, all; leased workers learn theirs as they claim them)."""

    number: int
    units: tuple[tuple[str, str], ...] = ()


@attrs.frozen
class Message:
    """A line about the whole sync (not one unit)."""

    text: str


@attrs.frozen
class WorkerIdle(Message):
    """This worker pulled no unit of a round (leased workers): why, in ``text``."""


@attrs.frozen
class WebhookCounts:
    """One store's webhooks (``sync --listen``): the receiver's counters, and what applying the
    events did: ``applied`` (rows written or deleted, ``deletes`` of them), ``stale`` (older
    than the stored row, or deleted), ``ignored`` (resources the store does not sync)."""

    store: str
    receiver: ReceiverStats = attrs.field(factory=ReceiverStats)
    applied: int = 0
    deletes: int = 0
    stale: int = 0
    ignored: int = 0


@attrs.frozen
class WebhookRefused:
    """The first delivery of ``store`` refused for ``reason`` (a ``webhooks.Refusal`` value),
    answered ``status`` (401, 403 or 400); ``detail``: what was wrong with it, ``check``: what
    to check, naming the stores.toml keys. Later refusals of the store for the same reason are
    only counted (``WebhookCounts``): a sender retrying a thousand must not flood the output."""

    store: str
    reason: str
    status: int
    detail: str
    check: str


Event: TypeAlias = (
    UnitStarted
    | PageCommitted
    | PoolLearned
    | Retrying
    | UnitNote
    | UnitDone
    | UnitFailed
    | UnitStopped
    | RunStarted
    | Message
    | WebhookCounts
    | WebhookRefused
    | WorkerIdle
)
Observer: TypeAlias = Callable[[Event], object]
