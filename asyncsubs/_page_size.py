"""The largest page a list path serves, found while pulling (``page_size="max"``): pure state.

The interface does not say pageSize's maximum, and a bulk pull runs at (pool's rate) x (records
per page). :class:`PageSizeSearch` is one path's search, shared by the store's pulls of the path
in an event loop and, as a part of the path's record (:mod:`._learned`), with other loops,
workers and runs; :func:`page_size_search` finds it for a pull.
"""

from __future__ import annotations

from typing import Any, Final

from ._discovery import Learned
from ._learned import StoreLearning

__all__ = ["FIRST_PAGE_ASK", "MAX_PAGE_ASK", "PageSizeSearch", "page_size_search"]

#: The first page size a ``page_size="max"`` pull asks for, and the most it ever asks for. The
#: ladder: the round sizes servers' maxima tend to be; a page served in full is followed by one
#: of the next size up, a 400 with nothing accepted yet steps down it, and a 400 at its last
#: rung is not about the page size. A 400 that does not name the page size steps down to
#: ``UNNAMED_LAST_RUNG`` only: below it, such a 400 is more likely about something else (a
#: filter) than a server's maximum.
FIRST_PAGE_ASK: Final = 1_000
MAX_PAGE_ASK: Final = 10_000
PAGE_LADDER: Final = (MAX_PAGE_ASK, 5_000, 2_500, 1_000, 500, 250, 100, 50, 25, 10, 1)
UNNAMED_LAST_RUNG: Final = 50
#: How a 400's code or message names the page size, lower-cased.
_SIZE_WORDS: Final = ("pagesize", "page_size", "page size", "page-size")
#: Narrowing stops once the refused size is within this share of the accepted one.
PAGE_TOLERANCE: Final = 0.02


class PageSizeSearch:
    """The largest page a list endpoint serves, found while pulling (``page_size="max"``).

    It asks ``FIRST_PAGE_ASK`` records and learns from what comes back:

    - **clamping**: fewer records than asked while more follow, the same count twice in a row
      (one short page may be a filtered stretch): that count is the size;
    - **400s**: a 400 to a size larger than any accepted is about the size: the same page is
      asked again smaller, down ``PAGE_LADDER`` while nothing was accepted, then narrowing
      between the largest accepted and the smallest refused (first one past the accepted: a
      server's maximum is often a round number), never twice the same size; a 400 to a size
      accepted before, at the ladder's last rung (``UNNAMED_LAST_RUNG`` unless it names the
      page size), or naming the cursor and not the page size (an expired cursor) is about
      something else and fails;
    - a page served in full is followed by one of the ladder's next size, up to
      ``MAX_PAGE_ASK``.
    """

    __slots__ = ("_clamped", "_first", "_full", "_tried_next", "accepted", "by", "refused", "size")

    def __init__(self) -> None:
        self.size: int | None = None
        self.by: str | None = None
        self.accepted = 0
        self.refused: int | None = None
        self._full, self._first = 0, FIRST_PAGE_ASK
        self._clamped: int | None = None
        self._tried_next = False

    def ask(self) -> int:
        """The size to ask for now."""
        if self.size is not None:
            return self.size
        low, high = self.accepted, self.refused
        if high is None:
            if low == 0:
                return self._first
            if self._full == low:  # served in full: maybe more
                return next((rung for rung in reversed(PAGE_LADDER) if rung > low), low)
            return low
        if low == 0:
            return next(rung for rung in PAGE_LADDER if rung < high)
        if high - low <= max(1.0, low * PAGE_TOLERANCE):
            self._learn(low, "400")
            return low
        if not self._tried_next:
            self._tried_next = True
            return low + 1
        return (low + high) // 2

    def _learn(self, size: int, by: str) -> None:
        self.size, self.by = size, by

    def refused_size(self, size: int, reason: str = "") -> bool:
        """A 400 answered a request for ``size`` records (``reason``: its code and message):
        True when the same page should be asked again at a smaller size (``ask()``), False when
        the 400 is not about the size."""
        said = reason.lower()
        names_size = any(word in said for word in _SIZE_WORDS)
        if "cursor" in said and not names_size:
            return False
        last = PAGE_LADDER[-1] if names_size else UNNAMED_LAST_RUNG
        if size <= self.accepted or (self.accepted == 0 and size <= last):
            if self.accepted == 0:
                self.refused = None  # nothing was ever accepted: the 400s were not about size
            return False
        self.refused = size if self.refused is None else min(self.refused, size)
        if self.size is not None and self.size >= size:
            self.size = self.by = None  # the server serves less than it did
        return True

    def served(self, size: int, count: int, has_next: bool) -> None:
        """A request for ``size`` records was answered with ``count`` of them."""
        self.accepted = max(self.accepted, size)
        if count >= size:
            self._full = max(self._full, size)
            self._clamped = None
        elif has_next:
            if self._clamped == count and count > 0:
                self._learn(count, "clamp")
            self._clamped = count
        if self.size is None and self.refused is not None and self.refused - self.accepted <= 1:
            self._learn(self.accepted, "400")

    def snapshot(self, now: float = 0.0) -> dict[str, Any]:
        return {
            "page_size": self.size,
            "page_by": self.by,
            "page_accepted": self.accepted,
            "page_refused": self.refused,
        }

    def take(self, learned: Learned, now: float, *, imported: bool) -> None:
        """Take in an import (a record of an earlier run) or another holder's record."""
        if imported:
            self.restore(learned)
        else:
            self.adopt(learned)

    def stats(self) -> dict[str, Any]:
        return {"page_size": self.size, "page_size_by": self.by}

    def restore(self, learned: Learned) -> None:
        """Start from what was learned before. Nothing counts as accepted until this run sees
        it: a server that lowered its maximum meanwhile is searched again, not failed."""
        self.accepted = self._full = 0
        if learned.expired():  # asked again at the size it knew, and above if served in full
            self.size = self.by = self.refused = None
            self._first = learned.page_size or FIRST_PAGE_ASK
            return
        self.size, self.refused = learned.page_size, learned.page_refused
        self.by = None if learned.page_size is None else "remembered"

    def adopt(self, learned: Learned) -> None:
        """Take in what another holder of the path learned in its pulls."""
        if learned.page_size is not None:
            self.size, self.by = learned.page_size, learned.page_by
        self.accepted = max(self.accepted, learned.page_accepted)
        refused = [r for r in (self.refused, learned.page_refused) if r is not None]
        self.refused = min(refused, default=None)


def route(path: str) -> str:
    """The list ``path`` as its route, under which its page size is learned: a segment between
    two others that holds a digit is an id, as REST nests them (``customers/{id}/orders``). A
    pull of each customer's orders learns one page size for all, and holds one key, not one
    per customer. Other paths are their own route (``reports/daily``, ``a/b/c``)."""
    segments = path.split("/")
    for i in range(1, len(segments) - 1, 2):
        if any(c.isdigit() for c in segments[i]):
            segments[i] = "{id}"
    return "/".join(segments)


async def page_size_search(
    learning: StoreLearning, path: str, *, heavy: bool = False
) -> PageSizeSearch:
    """The page-size search of list ``path``'s route (of a ``heavy`` pool's path: its own, the
    pool's key), shared by every pull of it in this loop and with the backend's other holders."""
    key = path if heavy else route(path)
    search = learning.part(key, PageSizeSearch)
    await learning.ready(key)
    return search
