"""Three ways to show a command's ``Progress`` on stderr, each a watcher of its events:
``PlainLines`` (a line per running unit every few seconds, and one per start, finish, failure
and note, for logs and CI), ``JsonLines`` (the same as JSON, ``--log-format json``) and
``LiveTable`` (rich, on a terminal). A display is refreshed by an asyncio task, never by rich's
own thread, so the figures are read on the event loop's thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from typing import IO, Any, Final, Literal, NamedTuple

import attrs

from ..errors import ConfigError
from ..stores import (
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
from ._output import Output, json_line
from ._progress import COLUMNS, Progress, UnitRow, cells, learned_text, per_second, plural
from ._summaries import WebhookTotals, refusal_line, webhook_totals
from ._tables import format_table, rich_available

__all__ = ["DEFAULT_INTERVAL", "Mode", "choose_mode", "show_progress"]

Mode = Literal["rich", "plain", "json", "none"]
DEFAULT_INTERVAL: Final = 5.0
RICH_REFRESH: Final = 0.5
LIVE_HEADERS: Final = tuple(column for column in COLUMNS if column != "rows")
# Running and failed rows first, so a sync of many stores shows what matters in one screen.
_ORDER: Final = {"running": 0, "failed": 1, "waiting": 2, "interrupted": 3, "done": 4}
_STYLES: Final = {"done": "green", "failed": "bold red", "interrupted": "yellow"}
#: What a pool learned, as the fields of a JSON line.
_LEARNED: Final = ("rate", "rate_by", "ceiling_found", "page_size", "page_size_by")
#: What the live table shows in its rows rather than as lines.
_ROW_EVENTS: Final = ("start", "resume", "done", "failed")


def choose_mode(args: argparse.Namespace) -> Mode:
    """``none`` when quiet; JSON lines for ``--log-format json``; plain lines with ``--debug`` (log
    lines and a live table do not mix) or off a terminal; else rich's live table."""
    if args.quiet:
        return "none"
    if args.log_format == "json":
        return "json"
    if args.debug or args.progress == "plain":
        return "plain"
    if args.progress == "rich" and not rich_available():
        raise ConfigError("--progress rich needs the rich package: pip install 'asyncsubs[cli]'")
    rich = args.progress == "rich" or (sys.stderr.isatty() and rich_available())
    return "rich" if rich else "plain"


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
        f"{row.key}: {row.status}, {plural(row.records, 'record')}, "
        f"{plural(row.pages, 'page')}, {per_second(row.record_rate(now))} records/s, "
        f"{plural(stats.requests, 'request')}, {plural(stats.rate_limited, '429')}, "
        f"{plural(stats.retries, 'retry', 'retries')}"
    )
    if row.records_before:
        line += f" (+{row.records_before:,} before resuming)"
    if row.last_error:
        line += f"; last error: {row.last_error}"
    return line


def live_row(row: UnitRow, now: float) -> list[str]:
    return cells(row, LIVE_HEADERS, now)


class Said(NamedTuple):
    """An event as the displays show it: its level and name in JSON, its plain line, and the
    fields of its JSON line besides the unit's figures."""

    level: str
    event: str
    text: str
    fields: dict[str, Any]


def describe(event: Event, row: UnitRow | None, verbose: bool) -> Said | None:
    """What the lines show of ``event`` (None: nothing)."""
    if isinstance(event, Message):
        return Said("info", "message", event.text, {"message": event.text})
    if isinstance(event, WebhookRefused):
        return Said("warning", "webhook_refused", refusal_line(event), attrs.asdict(event))
    if row is None:
        return None
    if isinstance(event, UnitStarted):
        begun = "resuming from its saved cursor" if row.resumed else "starting"
        return Said("info", "resume" if row.resumed else "start", f"{row.key}: {begun}", {})
    if isinstance(event, UnitDone):
        rows = (
            "" if row.rows is None else f"; {plural(row.rows, 'row')} in the table for this store"
        )
        done = f"{plural(row.records, 'record')} in {plural(row.pages, 'page')}"
        return Said("info", "done", f"{row.key}: done, {done} ({row.elapsed():.1f}s){rows}", {})
    if isinstance(event, UnitFailed):
        return Said("error", "failed", f"{row.key}: FAILED: {row.error}", {})
    if isinstance(event, Retrying) and verbose:
        return Said("warning", "retry", f"{row.key}: {retry_line(event)}", {})
    if isinstance(event, UnitNote):
        return Said("warning", "note", f"{row.key}: {event.message}", {"message": event.message})
    if isinstance(event, PoolLearned):
        said = learned_text(event.stats)
        learned = {name: getattr(event.stats, name) for name in _LEARNED}
        return Said("info", "learned", f"{row.key}: {said}", {"message": said, **learned})
    return None


class PlainLines:
    """Timestamped lines: events as they come, running units every ``interval`` seconds."""

    def __init__(
        self, progress: Progress, stream: IO[str], interval: float, *, verbose: bool = False
    ) -> None:
        self.progress, self.interval, self.verbose = progress, interval, verbose
        self.out = Output(stream=stream)
        self._last_webhooks: WebhookTotals | None = None
        self._learned: dict[str, str] = {}  # each unit's last "learned" line
        self._ended: dict[str, str] = {}  # how each unit's last run ended ("done", "failed")

    def show(self, row: UnitRow | None, said: Said) -> None:
        self.out.write(f"[{time.monotonic() - self.progress.started:7.1f}s] {said.text}")

    def __call__(self, event: Event, row: UnitRow | None) -> None:
        if (said := describe(event, row, self.verbose)) is not None and self._new(row, said):
            self.show(row, said)

    def _new(self, row: UnitRow | None, said: Said) -> bool:
        """Whether ``said`` tells something new. A service's later runs (``sync --listen``) say
        of a unit what changed only: a pace learned anew, a failure and the run that ends it,
        a resumed run's end; not three lines a unit each time, the records pulled being said
        by the run's own line (an incremental pull's overlap brings a record or two back each
        time). With ``-v``, every line."""
        if row is None or self.verbose:
            return True
        if said.event == "learned":
            before, self._learned[row.key] = self._learned.get(row.key), said.text
            return said.text != before
        before = self._ended.get(row.key, "done")
        if said.event in ("done", "failed"):
            self._ended[row.key] = said.event
        if self.progress.runs <= 1 or said.event not in ("start", "done"):
            return True
        return said.event == "done" and (row.resumed or before != "done")

    def tick(self) -> None:
        now = time.monotonic()
        for row in self.progress.rows.values():
            if row.state == "running":
                self.show(row, Said("info", "progress", progress_line(row, now), {}))
        totals = webhook_totals(self.progress.webhooks)
        # Only when something changed: an idle listener should not fill the log.
        if self.progress.webhooks and totals != self._last_webhooks:
            self._last_webhooks = totals
            self.show(None, Said("info", "webhooks", totals.line(), attrs.asdict(totals)))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.tick()


class JsonLines(PlainLines):
    """``--log-format json``: the plain lines' events as one JSON object per line (time,
    level, store, resource, event and the figures), for log collectors."""

    def show(self, row: UnitRow | None, said: Said) -> None:
        where = {} if row is None else {"store": row.store, "resource": row.resource}
        figures = {} if row is None else row.figures()
        self.out.write(json_line(said.level, said.event, **where, **figures, **said.fields))


class LiveTable(PlainLines):
    """A live table on a terminal, as pre-aligned Text: a rich Table of a dozen rows takes ~20
    ms of the event loop to render, delaying request starts the limiter has paced."""

    def __init__(self, progress: Progress, stream: IO[str], *, verbose: bool = False) -> None:
        from rich.console import Console
        from rich.live import Live

        super().__init__(progress, stream, RICH_REFRESH, verbose=verbose)
        self.console = Console(file=stream, stderr=stream is sys.stderr)
        # auto_refresh off: rich's refresh thread would read the figures off the loop thread.
        # No stdout redirection: ``pull`` writes records to stdout meanwhile.
        self.live = Live(
            self._render(),
            console=self.console,
            auto_refresh=False,
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
        if hooks:
            text.append(webhook_totals(hooks).line() + "\n")
        more = f"; {len(hidden)} more rows not shown" if hidden else ""
        text.append(f"{self.progress.records:,} records{more}", style="dim")
        return text

    def show(self, row: UnitRow | None, said: Said) -> None:
        # Starts and finishes show in the next refresh; what a pool learned shows in its
        # columns, and with -v as each change's line too.
        if said.event not in _ROW_EVENTS and (said.event != "learned" or self.verbose):
            self.live.console.print(said.text, highlight=False)

    def tick(self) -> None:
        self.live.update(self._render(), refresh=True)


@contextlib.asynccontextmanager
async def show_progress(
    progress: Progress, mode: Mode, *, interval: float = DEFAULT_INTERVAL, verbose: bool = False
) -> AsyncIterator[None]:
    """Show ``progress`` on stderr while the body runs."""
    if mode == "none":
        yield
        return
    display: PlainLines
    if mode == "rich":
        display = LiveTable(progress, sys.stderr, verbose=verbose)
        display.live.start()
    else:
        display = (JsonLines if mode == "json" else PlainLines)(
            progress, sys.stderr, interval, verbose=verbose
        )
    progress.watch(display)
    task = asyncio.create_task(display.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if isinstance(display, LiveTable):
            display.tick()
            display.live.stop()
