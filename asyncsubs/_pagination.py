"""Cursor pagination, exactly the interface's four steps, as async generators.

1. The first request is sent without afterCursor (or with the caller's resume cursor).
2. The response carries the records and pageInfo.
3. The next request passes pageInfo.nextCursor as afterCursor.
4. Repeat until pageInfo.hasNextPage is false.

A cursor that repeats would loop forever, so it raises ProtocolError. An empty page that says
more records follow is allowed (a filtered scan may pass stretches with no match), but only
``max_empty_pages`` in a row: a server that hands out fresh cursors to empty pages forever is
stopped too. A failed page fetch is retried (by the client) with the same cursor, so no record
is skipped or yielded twice. With ``page_size="max"`` the size asked comes from the path's
:class:`~asyncsubs._page_size.PageSizeSearch`, and a 400 it attributes to the size asks the same
page again, smaller.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final, Generic, Literal, TypeAlias, TypeVar

from ._config import positive_int
from ._converter import structure_records, structurer_for
from ._models import Page
from ._page_size import PageSizeSearch
from ._protocol import PageEnvelope
from .errors import BadRequestError, ConfigError, ProtocolError

__all__ = ["MAX", "FetchPage", "ListCall", "ListEndpoint", "PageSizes"]

T = TypeVar("T")
#: Fetches one page: ``GET path`` with the query; the client's rate-limited, retried request.
FetchPage: TypeAlias = Callable[[str, Mapping[str, Any]], Awaitable[PageEnvelope]]
#: The page-size search of a list path, shared by the store's pulls of it.
PageSizes: TypeAlias = Callable[[str], Awaitable[PageSizeSearch]]
#: ``list(page_size=MAX)``: the largest page the server serves, found while pulling.
MAX: Final = "max"
PAGE_SIZE: Final = "pageSize"
AFTER_CURSOR: Final = "afterCursor"
#: Pages fetched ahead of the consumer by default: overlaps one network wait with the caller's
#: work on the current page, for at most one extra page in memory.
DEFAULT_PREFETCH: Final = 1
#: Empty pages in a row (each claiming that more records follow) before a pull gives up: 250,000
#: records of a filtered scan without a match at 250 a page.
DEFAULT_MAX_EMPTY_PAGES: Final = 1_000


def _check_params(params: object) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"params must be a mapping, got {type(params).__name__}")
    reserved = {PAGE_SIZE, AFTER_CURSOR} & set(params)
    if reserved:
        raise ConfigError(
            f"pass {', '.join(sorted(reserved))} as page_size=/after_cursor=, not in params"
        )
    for key, value in params.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"params keys must be non-empty strings, got {key!r}")
        if isinstance(value, bool) or value is None:
            continue
        if not isinstance(value, str | int | float):
            raise ConfigError(f"params[{key!r}] must be str, int, float or bool, got {value!r}")
    return dict(params)


class ListCall(Generic[T]):
    """One pull of a list endpoint: iterate it for records, or ``.pages()`` for pages."""

    def __init__(
        self,
        fetch_page: FetchPage,
        path: str,
        *,
        page_size: int | Literal["max"] | None,
        after_cursor: str | None,
        params: dict[str, Any],
        structure: Callable[[Any], T] | None,
        prefetch: int = DEFAULT_PREFETCH,
        max_empty_pages: int = DEFAULT_MAX_EMPTY_PAGES,
        page_sizes: PageSizes | None = None,
    ) -> None:
        self._page_sizes = page_sizes
        self._prefetch = prefetch
        self._max_empty_pages = max_empty_pages
        self._fetch_page = fetch_page
        self._path = path
        self._page_size = page_size
        self._after_cursor = after_cursor
        self._params = params
        self._structure = structure

    def __repr__(self) -> str:
        return (
            f"<ListCall {self._path} page_size={self._page_size} "
            f"after_cursor={self._after_cursor!r}>"
        )

    async def pages(self) -> AsyncIterator[Page[T]]:
        """Yield each page; ``page.next_cursor`` is the checkpoint to resume from.

        With ``prefetch=N`` the next pages are fetched in the background while the caller works
        on the current one, never more than N pages ahead of it. Pages are still yielded in
        order, and an error surfaces after every page before it has been yielded.
        """
        if self._prefetch == 0:
            async for page in self._fetch_pages():
                yield page
            return
        # One credit per page fetched; the consumer returns one each time it asks for the next
        # page, so fetched-but-unconsumed pages never exceed `prefetch`.
        credits = asyncio.Semaphore(self._prefetch + 1)
        ready: asyncio.Queue[Page[T] | BaseException | None] = asyncio.Queue()

        async def produce() -> None:
            try:
                async for page in self._fetch_pages(credits):
                    ready.put_nowait(page)
            except BaseException as exc:  # an on_retry hook's BaseException too: never a hang
                ready.put_nowait(exc)  # raised in the consumer's task, where it belongs
                if isinstance(exc, asyncio.CancelledError):
                    raise
            else:
                ready.put_nowait(None)

        producer = asyncio.create_task(produce())
        try:
            while (item := await ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
                credits.release()
        finally:
            producer.cancel()
            # Not `await producer`: its CancelledError would pass for this task's own, which a
            # cancellation arriving meanwhile must still raise.
            await asyncio.wait({producer})

    async def _fetch_pages(
        self, credits: asyncio.Semaphore | None = None
    ) -> AsyncIterator[Page[T]]:
        cursor = self._after_cursor
        seen: set[str] = set() if cursor is None else {cursor}
        empty_in_a_row = 0
        query = dict(self._params)
        search = None
        if self._page_size == MAX and self._page_sizes is not None:
            search = await self._page_sizes(self._path)
        elif self._page_size is not None:
            query[PAGE_SIZE] = self._page_size
        while True:
            if cursor is None:
                query.pop(AFTER_CURSOR, None)
            else:
                query[AFTER_CURSOR] = cursor
            if credits is not None:
                await credits.acquire()
            if search is None:
                envelope = await self._fetch_page(self._path, query)
            else:
                envelope = await self._fetch_largest(query, search)
            next_cursor = envelope.next_cursor if envelope.has_next_page else None
            if next_cursor is not None:
                # Checked before the page is yielded, so the caller's last checkpoint
                # (this page's cursor) still re-fetches this page.
                if next_cursor in seen:
                    raise ProtocolError(
                        f"GET {self._path}: the server returned a cursor it returned before; "
                        "stopping instead of looping forever",
                        method="GET",
                        path=self._path,
                    )
                seen.add(next_cursor)
                empty_in_a_row = 0 if envelope.data else empty_in_a_row + 1
                if empty_in_a_row > self._max_empty_pages:
                    raise ProtocolError(
                        f"GET {self._path}: {empty_in_a_row} empty pages in a row, each claiming "
                        "that more records follow; stopping (pass a larger max_empty_pages= "
                        "for a sparse filter over a very large store)",
                        method="GET",
                        path=self._path,
                    )
            records = structure_records(
                envelope.data, self._structure, method="GET", path=self._path
            )
            yield Page(
                data=records,
                cursor=cursor,
                next_cursor=next_cursor,
                has_next_page=envelope.has_next_page,
            )
            if next_cursor is None:
                return
            cursor = next_cursor

    async def _fetch_largest(self, query: dict[str, Any], search: PageSizeSearch) -> PageEnvelope:
        """The page at ``query``'s cursor, as large as ``search`` says; a 400 that it takes for
        one about the size is answered by asking the same page again, smaller."""
        while True:
            query[PAGE_SIZE] = size = search.ask()
            try:
                envelope = await self._fetch_page(self._path, query)
            except BadRequestError as exc:
                if not search.refused_size(size, f"{exc.code or ''} {exc.message or ''}"):
                    raise
                continue
            search.served(size, len(envelope.data), envelope.has_next_page)
            return envelope

    async def __aiter__(self) -> AsyncIterator[T]:
        async for page in self.pages():
            for record in page.data:
                yield record


class ListEndpoint(Generic[T]):
    """A list endpoint of the admin interface, e.g. ``client.subscriptions``."""

    def __init__(
        self,
        fetch_page: FetchPage,
        path: str,
        model: type[T] | Any,
        page_sizes: PageSizes | None = None,
    ) -> None:
        self._fetch_page = fetch_page
        self._page_sizes = page_sizes
        self.path = path
        self.model = model

    def __repr__(self) -> str:
        return f"<ListEndpoint {self.path} model={getattr(self.model, '__name__', self.model)}>"

    def list(
        self,
        *,
        page_size: int | Literal["max"] | None = None,
        after_cursor: str | None = None,
        params: Mapping[str, Any] | None = None,
        model: type[Any] | None = None,
        prefetch: int = DEFAULT_PREFETCH,
        max_empty_pages: int = DEFAULT_MAX_EMPTY_PAGES,
    ) -> ListCall[Any]:
        """Records of this endpoint, fetched page by page.

        - ``page_size``: records per request (the server may clamp it); None = server default;
          ``"max"``: the largest page the server serves, learned while pulling (from pages cut
          short and from 400s to larger sizes, which never fail the pull) and remembered by the
          store's limiter for the next pull of the path.
        - ``after_cursor``: resume after a page whose ``next_cursor`` you saved.
        - ``params``: extra query parameters passed through (e.g. ``{"status": "ACTIVE"}``).
        - ``model``: ``dict`` for plain dicts (no structuring cost), or any attrs class.
        - ``prefetch``: pages fetched ahead while you work on the current one (0 = none).
        - ``max_empty_pages``: empty pages in a row that claim more records follow before the
          pull raises ProtocolError (0 = none allowed).
        """
        for name, value in (("prefetch", prefetch), ("max_empty_pages", max_empty_pages)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an int >= 0, got {value!r}")
        if after_cursor is not None and (not isinstance(after_cursor, str) or not after_cursor):
            raise ConfigError(f"after_cursor must be a non-empty string, got {after_cursor!r}")
        if page_size == MAX and self._page_sizes is None:
            raise ConfigError('page_size="max" needs a client that learns page sizes')
        if page_size is not None and page_size != MAX:
            positive_int('page_size (or "max")', page_size)
        return ListCall(
            self._fetch_page,
            self.path,
            page_size=page_size,
            after_cursor=after_cursor,
            params=_check_params(params),
            structure=structurer_for(self.model if model is None else model),
            prefetch=prefetch,
            max_empty_pages=max_empty_pages,
            page_sizes=self._page_sizes,
        )
