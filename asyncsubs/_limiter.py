"""Client-side rate limiting: even pacing per (store, pool), an in-flight cap per store, pauses.

How the client uses it::

    limiter = default_limiter()                 # or LocalLimiter(), or a RedisLimiter
    store_limiter = limiter.bind(store, limits)   # inside the running loop
    async with store_limiter.slot(pool, reports_sends=True) as start:
        ...                                       # send the request; once it is written:
        start.sent()
        ...                                       # read the response
    store_limiter.pause(pool, retry_after)        # after a 429
    store_limiter.record_429(pool); store_limiter.record_retry(pool)
    store_limiter.stats()                         # -> LimiterStats

Guarantees
----------
- Starts in one (store, pool) are paced ``limits.interval_for(pool)`` apart (``per / n``
  widened by the safety margin), measured with ``loop.time()``, from a cold start on (no
  initial burst). A start late for its moment by at most the lateness credit (timer lateness on
  a busy loop) is paced from that moment, so lateness does not add up to a lower rate; one held
  up longer (an idle pool, a full in-flight gate) is paced from when it went, so no catch-up
  burst follows. Either way no ``n + 1`` starts fall within ``per``. (On a loop whose clock
  counts milliseconds, like uvloop's, a start may be let through up to 1 ms before its moment
  by that clock; the next is still paced from the moment itself.)
- Whatever the loop does, no ``n + 1`` requests of a pool are *written* within
  ``limits.send_span_for(pool)`` (``per`` plus half the margin's share), as far as this process
  can see: a request whose write lagged its start (a new connection, a busy loop) holds back the
  start ``n`` places after it, so its lateness never bunches it up with later requests in a
  server's window. Callers that report writes (``reports_sends=True``, then ``start.sent()``)
  get this for the actual write moments; for the others a request counts as written when it
  starts. A request started but not yet written counts as written from now on; one that ends
  unwritten (it could not connect) does not count.
- ``max_in_flight`` caps the requests of a store that are in flight at once, across its pools.
- ``pause(pool, seconds)`` holds every task of that pool until the pause has passed; pacing then
  resumes one interval at a time. A pause never shortens an existing one.
- All waiting is on futures and ``loop.call_at`` timers set for the exact moment computed; there
  is never more than one pacing timer per (store, pool), whatever the number of waiters.

Ordering
--------
A request goes through three stages, in this order:

1. its pool's *turn*: a FIFO queue per (store, pool); only the head of the queue goes further;
2. the pool's *paced start*: the head sleeps until ``last start + interval`` (and past any
   pause and the write-span bound above), holding nothing but its pool's turn. A start hands
   the turn to the next request with a timer for that moment, so a paced request is woken
   once, not once for the turn and again for its moment;
3. the store's *in-flight gate*: a FIFO of pool heads whose start time has come; the request
   starts the moment it gets a place, and that moment is what the next start is paced from.

So in-flight places go first come first served among requests that may start now, and a heavy
request waiting for its slow pool never holds a place that a light request could use. Because
the pace is measured from actual starts, a start delayed by a full gate is not followed by a
catch-up burst. A task cancelled while waiting leaves its queue, and the next task of its pool
inherits its place and its start time (in-flight places are handed over, never leaked).

Shared backends (the interface a RedisLimiter implements)
---------------------------------------------------------
``StoreLimiter`` owns the queues, the in-flight gate, pauses as seen by this process, and the
statistics. Across processes only the pacing itself must be shared; that is a
:class:`PacingBackend`, two coroutines keyed by ``(store, pool)``:

- ``reserve(store, pool, interval) -> float``: atomically claim the pool's next start slot,
  ``slot = max(now, tat, pause_end)``, set ``tat = slot + interval`` and return
  ``slot - now`` in seconds (>= 0), all on the backend's own clock (GCRA without burst; one
  Redis round trip). Called only when this process's own pacing would let a request start now,
  by at most one task per (store, pool) per process at a time; the call is shielded from
  cancellation so that the slot it claims is used by the next waiter rather than lost.
- ``pause(store, pool, seconds)``: no slot may be handed out before ``now + seconds``; never
  shortens an existing pause (e.g. a key with a TTL holding the pause's end). Runs as a
  background task; failures are logged, not raised.

Errors should be raised as :class:`~asyncsubs.errors.LimiterUnavailableError`; any other
``Exception`` from ``reserve`` is wrapped in one. A subclass of :class:`Limiter` that passes its
backend to ``super().__init__(backend)`` is all a shared limiter needs. ``max_in_flight`` stays
per process. :class:`MemoryPacing` is the reference implementation (and what tests use to
simulate several processes).

Known limits: with a shared backend, a request held up by this process's full in-flight gate
starts later than its slot and so may land close to another process's next start (the safety
margin absorbs small delays); likewise the write-span bound sees this process's writes only.
Store state lives as long as its event loop, so that a store bound again right after its last
client closed is still paced from its previous start.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Mapping
from types import MappingProxyType, TracebackType
from typing import Protocol

import attrs

from ._config import Limits
from .errors import AsyncSubsError, ConfigError, LimiterUnavailableError

__all__ = [
    "Limiter",
    "LimiterStats",
    "LocalLimiter",
    "MemoryPacing",
    "PacingBackend",
    "PoolStats",
    "Slot",
    "StoreLimiter",
    "default_limiter",
]

logger = logging.getLogger("asyncsubs.limiter")

#: A request that waited longer than this (seconds) is logged at DEBUG.
LONG_WAIT_SECONDS = 1.0

_NEVER = -math.inf

#: asyncio runs every timer due within the clock's resolution in one go, so a task woken by its
#: own timer may find loop.time() a hair before the moment it asked for. Going back to sleep for
#: that would only cost another timer; within this slack, the moment counts as reached.
_SLACK = time.get_clock_info("monotonic").resolution

#: A shared-backend slot is kept at least this long before it counts as stale (a local Redis
#: round trip takes ~0.2 ms, a remote one a few ms).
_MIN_STALE_SECONDS = 0.01

#: The slack of loops whose clock is not asyncio's. uvloop's loop.time() counts whole
#: milliseconds (cached per loop iteration) and rounds timer delays to the nearest millisecond,
#: a delay under half a millisecond to "now": with a finer slack, a woken task would find itself
#: a fraction of a millisecond early and re-arm a zero-delay timer until the clock ticks over,
#: dozens of loop iterations per request.
_COARSE_SLACK = 1e-3


def _clock_slack(loop: asyncio.AbstractEventLoop) -> float:
    """How far before its moment a woken task may find ``loop.time()``: the loop clock's grain."""
    resolution = getattr(loop, "_clock_resolution", None)  # asyncio's BaseEventLoop
    if isinstance(resolution, float) and 0 < resolution <= _COARSE_SLACK:
        return max(resolution, _SLACK)
    return _COARSE_SLACK


# --------------------------------------------------------------------------------------------
# Statistics


@attrs.frozen
class PoolStats:
    """Counters for one pool of one store since the store was first bound in this loop."""

    requests: int = 0  #: requests started (retries included: each attempt is a request)
    rate_limited: int = 0  #: 429 responses received
    retries: int = 0  #: attempts that were retries
    wait_seconds: float = 0.0  #: total time started requests spent queued in the limiter
    waiting: int = 0  #: tasks queued in this pool right now


@attrs.frozen
class LimiterStats:
    """A snapshot of one store's limiter: its pools' counters and what is in flight now."""

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


# --------------------------------------------------------------------------------------------
# Backends


class PacingBackend(Protocol):
    """Shared pacing and pauses for (store, pool); see the module docstring for the contract."""

    async def reserve(self, store: str, pool: str, interval: float) -> float: ...

    async def pause(self, store: str, pool: str, seconds: float) -> None: ...


class MemoryPacing:
    """Reference :class:`PacingBackend` in memory: what a Redis backend does atomically.

    Several limiters sharing one instance (in one loop) behave like several processes sharing
    one Redis. The clock is the running loop's, so tests can fake it.
    """

    def __init__(self) -> None:
        # (store, pool) -> theoretical arrival time of the next slot / end of the pause
        self._tat: dict[tuple[str, str], float] = {}
        self._pause_end: dict[tuple[str, str], float] = {}

    async def reserve(self, store: str, pool: str, interval: float) -> float:
        now = asyncio.get_running_loop().time()
        key = (store, pool)
        slot = max(now, self._tat.get(key, _NEVER), self._pause_end.get(key, _NEVER))
        self._tat[key] = slot + interval
        return slot - now

    async def pause(self, store: str, pool: str, seconds: float) -> None:
        end = asyncio.get_running_loop().time() + seconds
        key = (store, pool)
        self._pause_end[key] = max(end, self._pause_end.get(key, _NEVER))


# --------------------------------------------------------------------------------------------
# Primitives


class _FifoGate:
    """A FIFO semaphore: places go to waiters strictly in arrival order, no barging.

    Waiters sit in an OrderedDict so that a cancelled one leaves in O(1) and no cancelled future
    lingers (a lingering future would keep its closed event loop alive).
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: OrderedDict[asyncio.Future[None], None] = OrderedDict()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        # Places are handed straight to waiters on release, so a free place means nobody waits.
        if self._free > 0:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[fut] = None
        try:
            await fut
        except asyncio.CancelledError:
            if fut in self._waiters:
                del self._waiters[fut]  # still queued: leaving the queue is all there is to do
            elif not fut.cancelled():
                self.release()  # granted, then cancelled before it ran: pass the place on
            raise

    def _next_waiter(self) -> asyncio.Future[None] | None:
        while self._waiters:
            fut, _ = self._waiters.popitem(last=False)
            # A future cancelled an instant ago is still queued until its task runs; skip it.
            if not fut.done():
                return fut
        return None

    def release(self) -> None:
        fut = self._next_waiter()
        if fut is None:
            self._free += 1
        else:
            fut.set_result(None)

    def release_at(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """Hand the place to the next waiter, but wake it only at ``when``: a pool's next head
        has nothing to do before its paced moment, and waking it then saves it a wake-up (and
        a timer) per request. Cancelled before then, it passes the place on at once."""
        fut = self._next_waiter()
        if fut is None:
            self._free += 1
        else:
            loop.call_at(when, self._grant, fut)

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # cancelled while its grant was pending: the next waiter's turn
            self.release()
        else:
            fut.set_result(None)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _sleep_until(
    loop: asyncio.AbstractEventLoop, when: float, unsent_of: _Pool | None = None
) -> None:
    """Sleep until ``when`` (may be inf with ``unsent_of``) or, with ``unsent_of``, until an
    unwritten request of that pool is written or gives up, whichever comes first."""
    fut: asyncio.Future[None] = loop.create_future()
    if unsent_of is not None:
        unsent_of.unsent_changed = fut
    handle = loop.call_at(when, _wake, fut) if when < math.inf else None
    try:
        await fut
    finally:
        if unsent_of is not None:
            unsent_of.unsent_changed = None
        if handle is not None:
            handle.cancel()


class _Pool:
    """Mutable state of one (store, pool)."""

    __slots__ = (
        "interval",
        "last_start",
        "lateness_credit",
        "n",
        "name",
        "pause_until",
        "rate_limited",
        "requests",
        "reserved_at",
        "reserving",
        "retries",
        "send_span",
        "sends",
        "turn",
        "unsent",
        "unsent_changed",
        "wait_seconds",
        "waiting",
        "warm_since",
        "window",
    )

    def __init__(self, name: str, limits: Limits) -> None:
        rate = limits.rate_for(name)
        self.name = name
        self.interval = limits.interval_for(name)
        self.window = rate.per
        self.n = rate.n
        # The write moments of the pool's last n written requests, oldest first (loop time;
        # appended as they happen, so sorted), and how many started requests are not written
        # yet; see _send_bound.
        self.send_span = limits.send_span_for(name)
        self.sends: deque[float] = deque(maxlen=rate.n)
        self.unsent = 0
        # Set by the head while unwritten requests hold it back; woken when one of them is
        # written or gives up.
        self.unsent_changed: asyncio.Future[None] | None = None
        # When the current unbroken run of paced starts began (a cold start or a pause's end).
        self.warm_since = _NEVER
        # How late a start may be and still be paced from its scheduled moment (see
        # _wait_for_start); see Limits.lateness_credit_for.
        self.lateness_credit = limits.lateness_credit_for(name)
        self.turn = _FifoGate(1)
        self.last_start = _NEVER
        self.pause_until = _NEVER
        # Shared backends only: a slot claimed from the backend and not used yet (loop time),
        # and the claim in progress. Both belong to the pool, not to a task, so a cancelled
        # head's slot goes to the next head.
        self.reserved_at: float | None = None
        self.reserving: asyncio.Task[None] | None = None
        self.requests = 0
        self.rate_limited = 0
        self.retries = 0
        self.wait_seconds = 0.0
        self.waiting = 0

    def snapshot(self) -> PoolStats:
        return PoolStats(
            requests=self.requests,
            rate_limited=self.rate_limited,
            retries=self.retries,
            wait_seconds=self.wait_seconds,
            waiting=self.waiting,
        )


# --------------------------------------------------------------------------------------------
# Per-store limiter


class Slot:
    """``async with store_limiter.slot(pool) as start``: wait for a start, hold an in-flight
    place; ``start.sent()`` reports the moment the request was written (see the guarantees)."""

    __slots__ = ("_limiter", "_pool", "_reports_sends", "_unsent")

    def __init__(self, limiter: StoreLimiter, pool: _Pool, reports_sends: bool) -> None:
        self._limiter = limiter
        self._pool = pool
        self._reports_sends = reports_sends
        self._unsent = False

    async def __aenter__(self) -> Slot:
        started = await self._limiter._acquire(self._pool)
        if self._reports_sends:
            self._unsent = True
            self._pool.unsent += 1
        else:
            self._pool.sends.append(started)
        return self

    def sent(self) -> None:
        """The request has just been written: count it from now (once; later calls are no-ops)."""
        if self._unsent:
            self._settle(written=True)

    def _settle(self, *, written: bool) -> None:
        p = self._pool
        self._unsent = False
        p.unsent -= 1
        if written:
            p.sends.append(asyncio.get_running_loop().time())
        if p.unsent_changed is not None:
            _wake(p.unsent_changed)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._unsent:  # never written (it could not connect): the server never saw it
            self._settle(written=False)
        self._limiter._in_flight.release()


class StoreLimiter:
    """The limiter state of one store in one event loop; get it from :meth:`Limiter.bind`."""

    def __init__(
        self,
        store: str,
        limits: Limits,
        backend: PacingBackend | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.store = store
        self.limits = limits
        self._backend = backend
        # Weak: the registry is keyed weakly by loop, and a strong reference from the value
        # would keep every loop that ever bound a store alive.
        self._loop_ref = weakref.ref(loop)
        self._slack = _clock_slack(loop)
        self._in_flight = _FifoGate(limits.max_in_flight)
        self._pools = {name: _Pool(name, limits) for name in limits.pools}
        # Strong references to backend pause calls in progress (the loop keeps only weak ones).
        self._background: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        waiting = sum(p.waiting for p in self._pools.values())
        return (
            f"<StoreLimiter store={self.store!r} in_flight={self.in_flight}"
            f"/{self.limits.max_in_flight} waiting={waiting}>"
        )

    @property
    def in_flight(self) -> int:
        return self.limits.max_in_flight - self._in_flight._free

    def pool_for(self, method: str, path: str) -> str:
        """The pool a request draws on, by the Limits this store was bound with."""
        return self.limits.pool_for(method, path)

    def _pool(self, pool: str) -> _Pool:
        try:
            return self._pools[pool]
        except KeyError:
            raise ConfigError(
                f"store {self.store!r} has no rate-limit pool {pool!r}"
                f" (pools: {', '.join(self._pools)})"
            ) from None

    def slot(self, pool: str, *, reports_sends: bool = False) -> Slot:
        """Wait (FIFO, pacing, pauses, in-flight cap) and hold an in-flight place meanwhile.

        With ``reports_sends``, the caller calls ``sent()`` on the entered slot the moment the
        request is written; otherwise the start counts as the write."""
        return Slot(self, self._pool(pool), reports_sends)

    def pause(self, pool: str, seconds: float) -> None:
        """Hold every task of ``pool`` for ``seconds`` from now (after a 429).

        Never shortens a longer pause already in force. Values that are not positive and finite
        are ignored. With a shared backend, the pause is also sent to it in the background.
        """
        p = self._pool(pool)
        if not 0 < seconds < math.inf:
            return
        loop = self._loop_ref()
        if loop is None:
            return
        until = loop.time() + seconds
        if until > p.pause_until:
            p.pause_until = until
            logger.debug("store %r pool %r: paused for %.3fs", self.store, pool, seconds)
        else:
            logger.debug(
                "store %r pool %r: pause of %.3fs is within the current one",
                self.store,
                pool,
                seconds,
            )
        if self._backend is not None:
            task = loop.create_task(self._backend.pause(self.store, pool, seconds))
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

    def record_429(self, pool: str) -> None:
        self._pool(pool).rate_limited += 1

    def record_retry(self, pool: str) -> None:
        self._pool(pool).retries += 1

    def stats(self) -> LimiterStats:
        return LimiterStats(
            store=self.store,
            pools=MappingProxyType({name: p.snapshot() for name, p in self._pools.items()}),
            in_flight=self.in_flight,
            max_in_flight=self.limits.max_in_flight,
        )

    # -- acquiring ----------------------------------------------------------------------------

    async def _acquire(self, p: _Pool) -> float:
        loop = asyncio.get_running_loop()
        if loop is not self._loop_ref():
            raise RuntimeError(
                f"the limiter of store {self.store!r} was bound in another event loop;"
                " bind the store again in this one"
            )
        queued_at = loop.time()
        p.waiting += 1
        try:
            await p.turn.acquire()
            try:
                now = await self._wait_for_start(loop, p, queued_at)
            except BaseException:
                p.turn.release()  # gave up: the next request finds its own moment
                raise
            # Hand the turn on as soon as this request starts, for the next request's paced
            # moment (it is paced from this start, not from this request's end). Whatever
            # happens meanwhile (a pause, a late write), it looks again when it wakes.
            p.turn.release_at(loop, max(p.last_start + p.interval, p.pause_until))
        finally:
            p.waiting -= 1
        waited = now - queued_at
        p.requests += 1
        p.wait_seconds += waited
        if waited > LONG_WAIT_SECONDS:
            logger.debug(
                "store %r pool %r: request waited %.2fs (%d still queued)",
                self.store,
                p.name,
                waited,
                p.waiting,
            )
        return now

    async def _wait_for_start(
        self, loop: asyncio.AbstractEventLoop, p: _Pool, queued_at: float
    ) -> float:
        """As the pool's head: sleep until the paced start, take an in-flight place, start."""
        while True:
            now = loop.time()
            bound = _send_bound(p, now)
            ready_at = max(p.last_start + p.interval, p.pause_until, bound)
            if ready_at == bound and p.unsent and bound - now > self._slack:
                # Held back by requests not written yet: their write or failure moves the bound.
                await _sleep_until(loop, bound, unsent_of=p)
                continue
            if self._backend is not None:
                at = p.reserved_at
                # A slot from before a pause, or one left unused for a while (its claimer was
                # cancelled), would start out of step with the other processes: drop it; the
                # backend only ever loses a slot, which is the safe side.
                # A slot claimed more than an interval ago is stale (using it now could put two
                # starts closer than the interval); but never call a slot stale before a backend
                # round trip could have returned it, or tiny intervals would re-claim forever.
                stale_after = max(p.interval, _MIN_STALE_SECONDS)
                if at is not None and (at < p.pause_until or at + stale_after < now):
                    p.reserved_at = at = None
                if at is None:
                    if ready_at - now > self._slack:
                        # Claim a shared slot only once this process may start: the slot then
                        # lies after our own last start + interval, so both paces agree.
                        await _sleep_until(loop, ready_at)
                        continue
                    await self._reserve(loop, p)
                    continue
                ready_at = max(ready_at, at)
            if ready_at - now > self._slack:
                await _sleep_until(loop, ready_at)
                continue  # re-check: a pause may have come in meanwhile
            await self._in_flight.acquire()
            now = loop.time()
            if max(p.pause_until, _send_bound(p, now)) - now > self._slack:
                # Paused (or every recent start still unwritten) while queued at the gate: give
                # the place back and wait.
                self._in_flight.release()
                continue
            # A start a little late for its moment (timer and loop lateness, ~1 ms each on
            # asyncio) is paced from that moment, or the lateness would add up to a rate a few %
            # low; one held up for long (idle pool, full in-flight gate) is paced from its
            # actual start, so no catch-up burst follows. Any n+1 starts thus span at least
            # n*interval - credit >= send_span > per (see Limits.lateness_credit_for); the
            # write-span bound holds that line for late writes. A start within the slack before
            # its moment counts as on time.
            # No credit during the first window after a cold start (the pool was idle when this
            # request came) or a pause: that is when connections are opened and the first
            # requests reach the server late, and the lateness kept then is what absorbs it
            # (issue: one 429 at cold start otherwise). A start merely late for its timer on a
            # busy loop is not cold: a window without credit after each would cost a few %.
            resumed = ready_at == p.pause_until and p.pause_until > p.last_start + p.interval
            if now - ready_at > p.lateness_credit or resumed:
                if resumed or ready_at + p.lateness_credit < queued_at:
                    p.warm_since = now
                p.last_start = now
            elif now - p.warm_since >= p.window:
                p.last_start = ready_at
            else:
                p.last_start = max(now, ready_at)
            p.reserved_at = None
            return now

    async def _reserve(self, loop: asyncio.AbstractEventLoop, p: _Pool) -> None:
        task = p.reserving
        if task is None:
            task = p.reserving = loop.create_task(self._claim_slot(loop, p))
            # Retrieve a failure nobody awaits any more (its waiter was cancelled).
            task.add_done_callback(_consume_result)
        # Shielded: if this task is cancelled the claim still completes, for the next head.
        await asyncio.shield(task)

    async def _claim_slot(self, loop: asyncio.AbstractEventLoop, p: _Pool) -> None:
        assert self._backend is not None
        try:
            delay = float(await self._backend.reserve(self.store, p.name, p.interval))
        except AsyncSubsError:
            raise
        except Exception as exc:
            # The type only: a backend's message may carry its URL and password. The cause
            # stays chained for whoever debugs it.
            raise LimiterUnavailableError(
                f"rate limiter backend failed for store {self.store!r}: {type(exc).__name__}"
            ) from exc
        finally:
            p.reserving = None
        if not 0 <= delay < math.inf:
            raise LimiterUnavailableError(
                f"rate limiter backend returned an invalid delay {delay!r} for store {self.store!r}"
            )
        p.reserved_at = loop.time() + delay


def _send_bound(p: _Pool, now: float) -> float:
    """The earliest moment the pool's next request may start so that no ``n + 1`` writes fall
    within ``send_span``: ``send_span`` after the n-th most recent write, counting the requests
    started and not yet written as written now or later (so their own lateness is covered)."""
    written = p.n - p.unsent  # of the last n requests, how many are written
    if written <= 0:
        return math.inf  # all still unwritten: wait for one of them
    sends = p.sends
    if len(sends) < written:
        return _NEVER
    return sends[-written] + p.send_span


def _consume_result(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


# --------------------------------------------------------------------------------------------
# Registries


class Limiter:
    """Per-store limiter state, shared by every client bound to the same store and loop.

    ``backend=None`` paces in this process only; a shared backend (see the module docstring)
    makes processes pace together. Different stores never slow each other.

    If a store is bound again with different :class:`Limits`, the first binding wins and a
    warning is logged: one store has one budget, and changing it under running requests would
    break the guarantees. Use :meth:`StoreLimiter.pool_for` so requests use that binding's pools.
    """

    def __init__(self, backend: PacingBackend | None = None) -> None:
        self._backend = backend
        # bind() is sync and may run in several threads' loops at once.
        self._lock = threading.Lock()
        self._stores: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, StoreLimiter]
        ] = weakref.WeakKeyDictionary()

    @property
    def backend(self) -> PacingBackend | None:
        return self._backend

    def bind(self, store: str, limits: Limits) -> StoreLimiter:
        """The limiter of ``store`` in the running loop; same store and loop -> same object."""
        if not isinstance(store, str) or not store:
            raise ConfigError(f"store must be a non-empty string, got {store!r}")
        if not isinstance(limits, Limits):
            raise ConfigError(f"limits must be a Limits, got {limits!r}")
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "Limiter.bind() must be called in the event loop that will send the requests"
            ) from None
        with self._lock:
            stores = self._stores.get(loop)
            if stores is None:
                stores = self._stores[loop] = {}
            bound = stores.get(store)
            if bound is None:
                bound = stores[store] = StoreLimiter(store, limits, self._backend, loop)
                return bound
        if bound.limits != limits:
            logger.warning(
                "store %r is already bound with %r; keeping those limits and ignoring %r",
                store,
                bound.limits,
                limits,
            )
        return bound


class LocalLimiter(Limiter):
    """In-process limiter: clients sharing an instance (and a loop) share each store's budget."""

    def __init__(self) -> None:
        super().__init__(None)


_default = LocalLimiter()


def default_limiter() -> LocalLimiter:
    """The process-wide limiter that ``AdminClient(limiter=None)`` uses (state kept per loop)."""
    return _default
