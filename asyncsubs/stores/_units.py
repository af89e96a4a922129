"""One unit, a ``(store, resource)``, pulled page by page: the one pull loop of every door.

``Unit.pages`` lists the resource through the store's client; the door takes each page (``pull``
writes it to a file, ``sync`` commits it to its sink, the dlt source yields rows) and says so
(``committed``). The unit counts its rate-limit pool from its start and tells the door's
observer what happens (``_events``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, cast

import attrs

from .. import AdminClient, Page, RetryEvent
from ..limiting import PoolStats
from ._events import (
    Observer,
    PageCommitted,
    PoolLearned,
    Retrying,
    UnitDone,
    UnitFailed,
    UnitNote,
    UnitStarted,
    UnitStopped,
    learned_changed,
)

__all__ = ["Unit", "clamped_page_note", "describe_error"]


def describe_error(exc: BaseException) -> str:
    """An error in one line, its type first (the library's messages name method and path)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def clamped_page_note(asked: int | str | None, page: Page[Any]) -> str | None:
    """What to say when ``page`` is shorter than ``asked`` (a fixed size) while more follow: the
    server cut the page size (None otherwise; a learned size is told by ``PoolLearned``)."""
    if not isinstance(asked, int) or not page.data or page.next_cursor is None:
        return None
    if len(page.data) >= asked:
        return None
    return f"the server cut the page size to {len(page.data):,} records (asked for {asked:,})"


class Unit:
    """``resource`` of ``store``, pulled through ``client``, its events told to ``observe``."""

    def __init__(
        self, client: AdminClient, store: str, resource: str, observe: Observer = lambda _: None
    ) -> None:
        self.client, self.store, self.resource, self.observe = client, store, resource, observe
        self.pool = client.limits.pool_for("GET", resource)
        self._base = PoolStats()
        self._told: PoolStats | None = None

    def stats(self) -> PoolStats:
        """The pool's counters since the unit started; the pace as it stands."""
        now = self.client.stats.pools.get(self.pool, PoolStats())
        counters = ("requests", "rate_limited", "retries", "wait_seconds")
        return attrs.evolve(now, **{c: getattr(now, c) - getattr(self._base, c) for c in counters})

    def start(self, *, resumed: bool = False, records_before: int = 0) -> None:
        """Count the pool from now; tell ``UnitStarted`` and what the pool knows already."""
        self._base = self.client.stats.pools.get(self.pool, PoolStats())
        allowed = self.client.limits.rate_for(self.pool)
        self.observe(UnitStarted(self.store, self.resource, resumed, records_before, allowed))
        self._tell_learned(self.stats())

    async def pages(
        self,
        *,
        page_size: int | str,
        after_cursor: str | None = None,
        params: Mapping[str, Any] | None = None,
        prefetch: int | None = None,
    ) -> AsyncIterator[Page[Any]]:
        """The resource's pages, records as sent (dicts); a fixed page size the server cut is
        told once (``UnitNote``)."""
        options: dict[str, Any] = {} if prefetch is None else {"prefetch": prefetch}
        call = self.client.list_endpoint(self.resource).list(
            page_size=page_size,  # type: ignore[arg-type]
            after_cursor=after_cursor,
            params=params or None,
            **options,
        )
        first = True
        async with contextlib.aclosing(cast(AsyncGenerator[Page[Any]], call.pages())) as pages:
            async for page in pages:
                yield page
                if first and (note := clamped_page_note(page_size, page)):
                    self.note(note)
                first = False

    def committed(self, records: int) -> None:
        """A page of ``records`` records is the door's now (written, committed, handed on)."""
        stats = self.stats()
        self.observe(PageCommitted(self.store, self.resource, records, stats))
        self._tell_learned(stats)

    def note(self, text: str) -> None:
        self.observe(UnitNote(self.store, self.resource, text))

    def retried(self, event: RetryEvent) -> None:
        error = describe_error(event.error)
        self.observe(Retrying(self.store, self.resource, error, self.stats()))

    def done(self, rows: int | None = None) -> None:
        self.observe(UnitDone(self.store, self.resource, self.stats(), rows))

    def failed(self, error: str, rows: int | None = None) -> None:
        self.observe(UnitFailed(self.store, self.resource, error, self.stats(), rows))

    def stopped(self, rows: int | None = None) -> None:
        self.observe(UnitStopped(self.store, self.resource, self.stats(), rows))

    def _tell_learned(self, stats: PoolStats) -> None:
        """``PoolLearned`` when the pool's rate or page size changed since last told."""
        if learned_changed(self._told, stats):
            self._told = stats
            self.observe(PoolLearned(self.store, self.resource, stats))
