"""Client-side rate limiting: in each loop, a paced queue per (store, pool), an in-flight cap.

A request waits for its pool's turn (FIFO), then for a place in the store's in-flight gate (a
full gate must not bunch starts), then claims a start from the backend, GCRA without burst:
``slot = max(now, tat)``, ``tat = slot + interval`` (a pause moves ``tat`` on), ``interval =
per / n * (1 + margin) * slowdown`` (:mod:`._calibration`), ``n / per`` as configured or lower
as announced (:mod:`._server_limits`), or as a discovering pool found it (:mod:`._discovery`,
shared as :mod:`._learned` says). It sleeps until the slot (claiming again if a pause came
meanwhile), hands the turn on; a late start pauses the pool (:meth:`Slot.sending`). A cancelled
waiter leaves the queue, losing a claimed slot (the safe side). Backends hold what processes
share (each pool's ``tat`` and slowdown): :class:`MemoryPacing` in process, Redis in Lua.
"""

from __future__ import annotations

import asyncio
import logging
import math
import weakref
from collections import defaultdict
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from ._calibration import Jitter, Slowdown
from ._config import Limits, Rate, check_binding
from ._discovery import RateSearch
from ._learned import MemoryLearning, StoreLearning
from ._server_limits import ServerLimit
from ._stats import LimiterStats, PoolStats
from .errors import AsyncSubsError, ConfigError, LimiterUnavailableError, RateLimitError

__all__ = ["DEFAULT_LIMITER", "Limiter", "MemoryPacing", "PacingBackend", "Slot", "StoreLimiter"]

logger = logging.getLogger("asyncsubs.limiter")
Closed = Callable[[], bool] | None  # a request's client closed: it fails at its turn, no claim


class PacingBackend(Protocol):
    """Shared pacing on the backend's clock. ``reserve`` claims the next start: ``(slot - now,
    slowdown)``, the pool's shared 429 slowdown (1.0: none). ``pause``: no slot before ``now +
    seconds``, the slowdown raised to ``slowdown``. Raises LimiterUnavailableError. One with an
    ``exchange`` method shares what stores learn too (:class:`~._learned.LearningBackend`)."""

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]: ...
    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None: ...


@attrs.define
class _Shared:
    tat: float = -math.inf  # no start before it; a pause moves it too
    slowdown: Slowdown = attrs.Factory(Slowdown)


class MemoryPacing(MemoryLearning):
    """The :class:`PacingBackend` of a process, shared by its threads' loops on the running loop's
    clock (CPython's and uvloop's read one monotonic clock), as Redis is by processes; it shares
    what the process's loops learn too (:class:`~._learned.MemoryLearning`)."""

    def __init__(self) -> None:
        super().__init__()  # its lock: a claim reads and moves the state; other threads claim too
        self._pools = defaultdict[tuple[str, str], _Shared](_Shared)
        self._sweep_at = 1024  # pools held before idle ones go, as Redis expires its keys

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]:
        with self._lock:
            now, shared = asyncio.get_running_loop().time(), self._pools[store, pool]
            slot = max(now, shared.tat)
            shared.tat = slot + interval
            if len(self._pools) >= self._sweep_at:  # idle an hour: as new (its slowdown too)
                kept = {k: s for k, s in self._pools.items() if s.tat > now - 3600.0}
                self._pools, self._sweep_at = defaultdict(_Shared, kept), 2 * len(kept) + 1024
                self._forget_learned(now)  # what was learned outlives idle pools a while
            return slot - now, shared.slowdown.value(now)

    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None:
        with self._lock:
            now, shared = asyncio.get_running_loop().time(), self._pools[store, pool]
            shared.tat = max(shared.tat, now + seconds)  # now at least: not idle since
            shared.slowdown.set(now, slowdown)


class _Pool:
    """One (store, pool) in this process; the counters are named as PoolStats' fields."""

    def __init__(self, name: str, rate: Rate, search: RateSearch | None) -> None:
        self.name, self.paced_by = name, "start"
        self.configured = self.rate = rate  # rate: paced by, lower if the server announced so
        self.search, self.slowdown = search, Slowdown()  # search: a discovering pool's, sets rate
        self.turn = asyncio.Lock()  # FIFO without barging, as Python 3.11's locks are
        self.pause_until = self.last_start = self.run_start = -math.inf
        self.interval = self.margin = self.logged = self.wait_seconds = 0.0
        self.requests = self.rate_limited = self.retries = self.waiting = self.in_flight = 0

    @property
    def announced(self) -> bool:  # paced by a quota the server announced
        return self.rate is not self.configured if self.search is None else self.search.announced


#: The fields of PoolStats that a _Pool holds under the same names.
_COUNTED: tuple[str, ...] = ("requests", "rate_limited", "retries", "wait_seconds", "waiting")
_COUNTED += ("in_flight", "interval", "margin", "paced_by")


class Slot:
    """``async with store_limiter.slot(pool) as slot``: held in flight; ``due``: its paced time."""

    __slots__ = ("_closed", "_limiter", "_max_wait", "_pool", "due", "pool")

    def __init__(self, limiter: StoreLimiter, pool: _Pool, max_wait: float, closed: Closed) -> None:
        self._limiter, self._pool, self._max_wait, self.due = limiter, pool, max_wait, 0.0
        self.pool, self._closed = pool.name, closed

    async def __aenter__(self) -> Slot:
        self.due = await self._limiter._acquire(self._pool, self._max_wait, self._closed)
        self.sending()  # late by the loop's own delay
        return self

    def sending(self) -> None:
        """The request goes out now (again when a session the client made gives it a connection:
        a connect delays it unseen); past half the room, the pool's pace restarts from now."""
        p = self._pool
        room = p.rate.n * p.interval - p.rate.per  # how far n paced starts span beyond a window
        if asyncio.get_running_loop().time() - self.due > room / 2:  # half for the server's delay
            self._limiter.pause(p.name, p.interval)  # its whole margin kept from this start

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        limiter, p = self._limiter, self._pool
        limiter._in_flight.release()
        p.in_flight -= 1
        if exc_type is None and p is limiter._global:  # a jitter sample (heavy pages: built late)
            limiter.jitter.add(asyncio.get_running_loop().time() - self.due)
        elif exc_type is None and self.due == p.run_start and not (p.waiting or p.in_flight):
            # A run's first stamp may be as late as its answer: alone, its n-th next start waits.
            limiter.pause(p.name, p.rate.per - (p.rate.n - 1) * p.interval)  # a window from now


class StoreLimiter:
    """The limiter state of one store in one event loop; get it from :meth:`Limiter.bind`."""

    def __init__(self, store: str, limits: Limits, backend: PacingBackend, jitter: Jitter) -> None:
        self.store, self.limits, self._backend, self.jitter = store, limits, backend, jitter
        self._loop_ref = weakref.ref(asyncio.get_running_loop())  # weak: not keeping it alive
        self._in_flight = asyncio.Semaphore(limits.max_in_flight)
        self.learning = StoreLearning(store, backend, self._repaced)  # rates, page sizes found
        self._pools: dict[str, _Pool] = {}
        for name in limits.pools:
            discovery = limits.discovery_for(name)
            search = None if discovery is None else self.learning.add(name, RateSearch(discovery))
            self._pools[name] = _Pool(name, limits.rate_for(name), search)
        self._global = self._pools["global"]
        self._sharers = getattr(backend, "sharers", None)

    def _pool(self, pool: str) -> _Pool:
        if (found := self._pools.get(pool)) is None:
            pools = ", ".join(self._pools)
            raise ConfigError(f"store {self.store!r} has no rate-limit pool {pool!r} ({pools})")
        return found

    def slot(self, pool: str, *, max_wait: float = math.inf, closed: Closed = None) -> Slot:
        """A paced start of ``pool``; one that would wait on a pause (past its interval) more
        than ``max_wait`` s fails at once with RateLimitError, ``retry_after`` saying how long."""
        return Slot(self, self._pool(pool), max_wait, closed)

    def stats(self) -> LimiterStats:
        pools = {}
        for name, p in self._pools.items():
            fields = {f: getattr(p, f) for f in _COUNTED}
            fields["rate_by"] = "server" if p.announced else "configured"
            fields.update(self.learning.stats(name))  # a search's rate_by, the page size found
            pools[name] = PoolStats(**fields, rate=p.rate.per_second)
        in_flight, most = sum(p.in_flight for p in pools.values()), self.limits.max_in_flight
        return LimiterStats(self.store, MappingProxyType(pools), in_flight, most)

    def _repaced(self, key: str, now: float, *, share: bool = False) -> None:
        """What ``key`` learned changed (here, if ``share``): a discovering pool paces by it."""
        if (p := self._pools.get(key)) is not None and p.search is not None:
            p.rate = p.search.pace()
            logger.debug("store %r pool %r: rate now %.3f/s", self.store, key, p.search.rate)
        if share:
            self.learning.share(key)

    def record_retry(self, pool: str) -> None:
        self._pool(pool).retries += 1

    def rate_limited(self, slot: Slot, pause: float | None) -> None:
        """A 429 answered ``slot``'s request: count it, widen the pool's slowdown (once per
        round trip) and pause the pool for ``pause`` seconds (Retry-After)."""
        p, now = slot._pool, asyncio.get_running_loop().time()
        p.rate_limited += 1
        if p.search is not None:  # a discovering pool learns its rate instead of slowing down
            workers = 1 if self._sharers is None else self._sharers(self.store)
            if p.search.refused_start(slot.due, now, p.pause_until, workers, p.interval):
                self._repaced(p.name, now, share=True)
        elif slot.due > p.slowdown.widened_at:  # else sent before the last widening
            since = max(p.run_start, slot.due - p.rate.per)
            # The starts in the window before: one per interval in all processes; none if paused.
            accepted = (slot.due - since) / p.interval if p.pause_until <= since else 0.0
            factor = p.slowdown.widen(now, p.rate.n / accepted if accepted >= 3 else 1.0)
            logger.debug("store %r pool %r: 429, slowdown now %.3f", self.store, p.name, factor)
        self.pause(p.name, pause or 0.0)

    def server_limit(self, pool: str, limit: ServerLimit, *, hold: bool = True) -> None:
        """A response of ``pool`` announced the server's limit: pace by a lower quota (any, with
        ``server_limits="follow"``); with none left, hold the pool (if ``hold``: no Retry-After)
        until the reset, unless paced by the quota and due within a second (``t`` is whole s)."""
        mode, p = self.limits.server_limits, self._pool(pool)
        if mode == "ignore":
            return
        if limit.quota is not None:
            announced = Rate(limit.quota, per=limit.window or p.configured.per)
            if p.search is not None:  # any announced quota replaces the search
                before = p.search.rate
                p.search.announce(now := asyncio.get_running_loop().time(), announced.per_second)
                if p.search.rate != before:
                    self._repaced(pool, now, share=True)
            else:
                lower = announced.per_second < p.configured.per_second
                p.rate = announced if lower or mode == "follow" else p.configured
        covered = p.announced and (limit.reset or 0) <= 1.0
        if limit.remaining == 0 and limit.reset and hold and not covered:
            self.pause(pool, limit.reset)

    def pause(self, pool: str, seconds: float) -> None:
        """Hold ``pool`` for ``seconds`` from now (not shortening a pause; seconds not positive and
        finite hold nothing) in every process sharing the backend, which learns the slowdown too."""
        p, loop = self._pool(pool), asyncio.get_running_loop()
        seconds = seconds if 0 < seconds < math.inf else 0.0
        if seconds:
            p.pause_until = max(p.pause_until, loop.time() + seconds)
            logger.debug("store %r pool %r: paused for %.3fs", self.store, pool, seconds)
        pausing = self._backend.pause(self.store, pool, seconds, p.slowdown.value(loop.time()))
        self.learning.background(pausing, "a pause")

    def _pace(self, p: _Pool, now: float) -> float:
        """The pool's interval now, with its margin and what set it."""
        limits, rate, spread = self.limits, p.rate, self.jitter.spread
        if spread is None and (p is self._global or p.requests <= rate.n):
            margin, paced_by = limits.max_margin, "start"  # until the first spread
        else:  # a store sending heavy lists only has no samples: their pool paces at the floor
            margin = min(limits.max_margin, max(limits.safety_margin, (spread or 0) / rate.per))
            paced_by = "jitter" if margin > limits.safety_margin else "floor"
        slowdown = p.slowdown.value(now)
        paced_by = "429" if slowdown > 1.001 else "server" if p.announced else paced_by
        p.margin, p.paced_by, p.interval = margin, paced_by, rate.interval * (1 + margin) * slowdown
        if abs(p.interval - p.logged) > 0.05 * p.logged:  # a marked change
            message = "store %r pool %r: interval %.4fs (margin %.3f, slowdown %.3f, by %s)"
            logger.debug(message, self.store, p.name, p.interval, margin, slowdown, paced_by)
            p.logged = p.interval
        return p.interval

    async def _acquire(self, p: _Pool, max_wait: float, closed: Closed) -> float:
        loop = asyncio.get_running_loop()
        if loop is not self._loop_ref():
            raise ConfigError(f"store {self.store!r}: this limiter is bound to another event loop")
        queued_at, p.waiting = loop.time(), p.waiting + 1
        try:
            async with p.turn:  # as the pool's head, holding an in-flight place, claim a slot
                if p.search is not None:
                    await self.learning.ready(p.name)
                await self._in_flight.acquire()
                try:
                    while True:
                        if closed is not None and closed():
                            raise ConfigError("the client was closed while this request waited")
                        held = (now := loop.time()) < p.pause_until  # this process's view
                        due = p.pause_until if held else await self._reserve(p, now)
                        if (wait := due - loop.time()) > max_wait + (0 if held else p.interval):
                            p.pause_until = max(p.pause_until, due)  # the rest here claim none
                            message = f"store {self.store!r}: the {p.name} pool is paused for"
                            message += f" {wait:.1f}s, longer than RetryPolicy.max_retry_after"
                            raise RateLimitError(message, retry_after=wait, status=429)
                        if wait > 0:
                            await asyncio.sleep(wait)
                        if not held and p.pause_until <= due:  # else claim after a pause
                            break
                except BaseException:
                    self._in_flight.release()
                    raise
        finally:
            p.waiting -= 1
        # Back from idle (not from a pause), the server's window is empty (see rate_limited).
        if due - p.last_start >= p.rate.per and p.pause_until <= p.last_start:
            p.run_start = due
        p.last_start, p.requests, p.in_flight = due, p.requests + 1, p.in_flight + 1
        p.wait_seconds += due - queued_at
        if p.search is not None and p.search.started(due, waited=due > queued_at):
            self._repaced(p.name, due, share=True)
        self.learning.tick(due)  # read what other holders learned, now and then
        return due

    async def _reserve(self, p: _Pool, now: float) -> float:
        """Claim the pool's next start from the backend: the loop time it is due."""
        try:
            wait, slowdown = await self._backend.reserve(self.store, p.name, self._pace(p, now))
            if not (0 <= wait < math.inf and 1 <= slowdown < math.inf):
                message = f"rate limiter backend returned an invalid slot ({wait!r}, {slowdown!r})"
                raise LimiterUnavailableError(f"{message} for store {self.store!r}")
        except AsyncSubsError:
            raise
        except Exception as exc:  # its type only: a message may hold the backend's password
            message = f"rate limiter backend failed for store {self.store!r}"
            raise LimiterUnavailableError(f"{message}: {type(exc).__name__}") from exc
        p.slowdown.set(now := asyncio.get_running_loop().time(), slowdown)
        return now + wait


class Limiter:
    """Per-store limiter state, one per store and loop, pacing through ``backend`` (by default a
    :class:`MemoryPacing` of its own, shared by every loop of the process)."""

    def __init__(self, backend: PacingBackend | None = None) -> None:
        self._backend = MemoryPacing() if backend is None else backend
        # Weak: a loop is freed with its clients (its limiters' asyncio locks hold it).
        self._stores = weakref.WeakValueDictionary[tuple[Any, str], StoreLimiter]()
        self._jitters = weakref.WeakValueDictionary[tuple[str, Limits], Jitter]()  # all loops'

    def bind(self, store: str, limits: Limits) -> StoreLimiter:
        """The limiter of ``store`` in the running loop; same store and loop -> same object."""
        check_binding(store, limits)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise ConfigError("Limiter.bind() must run in the event loop that sends") from None
        if (bound := self._stores.get(key := (weakref.ref(loop), store))) is None:
            jitter = self._jitters.setdefault((store, limits), Jitter(limits.global_rate.n))
            bound = self._stores[key] = StoreLimiter(store, limits, self._backend, jitter)
        if bound.limits != limits:
            message = f"store {store!r} is already in use with other Limits ({bound.limits!r})"
            raise ConfigError(f"{message}; every client of one store must pass the same Limits")
        return bound


#: The process-wide limiter of ``AdminClient(limiter=None)``, shared by every event loop.
DEFAULT_LIMITER = Limiter()
