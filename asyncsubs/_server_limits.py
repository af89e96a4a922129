"""What a response says about the server's rate limit: pure parsing, no I/O.

The IETF draft's ``RateLimit-Policy: "p";q=40;w=1`` (``q`` requests per ``w`` s, unless ``qu``
names another unit) and ``RateLimit: "p";r=0;t=1`` (``r`` left, reset in ``t`` s); older drafts'
``RateLimit-*`` and ``X-RateLimit-*`` (no window: the pool's own; the reset maybe a Unix time).
Each is read as a structured list (RFC 9651), ignored whole if malformed, as the draft says. The
lowest quota per second wins; of the items with the fewest left, the latest reset. Non-numbers,
quotas >= 10**9 and durations over a day (which would stick a pool) are ignored: hints advise.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import attrs
import http_sf

__all__ = ["ServerLimit", "parse_server_limit"]

_HUGE, _DAY = 1e9, 86_400.0  # a quota this large is no limit, a reset this large a Unix time
_NAMES = {"ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining"}
_NAMES |= {"x-ratelimit-limit", "x-ratelimit-remaining"}


@attrs.frozen
class ServerLimit:
    """``quota`` requests per ``window`` s (None: the pool's own); ``remaining`` until ``reset``."""

    quota: int | None = None
    window: float | None = None
    remaining: int | None = None
    reset: float | None = None


def _number(value: Any, *, whole: bool = False) -> float | None:
    """A structured Integer (or Decimal, unless ``whole``: ``q``, ``r``) >= 0, else None."""
    is_number = type(value) is int or (type(value) is Decimal and not whole)  # not a Boolean
    return float(value) if is_number and value >= 0 else None


@functools.lru_cache(maxsize=256)  # a server repeats its fields: parsed once, read-only after
def _items(field: str | None, bare: str) -> tuple[dict[str, Any], ...]:
    """A structured list's items as their parameters, a bare number as ``bare`` (``100,
    100;w=60``, ``X-RateLimit-Remaining: 5``); none if the field does not parse."""
    try:
        parsed: Any = http_sf.parse((field or "").encode(), tltype="list")
    except ValueError:  # StructuredFieldError, or a character outside ASCII
        return ()
    return tuple({bare: v, **params} if _number(v) is not None else params for v, params in parsed)


def _policy(items: tuple[dict[str, Any], ...]) -> tuple[int | None, float | None]:
    """The lowest request quota per second of a list of policies, and its window if named."""
    best: tuple[int | None, float | None] = (None, None)
    for params in items:
        q, w = _number(params.get("q"), whole=True), _number(params.get("w", 1))
        if str(params.get("qu", "requests")) != "requests" or not q or q >= _HUGE or not w:
            continue  # a quota of bytes or of "content" says nothing about request starts
        if w <= _DAY and (best[0] is None or q / w < best[0] / (best[1] or 1.0)):
            best = int(q), (w if "w" in params else None)
    return best


def parse_server_limit(
    headers: Mapping[str, str], *, now: float | None = None
) -> ServerLimit | None:
    """The limit a response announces, or None when it announces none (or only nonsense)."""
    if _NAMES.isdisjoint(headers):  # most responses: nothing to read
        return None

    def older(name: str, bare: str) -> tuple[dict[str, Any], ...]:  # older drafts', X-RateLimit-*
        return _items(headers.get(f"ratelimit-{name}") or headers.get(f"x-ratelimit-{name}"), bare)

    quota, window = _policy(_items(headers.get("ratelimit-policy"), "q") or older("limit", "q"))
    plain = {**next(iter(older("remaining", "r")), {}), **next(iter(older("reset", "t")), {})}
    items = [*_items(headers.get("ratelimit"), "r"), plain]
    items = [i for i in items if _number(i.get("r"), whole=True) is not None]
    left = min(items, key=lambda i: (i["r"], -(_number(i.get("t")) or 0.0)), default={})
    reset = _number(left.get("t"))
    if reset is not None and reset >= _HUGE:  # a Unix time
        reset = max(0.0, reset - (time.time() if now is None else now))
    reset = reset if reset is not None and reset <= _DAY else None
    limit = ServerLimit(quota, window, left.get("r"), reset)  # r: an Integer >= 0, as filtered
    return None if quota is None and limit.remaining is None else limit
