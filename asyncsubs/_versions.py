"""Which of two versions of a record is the newer: one rule for the webhook receiver's
``supersedes``, the sinks' incremental high-water mark and the dlt source's repeated records.

Versions are ordered by a field the server stamps (``updatedAt``, or a resource's incremental
field): timestamps as instants (``Z`` and offsets mix; one without an offset is UTC), numbers
as numbers, other strings as text. Values that do not compare (one missing, a number and a
string) order nothing: the version seen later wins, as in the sinks' SQL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["newer", "older"]


def _instant(value: str) -> datetime:
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def older(a: Any, b: Any) -> bool:
    """Whether the version stamped ``a`` is older than the one stamped ``b``."""
    if isinstance(a, str) and isinstance(b, str):
        try:
            return _instant(a) < _instant(b)
        except ValueError:
            return a < b
    numbers = [isinstance(v, int | float) and not isinstance(v, bool) for v in (a, b)]
    return all(numbers) and bool(a < b)


def newer(a: Any, b: Any) -> Any:
    """The newer of two stamps, ``b`` (seen later) unless ``a`` is newer; None is no stamp."""
    return a if b is None or older(b, a) else b
