"""What a response says about the server's rate limit: pure parsing, no I/O.

Reads the IETF draft's ``RateLimit-Policy: "p";q=40;w=1`` (``q`` requests per ``w`` s; other units
``qu`` skipped), ``RateLimit: "p";r=0;t=1`` (``r`` left, reset in ``t`` s), older drafts'
``RateLimit-Limit``/``-Remaining``/``-Reset`` and ``X-RateLimit-*`` (no window: the pool's own; the
reset maybe a Unix time). The lowest quota per second and the item with the fewest left win.
Malformed values, quotas >= 10**9 and durations over a day (which would stick a pool) are ignored,
never raised: a hint is advice, a 429 and Retry-After rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import attrs

__all__ = ["ServerLimit", "parse_server_limit"]

_HUGE, _DAY = 1e9, 86_400.0  # a quota this large is no limit, a reset this large a Unix time
_NAMES = frozenset(("ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining"))
_NAMES |= {"x-ratelimit-limit", "x-ratelimit-remaining"}


@attrs.frozen
class ServerLimit:
    """``quota`` requests per ``window`` s (None: the pool's own); ``remaining`` until ``reset``."""

    quota: int | None = None
    window: float | None = None
    remaining: int | None = None
    reset: float | None = None


def _number(text: str | None, most: float = math.inf) -> float | None:
    try:
        value = float((text or "").strip().strip('"'))
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= most else None


def _items(header: str) -> list[dict[str, str]]:
    """Structured-field list items as {parameter: raw value}; a bare leading value is "q"."""
    items = []
    for item in header.split(","):
        head, *parts = item.split(";")
        pairs = (part.partition("=") for part in parts)
        params = {key.strip().lower(): value.strip().strip('"') for key, _, value in pairs}
        items.append({"q": head, **params} if _number(head) is not None else params)
    return items


def _policy(header: str) -> tuple[int | None, float | None]:
    """The lowest request quota per second of a list of policies, and its window if named."""
    best: tuple[int | None, float | None] = (None, None)
    for params in _items(header):
        q, w = _number(params.get("q"), _HUGE - 1), _number(params.get("w", "1"), _DAY)
        if params.get("qu", "requests") != "requests" or not q or q < 1 or not w:
            continue  # a quota of bytes or of "content" says nothing about request starts
        if best[0] is None or q / w < best[0] / (best[1] or 1.0):
            best = int(q), (w if "w" in params else None)
    return best


def parse_server_limit(
    headers: Mapping[str, str], *, now: float | None = None
) -> ServerLimit | None:
    """The limit a response announces, or None when it announces none (or only nonsense)."""
    if _NAMES.isdisjoint(headers):  # most responses: nothing to read
        return None

    def older(name: str) -> str:  # older drafts' RateLimit-* or the common X-RateLimit-*
        return headers.get(f"ratelimit-{name}") or headers.get(f"x-ratelimit-{name}") or ""

    # Older drafts' "RateLimit-Limit: 100, 100;w=60" reads as the quota, then policies.
    quota, window = _policy(headers.get("ratelimit-policy") or older("limit"))
    items = [i for i in _items(headers.get("ratelimit", "")) if _number(i.get("r")) is not None]
    current = min(items, key=lambda i: _number(i["r"]) or 0.0) if items else {}
    remaining = _number(current.get("r") or older("remaining"))
    reset = _number(current.get("t") or older("reset"))
    if reset is not None and reset >= _HUGE:  # a Unix time
        reset = max(0.0, reset - (time.time() if now is None else now))
    reset = reset if reset is not None and reset <= _DAY else None
    if quota is None and remaining is None:
        return None
    return ServerLimit(quota, window, None if remaining is None else int(remaining), reset)
