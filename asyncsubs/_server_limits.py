"""What a response says about the server's rate limit: pure parsing, no I/O.

Two header families are read (names are lower-case, as the transport hands them over):

- the IETF draft (draft-ietf-httpapi-ratelimit-headers): ``RateLimit-Policy: "p";q=40;w=1``
  (quota ``q`` per window ``w`` seconds; a policy whose quota unit ``qu`` is not "requests" is
  skipped, ``pk`` is ignored) and ``RateLimit: "p";r=0;t=1`` (``r`` left, reset in ``t``
  seconds). Older drafts' ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` are read too.
- the common ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset``, the reset in delta seconds or
  as a Unix time (values of 10**9 and more). These name no window: the pool's own is assumed.

Several policies: the most restrictive (lowest quota per second) wins. Malformed values are
ignored, never raised: a hint is advice, the 429 and its Retry-After stay the rule.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import attrs

__all__ = ["ServerLimit", "parse_server_limit"]

_EPOCH = 1e9  # a reset this large is a Unix time, not a delta
_NAMES = frozenset(("ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining"))
_NAMES |= {"x-ratelimit-limit", "x-ratelimit-remaining"}


@attrs.frozen
class ServerLimit:
    """A server's announced limit: ``quota`` requests per ``window`` seconds (None: no window
    named, the pool's own applies), and ``remaining`` of them until ``reset`` seconds from now."""

    quota: int | None = None
    window: float | None = None
    remaining: int | None = None
    reset: float | None = None


def _number(text: str) -> float | None:
    try:
        value = float(text.strip().strip('"'))
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _items(header: str) -> list[dict[str, str]]:
    """Structured-field list items as {parameter: raw value}; a bare leading value is "q"."""
    items = []
    for item in header.split(","):
        head, *parts = item.split(";")
        params = {"q": head} if _number(head) is not None else {}
        for part in parts:
            key, _, value = part.partition("=")
            params[key.strip().lower()] = value.strip().strip('"')
        items.append(params)
    return items


def _reset(text: str | None, now: float) -> float | None:
    value = None if text is None else _number(text)
    if value is None:
        return None
    return max(0.0, value - now) if value >= _EPOCH else value


def parse_server_limit(
    headers: Mapping[str, str], *, now: float | None = None
) -> ServerLimit | None:
    """The limit a response announces, or None when it announces none (or only nonsense)."""
    if _NAMES.isdisjoint(headers):  # most responses: nothing to read
        return None
    now = time.time() if now is None else now
    quota: int | None = None
    window: float | None = None
    for params in _items(headers.get("ratelimit-policy", "")):
        if params.get("qu", "requests") != "requests":
            continue  # a quota of bytes or of "content" says nothing about request starts
        q, w = _number(params.get("q", "")), _number(params.get("w", "1"))
        if q is None or q < 1 or not w:
            continue
        if quota is None or q / w < quota / (window or 1.0):
            quota, window = int(q), (w if "w" in params else None)
    current = _items(headers["ratelimit"])[0] if "ratelimit" in headers else {}
    remaining = _number(current["r"]) if "r" in current else None
    if remaining is None:
        text = headers.get("ratelimit-remaining") or headers.get("x-ratelimit-remaining")
        remaining = None if text is None else _number(text)
    reset = _number(current["t"]) if "t" in current else None
    if reset is None:
        reset = _reset(headers.get("ratelimit-reset") or headers.get("x-ratelimit-reset"), now)
    if quota is None:
        limit_text = headers.get("ratelimit-limit") or headers.get("x-ratelimit-limit")
        # "RateLimit-Limit: 40, 40;w=1" (older drafts): the first item is the quota.
        first = _number(limit_text.split(",")[0].split(";")[0]) if limit_text else None
        if first is not None and first >= 1:
            quota = int(first)
    if quota is None and remaining is None:
        return None
    return ServerLimit(
        quota=quota,
        window=window,
        remaining=None if remaining is None else int(remaining),
        reset=reset,
    )
