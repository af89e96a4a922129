"""Client-side rate limiting: one paced queue per (store, pool), an in-flight cap per store.

How the client uses it::

    store_limiter = limiter.bind(store, limits)       # inside the running loop
    async with store_limiter.slot(pool, max_wait=120.0) as slot:
        ...                                           # send the request, read the response
    store_limiter.rate_limited(slot, pause=1.0)       # after a 429
    store_limiter.server_limit(pool, hint)            # after any response with rate headers
    store_limiter.stats()

One request's way through ``slot``:

1. its pool's *turn*: a FIFO queue per (store, pool); only the head goes on;
2. a place in the store's in-flight gate (FIFO too), taken before the request's start is
   claimed, so a full gate never bunches starts up: at most one place per pool waits idle;
3. a start claimed from the backend, ``reserve(store, pool, interval)``: GCRA without burst,
   ``slot = max(now, tat, pause_end)``, ``tat = slot + interval``; the head sleeps until its
   slot (one timer), checks that no pause came in meanwhile (else claims again after it) and
   starts, handing the turn to the next head.

Starts are thus never closer than the interval, from a cold start on, whatever the backend.
``interval = per / n * (1 + margin) * slowdown``, margin and slowdown from
:mod:`asyncsubs._calibration`, ``n / per`` the configured rate or a lower one the server
announced (:mod:`asyncsubs._server_limits`). A task cancelled while waiting leaves its queue
and gives back its place; the slot it claimed is lost, which only slows the pool a little.

Backends (:class:`PacingBackend`) hold what processes must share: each pool's next slot, its
pause and its 429 slowdown. :class:`MemoryPacing` is the in-process one; ``RedisLimiter``
implements the same contract with one Lua script per call. The in-flight cap, queues and
statistics stay per process.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import weakref
from collections import OrderedDict
from types import MappingProxyType, TracebackType
from typing import Protocol

import attrs

from ._calibration import Jitter, Slowdown
from ._config import Limits, Rate
from ._server_limits import ServerLimit
from ._stats import LimiterStats, PoolStats
from .errors import AsyncSubsError, ConfigError, LimiterUnavailableError, RateLimitError

__all__ = ["Limiter", "LocalLimiter", "MemoryPacing", "PacingBackend", "Slot", "StoreLimiter"]
__all__ += ["default_limiter"]

logger = logging.getLogger("asyncsubs.limiter")

#: A change of a pool's interval by more than this fraction is logged at DEBUG.
_LOGGED_CHANGE = 0.05


class PacingBackend(Protocol):
    """Shared pacing of (store, pool). Errors are raised as LimiterUnavailableError (anything
    else is wrapped in one); times are on the backend's own clock.

    - ``reserve(store, pool, interval)``: claim the next start, ``slot = max(now, tat,
      pause_end)``, set ``tat = slot + interval``; return ``(slot - now, slowdown)``, the
      second the pool's shared 429 slowdown (1.0 when none), so a widening one process learnt
      reaches the others with their next start, in the same round trip.
    - ``pause(store, pool, seconds, slowdown)``: no slot before ``now + seconds``, and the
      slowdown raised to ``slowdown``; neither is ever lowered by a smaller value.
    """

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]: ...

    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None: ...


class _Shared:
    __slots__ = ("pause_end", "slowdown", "tat")

    def __init__(self) -> None:
        self.tat = self.pause_end = -math.inf
        self.slowdown = Slowdown()


class MemoryPacing:
    """The :class:`PacingBackend` of one process, on each running loop's clock. Several
    limiters sharing one instance behave like processes sharing one Redis."""

    def __init__(self) -> None:
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[tuple[str, str], _Shared]
        ] = weakref.WeakKeyDictionary()

    def _shared(self, store: str, pool: str) -> tuple[float, _Shared]:
        loop = asyncio.get_running_loop()
        pools = self._loops.setdefault(loop, {})
        shared = pools.get((store, pool))
        if shared is None:
            shared = pools[store, pool] = _Shared()
        return loop.time(), shared

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]:
        now, shared = self._shared(store, pool)
        slot = max(now, shared.tat, shared.pause_end)
        shared.tat = slot + interval
        return slot - now, shared.slowdown.value(now)

    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None:
        now, shared = self._shared(store, pool)
        shared.pause_end = max(shared.pause_end, now + seconds)
        shared.slowdown.set(now, slowdown)


class _FifoGate:
    """A FIFO semaphore: places go to waiters in arrival order, no barging. Waiters sit in an
    OrderedDict so that a cancelled one leaves in O(1)."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: OrderedDict[asyncio.Future[None], None] = OrderedDict()

    async def acquire(self) -> None:
        if self._free > 0:  # places are handed straight to waiters: free means nobody waits
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[fut] = None
        try:
            await fut
        except asyncio.CancelledError:
            if fut in self._waiters:
                del self._waiters[fut]
            elif not fut.cancelled():
                self.release()  # granted, then cancelled before it ran: pass the place on
            raise

    def release(self) -> None:
        while self._waiters:
            fut, _ = self._waiters.popitem(last=False)
            if not fut.done():  # a future cancelled an instant ago is still queued: skip it
                fut.set_result(None)
                return
        self._free += 1


class _Pool:
    """Mutable state of one (store, pool)."""

    def __init__(self, name: str, rate: Rate) -> None:
        self.name = name
        self.rate = rate
        self.server_rate: Rate | None = None  # a lower rate the server announced
        self.turn = _FifoGate(1)
        self.jitter = Jitter(rate.n)
        self.slowdown = Slowdown()
        self.pause_until = self.last_start = self.run_start = -math.inf
        self.interval = self.margin = self.logged = 0.0
        self.paced_by = "start"
        self.requests = self.rate_limited = self.retries = self.waiting = 0
        self.wait_seconds = 0.0


class Slot:
    """``async with store_limiter.slot(pool) as slot``: holds an in-flight place while the
    request runs; ``slot.due`` is the moment it was paced for (loop time)."""

    __slots__ = ("_limiter", "_max_wait", "_pool", "due")

    def __init__(self, limiter: StoreLimiter, pool: _Pool, max_wait: float) -> None:
        self._limiter = limiter
        self._pool = pool
        self._max_wait = max_wait
        self.due = 0.0

    @property
    def pool(self) -> str:
        return self._pool.name

    async def __aenter__(self) -> Slot:
        self.due = await self._limiter._acquire(self._pool, self._max_wait)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        limiter = self._limiter
        limiter._in_flight.release()
        # An answered request of the global pool is a jitter sample.
        if (
            exc_type is None
            and self._pool is limiter._global
            and limiter._global.jitter.add(asyncio.get_running_loop().time() - self.due)
        ):
            limiter._pace(limiter._global, self.due)


class StoreLimiter:
    """The limiter state of one store in one event loop; get it from :meth:`Limiter.bind`."""

    def __init__(
        self, store: str, limits: Limits, backend: PacingBackend, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.store = store
        self.limits = limits
        self._backend = backend
        self._loop_ref = weakref.ref(loop)  # weak: the registry must not keep loops alive
        self._in_flight = _FifoGate(limits.max_in_flight)
        self._pools = {name: _Pool(name, limits.rate_for(name)) for name in limits.pools}
        self._global = self._pools["global"]
        self._background: set[asyncio.Task[None]] = set()  # backend pauses in progress

    def __repr__(self) -> str:
        return f"<StoreLimiter store={self.store!r} in_flight={self.in_flight}>"

    @property
    def in_flight(self) -> int:
        return self.limits.max_in_flight - self._in_flight._free

    def _pool(self, pool: str) -> _Pool:
        try:
            return self._pools[pool]
        except KeyError:
            pools = ", ".join(self._pools)
            raise ConfigError(
                f"store {self.store!r} has no rate-limit pool {pool!r} (pools: {pools})"
            ) from None

    def slot(self, pool: str, *, max_wait: float = math.inf) -> Slot:
        """Wait for a paced start of ``pool`` and hold an in-flight place meanwhile. A request
        that would wait on a pause (or slot) longer than ``max_wait`` seconds fails at once
        with RateLimitError, ``retry_after`` saying how long the wait is."""
        return Slot(self, self._pool(pool), max_wait)

    def stats(self) -> LimiterStats:
        fields = [f.name for f in attrs.fields(PoolStats)]
        pools = {n: PoolStats(*(getattr(p, f) for f in fields)) for n, p in self._pools.items()}
        return LimiterStats(
            self.store, MappingProxyType(pools), self.in_flight, self.limits.max_in_flight
        )

    # -- what responses teach ------------------------------------------------------------------

    def record_retry(self, pool: str) -> None:
        self._pool(pool).retries += 1

    def rate_limited(self, slot: Slot, pause: float | None) -> None:
        """A 429 answered the request of ``slot``: count it, widen the pool's slowdown (once
        per round trip) and pause the pool for ``pause`` seconds (Retry-After)."""
        p = slot._pool
        p.rate_limited += 1
        loop = self._loop_ref()
        if loop is None:
            return
        now = loop.time()
        if slot.due > p.slowdown.widened_at:  # else it was sent before the last widening
            rate = p.server_rate or p.rate
            since = max(p.run_start, slot.due - rate.per)
            # The pool's starts in the window before the refused one, as the store made them:
            # every process sharing the backend starts one per interval, so the count comes
            # from the interval, not from this process's own starts (a fraction of them).
            # Under 3 it says more about one start stamped late than about a quota.
            accepted = (slot.due - since) / p.interval if p.pause_until <= since else 0.0
            factor = p.slowdown.widen(now, rate.n / accepted if accepted >= 3 else 1.0)
            logger.debug("store %r pool %r: 429, slowdown now %.3f", self.store, p.name, factor)
        self._pause(p, loop, pause or 0.0, p.slowdown.value(now))

    def server_limit(self, pool: str, limit: ServerLimit, *, hold: bool = True) -> None:
        """A response of ``pool`` announced the server's limit: pace by a lower quota (or any,
        with ``Limits(server_limits="follow")``); hold the pool until the reset when nothing
        remains (unless not ``hold``: a Retry-After said how long), when pacing by the quota
        does not cover it already."""
        if self.limits.server_limits == "ignore":
            return
        p = self._pool(pool)
        loop = self._loop_ref()
        if limit.quota is not None and limit.quota < 1e9:
            announced = Rate(limit.quota, per=limit.window or p.rate.per)
            lower = announced.per_second < p.rate.per_second
            new = announced if lower or self.limits.server_limits == "follow" else None
            if new != p.server_rate:
                p.server_rate = new
                n = (new or p.rate).n
                p.jitter.needed = min(p.jitter.needed, n + 1)
        if (
            limit.remaining == 0
            and limit.reset
            and hold
            and loop is not None
            and (p.server_rate is None or limit.reset > p.server_rate.per)
        ):
            self._pause(p, loop, limit.reset, 1.0)

    def pause(self, pool: str, seconds: float) -> None:
        """Hold every request of ``pool`` for ``seconds`` from now, in every process sharing the
        backend. Never shortens a pause in force; values not positive and finite are ignored."""
        p = self._pool(pool)
        loop = self._loop_ref()
        if loop is not None and 0 < seconds < math.inf:
            self._pause(p, loop, seconds, 1.0)

    def _pause(
        self, p: _Pool, loop: asyncio.AbstractEventLoop, seconds: float, slowdown: float
    ) -> None:
        if 0 < seconds < math.inf:
            p.pause_until = max(p.pause_until, loop.time() + seconds)
            logger.debug("store %r pool %r: paused for %.3fs", self.store, p.name, seconds)
        task = loop.create_task(
            self._backend.pause(self.store, p.name, max(0.0, seconds), slowdown)
        )
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            logger.warning(
                "store %r: could not share a pause with the limiter backend (%s)",
                self.store,
                type(exc).__name__,
            )

    def _pace(self, p: _Pool, now: float) -> float:
        """The pool's interval now, with the margin and what set it."""
        limits = self.limits
        rate = p.server_rate or p.rate
        spread = self._global.jitter.spread
        if spread is not None:
            margin = min(limits.max_margin, max(limits.safety_margin, spread / rate.per))
            paced_by = "jitter" if margin > limits.safety_margin else "floor"
        elif p is not self._global and p.requests > rate.n:  # a store sending only heavy lists
            margin, paced_by = limits.safety_margin, "floor"
        else:
            margin, paced_by = limits.max_margin, "start"
        slowdown = p.slowdown.value(now)
        if slowdown > 1 + 1e-3:
            paced_by = "429"
        elif p.server_rate is not None:
            paced_by = "server"
        interval = rate.interval * (1 + margin) * slowdown
        if abs(interval - p.logged) > _LOGGED_CHANGE * p.logged:
            message = "store %r pool %r: interval %.4fs (margin %.3f, slowdown %.3f, by %s)"
            logger.debug(message, self.store, p.name, interval, margin, slowdown, paced_by)
            p.logged = interval
        p.interval, p.margin, p.paced_by = interval, margin, paced_by
        return interval

    # -- acquiring ----------------------------------------------------------------------------

    async def _acquire(self, p: _Pool, max_wait: float) -> float:
        loop = asyncio.get_running_loop()
        if loop is not self._loop_ref():
            raise ConfigError(
                f"store {self.store!r} is bound to another event loop: use a client (and its"
                " limiter binding) only in the loop that first used it"
            )
        queued_at = loop.time()
        p.waiting += 1
        try:
            await p.turn.acquire()
            try:
                await self._in_flight.acquire()
                try:
                    due = await self._claim(loop, p, max_wait)
                except BaseException:
                    self._in_flight.release()
                    raise
            finally:
                p.turn.release()
        finally:
            p.waiting -= 1
        # Back from idle (not from a pause), the server's window holds nothing of this pool:
        # a 429 then tells its quota by the starts since (see rate_limited).
        if due - p.last_start >= (p.server_rate or p.rate).per and not (
            p.last_start < p.pause_until <= due
        ):
            p.run_start = due
        p.last_start = due
        p.requests += 1
        p.wait_seconds += loop.time() - queued_at
        return due

    async def _claim(self, loop: asyncio.AbstractEventLoop, p: _Pool, max_wait: float) -> float:
        """As the pool's head, holding an in-flight place: claim a slot and sleep until it."""
        while True:
            now = loop.time()
            paused = p.pause_until - now  # this process's view; a shared backend may lag it
            if paused > 0:
                self._check_wait(p, paused, max_wait)
                await asyncio.sleep(paused)
                continue
            wait, slowdown = await self._reserve(p, self._pace(p, now))
            now = loop.time()
            p.slowdown.set(now, slowdown)
            self._check_wait(p, wait, max_wait)
            due = now + wait
            if wait > 0:
                await asyncio.sleep(wait)
            if p.pause_until <= due:  # else a pause came in meanwhile: claim again after it
                return due

    def _check_wait(self, p: _Pool, wait: float, max_wait: float) -> None:
        if wait > max_wait:
            raise RateLimitError(
                f"store {self.store!r}: the {p.name} pool is paused for {wait:.1f}s more,"
                " longer than RetryPolicy.max_retry_after allows a request to wait",
                retry_after=wait,
                status=429,
                code=None,
                server_message=None,
                body=None,
            )

    async def _reserve(self, p: _Pool, interval: float) -> tuple[float, float]:
        try:
            wait, slowdown = await self._backend.reserve(self.store, p.name, interval)
            wait, slowdown = float(wait), float(slowdown)
        except AsyncSubsError:
            raise
        except Exception as exc:
            # The type only: a backend's message may carry its URL and password.
            raise LimiterUnavailableError(
                f"rate limiter backend failed for store {self.store!r}: {type(exc).__name__}"
            ) from exc
        if not (0 <= wait < math.inf and 1 <= slowdown < math.inf):
            raise LimiterUnavailableError(
                f"rate limiter backend returned an invalid slot ({wait!r}, {slowdown!r})"
                f" for store {self.store!r}"
            )
        return wait, slowdown


class Limiter:
    """Per-store limiter state, shared by every client bound to the same store and loop.

    ``backend`` holds what processes share (see :class:`PacingBackend`); different stores
    never slow each other. A store has one budget: binding it again with other
    :class:`Limits` raises ConfigError.
    """

    def __init__(self, backend: PacingBackend) -> None:
        self._backend = backend
        self._lock = threading.Lock()  # bind() is sync and may run in several threads' loops
        self._stores: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, StoreLimiter]
        ] = weakref.WeakKeyDictionary()

    def bind(self, store: str, limits: Limits) -> StoreLimiter:
        """The limiter of ``store`` in the running loop; same store and loop -> same object."""
        if not isinstance(store, str) or not store:
            raise ConfigError(f"store must be a non-empty string, got {store!r}")
        if not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {type(limits).__name__}")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigError(
                "Limiter.bind() must be called in the event loop that will send the requests"
            ) from None
        with self._lock:
            stores = self._stores.setdefault(loop, {})
            bound = stores.get(store)
            if bound is None:
                bound = stores[store] = StoreLimiter(store, limits, self._backend, loop)
        if bound.limits != limits:
            raise ConfigError(
                f"store {store!r} is already in use with other Limits ({bound.limits!r});"
                " every client of one store must pass the same Limits"
            )
        return bound


class LocalLimiter(Limiter):
    """In-process limiter: clients sharing an instance (and a loop) share each store's budget."""

    def __init__(self) -> None:
        super().__init__(MemoryPacing())


_default = LocalLimiter()


def default_limiter() -> LocalLimiter:
    """The process-wide limiter that ``AdminClient(limiter=None)`` uses (state kept per loop)."""
    return _default
