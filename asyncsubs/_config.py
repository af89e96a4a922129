"""Small frozen configuration objects: Rate, Discovery, Limits, RetryPolicy.

Validation raises ConfigError (a ValueError) at construction, so bad configuration never reaches
the network.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import urlsplit

import attrs

from ._frozen import FrozenMap
from .errors import ConfigError

__all__ = [
    "DEFAULT_HEAVY",
    "Discovery",
    "Limits",
    "PoolSplit",
    "Rate",
    "RetryPolicy",
    "check_binding",
    "check_redis_url",
    "positive_int",
    "positive_number",
]


def check_redis_url(url: object, *, where: str = "redis") -> str:
    """A ``redis://``, ``rediss://`` or ``unix://`` URL redis-py can read, or ConfigError
    saying of ``where`` what is wrong, never echoing it (it may hold a password)."""
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("expected a redis://, rediss:// or unix:// URL", key=where)
    try:
        parts = urlsplit(url)  # as redis-py reads it
    except ValueError:  # "Invalid IPv6 URL": a "[" or "]" unmatched
        parts = None
    if parts is None:  # raised here: no exception of the URL's reading in its context
        raise ConfigError("the URL's host has a '[' or ']' unmatched", key=where)
    try:
        _ = parts.port  # else it fails at the first request
    except ValueError:  # its message quotes what it took for the port: a password, maybe
        problem = "the URL's port is not a number"
    else:
        # A password's "/", "?" or "#" ends the address early: the rest, "@" and all, would be
        # read as a path, query or fragment, and another host reached, without the password.
        at = "@" in parts.path + parts.query + parts.fragment
        problem = "an '@' after the address" if at else ""
    if problem:
        raise ConfigError(
            f"{problem} (is there a password holding '/', '?', '#' or '@'? write those "
            "percent-encoded: %2F, %3F, %23, %40)",
            key=where,
        )
    return url


def positive_number(name: str, value: Any) -> float:
    """``value`` as a float when it is a positive finite number; else ConfigError naming ``name``.
    The one check of the package's numeric settings (seconds, sizes, rates)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def positive_int(name: str, value: Any) -> int:
    """``value`` when it is an int > 0 (not a bool); else ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive int, got {value!r}")
    return value


#: The most starts a Rate's window may hold: far above any server's, and what the pacing's
#: per-window state is sized by.
MAX_STARTS: Final = 1_000_000
#: The longest window a Rate may have: a day (quotas over longer spans are not paced).
MAX_PER: Final = 86_400.0


@attrs.frozen
class Rate:
    """At most ``n`` request starts in any window of ``per`` seconds, paced evenly.

    The limiter starts one request every ``per / n`` seconds (``interval``), with no initial burst,
    so the rate holds against fixed-window, sliding-window and leaky-bucket servers alike.
    """

    n: int
    per: float = 1.0

    def __attrs_post_init__(self) -> None:
        if positive_int("Rate.n", self.n) > MAX_STARTS:
            raise ConfigError(f"Rate.n must be at most {MAX_STARTS:,}, got {self.n!r}")
        object.__setattr__(self, "per", positive_number("Rate.per", self.per))
        if self.per > MAX_PER:
            raise ConfigError(f"Rate.per must be at most {MAX_PER:,.0f} seconds, got {self.per!r}")

    @property
    def interval(self) -> float:
        """Seconds between two request starts."""
        return self.per / self.n

    @property
    def per_second(self) -> float:
        return self.n / self.per

    def __str__(self) -> str:
        return f"{self.n}/{self.per:g}s"

    @staticmethod
    def discover(*, start: Rate | int = 1, ceiling: Rate | int = 50) -> Discovery:
        """A heavy pool's rate found at run time, from ``start`` up to at most ``ceiling``
        (ints are requests per second): ``Limits(heavy={"orders": Rate.discover()})``."""
        return Discovery(start=start, ceiling=ceiling)


def _per_second(value: Rate | int) -> Rate:
    """A Rate, or an int taken as that many requests per second."""
    if isinstance(value, Rate):
        return value
    return Rate(positive_int("Discovery rate (requests per second)", value), per=1.0)


@attrs.frozen
class Discovery:
    """A heavy pool whose rate the server does not tell: paced from ``start``, raised after
    clean time up to at most ``ceiling``, and brought back under what the server evidently
    allowed by a 429 (see README, "Discovery"). ``ceiling.per`` is the window the search
    counts in. The global pool's 50/s is documented by the interface and never discovered."""

    start: Rate = attrs.field(default=Rate(1, per=1.0), converter=_per_second)
    ceiling: Rate = attrs.field(default=Rate(50, per=1.0), converter=_per_second)

    def __attrs_post_init__(self) -> None:
        if self.start.per_second > self.ceiling.per_second:
            raise ConfigError(f"Discovery start {self.start} is above its ceiling {self.ceiling}")

    def __str__(self) -> str:
        return f"discover {self.start}..{self.ceiling}"


#: Heavy list endpoints and their isolated pools. The interface says only that these pools are
#: "small"; one request per second each is a conservative guess that real stores tolerate.
DEFAULT_HEAVY: Mapping[str, Rate] = FrozenMap(
    {
        "subscriptions": Rate(1, per=1.0),
        "customers": Rate(1, per=1.0),
        "orders": Rate(1, per=1.0),
    }
)


def _heavy(value: Mapping[str, Any] | None, kinds: tuple[type, ...]) -> Mapping[str, Any]:
    if value is None:
        return DEFAULT_HEAVY
    if not isinstance(value, Mapping):
        raise ConfigError("Limits.heavy must be a mapping of path -> Rate")
    frozen: dict[str, Any] = {}
    for path, rate in value.items():
        if not isinstance(path, str) or not path.strip("/"):
            raise ConfigError(f"Limits.heavy keys must be non-empty paths, got {path!r}")
        if path.strip("/") == "global":  # the shared pool's name: a heavy pool would merge into it
            raise ConfigError("Limits.heavy cannot name a path 'global' (the shared pool's name)")
        if not isinstance(rate, kinds):
            what = " or Rate.discover()" if Discovery in kinds else ""
            raise ConfigError(f"Limits.heavy[{path!r}] must be a Rate{what}, got {rate!r}")
        frozen[path.strip("/")] = rate
    return FrozenMap(frozen)


def freeze_heavy(value: Mapping[str, Rate] | None) -> Mapping[str, Rate]:
    """Validate a path -> Rate mapping of heavy pools (paths stripped of slashes), frozen."""
    return _heavy(value, (Rate,))


def _freeze_limits_heavy(value: Mapping[str, Rate | Discovery] | None) -> Mapping[str, Any] | None:
    return None if value is None else _heavy(value, (Rate, Discovery))  # None: see Limits


class PoolSplit:
    """How requests split into pools: a GET of exactly a heavy path (a list endpoint) draws only
    on that path's isolated pool, everything else on "global". Shared by the client's ``Limits``
    and the fake server's ``ServerRateLimits``, so both split alike."""

    __slots__ = ()
    global_rate: Rate
    heavy: Mapping[str, Any]

    def pool_for(self, method: str, path: str) -> str:
        """The pool a request draws on: a heavy path for GETs of a heavy list, else "global"."""
        if method == "GET":
            key = path.strip("/")
            if key in self.heavy:
                return key
        return "global"

    def rate_for(self, pool: str) -> Rate:
        """The rate ``pool`` paces at before it learns anything (a discovering pool's start)."""
        rate = self.global_rate if pool == "global" else self.heavy[pool]
        return rate.start if isinstance(rate, Discovery) else rate

    def discovery_for(self, pool: str) -> Discovery | None:
        """How ``pool`` finds its rate, or None for a fixed rate."""
        rate = self.heavy.get(pool)
        return rate if isinstance(rate, Discovery) else None

    @property
    def pools(self) -> tuple[str, ...]:
        return ("global", *self.heavy)


_SERVER_LIMITS = ("lower", "follow", "ignore")


@attrs.frozen
class Limits(PoolSplit):
    """Per-store request budgets, and how close to them to pace.

    - ``global_rate``: the shared pool for every request that is not a heavy list request.
    - ``heavy``: path -> Rate; a GET of exactly that path (a list endpoint) draws only on its own
      isolated pool, never on the global one. Defaults to ``DEFAULT_HEAVY``. A value may be
      ``Rate.discover()`` (a :class:`Discovery`): the pool finds its rate at run time.
    - ``discover``: True adds the default heavy paths that ``heavy`` does not name as
      discovering pools (``Limits(discover=True)``: all three discover).
    - ``max_in_flight``: concurrent requests per store, across all pools.
    - ``safety_margin``: the least fraction by which pacing stays below each rate (0.02: starts
      at least ``1.02 * per / n`` apart).
    - ``max_margin``: the most the measured margin may grow to, for arrival jitter (see
      README, "How close to the limit"), and the margin of a pool until it has a window of
      samples: a fresh server (cold caches, connections being opened) stamps its first
      requests unevenly.
    - ``server_limits``: what a server's rate-limit headers do: ``"lower"`` paces by an
      announced quota lower than configured, ``"follow"`` by any announced quota, ``"ignore"``
      reads none.
    """

    global_rate: Rate = Rate(50, per=1.0)
    heavy: Mapping[str, Rate | Discovery] = attrs.field(
        default=None, converter=_freeze_limits_heavy
    )
    max_in_flight: int = 64
    safety_margin: float = 0.02
    max_margin: float = 0.10
    server_limits: str = "lower"
    discover: bool = attrs.field(default=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.discover, bool):
            raise ConfigError(f"Limits.discover must be a bool, got {self.discover!r}")
        heavy: Mapping[str, Any] | None = self.heavy
        if self.discover:  # the default paths not named discover; named ones keep their value
            named = heavy or {}
            added = {path: Discovery() for path in DEFAULT_HEAVY if path not in named}
            object.__setattr__(self, "heavy", FrozenMap({**named, **added}))
            object.__setattr__(self, "discover", False)  # said once: equal to the same heavy
        elif heavy is None:
            object.__setattr__(self, "heavy", DEFAULT_HEAVY)
        if not isinstance(self.global_rate, Rate):
            raise ConfigError(f"Limits.global_rate must be a Rate, got {self.global_rate!r}")
        positive_int("Limits.max_in_flight", self.max_in_flight)
        for name in ("safety_margin", "max_margin"):
            margin = getattr(self, name)
            if (
                isinstance(margin, bool)
                or not isinstance(margin, int | float)
                or not 0 <= margin < 1
            ):
                raise ConfigError(f"Limits.{name} must be in [0, 1), got {margin!r}")
        if self.max_margin < self.safety_margin:
            raise ConfigError("max_margin must be >= safety_margin", key="Limits")
        if self.server_limits not in _SERVER_LIMITS:
            raise ConfigError(
                f"Limits.server_limits must be one of {', '.join(_SERVER_LIMITS)},"
                f" got {self.server_limits!r}"
            )


#: Statuses that are retried by default: the request was not (or need not have been) processed.
DEFAULT_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def _statuses(value: object) -> frozenset[int]:
    """HTTP statuses (100-599) as a frozenset; ConfigError for anything else ("429", None)."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigError(
            f"RetryPolicy.retry_statuses must be a set of HTTP statuses, got {value!r}"
        )
    statuses = frozenset(value)
    for status in statuses:
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            raise ConfigError(f"RetryPolicy.retry_statuses holds {status!r}, not a status 100-599")
    return statuses


def check_binding(store: Any, limits: Any) -> None:
    """What a limiter binds, checked: ConfigError unless ``store`` is a non-blank string and
    ``limits`` a :class:`Limits`."""
    if not isinstance(store, str) or not store.strip():
        raise ConfigError(f"store must be a non-empty string, got {store!r}")
    if not isinstance(limits, Limits):
        raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")


@attrs.frozen
class RetryPolicy:
    """When and how failed attempts are retried.

    - ``max_attempts``: attempts in all, the first included (1 disables retries).
    - ``backoff_initial``/``backoff_max``: capped exponential backoff with full jitter, seconds.
    - ``max_total``: give up once this many seconds have passed since the first attempt; a
      backoff is cut to what is left, and a Retry-After that ends later fails at once.
    - ``retry_statuses``: HTTP statuses worth another attempt (a 2xx answer whose envelope
      reports a server error, code ``INTERNAL_ERROR`` or ``SERVER_ERROR``, counts as a 500).
    - ``max_retry_after``: a Retry-After longer than this fails fast with RateLimitError.
    - ``retry_non_idempotent``: also retry POST/PATCH/DELETE after failures where the server may
      have processed the request (5xx, timeouts, resets). Off by default: those are retried only
      when the request provably was not processed (429, connection refused).
    """

    max_attempts: int = 6
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    max_total: float = 300.0
    retry_statuses: frozenset[int] = attrs.field(
        default=DEFAULT_RETRY_STATUSES, converter=_statuses
    )
    max_retry_after: float = 120.0
    retry_non_idempotent: bool = False

    def __attrs_post_init__(self) -> None:
        positive_int("RetryPolicy.max_attempts", self.max_attempts)
        for name in ("backoff_initial", "backoff_max", "max_total", "max_retry_after"):
            object.__setattr__(
                self, name, positive_number(f"RetryPolicy.{name}", getattr(self, name))
            )
        if self.backoff_max < self.backoff_initial:
            raise ConfigError("RetryPolicy.backoff_max must be >= backoff_initial")
        if not isinstance(value := self.retry_non_idempotent, bool):
            raise ConfigError(f"RetryPolicy.retry_non_idempotent must be a bool, got {value!r}")
