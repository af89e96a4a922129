"""Progress of a pull or sync: counters per (store, resource) and per webhook receiver, and
three ways to show them.

- ``rich``: a live table on stderr when it is a terminal (rich is imported only here, lazily);
- ``plain``: a line per running (store, resource) every few seconds, plus a line at each start,
  finish and failure, for logs and CI;
- ``json``: the same events as one JSON object per line (``--log-format json``);
- ``none``: ``--quiet``.

Everything runs on the event loop thread: the display is refreshed by an asyncio task, never by
rich's own refresh thread, so counters are read without locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any, Final, Literal

import attrs
import orjson

from ..errors import ConfigError
from ..limiting import PoolStats
from ..webhooks import ReceiverStats

if TYPE_CHECKING:
    from .. import AdminClient

__all__ = [
    "Mode",
    "ResourceProgress",
    "Tracker",
    "WebhookProgress",
    "capture_retries",
    "choose_mode",
    "format_table",
    "plural",
    "show_progress",
]

Mode = Literal["rich", "plain", "json", "none"]
State = Literal["waiting", "running", "done", "failed", "interrupted"]
DEFAULT_PLAIN_INTERVAL: Final = 5.0
RICH_REFRESH: Final = 0.5


@attrs.define
class ResourceProgress:
    """Counters of one (store, resource) in this process."""

    store: str
    resource: str
    state: State = "waiting"
    records: int = 0
    pages: int = 0
    #: Records and pages of the same run committed by an earlier, interrupted process.
    resumed_records: int = 0
    resumed: bool = False
    started: float | None = None
    finished: float | None = None
    error: str | None = None
    #: Rows of this store in the resource's table once finished (sync only).
    rows: int | None = None
    #: Why the last failed attempt failed (one line), while the client retries.
    last_error: str | None = None
    client: AdminClient | None = attrs.field(default=None, repr=False)
    #: The pool's counters when the client closed (a closed client has none to give).
    final_stats: PoolStats | None = None
    #: The pool's counters when a repeated run started: a store's counters live as long as the
    #: process, so later runs (``sync --listen``) count from here.
    baseline: PoolStats | None = None
    rebase: bool = False

    @property
    def key(self) -> str:
        return f"{self.store}/{self.resource}"

    def elapsed(self, now: float | None = None) -> float:
        if self.started is None:
            return 0.0
        end = (
            self.finished if self.finished is not None else time.monotonic() if now is None else now
        )
        return max(end - self.started, 0.0)

    def record_rate(self, now: float | None = None) -> float:
        elapsed = self.elapsed(now)
        return self.records / elapsed if elapsed > 0 else 0.0

    @property
    def pool(self) -> str | None:
        if self.client is None:
            return None
        return self.client.limits.pool_for("GET", self.resource)

    def pool_stats(self) -> PoolStats:
        """Requests, 429s and retries of the rate-limit pool this resource draws on."""
        if self.final_stats is not None:
            return self.final_stats
        stats = self._pool_stats()
        base = self.baseline
        if base is None:
            return stats
        return attrs.evolve(
            stats,
            requests=stats.requests - base.requests,
            rate_limited=stats.rate_limited - base.rate_limited,
            retries=stats.retries - base.retries,
            wait_seconds=stats.wait_seconds - base.wait_seconds,
        )

    def _pool_stats(self) -> PoolStats:
        pool = self.pool
        if self.client is None or pool is None:
            return PoolStats()
        try:
            return self.client.stats.pools.get(pool, PoolStats())
        except RuntimeError:  # no running loop to bind the limiter in: nothing was sent
            return PoolStats()

    def freeze_stats(self) -> None:
        """Keep the pool's counters; called before the client closes."""
        self.final_stats = self.pool_stats()

    def allowed_rate(self) -> float | None:
        """Requests per second the client's limits allow this resource's pool."""
        pool = self.pool
        if self.client is None or pool is None:
            return None
        return self.client.limits.rate_for(pool).per_second


@attrs.define
class WebhookProgress:
    """Webhooks of one store (``sync --listen``): the receiver's counters plus what applying
    the events did to the database."""

    store: str
    url: str = ""
    #: Events written: upserts that replaced or added a row, and deletes.
    applied: int = 0
    deletes: int = 0
    #: Upserts left out: the stored row was newer, or the id was deleted.
    stale: int = 0
    #: Events for resources this store does not sync.
    ignored: int = 0
    #: Reads the receiver's counters (a snapshot each call); None before it exists.
    receiver_stats: Callable[[], ReceiverStats] | None = attrs.field(default=None, repr=False)

    def stats(self) -> ReceiverStats:
        return ReceiverStats() if self.receiver_stats is None else self.receiver_stats()


@attrs.frozen
class WebhookTotals:
    accepted: int = 0
    duplicates: int = 0
    applied: int = 0
    deletes: int = 0
    stale: int = 0
    ignored: int = 0
    dead_letters: int = 0
    #: Refused deliveries: bad signature, not an event, too large.
    refused: int = 0

    def line(self) -> str:
        return (
            f"webhooks: {self.accepted:,} accepted, {self.duplicates:,} duplicates, "
            f"{self.applied:,} applied ({self.deletes:,} deletes), {self.stale:,} stale, "
            f"{self.ignored:,} ignored, {self.dead_letters:,} dead letters, "
            f"{self.refused:,} refused"
        )


def webhook_totals(hooks: Sequence[WebhookProgress]) -> WebhookTotals:
    accepted = duplicates = dead = refused = 0
    for hook in hooks:
        stats = hook.stats()
        accepted += stats.accepted
        duplicates += stats.duplicates
        dead += stats.dead_lettered
        refused += stats.unauthorized + stats.bad_request + stats.too_large
    return WebhookTotals(
        accepted=accepted,
        duplicates=duplicates,
        applied=sum(h.applied for h in hooks),
        deletes=sum(h.deletes for h in hooks),
        stale=sum(h.stale for h in hooks),
        ignored=sum(h.ignored for h in hooks),
        dead_letters=dead,
        refused=refused,
    )


class Tracker:
    """All (store, resource) counters of one command, plus start/finish events for the display."""

    def __init__(self, *, verbose: bool = False) -> None:
        self.rows: dict[tuple[str, str], ResourceProgress] = {}
        #: Per store, with ``sync --listen``.
        self.webhooks: dict[str, WebhookProgress] = {}
        #: Records pulled over every run of this process (rows restart at each run), and the
        #: runs started (``sync --listen`` pulls again and again).
        self.pulled = 0
        self.runs = 0
        self.started = time.monotonic()
        #: ``-v``: every retry is an event of its own, not only the row's last error.
        self.verbose = verbose
        self._listeners: list[Callable[[ResourceProgress, str], None]] = []
        self._message_listeners: list[Callable[[str], None]] = []

    def add(self, store: str, resource: str) -> ResourceProgress:
        row = self.rows.get((store, resource))
        if row is None:
            row = self.rows[(store, resource)] = ResourceProgress(store, resource)
        return row

    def listen(
        self,
        callback: Callable[[ResourceProgress, str], None],
        on_message: Callable[[str], None] | None = None,
    ) -> None:
        self._listeners.append(callback)
        if on_message is not None:
            self._message_listeners.append(on_message)

    @property
    def has_display(self) -> bool:
        """Whether messages are shown (not with --quiet)."""
        return bool(self._message_listeners)

    def message(self, text: str) -> None:
        """A line about the whole command (not one resource), shown like notes."""
        for callback in self._message_listeners:
            callback(text)

    def webhook(self, store: str) -> WebhookProgress:
        hook = self.webhooks.get(store)
        if hook is None:
            hook = self.webhooks[store] = WebhookProgress(store)
        return hook

    def webhook_totals(self) -> WebhookTotals:
        return webhook_totals(list(self.webhooks.values()))

    def reset(self, row: ResourceProgress) -> None:
        """Back to waiting before another run of the same (store, resource)."""
        row.state = "waiting"
        row.records = row.pages = row.resumed_records = 0
        row.resumed = False
        row.started = row.finished = None
        row.error = row.last_error = None
        row.rows = None
        row.client = None
        row.final_stats = row.baseline = None
        row.rebase = True

    def _emit(self, row: ResourceProgress, event: str) -> None:
        for callback in self._listeners:
            callback(row, event)

    def start(
        self,
        row: ResourceProgress,
        client: AdminClient | None,
        *,
        resumed: bool = False,
        resumed_records: int = 0,
    ) -> None:
        _current_row.set(row)  # this task's retries are this row's (see capture_retries)
        row.client = client
        if row.rebase:
            row.baseline = row._pool_stats()
            row.rebase = False
        row.state = "running"
        row.started = time.monotonic()
        row.resumed = resumed
        row.resumed_records = resumed_records
        self._emit(row, "start")

    def page(self, row: ResourceProgress, records: int) -> None:
        row.pages += 1
        row.records += records
        self.pulled += records

    def retry(self, row: ResourceProgress, error: str) -> None:
        """An attempt of ``row`` failed and will be retried."""
        row.last_error = error
        if self.verbose:
            self._emit(row, "retry")

    def note(self, row: ResourceProgress, message: str) -> None:
        self._emit(row, message)

    def finish(self, row: ResourceProgress, *, rows: int | None = None) -> None:
        row.state = "done"
        row.finished = time.monotonic()
        row.rows = rows
        self._emit(row, "done")

    def fail(self, row: ResourceProgress, message: str) -> None:
        row.state = "failed"
        row.finished = time.monotonic()
        row.error = message
        self._emit(row, "failed")

    def interrupt_running(self) -> None:
        for row in self.rows.values():
            if row.state in ("running", "waiting"):
                row.state = "interrupted"
                row.finished = time.monotonic()

    @property
    def failed(self) -> list[ResourceProgress]:
        return [row for row in self.rows.values() if row.state == "failed"]

    @property
    def records(self) -> int:
        return sum(row.records for row in self.rows.values())


# ---------------------------------------------------------------------------------------------
# Retries: the library logs each failed attempt it will retry (asyncsubs.retry, DEBUG, with the
# error); the task that logs it is the one pulling the row that Tracker.start set here.

_current_row: contextvars.ContextVar[ResourceProgress | None] = contextvars.ContextVar(
    "asyncsubs_cli_row", default=None
)


class _RetryLog(logging.Handler):
    def __init__(self, tracker: Tracker) -> None:
        super().__init__(logging.DEBUG)
        self.tracker = tracker

    def emit(self, record: logging.LogRecord) -> None:
        row = _current_row.get()
        error = getattr(record, "error", None)
        if row is not None and isinstance(error, BaseException):
            text = " ".join(str(error).split()) or type(error).__name__
            self.tracker.retry(row, f"{type(error).__name__}: {text}")


@contextlib.contextmanager
def capture_retries(tracker: Tracker) -> Iterator[None]:
    """Record why each retried attempt failed on its row (``last_error``) for the block."""
    logger = logging.getLogger("asyncsubs.retry")
    handler = _RetryLog(tracker)
    level = logger.level
    logger.addHandler(handler)
    if not logger.isEnabledFor(logging.DEBUG):
        logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# ---------------------------------------------------------------------------------------------
# Display


def choose_mode(stream: IO[str], *, quiet: bool, force: str | None = None) -> Mode:
    """``none`` when quiet; rich on a terminal when rich is installed; plain otherwise."""
    if quiet:
        return "none"
    if force == "plain":
        return "plain"
    if force == "json":
        return "json"
    if force == "rich":
        if not _rich_available():
            raise ConfigError(
                "--progress rich needs the rich package: pip install 'asyncsubs[cli]'"
            )
        return "rich"
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty() and _rich_available():
        return "rich"
    return "plain"


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 page``, ``2 pages``, ``1,000 records``; ``nouns`` where it is not noun + s."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {nouns or noun + 's'}"


def _fmt_rate(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _status(row: ResourceProgress) -> str:
    if row.state == "running" and row.resumed:
        return "running (resumed)"
    if row.state == "failed":
        return "failed"
    return row.state


def _progress_line(row: ResourceProgress, now: float) -> str:
    stats = row.pool_stats()
    line = (
        f"{row.key}: {_status(row)}, {plural(row.records, 'record')}, "
        f"{plural(row.pages, 'page')}, "
        f"{_fmt_rate(row.record_rate(now))} records/s, {plural(stats.requests, 'request')}, "
        f"{plural(stats.retries, 'retry', 'retries')}, {stats.rate_limited:,} 429s"
    )
    if row.resumed_records:
        line += f" (+{row.resumed_records:,} before resuming)"
    if row.last_error:
        line += f"; last error: {row.last_error}"
    return line


class _PlainDisplay:
    def __init__(self, tracker: Tracker, stream: IO[str], interval: float) -> None:
        self.tracker = tracker
        self.stream = stream
        self.interval = interval
        self._last_webhooks: WebhookTotals | None = None

    def write(self, text: str) -> None:
        elapsed = time.monotonic() - self.tracker.started
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(f"[{elapsed:7.1f}s] {text}\n")
            self.stream.flush()

    def on_event(self, row: ResourceProgress, event: str) -> None:
        if event == "start":
            how = "resuming from its saved cursor" if row.resumed else "starting"
            self.write(f"{row.key}: {how}")
        elif event == "done":
            rows = (
                ""
                if row.rows is None
                else f"; {plural(row.rows, 'row')} in the table for this store"
            )
            self.write(
                f"{row.key}: done, {plural(row.records, 'record')} in "
                f"{plural(row.pages, 'page')} ({row.elapsed():.1f}s){rows}"
            )
        elif event == "failed":
            self.write(f"{row.key}: FAILED: {row.error}")
        elif event == "retry":
            self.write(f"{row.key}: retrying after {row.last_error}")
        else:
            self.write(f"{row.key}: {event}")

    def on_message(self, text: str) -> None:
        self.write(text)

    def tick(self) -> None:
        now = time.monotonic()
        for row in self.tracker.rows.values():
            if row.state == "running":
                self.write(_progress_line(row, now))
        if self.tracker.webhooks:
            totals = self.tracker.webhook_totals()
            # Only when something changed: an idle listener should not fill the log.
            if totals != self._last_webhooks:
                self._last_webhooks = totals
                self.write(totals.line())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.tick()


class _JsonDisplay(_PlainDisplay):
    """``--log-format json``: the plain display's events as one JSON object per line (time,
    level, store, resource, event and the figures), for log collectors."""

    def emit(self, level: str, event: str, row: ResourceProgress | None, **fields: Any) -> None:
        record: dict[str, Any] = {"time": utc_now(), "level": level}
        if row is not None:
            record.update(store=row.store, resource=row.resource)
        record["event"] = event
        if row is not None:
            record.update(row_figures(row))
        record.update(fields)
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(orjson.dumps(record).decode() + "\n")
            self.stream.flush()

    def on_event(self, row: ResourceProgress, event: str) -> None:
        if event == "start":
            self.emit("info", "resume" if row.resumed else "start", row)
        elif event == "done":
            self.emit("info", "done", row)
        elif event == "failed":
            self.emit("error", "failed", row)
        elif event == "retry":
            self.emit("warning", "retry", row)
        else:
            self.emit("warning", "note", row, message=event)

    def on_message(self, text: str) -> None:
        self.emit("info", "message", None, message=text)

    def tick(self) -> None:
        for row in self.tracker.rows.values():
            if row.state == "running":
                self.emit("info", "progress", row)
        if self.tracker.webhooks:
            totals = self.tracker.webhook_totals()
            if totals != self._last_webhooks:
                self._last_webhooks = totals
                self.emit("info", "webhooks", None, **attrs.asdict(totals))


def utc_now() -> str:
    """Now as an ISO 8601 UTC timestamp with milliseconds."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def row_figures(row: ResourceProgress) -> dict[str, Any]:
    """A row's figures as JSON fields (the live table's columns)."""
    stats = row.pool_stats()
    figures: dict[str, Any] = {
        "state": row.state,
        "records": row.records,
        "pages": row.pages,
        "records_before_resuming": row.resumed_records,
        "requests": stats.requests,
        "retries": stats.retries,
        "rate_limited": stats.rate_limited,
        "elapsed": round(row.elapsed(), 3),
    }
    if row.rows is not None:
        figures["rows"] = row.rows
    if row.error is not None:
        figures["error"] = row.error
    if row.last_error is not None:
        figures["last_error"] = row.last_error
    return figures


_LIVE_HEADERS: Final = (
    "store",
    "resource",
    "status",
    "records",
    "pages",
    "records/s",
    "requests",
    "req/s (allowed)",
    "retries",
    "429s",
    "time",
    "last error",
)
#: Characters of the last error the live table shows (the plain lines show it whole).
LAST_ERROR_WIDTH: Final = 60
# Running and failed rows first, so a sync of many stores shows what matters in one screen.
_ORDER: Final = {"running": 0, "failed": 1, "waiting": 2, "interrupted": 3, "done": 4}
_STYLES: Final = {"done": "green", "failed": "bold red", "interrupted": "yellow"}


def _live_row(row: ResourceProgress, now: float) -> list[str]:
    stats = row.pool_stats()
    elapsed = row.elapsed(now)
    allowed = row.allowed_rate()
    # n starts span n - 1 intervals: counting the first would overstate the pace early on.
    req_rate = max(stats.requests - 1, 0) / elapsed if elapsed > 0 else 0.0
    return [
        row.store,
        row.resource,
        _status(row),
        f"{row.records:,}" + (f" (+{row.resumed_records:,} before)" if row.resumed_records else ""),
        f"{row.pages:,}",
        _fmt_rate(row.record_rate(now)),
        f"{stats.requests:,}",
        f"{req_rate:.2f} ({allowed:.2f})" if allowed else f"{req_rate:.2f}",
        f"{stats.retries:,}",
        f"{stats.rate_limited:,}",
        f"{elapsed:.1f}s",
        _shorten(row.error or row.last_error or "", LAST_ERROR_WIDTH),
    ]


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class _RichDisplay:
    """A live table on a terminal.

    Rendered as pre-aligned Text rather than a rich Table: a Table of a dozen rows costs ~20 ms
    to render, and that time is taken from the event loop, where it would delay request starts
    the limiter has already paced (and so risk 429s on strict servers).
    """

    def __init__(self, tracker: Tracker, stream: IO[str]) -> None:
        from rich.console import Console
        from rich.live import Live

        self.tracker = tracker
        self.console = Console(file=stream, stderr=stream is sys.stderr)
        # auto_refresh off: rich's refresh thread would read the counters off the loop thread.
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
        rows = sorted(self.tracker.rows.values(), key=lambda r: _ORDER.get(r.state, 9))
        room = max(self.console.height - (4 if self.tracker.webhooks else 3), 3)
        hidden = rows[room:]
        rows = rows[:room]
        lines = format_table(_LIVE_HEADERS, [_live_row(r, now) for r in rows]).split("\n")
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(lines[0] + "\n", style="bold")
        for row, line in zip(rows, lines[2:], strict=True):
            text.append(line + "\n", style=_STYLES.get(row.state, ""))
        total = self.tracker.records
        summary = f"{total:,} records"
        if hidden:
            summary += f"; {len(hidden)} more rows not shown"
        if self.tracker.webhooks:
            text.append(self.tracker.webhook_totals().line() + "\n")
        text.append(summary, style="dim")
        return text

    def on_event(self, row: ResourceProgress, event: str) -> None:
        # Only notes are printed; starts and finishes show in the next periodic refresh.
        if event == "retry":
            self.live.console.print(f"{row.key}: retrying after {row.last_error}", highlight=False)
        elif event not in ("start", "done", "failed"):
            self.live.console.print(f"{row.key}: {event}", highlight=False)

    def on_message(self, text: str) -> None:
        self.live.console.print(text, highlight=False)

    def refresh(self) -> None:
        self.live.update(self._render(), refresh=True)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(RICH_REFRESH)
            self.refresh()


@contextlib.asynccontextmanager
async def show_progress(
    tracker: Tracker,
    mode: Mode,
    *,
    stream: IO[str] | None = None,
    interval: float = DEFAULT_PLAIN_INTERVAL,
) -> AsyncIterator[None]:
    """Show ``tracker`` on ``stream`` (stderr) while the body runs."""
    if mode == "none":
        yield
        return
    out = sys.stderr if stream is None else stream
    display: _PlainDisplay | _RichDisplay
    if mode == "rich":
        display = _RichDisplay(tracker, out)
        display.live.start()
    elif mode == "json":
        display = _JsonDisplay(tracker, out, interval)
    else:
        display = _PlainDisplay(tracker, out, interval)
    tracker.listen(display.on_event, display.on_message)
    task = asyncio.create_task(display.run())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if isinstance(display, _RichDisplay):
            display.refresh()
            display.live.stop()


# ---------------------------------------------------------------------------------------------
# Tables for summaries


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain, aligned text table (numbers right-aligned) for logs and non-terminals."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def numeric(cell: str) -> bool:
        return bool(cell) and (cell[0].isdigit() or cell[0] in "-+") and cell[-1] != ":"

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(widths[i]) if numeric(cell) else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def print_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    stream: IO[str],
    footer: Iterator[str] | Sequence[str] = (),
) -> None:
    """Print a summary table: with rich on a terminal, as plain text otherwise."""
    plain = format_table(headers, rows)
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty() and _rich_available():
        from rich.console import Console
        from rich.table import Table

        console = Console(file=stream)
        # A boxed table needs 3 columns per cell more than the plain one; when the terminal is
        # narrower, the plain table reads better than rich's truncated cells.
        needed = max(map(len, plain.splitlines())) + 3 * len(headers)
        if console.width >= needed:
            table = Table(title=title, title_justify="left", header_style="bold")
            for i, header in enumerate(headers):
                numeric = any(r[i][:1].isdigit() for r in rows)
                table.add_column(header, justify="right" if numeric else "left", no_wrap=True)
            for row in rows:
                table.add_row(*row)
            console.print(table)
            for text in footer:
                console.print(text, highlight=False)
            return
    stream.write(f"{title}\n{plain}\n")
    for text in footer:
        stream.write(f"{text}\n")
    stream.flush()
