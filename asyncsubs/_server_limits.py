"""What a response says about the server's rate limit: pure parsing, no I/O.

Two header families are read (names are lower-case, as the transport hands them over):

- the IETF draft (draft-ietf-httpapi-ratelimit-headers): ``RateLimit-Policy: "p";q=40;w=1``
  (quota ``q`` per window ``w`` seconds; a policy whose quota unit ``qu`` is not "requests" is
  skipped, ``pk`` is ignored) and ``RateLimit: "p";r=0;t=1`` (``r`` left, reset in ``t``
  seconds). Older drafts' ``RateLimit-Limit`` / ``-Remaining`` / ``-Reset`` are read too.
- the common ``X-RateLimit-Limit`` / ``-Remaining`` / ``-Reset``, the reset in delta seconds or
  as a Unix time (values of 10**9 and more). These name no window: the pool's own is assumed.

Several policies: the most restrictive (lowest quota per second) wins, and of several
``RateLimit`` items the one with the fewest requests left. Malformed values are ignored, never
raised: a hint is advice, the 429 and its Retry-After stay the rule. So are quotas of 10**9 and
more and durations (windows, resets) over a day: no real limit says them, and a pool paced by
one, or held until it, would be stuck.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

import attrs

__all__ = ["ServerLimit", "parse_server_limit"]

_EPOCH = 1e9  # a reset this large is a Unix time, not a delta
_MAX_QUOTA = 1e9
_MAX_SECONDS = 86_400.0
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


def _seconds(text: str | None) -> float | None:
    value = None if text is None else _number(text)
    return value if value is not None and value <= _MAX_SECONDS else None


def _reset(text: str | None, now: float) -> float | None:
    value = None if text is None else _number(text)
    if value is not None and value >= _EPOCH:
        value = max(0.0, value - now)
    return value if value is not None and value <= _MAX_SECONDS else None


def _policy(header: str) -> tuple[int | None, float | None]:
    """The most restrictive request quota of a list of policies, and its window (None when the
    policy names none: the pool's own applies)."""
    quota: int | None = None
    window: float | None = None
    for params in _items(header):
        if params.get("qu", "requests") != "requests":
            continue  # a quota of bytes or of "content" says nothing about request starts
        q, w = _number(params.get("q", "")), _seconds(params.get("w", "1"))
        if q is None or not 1 <= q < _MAX_QUOTA or not w:
            continue
        if quota is None or q / w < quota / (window or 1.0):
            quota, window = int(q), (w if "w" in params else None)
    return quota, window


def parse_server_limit(
    headers: Mapping[str, str], *, now: float | None = None
) -> ServerLimit | None:
    """The limit a response announces, or None when it announces none (or only nonsense)."""
    if _NAMES.isdisjoint(headers):  # most responses: nothing to read
        return None
    now = time.time() if now is None else now
    quota, window = _policy(headers.get("ratelimit-policy", ""))
    if quota is None:
        # "RateLimit-Limit: 100, 100;w=60" (older drafts): the current quota, then policies.
        quota, window = _policy(
            headers.get("ratelimit-limit") or headers.get("x-ratelimit-limit") or ""
        )
    current: dict[str, str] = {}
    if "ratelimit" in headers:  # one item per policy: the one with the fewest left binds
        items = [i for i in _items(headers["ratelimit"]) if _number(i.get("r", "")) is not None]
        if items:
            current = min(items, key=lambda i: _number(i["r"]) or 0.0)
    remaining = _number(current["r"]) if "r" in current else None
    if remaining is None:
        text = headers.get("ratelimit-remaining") or headers.get("x-ratelimit-remaining")
        remaining = None if text is None else _number(text)
    reset = _seconds(current["t"]) if "t" in current else None
    if reset is None:
        reset = _reset(headers.get("ratelimit-reset") or headers.get("x-ratelimit-reset"), now)
    if quota is None and remaining is None:
        return None
    return ServerLimit(
        quota=quota,
        window=window,
        remaining=None if remaining is None else int(remaining),
        reset=reset,
    )
