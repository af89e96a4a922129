"""The sync engine: one unit, a ``(store, resource)``, pulled page by page into a sink.

Each page is committed with the cursor after it (``Sink.commit_page``), so a run stopped
anywhere resumes from its last commit. A run that was stopped is resumed with its own query
filter; a finished one starts over, incrementally where the store configures a filter: from the
newest value stored *before the previous run began*, so that records changed during a run are
caught by the next one. A saved cursor the server refuses (400) starts the run over.

The engine knows nothing of how progress is shown: it tells an observer (``_events``), and
the client's ``on_retry`` hook tells it why a request is being retried. Which units run, and
when, is a scheduler's business (``_schedulers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from .. import AdminClient, Page, RetryEvent
from ..errors import AsyncSubsError, BadRequestError, ConfigError
from ..limiting import Limiter, PoolStats
from ._config import StoreConfig
from ._events import (
    Message,
    Observer,
    PageCommitted,
    PoolLearned,
    Retrying,
    UnitDone,
    UnitFailed,
    UnitNote,
    UnitStarted,
    UnitStopped,
    learned_changed,
)
from ._sink import DatabaseError, LeaseLostError, PageWrite, Sink, UnitHandedOver, UnitState

__all__ = [
    "DEFAULT_MAX_STORES",
    "SyncEngine",
    "UnitPool",
    "clamped_page_note",
    "describe_error",
]

log = logging.getLogger("asyncsubs.sync")

#: Stores pulled at once by one process: each holds a few connections, and hundreds at once
#: would exhaust file descriptors.
DEFAULT_MAX_STORES: Final = 32


def describe_error(exc: BaseException) -> str:
    """An error in one line, its type first (the library's messages name method and path)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def clamped_page_note(asked: int | str | None, page: Page[Any]) -> str | None:
    """What to say when ``page`` is shorter than ``asked`` (a fixed size) while more follow: the
    server cut the page size (None otherwise; a learned size is told by ``PoolLearned``)."""
    if not isinstance(asked, int) or not page.data or page.next_cursor is None:
        return None
    if len(page.data) >= asked:
        return None
    return f"the server cut the page size to {len(page.data):,} records (asked for {asked:,})"


def stats_since(now: PoolStats, base: PoolStats) -> PoolStats:
    """``now``'s counters since ``base`` (an earlier snapshot of the same pool); the pace as it
    stands."""
    return attrs.evolve(
        now,
        requests=now.requests - base.requests,
        rate_limited=now.rate_limited - base.rate_limited,
        retries=now.retries - base.retries,
        wait_seconds=now.wait_seconds - base.wait_seconds,
    )


@attrs.define
class UnitPool:
    """The list pool of a unit being pulled (``sync``'s, ``pull``'s): its client, the pool's
    counters when the unit started, and what the pool knew of the server when last told."""

    client: AdminClient
    pool: str
    base: PoolStats = attrs.Factory(PoolStats)
    told: PoolStats | None = None

    @classmethod
    def start(cls, client: AdminClient, resource: str) -> UnitPool:
        """``resource``'s pool of ``client``, counted from now."""
        pool = client.limits.pool_for("GET", resource)
        return cls(client, pool, client.stats.pools.get(pool, PoolStats()))

    def stats(self) -> PoolStats:
        return stats_since(self.client.stats.pools.get(self.pool, PoolStats()), self.base)

    def learned(self, stats: PoolStats) -> bool:
        """Whether ``stats`` tells something new of the server since last told."""
        changed = learned_changed(self.told, stats)
        if changed:
            self.told = stats
        return changed


class SyncEngine:
    """Pulls units of stores into ``sink``, telling ``observe`` (see ``_events``)::

        async with SyncEngine(configs, sink, observe) as engine:
            await run_round(engine)          # every unit once (see _schedulers)

    Entered, it opens a ``RedisLimiter`` per Redis URL the stores pace through (closed on
    leaving). ``client(config)`` makes a store's client, ``pull(client, config, resource)``
    runs one unit.
    """

    def __init__(
        self,
        configs: Sequence[StoreConfig],
        sink: Sink,
        observe: Observer,
        *,
        max_stores: int = DEFAULT_MAX_STORES,
    ) -> None:
        self.configs = list(configs)
        self.sink = sink
        self.observe = observe
        self.max_stores = max_stores
        self.limiters: dict[str, Limiter] = {}
        #: Rounds run, and records committed in all of them.
        self.rounds = 0
        self.records = 0
        self._running: dict[tuple[str, str], UnitPool] = {}
        self._exit = contextlib.AsyncExitStack()

    async def __aenter__(self) -> SyncEngine:
        urls = sorted({c.redis for c in self.configs if c.redis is not None})
        if urls:
            try:
                from ..redis import RedisLimiter
            except ImportError:
                raise ConfigError(
                    "--redis needs redis-py: pip install 'asyncsubs[redis]'"
                ) from None
            for url in urls:
                # Stores sharing a Redis with different fallbacks: the smallest share holds.
                shares = [c.redis_fallback for c in self.configs if c.redis == url]
                fallback = min((f for f in shares if f is not None), default=None)
                limiter = RedisLimiter(url, fallback_fraction=fallback)
                self.limiters[url] = await self._exit.enter_async_context(limiter)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._exit.aclose()

    async def open_client(self, config: StoreConfig) -> AdminClient:
        """The client of one store, starting from what its pools learned in earlier syncs."""
        return self.client(config, await self.sink.load_learned(config.store))

    async def save_learned(self, client: AdminClient) -> None:
        """Keep what the client's pools learned, for the next sync of its store."""
        learned = client.export_learned()
        if learned["pools"]:
            await self.sink.save_learned(client.store, learned)

    def client(self, config: StoreConfig, learned: Mapping[str, Any] | None = None) -> AdminClient:
        """The client of one store, telling the engine of its retries, starting from what its
        pools ``learned`` before (as ``Sink.load_learned`` has it)."""
        if learned is not None:
            try:
                return self._client(config, learned)
            except ConfigError as exc:  # another base URL now: another server's limits
                self.observe(Message(f"store {config.store}: learned limits not used ({exc})"))
        return self._client(config, None)

    def _client(self, config: StoreConfig, learned: Mapping[str, Any] | None) -> AdminClient:
        return AdminClient(
            token=config.token,
            base_url=config.base_url,
            store=config.store,
            limits=config.limits,
            retry=config.retry,
            timeout=config.timeout,
            allow_insecure=config.allow_insecure,
            user_agent="asyncsubs-cli",
            limiter=None if config.redis is None else self.limiters[config.redis],
            version=config.version,
            on_retry=functools.partial(self._retried, config.store),
            learned=learned,
        )

    def _retried(self, store: str, event: RetryEvent) -> None:
        unit = self._running.get((store, event.path))  # a list request's path is its resource
        if unit is not None:
            self.observe(Retrying(store, event.path, describe_error(event.error), unit.stats()))

    async def pull(self, client: AdminClient, config: StoreConfig, resource: str) -> str | None:
        """One run of ``(config.store, resource)``; None once done (or stopped by a lost
        lease), the failure in one line when the API or the transport refused it (the other
        units go on). A DatabaseError is raised: the sink failed, which stops everything."""
        store = config.store
        unit = UnitPool.start(client, resource)
        self._running[(store, resource)] = unit
        try:
            await self._pull(unit, config, resource)
            await self.save_learned(client)
        except LeaseLostError as exc:
            self.observe(UnitNote(store, resource, f"{exc.why}; stopped"))
            self.observe(
                UnitStopped(store, resource, unit.stats(), await self._rows(config, resource))
            )
        except asyncio.CancelledError:
            self.observe(
                UnitStopped(store, resource, unit.stats(), await self._rows(config, resource))
            )
            raise
        except DatabaseError:
            raise
        except AsyncSubsError as exc:
            log.debug("store %s, %s failed", store, resource, exc_info=True)
            with contextlib.suppress(DatabaseError):
                await self.save_learned(client)
            error = describe_error(exc)
            rows = await self._rows(config, resource)
            self.observe(UnitFailed(store, resource, error, unit.stats(), rows))
            return error
        finally:
            del self._running[(store, resource)]
        return None

    async def _rows(self, config: StoreConfig, resource: str) -> int | None:
        """The store's rows in the resource's table, for a unit that ended; None if the
        database cannot say (its error, if it matters, is raised elsewhere)."""
        with contextlib.suppress(Exception):
            return await self.sink.count(config.store, resource)
        return None

    async def _pull(self, unit: UnitPool, config: StoreConfig, resource: str) -> None:
        store = config.store
        state = await self.sink.load_state(store, resource)
        incremental = config.incremental.get(resource)
        allowed = unit.client.limits.rate_for(unit.pool)
        started = restarted = False
        while True:
            resumed = state.in_progress
            # Resume an interrupted run with its own filter, whatever the config says now.
            params, run_from = self._run_filter(state, incremental)
            if not started:
                records_before = state.run_records if resumed else 0
                self.observe(UnitStarted(store, resource, resumed, records_before, allowed))
                self._tell_learned(unit, store, resource)
                started = True
            pages = 0
            call = getattr(unit.client, resource).list(
                page_size=config.page_size,
                after_cursor=state.cursor if resumed else None,
                params=params or None,
                model=dict,
            )
            try:
                async with contextlib.aclosing(call.pages()) as page_iterator:
                    async for page in page_iterator:
                        write = PageWrite(
                            store=store,
                            resource=resource,
                            records=page.data,
                            next_cursor=page.next_cursor,
                            new_run=pages == 0 and not resumed,
                            run_params=params,
                            run_from=run_from,
                            incremental_field=None if incremental is None else incremental.field,
                        )
                        await self._commit(write, unit)
                        if pages == 0 and (note := clamped_page_note(config.page_size, page)):
                            self.observe(UnitNote(store, resource, note))
                        pages += 1
            except BadRequestError as exc:
                # A saved cursor the server no longer accepts (expired, a server reset): start
                # the run over. Upserts make the re-read harmless.
                if resumed and pages == 0 and not restarted:
                    note = f"saved cursor rejected ({exc.code or exc.status}); starting over"
                    self.observe(UnitNote(store, resource, note))
                    state, restarted = attrs.evolve(state, done=True), True
                    continue
                raise
            break
        rows = await self.sink.count(store, resource)
        self.observe(UnitDone(store, resource, unit.stats(), rows))

    @staticmethod
    def _run_filter(state: UnitState, incremental: Any) -> tuple[Mapping[str, Any], Any]:
        """The run's query filter and the incremental value the next run will start from."""
        if state.in_progress:
            return state.run_params, state.run_from
        params = {}
        if incremental is not None and state.next_from is not None:
            params = {incremental.param: state.next_from}
        # Records changed while this run goes on are newer than anything stored now, so the
        # next run may start from here (inclusive filters catch equal timestamps).
        return params, state.seen_max if incremental is not None else None

    async def _commit(self, write: PageWrite, unit: UnitPool) -> None:
        """Commit ``write`` and say so; when the run is stopped meanwhile, the commit under way
        still lands (the sink's write does not stop half-way) and is counted."""
        commit = asyncio.ensure_future(self.sink.commit_page(write))
        try:
            await asyncio.shield(commit)
        except UnitHandedOver:
            self._committed(write, unit)  # committed, then handed over
            raise
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await commit
                self._committed(write, unit)
            raise
        self._committed(write, unit)

    def _committed(self, write: PageWrite, unit: UnitPool) -> None:
        self.records += len(write.records)
        stats = unit.stats()
        self.observe(PageCommitted(write.store, write.resource, len(write.records), stats))
        self._tell_learned(unit, write.store, write.resource, stats)

    def _tell_learned(
        self, unit: UnitPool, store: str, resource: str, stats: PoolStats | None = None
    ) -> None:
        stats = unit.stats() if stats is None else stats
        if unit.learned(stats):
            self.observe(PoolLearned(store, resource, stats))
