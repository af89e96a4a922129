"""Server-side rate limits of the fake admin server, and per-store counters.

Every store has a global pool and one isolated pool per heavy list path; a GET of a heavy path
draws only on its own pool, everything else on the global pool (the same split as the client's
``Limits``). Three window flavours exist because real gateways differ and the client must hold
against all of them. Time is always the caller's ``now`` (the event loop clock), so tests can
patch ``loop.time`` instead of sleeping.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Mapping
from typing import Any, Final, Literal, Protocol

import attrs

from .._config import PoolSplit, Rate, freeze_heavy
from .._frozen import FrozenMap

__all__ = [
    "DEFAULT_SERVER_HEAVY",
    "ServerPoolStats",
    "ServerRateLimits",
    "StoreCounters",
    "StoreWindows",
    "StoreStats",
    "Window",
]

Window = Literal["sliding", "fixed", "leaky"]
_WINDOWS: Final = ("sliding", "fixed", "leaky")

#: Isolated pools for the three heavy list endpoints. The interface only says they are "small".
DEFAULT_SERVER_HEAVY: Final[Mapping[str, Rate]] = FrozenMap(
    {
        "subscriptions": Rate(2, per=1.0),
        "customers": Rate(2, per=1.0),
        "orders": Rate(2, per=1.0),
    }
)


_DEFAULT_GLOBAL: Final = Rate(50, per=1.0)


def _check_window(_: object, __: attrs.Attribute[str], value: str) -> None:
    if value not in _WINDOWS:
        raise ValueError(f"window must be one of {_WINDOWS}, got {value!r}")


@attrs.frozen(kw_only=True)
class ServerRateLimits(PoolSplit):
    """The rate limits a fake store enforces.

    - ``global_rate``: shared pool for every request that is not a GET of a heavy path.
    - ``heavy``: path -> Rate, isolated pools (same shape as ``Limits.heavy``).
    - ``window``: ``"sliding"`` (at most n starts in any trailing ``per`` seconds),
      ``"fixed"`` (n per window aligned to multiples of ``per``) or ``"leaky"`` (token bucket of
      capacity n refilled at n/per per second: allows an initial burst).
    - ``retry_after_float``: send Retry-After as fractional seconds instead of an integer >= 1.
    - ``headers``: announce the limit on every answer of a limited pool: ``"ietf"``
      (``RateLimit-Policy: "default";q=N;w=PER`` and ``RateLimit: "default";r=LEFT;t=RESET``,
      whole seconds as the draft has them) or ``"x"`` (``X-RateLimit-Limit``, ``-Remaining``,
      ``-Reset`` in whole delta seconds); None (default) sends none.
    - ``enabled``: False turns limiting off for a store while the server default stays on.

    What a client is configured with is its own business: a server enforcing less than the
    client's ``Limits`` (and telling it only through 429s, or through ``headers``) is how the
    client's calibration is tested.
    """

    global_rate: Rate = _DEFAULT_GLOBAL
    heavy: Mapping[str, Rate] = attrs.field(
        factory=lambda: DEFAULT_SERVER_HEAVY, converter=freeze_heavy
    )
    window: Window = attrs.field(default="sliding", validator=_check_window)
    retry_after_float: bool = False
    headers: Literal["ietf", "x"] | None = attrs.field(
        default=None, validator=attrs.validators.in_(("ietf", "x", None))
    )
    enabled: bool = True

    @classmethod
    def disabled(cls) -> ServerRateLimits:
        return cls(enabled=False)


class _Window(Protocol):
    def acquire(self, now: float) -> float | None:
        """Take a slot: None when accepted, else seconds until a slot frees (nothing taken)."""

    def remaining(self, now: float) -> tuple[int, float]:
        """Slots left now, and seconds until the next one frees (0 when some are left)."""


class _Sliding:
    def __init__(self, rate: Rate) -> None:
        self.n = rate.n
        self.per = rate.per
        self.starts: deque[float] = deque()

    def acquire(self, now: float) -> float | None:
        starts = self.starts
        horizon = now - self.per
        while starts and starts[0] <= horizon:
            starts.popleft()
        if len(starts) < self.n:
            starts.append(now)
            return None
        return starts[0] + self.per - now

    def remaining(self, now: float) -> tuple[int, float]:
        current = [t for t in self.starts if t > now - self.per]
        left = max(0, self.n - len(current))
        return left, 0.0 if left else current[0] + self.per - now


class _Fixed:
    def __init__(self, rate: Rate) -> None:
        self.n = rate.n
        self.per = rate.per
        self.window = -math.inf
        self.count = 0

    def acquire(self, now: float) -> float | None:
        window = math.floor(now / self.per) * self.per
        if window != self.window:
            self.window = window
            self.count = 0
        if self.count < self.n:
            self.count += 1
            return None
        return window + self.per - now

    def remaining(self, now: float) -> tuple[int, float]:
        left = (
            self.n - self.count if math.floor(now / self.per) * self.per == self.window else self.n
        )
        return left, 0.0 if left else self.window + self.per - now


class _Leaky:
    def __init__(self, rate: Rate) -> None:
        self.capacity = float(rate.n)
        self.refill = rate.n / rate.per
        self.tokens = self.capacity
        self.last: float | None = None

    def acquire(self, now: float) -> float | None:
        if self.last is not None:
            self.tokens = min(self.capacity, self.tokens + max(0.0, now - self.last) * self.refill)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.refill

    def remaining(self, now: float) -> tuple[int, float]:
        left = int(self.tokens)
        return left, 0.0 if left else (1.0 - self.tokens) / self.refill


_WINDOW_CLASSES: Final[Mapping[str, type[_Sliding | _Fixed | _Leaky]]] = {
    "sliding": _Sliding,
    "fixed": _Fixed,
    "leaky": _Leaky,
}


def retry_after_header(wait: float, *, as_float: bool) -> str:
    """Retry-After value: integer seconds rounded up, at least 1 (or fractional when asked)."""
    if as_float:
        return f"{max(wait, 0.001):.3f}"
    return str(max(1, math.ceil(wait - 1e-9)))


@attrs.frozen
class ServerPoolStats:
    """Counters of one pool of one store (a snapshot)."""

    accepted: int = 0
    rejected: int = 0
    #: Loop-clock times of accepted request starts, oldest first (bounded ring buffer).
    starts: tuple[float, ...] = attrs.field(default=(), repr=False)

    def max_in_window(self, seconds: float) -> int:
        """The most accepted starts that fell inside any window of ``seconds`` (half-open)."""
        best = 0
        left = 0
        starts = self.starts
        for right, t in enumerate(starts):
            while t - starts[left] >= seconds:
                left += 1
            best = max(best, right - left + 1)
        return best

    def peak(self, rate: Rate, window: Window) -> int:
        """The most of ``rate`` the server's own window held at once: the accepted starts
        counted as a ``window`` server counts them (starts in any trailing ``rate.per`` when
        sliding, in any aligned window when fixed, the bucket's fill rounded up when leaky).
        Never above ``rate.n``, which the server answers 429 beyond. A sliding count of a
        fixed or leaky pool (``max_in_window``) may be, by up to ``rate.n`` again: starts on
        both sides of a fixed window's boundary, a full bucket's burst and then its refill."""
        if window == "sliding":
            return self.max_in_window(rate.per)
        if window == "fixed":
            counts = Counter(math.floor(t / rate.per) for t in self.starts)
            return max(counts.values(), default=0)
        bucket, fullest = _Leaky(rate), 0.0
        for t in self.starts:
            bucket.acquire(t)
            fullest = max(fullest, bucket.capacity - bucket.tokens)
        return math.ceil(fullest - 1e-9)


@attrs.frozen
class StoreStats:
    """Counters of one store (a snapshot): per pool, faults, scripted answers, concurrency."""

    pools: Mapping[str, ServerPoolStats]
    #: Authenticated requests seen (any outcome).
    requests: int = 0
    #: Responses by HTTP status, for authenticated requests.
    statuses: Mapping[int, int] = attrs.field(factory=dict)
    #: Injected faults by kind (``Faults`` field names).
    faults: Mapping[str, int] = attrs.field(factory=dict)
    #: Requests answered from ``enqueue()``/``redirect()`` scripts.
    scripted: int = 0
    #: Most authenticated requests in progress at once.
    max_in_flight: int = 0

    def pool(self, name: str) -> ServerPoolStats:
        return self.pools.get(name.strip("/"), ServerPoolStats())

    @property
    def accepted(self) -> int:
        return sum(p.accepted for p in self.pools.values())

    @property
    def rejected(self) -> int:
        """429s from rate limiting (injected 429s are counted under ``faults``)."""
        return sum(p.rejected for p in self.pools.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "pools": {
                name: {"accepted": p.accepted, "rejected": p.rejected, "starts": list(p.starts)}
                for name, p in self.pools.items()
            },
            "requests": self.requests,
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "faults": dict(self.faults),
            "scripted": self.scripted,
            "max_in_flight": self.max_in_flight,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StoreStats:
        pools = {
            name: ServerPoolStats(p["accepted"], p["rejected"], tuple(p["starts"]))
            for name, p in data["pools"].items()
        }
        return cls(
            pools=pools,
            requests=data["requests"],
            statuses={int(k): v for k, v in data["statuses"].items()},
            faults=dict(data["faults"]),
            scripted=data["scripted"],
            max_in_flight=data["max_in_flight"],
        )


class _PoolCounter:
    def __init__(self, keep: int) -> None:
        self.accepted = 0
        self.rejected = 0
        self.starts: deque[float] = deque(maxlen=keep)

    def snapshot(self) -> ServerPoolStats:
        return ServerPoolStats(self.accepted, self.rejected, tuple(self.starts))


class StoreWindows:
    """Mutable window state of one store's pools (counting lives in ``StoreCounters``)."""

    def __init__(self, limits: ServerRateLimits) -> None:
        self.limits = limits
        self._windows: dict[str, _Window] = {}
        if limits.enabled:
            cls = _WINDOW_CLASSES[limits.window]
            self._windows = {pool: cls(limits.rate_for(pool)) for pool in limits.pools}

    def acquire(self, pool: str, now: float) -> float | None:
        """None when the request may start (a slot is taken), else seconds until one frees."""
        window = self._windows.get(pool)
        return None if window is None else window.acquire(now)

    def headers(self, pool: str, now: float) -> dict[str, str]:
        """The rate-limit headers of an answer in ``pool`` (none unless ``limits.headers``)."""
        style = self.limits.headers
        window = self._windows.get(pool)
        if style is None or window is None:
            return {}
        rate = self.limits.rate_for(pool)
        left, frees_in = window.remaining(now)
        reset = str(math.ceil(frees_in - 1e-9))
        if style == "ietf":
            return {
                "RateLimit-Policy": f'"default";q={rate.n};w={rate.per:g}',
                "RateLimit": f'"default";r={left};t={reset}',
            }
        return {
            "X-RateLimit-Limit": str(rate.n),
            "X-RateLimit-Remaining": str(left),
            "X-RateLimit-Reset": reset,
        }


class StoreCounters:
    """Mutable counters of one store; ``snapshot()`` gives the frozen ``StoreStats``."""

    def __init__(self, *, keep_starts: int = 10_000) -> None:
        self.keep_starts = max(0, keep_starts)
        self.reset()

    def reset(self) -> None:
        self.pools: dict[str, _PoolCounter] = {}
        self.requests = 0
        self.statuses: dict[int, int] = {}
        self.faults: dict[str, int] = {}
        self.scripted = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def _pool(self, pool: str) -> _PoolCounter:
        counter = self.pools.get(pool)
        if counter is None:
            counter = self.pools[pool] = _PoolCounter(self.keep_starts)
        return counter

    def ensure_pools(self, pools: tuple[str, ...]) -> None:
        for pool in pools:
            self._pool(pool)

    def accepted(self, pool: str, now: float) -> None:
        counter = self._pool(pool)
        counter.accepted += 1
        counter.starts.append(now)

    def rejected(self, pool: str) -> None:
        self._pool(pool).rejected += 1

    def fault(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def begin(self) -> None:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def end(self, status: int) -> None:
        self.in_flight = max(0, self.in_flight - 1)  # reset() may have run meanwhile
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def snapshot(self) -> StoreStats:
        return StoreStats(
            pools={name: c.snapshot() for name, c in self.pools.items()},
            requests=self.requests,
            statuses=dict(self.statuses),
            faults=dict(self.faults),
            scripted=self.scripted,
            max_in_flight=self.max_in_flight,
        )
