"""Records as dlt receives them: exactly as the server sent them, plus their ``store``.

The client decodes integers of any size exactly, but dlt writes what a resource yields with
orjson, which refuses integers beyond 64 bits ("Integer exceeds 64-bit range"). Such integers
become ``dlt.common.wei.Wei``, the decimal type dlt keeps for large integers: the same value,
loaded into a ``wei`` column (DuckDB ``DECIMAL(38,0)``, PostgreSQL ``NUMERIC``, BigQuery
``BIGNUMERIC``). Only a page that orjson refuses is walked, so the common page costs one dump.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import orjson
from dlt.common.wei import Wei

__all__ = ["STORE_COLUMN", "exact", "rows"]

#: The column naming each record's store: half of the primary key (``store``, ``id``).
STORE_COLUMN: Final = "store"
_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1


def exact(value: Any) -> Any:
    """``value`` with every integer beyond 64 bits (at any depth) as a ``Wei``."""
    if isinstance(value, dict):
        return {key: exact(item) for key, item in value.items()}
    if isinstance(value, list):
        return [exact(item) for item in value]
    if type(value) is int and not _INT64_MIN <= value <= _INT64_MAX:
        return Wei(value)
    return value


def rows(store: str, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One page's records for dlt, each with its ``store`` (which replaces a ``store`` field of
    the record's own: the column is the store's name in the pipeline)."""
    page = [{**record, STORE_COLUMN: store} for record in records]
    try:
        orjson.dumps(page)
    except TypeError:  # an integer beyond 64 bits somewhere: the only value orjson refuses
        page = [exact(record) for record in page]
    return page
