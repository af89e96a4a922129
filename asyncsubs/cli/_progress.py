"""Progress of a command: every unit's figures as the sync's events tell them.

``Progress`` is the observer a command hands the engine (or ``pull`` its unit): it keeps one
``UnitRow`` per ``(store, resource)`` and each store's webhook counters, and passes every event
on, with its row, to the displays watching (``_display``). Everything runs on the event loop
thread, so the figures are read without locks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import attrs

from .. import Rate
from ..limiting import PoolStats
from ..stores import (
    Event,
    Message,
    PageCommitted,
    Retrying,
    RunStarted,
    UnitDone,
    UnitFailed,
    UnitStarted,
    UnitStopped,
    WebhookCounts,
    WebhookRefused,
    WorkerIdle,
)

__all__ = ["COLUMNS", "Progress", "UnitRow", "cells", "learned_text", "per_second", "plural"]

State = Literal["waiting", "running", "done", "failed", "interrupted"]


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 page``, ``2 pages``, ``1,000 records``; ``nouns`` where it is not noun + s."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {nouns or noun + 's'}"


@attrs.define
class UnitRow:
    """One (store, resource) in this process: its current or last run."""

    store: str
    resource: str
    state: State = "waiting"
    records: int = 0
    pages: int = 0
    #: Records of the same run committed by an earlier, interrupted process.
    records_before: int = 0
    resumed: bool = False
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    #: Why the last failed attempt failed (one line), while the client retries.
    last_error: str | None = None
    #: Rows of this store in the resource's table once the run ended (sync only).
    rows: int | None = None
    #: The pool's counters in this run, the pace as it stands.
    stats: PoolStats = attrs.Factory(PoolStats)
    #: The pool's configured rate.
    allowed: Rate | None = None

    @property
    def key(self) -> str:
        return f"{self.store}/{self.resource}"

    @property
    def status(self) -> str:
        return "running (resumed)" if self.state == "running" and self.resumed else self.state

    def elapsed(self, now: float | None = None) -> float:
        if self.started is None:
            return 0.0
        end = self.finished if self.finished is not None else now or time.monotonic()
        return max(end - self.started, 0.0)

    def records_cell(self) -> str:
        """This run's records, and those an interrupted process committed before it resumed."""
        before = f" (+{self.records_before:,} before)" if self.records_before else ""
        return f"{self.records:,}{before}"

    def record_rate(self, now: float | None = None) -> float:
        elapsed = self.elapsed(now)
        return self.records / elapsed if elapsed > 0 else 0.0

    def request_rate(self, now: float | None = None) -> float:
        """n starts span n - 1 intervals (counting the first would overstate the pace early)."""
        elapsed = self.elapsed(now)
        return max(self.stats.requests - 1, 0) / elapsed if elapsed > 0 else 0.0

    def figures(self) -> dict[str, Any]:
        """The row's figures as JSON fields (the live table's columns)."""
        stats = self.stats
        figures: dict[str, Any] = {
            "state": self.state,
            "records": self.records,
            "pages": self.pages,
            "records_before_resuming": self.records_before,
            "requests": stats.requests,
            "rate_limited": stats.rate_limited,
            "retries": stats.retries,
            "elapsed": round(self.elapsed(), 3),
        }
        optional = {"rows": self.rows, "error": self.error, "last_error": self.last_error}
        return figures | {name: value for name, value in optional.items() if value is not None}


#: How a pool's rate came to be, as the lines of what was learned say it: a configured rate
#: needs no word, and the rate a discovering pool starts at ("start") is nothing found.
_RATE_BY: Final = {
    "probe": "probing",
    "429": "learned",
    "remembered": "learned before",
    "server": "announced",
}


def learned_text(stats: PoolStats) -> str:
    """What a pool found of the server's limits: ``4.90 req/s learned, 500 records/page``,
    ``4.00 req/s probing (2.00 ran clean)``; empty for a fixed rate or the starting one, and no
    page size learned."""
    parts = []
    how = _RATE_BY.get(stats.rate_by)
    if how is not None and stats.rate:
        parts.append(f"{stats.rate:.2f} req/s {how}")
        if stats.rate_by == "probe" and stats.good:  # a raise not tried yet: not learned
            parts[-1] += f" ({stats.good:.2f} ran clean)"
        if stats.ceiling_found and stats.rate_by != "server":
            parts[-1] += f" (refused at {stats.ceiling_found:.2f})"
    if stats.page_size:
        parts.append(f"{stats.page_size:,} records/page")
    return ", ".join(parts)


def _allowed(row: UnitRow, now: float) -> str:
    """Requests per second achieved, and the pool's rate in force: configured, announced,
    learned, probing or the one a discovering pool starts at (``1.96 (2.00 learned)``,
    ``0.90 (1.00 start)``). Attempts that never brought a page back are no pace
    (``- (2.00)``)."""
    achieved = f"{row.request_rate(now):.2f}" if row.pages else "-"
    stats, allowed = row.stats, row.allowed
    if stats.rate and stats.rate_by != "configured":
        # In one word: "learned" for "learned before"; "start" for the rate a pool starts at.
        how = _RATE_BY.get(stats.rate_by, stats.rate_by).split()[0]
        return f"{achieved} ({stats.rate:.2f} {how})"
    return f"{achieved} ({allowed.per_second:.2f})" if allowed else achieved


def _page(row: UnitRow) -> str:
    """Records per page: as learned, else as many as the pages held on average."""
    if row.stats.page_size:
        return f"{row.stats.page_size:,}"
    return f"{row.records // row.pages:,}" if row.pages else ""


def per_second(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


#: Characters of the last error the live table shows (the plain lines show it whole).
LAST_ERROR_WIDTH: Final = 60

#: A unit's cells by column: the live table shows all but ``rows``, the summaries all but the
#: figures of a moment (``records/s``, ``last error``).
_CELLS: Final[dict[str, Callable[[UnitRow, float], str]]] = {
    "store": lambda row, now: row.store,
    "resource": lambda row, now: row.resource,
    "status": lambda row, now: row.status,
    "records": lambda row, now: row.records_cell(),
    "pages": lambda row, now: f"{row.pages:,}",
    "records/s": lambda row, now: per_second(row.record_rate(now)),
    "rows": lambda row, now: "" if row.rows is None else f"{row.rows:,}",
    "requests": lambda row, now: f"{row.stats.requests:,}",
    "req/s (allowed)": _allowed,
    "page": lambda row, now: _page(row),
    "429s": lambda row, now: f"{row.stats.rate_limited:,}",
    "retries": lambda row, now: f"{row.stats.retries:,}",
    "time": lambda row, now: f"{row.elapsed(now):.1f}s",
    "last error": lambda row, now: _shorten(row.error or row.last_error or ""),
}


COLUMNS: Final = tuple(_CELLS)


def _shorten(text: str, width: int = LAST_ERROR_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def cells(row: UnitRow, columns: Sequence[str], now: float | None = None) -> list[str]:
    """The row's cells in ``columns`` (of ``COLUMNS``), at ``now``."""
    return [_CELLS[column](row, time.monotonic() if now is None else now) for column in columns]


Watcher = Callable[[Event, UnitRow | None], object]


class Progress:
    """Every unit of one command, and each store's webhooks, as the events tell them."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], UnitRow] = {}
        self.webhooks: dict[str, WebhookCounts] = {}
        #: What to check for each reason deliveries were refused (``WebhookRefused``).
        self.refusal_checks: dict[str, str] = {}
        #: Records pulled over every run of this process (rows restart at each run), and the
        #: runs started (``sync --listen`` pulls again and again).
        self.pulled = 0
        self.runs = 0
        #: Why this worker pulled nothing in its last round (``WorkerIdle``), if it did not.
        self.idle: str | None = None
        self.started = time.monotonic()
        self._watchers: list[Watcher] = []

    def add(self, store: str, resource: str) -> UnitRow:
        """The unit's row, waiting until it starts."""
        return self.rows.setdefault((store, resource), UnitRow(store, resource))

    def watch(self, watcher: Watcher) -> None:
        """Pass every event on to ``watcher``, with its row (None for a sync-wide event)."""
        self._watchers.append(watcher)

    @property
    def shown(self) -> bool:
        """Whether a display watches (not with --quiet)."""
        return bool(self._watchers)

    def __call__(self, event: Event) -> None:
        row = self._apply(event)
        for watcher in self._watchers:
            watcher(event, row)

    def _apply(self, event: Event) -> UnitRow | None:
        if isinstance(event, WebhookCounts):
            self.webhooks[event.store] = event
        elif isinstance(event, WebhookRefused):
            self.refusal_checks[event.reason] = event.check
        elif isinstance(event, RunStarted):
            self.runs, self.idle = event.number, None
            if event.number > 1:  # a new run of the same units: their rows start over
                self.rows = {key: UnitRow(*key) for key in self.rows}
            for store, resource in event.units:
                self.add(store, resource)
        elif isinstance(event, WorkerIdle):
            self.idle = event.text
        elif not isinstance(event, Message):
            return self._apply_to(self.add(event.store, event.resource), event)
        return None

    def _apply_to(self, row: UnitRow, event: Event) -> UnitRow:
        now = time.monotonic()
        if isinstance(event, UnitStarted):
            row.state, row.started, row.resumed = "running", now, event.resumed
            row.records_before, row.allowed = event.records_before, event.allowed
        elif isinstance(event, PageCommitted):
            row.pages += 1
            row.records += event.records
            self.pulled += event.records
            row.stats = event.stats
        elif isinstance(event, Retrying):
            row.last_error, row.stats = event.error, event.stats
        elif isinstance(event, UnitDone | UnitFailed | UnitStopped):
            row.stats, row.rows, row.finished = event.stats, event.rows, now
            row.state = "done" if isinstance(event, UnitDone) else "interrupted"
            if isinstance(event, UnitFailed):
                row.state, row.error = "failed", event.error
        return row

    def stop(self) -> None:
        """The command stopped: units still running or waiting are interrupted."""
        for row in self.rows.values():
            if row.state in ("running", "waiting"):
                row.state, row.finished = "interrupted", time.monotonic()

    @property
    def failed(self) -> list[UnitRow]:
        return [row for row in self.rows.values() if row.state == "failed"]

    @property
    def records(self) -> int:
        return sum(row.records for row in self.rows.values())

    @property
    def records_before(self) -> int:
        """Records committed by interrupted processes before the rows resumed."""
        return sum(row.records_before for row in self.rows.values())
