"""Three ways to show a command's ``Progress`` on stderr, each a small watcher of its events:

- ``LiveTable``: a live table on a terminal (rich, imported only here, lazily);
- ``PlainLines``: a line per running unit every few seconds, plus a line at each start, finish,
  failure and note, for logs and CI;
- ``JsonLines``: the same as one JSON object per line (``--log-format json``).

``--quiet`` shows none. A display is refreshed by an asyncio task, never by rich's own refresh
thread, so the figures are read on the event loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from typing import IO, Any, Final, Literal

import attrs

from ..errors import ConfigError
from ..sync import (
    Event,
    Message,
    PoolLearned,
    Retrying,
    UnitDone,
    UnitFailed,
    UnitNote,
    UnitStarted,
    WebhookRefused,
)
from ._output import json_line
from ._progress import Progress, UnitRow, allowed_cell, learned_text, page_cell, plural
from ._tables import format_table, rich_available
from ._webhooks import WebhookTotals, refusal_line, webhook_totals

__all__ = ["DEFAULT_INTERVAL", "Mode", "choose_mode", "show_progress"]

Mode = Literal["rich", "plain", "json", "none"]
DEFAULT_INTERVAL: Final = 5.0
RICH_REFRESH: Final = 0.5
LIVE_HEADERS: Final = (
    "store",
    "resource",
    "status",
    "records",
    "pages",
    "records/s",
    "requests",
    "req/s (allowed)",
    "page",
    "429s",
    "retries",
    "time",
    "last error",
)
#: Characters of the last error the live table shows (the plain lines show it whole).
LAST_ERROR_WIDTH: Final = 60
# Running and failed rows first, so a sync of many stores shows what matters in one screen.
_ORDER: Final = {"running": 0, "failed": 1, "waiting": 2, "interrupted": 3, "done": 4}
_STYLES: Final = {"done": "green", "failed": "bold red", "interrupted": "yellow"}


def choose_mode(stream: IO[str], *, quiet: bool, force: str | None = None) -> Mode:
    """``none`` when quiet; rich on a terminal when rich is installed; plain otherwise."""
    if quiet:
        return "none"
    if force in ("plain", "json"):
        return "plain" if force == "plain" else "json"
    if force == "rich":
        if not rich_available():
            raise ConfigError(
                "--progress rich needs the rich package: pip install 'asyncsubs[cli]'"
            )
        return "rich"
    isatty = getattr(stream, "isatty", None)
    return "rich" if isatty is not None and isatty() and rich_available() else "plain"


def status(row: UnitRow) -> str:
    return "running (resumed)" if row.state == "running" and row.resumed else row.state


def rate(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def retry_line(event: Retrying) -> str:
    """Why a request is retried; after a 429, the pace the pool slowed to."""
    pace = event.stats
    slowed = pace.paced_by == "429" and pace.interval > 0
    return f"retrying after {event.error}" + (
        f"; pacing at {1 / pace.interval:.2f}/s" if slowed else ""
    )


def progress_line(row: UnitRow, now: float) -> str:
    stats = row.stats
    line = (
        f"{row.key}: {status(row)}, {plural(row.records, 'record')}, "
        f"{plural(row.pages, 'page')}, "
        f"{rate(row.record_rate(now))} records/s, {plural(stats.requests, 'request')}, "
        f"{plural(stats.rate_limited, '429')}, {plural(stats.retries, 'retry', 'retries')}"
    )
    if row.records_before:
        line += f" (+{row.records_before:,} before resuming)"
    if row.last_error:
        line += f"; last error: {row.last_error}"
    return line


def row_figures(row: UnitRow) -> dict[str, Any]:
    """A row's figures as JSON fields (the live table's columns)."""
    stats = row.stats
    figures: dict[str, Any] = {
        "state": row.state,
        "records": row.records,
        "pages": row.pages,
        "records_before_resuming": row.records_before,
        "requests": stats.requests,
        "rate_limited": stats.rate_limited,
        "retries": stats.retries,
        "elapsed": round(row.elapsed(), 3),
    }
    optional = {"rows": row.rows, "error": row.error, "last_error": row.last_error}
    figures.update({name: value for name, value in optional.items() if value is not None})
    return figures


class PlainLines:
    """Timestamped lines: events as they come, running units every ``interval`` seconds."""

    def __init__(
        self, progress: Progress, stream: IO[str], interval: float, *, verbose: bool = False
    ) -> None:
        self.progress = progress
        self.stream = stream
        self.interval = interval
        self.verbose = verbose
        self._last_webhooks: WebhookTotals | None = None

    def write(self, text: str) -> None:
        elapsed = time.monotonic() - self.progress.started
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(f"[{elapsed:7.1f}s] {text}\n")
            self.stream.flush()

    def __call__(self, event: Event, row: UnitRow | None) -> None:
        if isinstance(event, Message):
            self.write(event.text)
        elif isinstance(event, WebhookRefused):
            self.write(refusal_line(event))
        elif row is None:
            return
        elif isinstance(event, UnitStarted):
            self.write(
                f"{row.key}: {'resuming from its saved cursor' if row.resumed else 'starting'}"
            )
        elif isinstance(event, UnitDone):
            rows = (
                ""
                if row.rows is None
                else f"; {plural(row.rows, 'row')} in the table for this store"
            )
            self.write(
                f"{row.key}: done, {plural(row.records, 'record')} in "
                f"{plural(row.pages, 'page')} ({row.elapsed():.1f}s){rows}"
            )
        elif isinstance(event, UnitFailed):
            self.write(f"{row.key}: FAILED: {row.error}")
        elif isinstance(event, Retrying) and self.verbose:
            self.write(f"{row.key}: {retry_line(event)}")
        elif isinstance(event, UnitNote):
            self.write(f"{row.key}: {event.message}")
        elif isinstance(event, PoolLearned):
            self.write(f"{row.key}: {learned_text(event.stats)}")

    def tick(self) -> None:
        now = time.monotonic()
        for row in self.progress.rows.values():
            if row.state == "running":
                self.running(row, now)
        if self.progress.webhooks:
            totals = webhook_totals(self.progress.webhooks)
            # Only when something changed: an idle listener should not fill the log.
            if totals != self._last_webhooks:
                self._last_webhooks = totals
                self.webhooks(totals)

    def running(self, row: UnitRow, now: float) -> None:
        self.write(progress_line(row, now))

    def webhooks(self, totals: WebhookTotals) -> None:
        self.write(totals.line())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.tick()


class JsonLines(PlainLines):
    """``--log-format json``: the plain lines' events as one JSON object per line (time,
    level, store, resource, event and the figures), for log collectors."""

    def emit(self, level: str, event: str, row: UnitRow | None, **fields: Any) -> None:
        where = {} if row is None else {"store": row.store, "resource": row.resource}
        figures = {} if row is None else row_figures(row)
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(json_line(level, event, **where, **figures, **fields) + "\n")
            self.stream.flush()

    def __call__(self, event: Event, row: UnitRow | None) -> None:
        if isinstance(event, Message):
            self.emit("info", "message", None, message=event.text)
        elif isinstance(event, WebhookRefused):
            self.emit("warning", "webhook_refused", None, **attrs.asdict(event))
        elif row is None:
            return
        elif isinstance(event, UnitStarted):
            self.emit("info", "resume" if row.resumed else "start", row)
        elif isinstance(event, UnitDone):
            self.emit("info", "done", row)
        elif isinstance(event, UnitFailed):
            self.emit("error", "failed", row)
        elif isinstance(event, Retrying) and self.verbose:
            self.emit("warning", "retry", row)
        elif isinstance(event, UnitNote):
            self.emit("warning", "note", row, message=event.message)
        elif isinstance(event, PoolLearned):
            stats = event.stats
            learned = {
                "rate": stats.rate,
                "rate_by": stats.rate_by,
                "ceiling_found": stats.ceiling_found,
                "page_size": stats.page_size,
                "page_size_by": stats.page_size_by,
            }
            self.emit("info", "learned", row, message=learned_text(stats), **learned)

    def running(self, row: UnitRow, now: float) -> None:
        self.emit("info", "progress", row)

    def webhooks(self, totals: WebhookTotals) -> None:
        self.emit("info", "webhooks", None, **attrs.asdict(totals))


def live_row(row: UnitRow, now: float) -> list[str]:
    stats, elapsed = row.stats, row.elapsed(now)
    return [
        row.store,
        row.resource,
        status(row),
        row.records_cell(),
        f"{row.pages:,}",
        rate(row.record_rate(now)),
        f"{stats.requests:,}",
        allowed_cell(row, now),
        page_cell(row),
        f"{stats.rate_limited:,}",
        f"{stats.retries:,}",
        f"{elapsed:.1f}s",
        _shorten(row.error or row.last_error or "", LAST_ERROR_WIDTH),
    ]


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class LiveTable:
    """A live table on a terminal.

    Rendered as pre-aligned Text rather than a rich Table: a Table of a dozen rows costs ~20 ms
    to render, and that time is taken from the event loop, where it would delay request starts
    the limiter has already paced (and so risk 429s on strict servers).
    """

    def __init__(self, progress: Progress, stream: IO[str], *, verbose: bool = False) -> None:
        from rich.console import Console
        from rich.live import Live

        self.progress = progress
        self.verbose = verbose
        self.console = Console(file=stream, stderr=stream is sys.stderr)
        # auto_refresh off: rich's refresh thread would read the figures off the loop thread.
        # No stdout redirection: ``pull`` writes records to stdout meanwhile.
        self.live = Live(
            self._render(),
            console=self.console,
            auto_refresh=False,
            transient=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )

    def _render(self) -> Any:
        from rich.text import Text

        now = time.monotonic()
        rows = sorted(self.progress.rows.values(), key=lambda r: _ORDER.get(r.state, 9))
        hooks = self.progress.webhooks
        room = max(self.console.height - (4 if hooks else 3), 3)
        hidden, rows = rows[room:], rows[:room]
        lines = format_table(LIVE_HEADERS, [live_row(r, now) for r in rows]).split("\n")
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(lines[0] + "\n", style="bold")
        for row, line in zip(rows, lines[2:], strict=True):
            text.append(line + "\n", style=_STYLES.get(row.state, ""))
        summary = f"{self.progress.records:,} records"
        if hidden:
            summary += f"; {len(hidden)} more rows not shown"
        if hooks:
            text.append(webhook_totals(hooks).line() + "\n")
        text.append(summary, style="dim")
        return text

    def __call__(self, event: Event, row: UnitRow | None) -> None:
        # Only notes are printed; starts and finishes show in the next periodic refresh.
        if isinstance(event, Message):
            self.live.console.print(event.text, highlight=False)
        elif isinstance(event, WebhookRefused):
            self.live.console.print(refusal_line(event), highlight=False)
        elif row is not None and isinstance(event, Retrying) and self.verbose:
            self.live.console.print(f"{row.key}: {retry_line(event)}", highlight=False)
        elif row is not None and isinstance(event, UnitNote):
            self.live.console.print(f"{row.key}: {event.message}", highlight=False)
        elif row is not None and isinstance(event, PoolLearned) and self.verbose:
            # The table's columns show the rate and page size in force; -v: each change too.
            self.live.console.print(f"{row.key}: {learned_text(event.stats)}", highlight=False)

    def refresh(self) -> None:
        self.live.update(self._render(), refresh=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(RICH_REFRESH)
            self.refresh()


@contextlib.asynccontextmanager
async def show_progress(
    progress: Progress,
    mode: Mode,
    *,
    interval: float = DEFAULT_INTERVAL,
    verbose: bool = False,
    stream: IO[str] | None = None,
) -> AsyncIterator[None]:
    """Show ``progress`` on ``stream`` (stderr) while the body runs."""
    if mode == "none":
        yield
        return
    out = sys.stderr if stream is None else stream
    display: PlainLines | LiveTable
    if mode == "rich":
        display = LiveTable(progress, out, verbose=verbose)
        display.live.start()
    else:
        lines = JsonLines if mode == "json" else PlainLines
        display = lines(progress, out, interval, verbose=verbose)
    progress.watch(display)
    task = asyncio.create_task(display.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if isinstance(display, LiveTable):
            display.refresh()
            display.live.stop()
