"""Records as dlt receives them: as the server sent them, plus their ``store`` and the order
they were served in.

A server listing by modification time serves a record changed during a pull twice, its old
version first, and dlt's merge keeps an arbitrary row per key of one load unless a column
orders them. The newest wins, as in ``asyncsubs sync``: ``SEQ_COLUMN`` (hinted ``dedup_sort:
desc``) numbers the rows as served, and a version older by the incremental field than one
already yielded is dropped. dlt writes rows with orjson, which refuses integers beyond 64 bits:
those become dlt's ``Wei`` (a decimal column), in the rare page orjson refuses.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

import orjson
from dlt.common.wei import Wei

from .._versions import older

__all__ = ["SEQ_COLUMN", "STORE_COLUMN", "Served", "exact"]

#: The column naming each record's store: half of the primary key (``store``, ``id``).
STORE_COLUMN: Final = "store"
#: The column numbering rows in the order the source received them (larger: served later).
SEQ_COLUMN: Final = "asyncsubs_seq"


def exact(value: Any) -> Any:
    """``value`` with every integer beyond 64 bits (at any depth) as a ``Wei``."""
    if isinstance(value, dict):
        return {key: exact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [exact(item) for item in value]
    if type(value) is int and not -(2**63) <= value < 2**63:
        return Wei(value)
    return value


class Served:
    """The rows of one resource's run, numbered as served from the run's start in nanoseconds
    (so across runs too); a version older by ``field`` than one yielded before is dropped."""

    def __init__(self, field: str | None = None) -> None:
        self._field = field
        self._next = time.time_ns()
        self._newest: dict[tuple[str, str], Any] = {}
        #: Versions dropped because the run had already yielded a newer one.
        self.dropped = 0

    def _newer_or_equal(self, store: str, record: dict[str, Any]) -> bool:
        key = (store, str(record["id"]))
        value = record.get(self._field) if self._field is not None else None
        if key in self._newest and older(value, self._newest[key]):
            self.dropped += 1
            return False
        self._newest[key] = value
        return True

    def rows(self, store: str, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """One page's records for dlt, numbered, older versions left out; each with its
        ``store`` (in place of a ``store`` field of its own: the column is the pipeline's)."""
        if self._field is not None:
            records = [r for r in records if self._newer_or_equal(store, r)]
        page = [{**record, STORE_COLUMN: store} for record in records]
        try:
            orjson.dumps(page)
        except TypeError:  # an integer beyond 64 bits somewhere: the only value orjson refuses
            page = [exact(record) for record in page]
        self.number(page)
        return page

    def number(self, page: list[dict[str, Any]]) -> None:
        """Number rows the source made itself (deletes) in their turn."""
        for offset, row in enumerate(page):
            row[SEQ_COLUMN] = self._next + offset
        self._next += len(page)
