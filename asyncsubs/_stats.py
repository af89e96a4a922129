"""What the limiter reports: per-store and per-pool counters and the pace in force."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["LimiterStats", "PoolStats"]


@attrs.frozen
class PoolStats:
    """One pool of one store since the store was first bound in this loop."""

    requests: int = 0  #: requests started (each attempt is a request)
    rate_limited: int = 0  #: 429 responses received
    retries: int = 0  #: attempts that were retries
    wait_seconds: float = 0.0  #: total time started requests spent queued in the limiter
    waiting: int = 0  #: tasks queued in this pool right now
    in_flight: int = 0  #: requests of this pool started and not yet answered
    interval: float = 0.0  #: seconds between starts now (0 before the first request)
    margin: float = 0.0  #: the margin in that interval
    #: What sets the interval: "start" (no samples yet), "floor", "jitter", "429", "server"
    paced_by: str = "start"
    #: Requests per second the pool paces at before its margin (0 until the store is bound)
    rate: float = 0.0
    #: What set that rate: "configured", "server" (announced); for a discovering pool "start",
    #: "probe" (raised after clean time), "429" or "remembered" (learned before)
    rate_by: str = "configured"
    #: The lowest rate a 429 refused while discovering (requests per second), if any
    ceiling_found: float | None = None
    #: The highest rate that ran clean while discovering, if any (a "probe" rate is untried)
    good: float | None = None
    #: The largest page the server serves, once a ``page_size="max"`` pull learned it
    page_size: int | None = None
    #: What told it: "clamp" (pages cut short), "400" (larger pages refused), "remembered"
    page_size_by: str | None = None


@attrs.frozen
class LimiterStats:
    """A snapshot of one store's limiter: its pools and what is in flight now."""

    store: str
    pools: Mapping[str, PoolStats] = attrs.field(hash=False)
    in_flight: int = 0
    max_in_flight: int = 0

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.pools.values())

    @property
    def rate_limited(self) -> int:
        return sum(p.rate_limited for p in self.pools.values())

    @property
    def retries(self) -> int:
        return sum(p.retries for p in self.pools.values())

    @property
    def wait_seconds(self) -> float:
        return sum(p.wait_seconds for p in self.pools.values())
