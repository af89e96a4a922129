"""Records as dlt receives them: as the server sent them, plus their ``store`` and the order
they were served in.

A server listing by modification time serves a record changed during a pull twice, its old
version first, and dlt's merge keeps an arbitrary row per key of one load unless a column
orders them. The newest wins, as in ``asyncsubs sync``: ``SEQ_COLUMN`` (hinted ``dedup_sort:
desc``) numbers the rows as served, and a version older by the incremental field than one
already yielded is dropped. Integers beyond 64 bits signed become dlt's ``Wei`` (a decimal
column), in the rare page that may hold one: orjson, which dlt writes rows with, refuses those
beyond 64 bits unsigned, and a signed 64-bit column those from 2**63.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final

import orjson
from dlt.common.normalizers.naming.snake_case import NamingConvention
from dlt.common.wei import Wei

from .._json import may_hold_a_long_integer
from .._versions import older, version
from ._deletes import DELETED_COLUMN

__all__ = ["OWN_PREFIX", "SEQ_COLUMN", "STORE_COLUMN", "Served", "exact"]

#: The column naming each record's store: half of the primary key (``store``, ``id``).
STORE_COLUMN: Final = "store"
#: The column numbering rows in the order the source received them (larger: served later).
SEQ_COLUMN: Final = "asyncsubs_seq"
#: What a record's own field becomes when dlt's names would put it in one of the source's
#: columns (``Store``, ``ID``, a ``store`` of its own): ``record_Store``, kept beside them.
OWN_PREFIX: Final = "record_"
_OURS: Final = frozenset({STORE_COLUMN, "id", SEQ_COLUMN, DELETED_COLUMN})
#: dlt's default names (snake_case), which ``Store`` and ``store`` share.
_NAMES: Final = NamingConvention()


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
        self._plain: set[str] = set()  # records' keys dlt names other than the source's columns
        self._next = time.time_ns()
        self._newest: dict[tuple[str, str], Any] = {}
        #: Versions dropped because the run had already yielded a newer one.
        self.dropped = 0
        #: The newest ``field`` value yielded (the next high-water mark), None before one.
        self.newest: Any = None

    def _newer_or_equal(self, store: str, record: dict[str, Any]) -> bool:
        key = (store, str(record["id"]))
        value = record.get(self._field) if self._field is not None else None
        if key in self._newest and older(value, self._newest[key]):
            self.dropped += 1
            return False
        self._newest[key] = value
        # Only a stamp that orders (an empty one, a boolean would stay the mark for good).
        if version(value) is not None and (self.newest is None or older(self.newest, value)):
            self.newest = value
        return True

    def _own(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with a field dlt would name as one of the source's columns renamed
        (``OWN_PREFIX``): it would overwrite the row's key or its order."""
        plain = self._plain
        if plain.issuperset(record):  # the keys of every record but the first few
            return record
        ours = set()
        for key in record.keys() - plain:
            if key != "id" and _NAMES.normalize_identifier(key) in _OURS:
                ours.add(key)
            else:
                plain.add(key)
        if not ours:
            return record
        taken = {_NAMES.normalize_identifier(key) for key in record if key not in ours}
        renamed = {}
        for key in ours:
            name = OWN_PREFIX + key
            while _NAMES.normalize_identifier(name) in taken:  # a record_store of its own too
                name = OWN_PREFIX + name
            taken.add(_NAMES.normalize_identifier(name))
            renamed[key] = name
        return {renamed.get(key, key): value for key, value in record.items()}

    def rows(self, store: str, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """One page's records for dlt, numbered, older versions left out; each with its
        ``store``, and its own fields dlt would name as the source's columns renamed."""
        if self._field is not None:
            records = [r for r in records if self._newer_or_equal(store, r)]
        page = [{**self._own(record), STORE_COLUMN: store} for record in records]
        try:
            # orjson writes integers up to 2**64 - 1, which a signed 64-bit column cannot take.
            outside = may_hold_a_long_integer(orjson.dumps(page))
        except TypeError:  # an integer beyond 64 bits somewhere: the only value orjson refuses
            outside = True
        if outside:
            page = [exact(record) for record in page]
        self.number(page)
        return page

    def number(self, page: list[dict[str, Any]]) -> None:
        """Number rows the source made itself (deletes) in their turn."""
        for offset, row in enumerate(page):
            row[SEQ_COLUMN] = self._next + offset
        self._next += len(page)
