"""Client-side rate limiting: in each loop, a paced queue per (store, pool), an in-flight cap.

A request waits for its pool's turn (FIFO), then for a place in the store's in-flight gate (a
full gate must not bunch starts), then claims a start from the backend, GCRA without burst:
``slot = max(now, tat)``, ``tat = slot + interval`` (a pause moves ``tat`` on), ``interval =
per / n * (1 + margin) * slowdown`` (:mod:`._calibration`), ``n / per`` as configured or lower
as announced (:mod:`._server_limits`), or as a discovering pool found it (:mod:`._discovery`).
It sleeps until the slot (claiming again if a pause came meanwhile), hands the turn on; a late
start pauses the pool (:meth:`Slot.sending`). A cancelled waiter leaves the queue, losing a
claimed slot (the safe side). Backends hold what processes share (each pool's ``tat`` and
slowdown, and what pools learned): :class:`MemoryPacing` in process, Redis in Lua.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Coroutine, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from ._calibration import Jitter, Slowdown
from ._config import Limits, Rate, check_binding
from ._discovery import LEARNED_MAX_AGE, Learned, PageSizeSearch, RateSearch, merged
from ._server_limits import ServerLimit
from ._stats import LimiterStats, PoolStats
from .errors import AsyncSubsError, ConfigError, LimiterUnavailableError, RateLimitError

__all__ = [
    "DEFAULT_LIMITER",
    "LearningBackend",
    "Limiter",
    "MemoryPacing",
    "PacingBackend",
    "Slot",
    "StoreLimiter",
]

logger = logging.getLogger("asyncsubs.limiter")

#: Seconds between two exchanges of what pools learned with a shared backend, while in use.
SYNC_EVERY = 1.0


class PacingBackend(Protocol):
    """Shared pacing on the backend's clock. ``reserve`` claims the next start: ``(slot - now,
    slowdown)``, the pool's shared 429 slowdown (1.0: none). ``pause``: no slot before ``now +
    seconds``, the slowdown raised to ``slowdown``. Raises LimiterUnavailableError.

    A backend may also share what pools learn (discovered rates, page sizes) with an
    ``exchange`` method (see :class:`LearningBackend`); without one each process learns alone."""

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]: ...
    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None: ...


class LearningBackend(Protocol):
    """``exchange``: the shared record of what ``key`` (a pool, or a list path) of ``store``
    learned, with a version. Given ``learned``, it is written if ``version`` is the shared one's
    (0: none yet), compare-and-set; returns the shared ``(version, record or None, written)``,
    the record's ``hold`` and ``age`` counted to now on the backend's clock. ``sharers``: how
    many processes pace ``store`` through the backend now (optional; 1 without it)."""

    async def exchange(
        self, store: str, key: str, version: int, learned: Learned | None
    ) -> tuple[int, Learned | None, bool]: ...


@attrs.define
class _Shared:
    tat: float = -math.inf  # no start before it; a pause moves it too
    slowdown: Slowdown = attrs.Factory(Slowdown)


class MemoryPacing:
    """The :class:`PacingBackend` of a process, shared by its threads' loops on the running loop's
    clock (CPython's and uvloop's read one monotonic clock), as Redis is by processes."""

    def __init__(self) -> None:
        self._pools = defaultdict[tuple[str, str], _Shared](_Shared)
        self._lock = threading.Lock()  # a claim reads and moves the state; other threads claim too
        self._sweep_at = 1024  # pools held before idle ones go, as Redis expires its keys
        # What pools learned: (store, key) -> (version, record, loop time written).
        self._learned: dict[tuple[str, str], tuple[int, Learned, float]] = {}

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]:
        with self._lock:
            now, shared = asyncio.get_running_loop().time(), self._pools[store, pool]
            slot = max(now, shared.tat)
            shared.tat = slot + interval
            if len(self._pools) >= self._sweep_at:  # idle an hour: as new (its slowdown too)
                kept = {k: s for k, s in self._pools.items() if s.tat > now - 3600.0}
                self._pools, self._sweep_at = defaultdict(_Shared, kept), 2 * len(kept) + 1024
                old = now - 2 * LEARNED_MAX_AGE  # what was learned outlives idle pools a while
                self._learned = {k: v for k, v in self._learned.items() if v[2] > old}
            return slot - now, shared.slowdown.value(now)

    async def exchange(
        self, store: str, key: str, version: int, learned: Learned | None
    ) -> tuple[int, Learned | None, bool]:
        with self._lock:
            now, current = asyncio.get_running_loop().time(), self._learned.get((store, key))
            written = learned is not None and version == (0 if current is None else current[0])
            if written:
                assert learned is not None
                current = self._learned[store, key] = (version + 1, learned, now)
        if current is None:
            return 0, None, False
        shared_version, record, at = current
        return shared_version, record.aged(now - at), written

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
        self.search = search  # a discovering pool's: it sets ``rate``
        self.turn = asyncio.Lock()  # FIFO without barging, as Python 3.11's locks are
        self.slowdown = Slowdown()
        self.pause_until = self.last_start = self.run_start = -math.inf
        self.interval = self.margin = self.logged = self.wait_seconds = 0.0
        self.requests = self.rate_limited = self.retries = self.waiting = self.in_flight = 0
        # A discovering pool's last change of rate, and when its requests were due that were
        # not refused (the starts the server counted, as far as this loop knows: a 429 counts
        # its window).
        self.repaced_at = -math.inf
        self.counted = deque[float](maxlen=0 if search is None else 2 * search.most + 2)

    @property
    def announced(self) -> bool:
        """Paced by a quota the server announced."""
        return self.rate is not self.configured if self.search is None else self.search.announced


#: The fields of PoolStats that a _Pool holds under the same names.
_COUNTED = (
    *("requests", "rate_limited", "retries", "wait_seconds", "waiting", "in_flight"),
    *("interval", "margin", "paced_by"),
)


class _Learning:
    """What one pool (or list path) of a store learned in this loop, and its shared version."""

    __slots__ = ("again", "pages", "search", "seeded", "sync", "synced", "version")

    def __init__(self, search: RateSearch | None) -> None:
        self.search, self.pages = search, PageSizeSearch()
        self.version: int | None = None  # None: the shared record not read yet
        self.synced: Learned | None = None  # the record as last exchanged
        self.seeded = False  # restored from an import: the shared record, if any, wins
        self.sync: asyncio.Task[None] | None = None  # the exchange with the backend running
        self.again = False  # another asked for while it runs

    def snapshot(self, now: float) -> Learned:
        rate = {} if self.search is None else self.search.snapshot(now)
        return Learned(**rate, **self.pages.snapshot())  # type: ignore[arg-type]

    def restore(self, learned: Learned, now: float, *, imported: bool = False) -> None:
        """Take in ``learned``: an import (a record of an earlier run) or another holder's."""
        if self.search is not None:
            self.search.restore(learned, now, by="remembered" if imported else None)
        if imported:
            self.pages.restore(learned)
        else:
            self.pages.adopt(learned)


class Slot:
    """``async with store_limiter.slot(pool) as slot``: an in-flight place held while the
    request runs; ``slot.due`` is the loop time it was paced for."""

    __slots__ = ("_limiter", "_max_wait", "_pool", "due", "pool")

    def __init__(self, limiter: StoreLimiter, pool: _Pool, max_wait: float) -> None:
        self._limiter, self._pool, self._max_wait, self.due = limiter, pool, max_wait, 0.0
        self.pool = pool.name

    async def __aenter__(self) -> Slot:
        self.due = await self._limiter._acquire(self._pool, self._max_wait)
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
        self._limiter._in_flight.release()
        self._pool.in_flight -= 1
        # An answered light request is a jitter sample (heavy pages are built after the stamp).
        if exc_type is None and self._pool is self._limiter._global:
            self._limiter.jitter.add(asyncio.get_running_loop().time() - self.due)


class StoreLimiter:
    """The limiter state of one store in one event loop; get it from :meth:`Limiter.bind`."""

    def __init__(self, store: str, limits: Limits, backend: PacingBackend, jitter: Jitter) -> None:
        self.store, self.limits, self._backend, self.jitter = store, limits, backend, jitter
        self._loop_ref = weakref.ref(asyncio.get_running_loop())  # weak: not keeping it alive
        self._in_flight = asyncio.Semaphore(limits.max_in_flight)
        self._pools: dict[str, _Pool] = {}
        self._learning: dict[str, _Learning] = {}  # discovering pools', and list paths'
        for name in limits.pools:
            discovery = limits.discovery_for(name)
            search = None if discovery is None else RateSearch(discovery)
            self._pools[name] = _Pool(name, limits.rate_for(name), search)
            if search is not None:
                self._learning[name] = _Learning(search)
        self._global = self._pools["global"]
        self._background: set[asyncio.Task[None]] = set()  # pauses and learning being shared
        self._exchange = getattr(backend, "exchange", None)
        self._sharers = getattr(backend, "sharers", None)
        self._sync_at = -math.inf

    def _pool(self, pool: str) -> _Pool:
        if (found := self._pools.get(pool)) is None:
            pools = ", ".join(self._pools)
            raise ConfigError(f"store {self.store!r} has no rate-limit pool {pool!r} ({pools})")
        return found

    def slot(self, pool: str, *, max_wait: float = math.inf) -> Slot:
        """A paced start of ``pool``; one that would wait (on a pause) longer than ``max_wait``
        seconds fails at once with RateLimitError, ``retry_after`` saying how long."""
        return Slot(self, self._pool(pool), max_wait)

    def stats(self) -> LimiterStats:
        pools: dict[str, PoolStats] = {}
        for name, p in self._pools.items():
            learning, search = self._learning.get(name), p.search
            rate_by = search.by if search is not None else "server" if p.announced else "configured"
            pools[name] = PoolStats(
                **{f: getattr(p, f) for f in _COUNTED},
                rate=p.rate.per_second,
                rate_by=rate_by,
                ceiling_found=None if search is None else search.refused,
                good=None if search is None else search.good,
                page_size=None if learning is None else learning.pages.size,
                page_size_by=None if learning is None else learning.pages.by,
            )
        in_flight, most = sum(p.in_flight for p in pools.values()), self.limits.max_in_flight
        return LimiterStats(self.store, MappingProxyType(pools), in_flight, most)

    # -- what pools learn -----------------------------------------------------------------------

    async def page_sizes(self, path: str) -> PageSizeSearch:
        """The page-size search of list ``path`` (its heavy pool's, or the path's own), shared
        by every pull of the path in this loop and with the backend's other holders."""
        learning = self._learning.get(path)
        if learning is None:
            learning = self._learning[path] = _Learning(None)
        if learning.version is None:
            await self._read_shared(path)
        return learning.pages

    def learned(self) -> dict[str, Learned]:
        """What each pool (and list path) learned so far, ``hold`` and ``age`` counted to now
        (also once the loop has stopped: an export at the end of a run)."""
        loop = self._loop_ref()
        now = loop.time() if loop is not None else time.monotonic()
        return {key: learning.snapshot(now) for key, learning in self._learning.items()}

    def restore(self, records: Mapping[str, Learned]) -> None:
        """Start from records learned before (an import): each is used unless the backend
        already holds one for its key (another client or worker learned since)."""
        now = asyncio.get_running_loop().time()
        for key, record in records.items():
            pool = self._pools.get(key)
            search = None if pool is None else pool.search
            learning = self._learning.setdefault(key, _Learning(search))
            learning.restore(record, now, imported=True)
            learning.seeded = True
            if pool is not None and search is not None:
                self._repaced(pool, now)

    def _repaced(self, p: _Pool, now: float) -> None:
        """A discovering pool's rate changed: its next reserve paces by it."""
        assert p.search is not None
        p.repaced_at, p.rate = now, p.search.pace()

    async def _read_shared(self, key: str) -> None:
        """Start ``key`` from what the backend's holders learned: one exchange, however many
        of this loop's pulls wait for it."""
        learning = self._learning[key]
        if self._exchange is None:
            learning.version = 0
            return
        await asyncio.shield(learning.sync or self._exchanging(key))

    def _share(self, key: str) -> None:
        """Exchange what ``key`` learned with the backend, if it shares."""
        if self._exchange is not None:
            self._exchanging(key)

    def _exchanging(self, key: str) -> asyncio.Task[None]:
        """The exchange of ``key`` running, one at a time: one asked for meanwhile follows it
        (overlapping, both would write, and the second would adopt the first's record as
        another holder's and repace the pool, discarding its 429s' evidence, for nothing)."""
        learning = self._learning[key]
        if learning.sync is not None:
            learning.again = True
            return learning.sync
        task = learning.sync = self._spawn(self._sync(key), "what a pool learned")
        task.add_done_callback(functools.partial(self._exchanged, key))
        return task

    def _exchanged(self, key: str, task: asyncio.Task[None]) -> None:
        learning = self._learning[key]
        learning.sync = None
        if learning.again and not task.cancelled():
            learning.again = False
            self._exchanging(key)

    async def _sync(self, key: str) -> None:
        """Exchange what ``key`` learned with the backend's shared record: a change of ours is
        written (merged with one made elsewhere meanwhile), one made elsewhere adopted."""
        learning, loop = self._learning[key], asyncio.get_running_loop()
        assert self._exchange is not None
        for _ in range(3):  # a write lost to another writer is merged and written again
            mine = learning.snapshot(loop.time())
            known = learning.version
            dirty = learning.seeded or (known is not None and mine != learning.synced)
            try:
                version, shared, written = await self._exchange(
                    self.store, key, known or 0, mine if dirty else None
                )
            except Exception as exc:  # learning alone until the backend answers again
                learning.version = known or 0
                message = "store %r: what %r learned was not shared (%s)"
                logger.debug(message, self.store, key, type(exc).__name__)
                return
            if written or (not dirty and (shared is None or version == known)):
                learning.version, learning.synced, learning.seeded = version, mine, False
                return
            if shared is None:  # none (expired since) or none readable: ours is written over it
                learning.version = version
                continue
            adopt = shared if learning.seeded or not dirty else merged(mine, shared)
            learning.restore(adopt, now := loop.time())
            learning.version, learning.seeded = version, False
            learning.synced = shared if adopt is shared else None  # a merge is written next
            if (pool := self._pools.get(key)) is not None and pool.search is not None:
                self._repaced(pool, now)
            if adopt is shared:
                return

    def record_retry(self, pool: str) -> None:
        self._pool(pool).retries += 1

    def rate_limited(self, slot: Slot, pause: float | None) -> None:
        """A 429 answered ``slot``'s request: count it, widen the pool's slowdown (once per
        round trip) and pause the pool for ``pause`` seconds (Retry-After)."""
        p, now = slot._pool, asyncio.get_running_loop().time()
        p.rate_limited += 1
        if p.search is not None:  # a discovering pool learns its rate instead of slowing down
            self._refused(p, p.search, slot.due, now)
        elif slot.due > p.slowdown.widened_at:  # else sent before the last widening
            since = max(p.run_start, slot.due - p.rate.per)
            # The starts in the window before: one per interval in all processes; none if paused.
            accepted = (slot.due - since) / p.interval if p.pause_until <= since else 0.0
            factor = p.slowdown.widen(now, p.rate.n / accepted if accepted >= 3 else 1.0)
            logger.debug("store %r pool %r: 429, slowdown now %.3f", self.store, p.name, factor)
        self.pause(p.name, pause or 0.0)

    def _refused(self, p: _Pool, search: RateSearch, due: float, now: float) -> None:
        """A 429 answered a discovering pool's request due at ``due``."""
        with contextlib.suppress(ValueError):
            p.counted.remove(due)  # refused, not counted
        if due <= p.repaced_at:  # sent before the pool last changed its rate
            return
        # What the server evidently allowed: the starts it accepted in the window before, as a
        # sliding window counts them (pauses in it change nothing: the server counted these);
        # refused again at a rate a 429 set, no more than it accepted since the pause after
        # that 429 (a fixed window counts fewer than the last second holds, a token bucket
        # refills more slowly than it lets a burst through).
        per, counted = search.window, p.counted
        allowed = sum(due - per < start < due for start in counted) / per
        since = max(p.repaced_at, p.pause_until, counted[0] if counted else due)
        if search.by == "429" and due - since >= per:
            allowed = min(allowed, sum(since <= start < due for start in counted) / (due - since))
        # Shared through Redis, the other workers' starts went unseen: as many again per worker
        # (they claim the pool's slots in turn).
        workers = 1 if self._sharers is None else self._sharers(self.store)
        search.refused_at(now, allowed * workers or None, every_start=workers == 1)
        self._repaced(p, now)
        self._share(p.name)
        message = "store %r pool %r: 429, the server evidently allowed %.3f/s, rate now %.3f/s"
        logger.debug(message, self.store, p.name, allowed, search.rate)

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
                    self._repaced(p, now)
                    self._share(pool)
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
        slowdown = p.slowdown.value(loop.time())
        self._spawn(self._backend.pause(self.store, pool, seconds, slowdown), "a pause")

    def _spawn(self, sharing: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """Run ``sharing`` (with the backend) in the background; a failure is logged once."""
        task = asyncio.get_running_loop().create_task(sharing)
        self._background.add(task)
        task.add_done_callback(functools.partial(self._shared, what))
        return task

    def _shared(self, what: str, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            message = "store %r: could not share %s with the limiter backend (%s)"
            logger.warning(message, self.store, what, type(exc).__name__)

    def _pace(self, p: _Pool, now: float) -> float:
        """The pool's interval now, with its margin and what set it."""
        limits, rate, spread = self.limits, p.rate, self.jitter.spread
        if spread is None and (p is self._global or p.requests <= rate.n):
            margin, paced_by = limits.max_margin, "start"  # until the first spread
        else:  # a store sending heavy lists only has no samples: their pool paces at the floor
            margin = min(limits.max_margin, max(limits.safety_margin, (spread or 0) / rate.per))
            paced_by = "jitter" if margin > limits.safety_margin else "floor"
        slowdown = p.slowdown.value(now)
        paced_by = "server" if p.announced else paced_by
        paced_by = "429" if slowdown > 1.001 else paced_by
        p.margin, p.paced_by, p.interval = margin, paced_by, rate.interval * (1 + margin) * slowdown
        if abs(p.interval - p.logged) > 0.05 * p.logged:  # a marked change
            message = "store %r pool %r: interval %.4fs (margin %.3f, slowdown %.3f, by %s)"
            logger.debug(message, self.store, p.name, p.interval, margin, slowdown, paced_by)
            p.logged = p.interval
        return p.interval

    async def _acquire(self, p: _Pool, max_wait: float) -> float:
        loop = asyncio.get_running_loop()
        if loop is not self._loop_ref():
            raise ConfigError(f"store {self.store!r}: this limiter is bound to another event loop")
        queued_at, p.waiting = loop.time(), p.waiting + 1
        try:
            async with p.turn:  # as the pool's head, holding an in-flight place, claim a slot
                if p.search is not None and self._learning[p.name].version is None:
                    await self._read_shared(p.name)
                await self._in_flight.acquire()
                try:
                    while True:
                        held = (now := loop.time()) < p.pause_until  # this process's view
                        due = p.pause_until if held else await self._reserve(p, now)
                        if (wait := due - loop.time()) > max_wait:
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
        if p.search is not None:
            p.counted.append(due)
            if p.search.started(due, waited=due > queued_at):
                self._repaced(p, due)
                self._share(p.name)
            logger.debug("store %r pool %r: rate raised to %s", self.store, p.name, p.rate)
        if self._learning and due >= self._sync_at:  # read what other holders learned
            self._sync_at = due + SYNC_EVERY
            for key in self._learning:
                self._share(key)
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
