"""JSON in and out with every integer exact, orjson for speed.

orjson reads integers beyond 64 bits as floats (``18446744073709551617`` and ``…618`` become one
number, in ``raw`` too, and a sync would merge two records) and refuses to write them. The rare
body or value with such an integer goes through the standard library instead, which keeps
integers whole; everything else through orjson, several times faster.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

import orjson

__all__ = ["dumps", "loads"]

#: Maps every ASCII digit to "0", so that one ``in`` finds a run of digits of a given length.
_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
#: Runs of digits that may be an integer beyond 64 bits: 20 digits or more, or 19 after a minus
#: (orjson reads integers from -2**63 to 2**64 - 1 exactly).
_LONG_POSITIVE: Final = b"0" * 20
_LONG_NEGATIVE: Final = b"-" + b"0" * 19
#: In both of those: one search rules them out in most bodies (19-digit ids call for the two).
_LONG_EITHER: Final = b"0" * 19


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # orjson refuses 1e999 too
        raise ValueError("a number is out of range")
    return value


def _refuse_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def loads(body: bytes | str) -> Any:
    """Decode JSON, every integer exact. Raises ValueError (only) for anything that is not JSON,
    nested too deeply included."""
    if isinstance(body, str):
        body = body.encode()
    marked = body.translate(_DIGITS_TO_ZERO)
    if _LONG_EITHER not in marked or (
        _LONG_POSITIVE not in marked and _LONG_NEGATIVE not in marked
    ):
        return orjson.loads(body)  # JSONDecodeError is a ValueError
    try:
        value = json.loads(
            body.decode("utf-8"), parse_float=_finite_float, parse_constant=_refuse_constant
        )
        # As orjson: a lone surrogate ("\ud800") is no character (RFC 8259 8.2), so no JSON.
        json.dumps(value, ensure_ascii=False).encode()  # raises UnicodeEncodeError, a ValueError
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    return value


def dumps(value: Any) -> bytes:
    """Encode ``value`` as compact JSON, integers beyond 64 bits included. Raises
    ``orjson.JSONEncodeError`` (a TypeError) for what JSON cannot carry (keys that are not
    strings, types other than JSON's)."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        if "64-bit" not in str(exc):  # orjson: "Integer exceeds 64-bit range"
            raise
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise orjson.JSONEncodeError(str(exc)) from None
    return text.encode()
