"""JSON in and out with every integer exact: msgspec to read, orjson to write.

msgspec reads integers of any size exactly, at orjson's speed; orjson reads those beyond 64 bits
as floats (``18446744073709551617`` and ``…618`` become one number, in ``raw`` too, and a sync
would merge two records) and refuses to write them, which the standard library does instead.
What is not JSON is refused with orjson's description of it (where, and why: a lone surrogate,
a number out of range), and a body nested deeper than the stack lets msgspec go is read by
orjson to its fixed 1,024 levels, as long as no run of digits in it could be a large integer.
"""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec
import orjson

__all__ = ["dumps", "loads", "may_hold_a_long_integer"]

_DECODER: Final = msgspec.json.Decoder()
#: Maps every ASCII digit to "0", so that one ``in`` finds a run of 19 digits: the shortest that
#: may be an integer beyond 64 bits (orjson reads -2**63 to 2**64 - 1 exactly).
_DIGITS_TO_ZERO: Final = bytes.maketrans(b"123456789", b"000000000")
_LONG_DIGITS: Final = b"0" * 19


def loads(body: bytes | str) -> Any:
    """Decode JSON, every integer exact. Raises ValueError (only) for anything that is not JSON,
    nested too deeply included."""
    try:
        return _DECODER.decode(body)
    except RecursionError:  # msgspec nests as deep as the stack allows; orjson to 1,024 levels
        pass
    except ValueError:  # DecodeError, or UnicodeError for what is not UTF-8
        orjson.loads(body)  # raises JSONDecodeError (a ValueError) saying where and why
        raise  # orjson read what msgspec refused (an integer of 4,300 digits): refused still
    encoded = body.encode() if isinstance(body, str) else body
    if may_hold_a_long_integer(encoded):  # orjson would round such an integer
        raise ValueError("JSON nested too deeply") from None
    return orjson.loads(encoded)


def may_hold_a_long_integer(encoded: bytes) -> bool:
    """Whether JSON ``encoded`` may hold an integer beyond 64 bits signed: a run of 19 digits
    (in a string too: then it holds none, and the answer costs a closer look only)."""
    return _LONG_DIGITS in encoded.translate(_DIGITS_TO_ZERO)


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
