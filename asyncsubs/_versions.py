"""Which of two versions of a record is the newer: one rule for the webhook receiver's
``supersedes``, the sinks' upserts and incremental high-water mark, and the dlt source's
repeated records.

Versions are ordered by a field the server stamps (``updatedAt``, or a resource's incremental
field), of one of three kinds: numbers as numbers (a string of digits too: a sink's column holds
the stamp as text, and a server may send an epoch or a sequence either way), timestamps of ISO
8601's extended form as instants (``Z`` and offsets mix; one without an offset is UTC; ``t`` and
``z`` as RFC 3339 allows; fractions of any length, as Go and .NET write nanoseconds and ticks:
to the microsecond as an instant, then by the digits beyond), other strings as text (by code
point). Stamps of two kinds, or a missing one, order nothing: the version seen later wins. The
sinks apply the same rule in SQL (``older_sql`` in PostgreSQL, ``older`` itself registered in
SQLite), with the same patterns.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final

__all__ = ["INSTANT_PATTERN", "NUMBER_PATTERN", "newer", "older", "older_sql", "version"]

#: A number as JSON writes one, or as a string of digits: up to 255 digits (PostgreSQL's
#: longest repetition) and an exponent of three, which both Python's Decimal and PostgreSQL's
#: numeric read (longer ones are text).
NUMBER_PATTERN: Final = r"[+-]?([0-9]{1,255}(\.[0-9]{0,255})?|\.[0-9]{1,255})([eE][+-]?[0-9]{1,3})?"
#: JSON integers as large as the pattern's, in absolute value.
_LARGEST: Final = 10**255
#: An instant: a date, then maybe a time to the minute, second or a fraction of one, and its
#: zone; what both Python and PostgreSQL read alike once in upper case and cut to the
#: microsecond (not hour 24, a leap second or an offset beyond 15:59, which one of them refuses).
INSTANT_PATTERN: Final = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}([Tt ]([01][0-9]|2[0-3]):[0-5][0-9]"
    r"(:[0-5][0-9](\.[0-9]{1,255})?)?([Zz]|[+-](0[0-9]|1[0-5])(:?[0-5][0-9])?)?)?"
)
#: A fraction's first six digits (what both read as an instant), and the digits beyond them.
_SUB_MICROSECOND: Final = r"(\.[0-9]{6})([0-9]+)"
_DIGITS_BEYOND: Final = r"\.[0-9]{6}([0-9]+)"  # its second group alone, for SQL's substring
_NUMBER: Final = re.compile(NUMBER_PATTERN)
_INSTANT: Final = re.compile(INSTANT_PATTERN)
_BEYOND: Final = re.compile(_SUB_MICROSECOND)


def version(stamp: Any) -> tuple[str, Any] | None:
    """``stamp``'s kind (``"number"``, ``"instant"`` or ``"text"``) and the value it compares by
    within it (a number; an aware datetime to the microsecond and the fraction of a microsecond
    beyond it, a Decimal; the text); None when it orders nothing (none, an empty string, a
    boolean, an object or a list)."""
    if isinstance(stamp, bool) or stamp is None or stamp == "":
        return None
    if isinstance(stamp, int):
        if -_LARGEST < stamp < _LARGEST:
            return "number", stamp
        try:  # longer: text, as a sink's column holds it
            return "text", str(stamp)
        except ValueError:  # past Python's digits for str(): no sink takes it either
            return None
    if isinstance(stamp, float):
        return ("number", stamp) if math.isfinite(stamp) else None
    if not isinstance(stamp, str):
        return None
    if _NUMBER.fullmatch(stamp):
        return "number", Decimal(stamp)
    if _INSTANT.fullmatch(stamp):
        beyond = _BEYOND.search(stamp)
        cut = stamp if beyond is None else stamp[: beyond.end(1)] + stamp[beyond.end() :]
        try:
            parsed = datetime.fromisoformat(cut.upper())
        except ValueError:  # a month 13, a hour 25
            return "text", stamp
        parsed = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        return "instant", (parsed, Decimal(f"0.{beyond.group(2)}" if beyond else 0))
    return "text", stamp


def older(a: Any, b: Any) -> bool:
    """Whether the version stamped ``a`` is older than the one stamped ``b``."""
    version_a, version_b = version(a), version(b)
    if version_a is None or version_b is None or version_a[0] != version_b[0]:
        return False
    return bool(version_a[1] < version_b[1])


def newer(a: Any, b: Any) -> Any:
    """The newer of two stamps, ``b`` (seen later) unless ``a`` is newer; None is no stamp."""
    return a if b is None or older(b, a) else b


def older_sql(name: str) -> str:
    """``older`` as a PostgreSQL function ``name(a text, b text) RETURNS boolean``: the same
    patterns, instants read in UTC (``SET timezone``), text compared by code point."""
    return f"""CREATE OR REPLACE FUNCTION {name}(a text, b text) RETURNS boolean
        LANGUAGE plpgsql IMMUTABLE SET timezone TO 'UTC' AS $$
        DECLARE
            number text := '^{NUMBER_PATTERN}$';
            instant text := '^{INSTANT_PATTERN}$';
            beyond text := '{_SUB_MICROSECOND}';
            digits_beyond text := '{_DIGITS_BEYOND}';
            instant_a timestamptz;
            instant_b timestamptz;
        BEGIN
            IF a IS NULL OR b IS NULL OR a = '' OR b = '' THEN
                RETURN false;
            ELSIF a ~ number OR b ~ number THEN
                RETURN a ~ number AND b ~ number AND a::numeric < b::numeric;
            END IF;
            BEGIN  -- cut to the microsecond: PostgreSQL would round the digits beyond
                instant_a := CASE WHEN a ~ instant
                    THEN upper(regexp_replace(a, beyond, '\\1'))::timestamptz END;
            EXCEPTION WHEN others THEN
                instant_a := NULL;
            END;
            BEGIN
                instant_b := CASE WHEN b ~ instant
                    THEN upper(regexp_replace(b, beyond, '\\1'))::timestamptz END;
            EXCEPTION WHEN others THEN
                instant_b := NULL;
            END;
            IF instant_a IS NOT NULL OR instant_b IS NOT NULL THEN
                IF instant_a IS NULL OR instant_b IS NULL OR instant_a <> instant_b THEN
                    RETURN instant_a IS NOT NULL AND instant_b IS NOT NULL
                        AND instant_a < instant_b;
                END IF;
                RETURN coalesce(('0.' || substring(a FROM digits_beyond))::numeric, 0)
                    < coalesce(('0.' || substring(b FROM digits_beyond))::numeric, 0);
            END IF;
            RETURN a COLLATE "C" < b COLLATE "C";
        END $$"""
