"""The sync engine: one unit, a ``(store, resource)``, pulled page by page into a sink.

Each page is committed with the cursor after it, so a run stopped anywhere resumes from its
last commit, with its own query filter. A finished run starts over, incrementally where the
store configures a filter: from the newest value stored *before the previous run began*, so
records changed during a run are caught by the next. A saved cursor the server refuses (400)
starts the run over. The engine tells an observer what happens (``asyncsubs.stores``' events);
which units run, and when, is ``_schedulers``' business.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .. import AdminClient, RetryEvent
from ..errors import APIError, AsyncSubsError, BadRequestError, NotFoundError
from ..stores import (
    DEFAULT_MAX_STORES,
    Message,
    Observer,
    Store,
    StoreClients,
    Unit,
    describe_error,
)
from ._sink import DatabaseError, LeaseLostError, PageWrite, Sink, UnitHandedOver, UnitState

__all__ = ["SyncEngine"]

log = logging.getLogger("asyncsubs.sync")


class SyncEngine:
    """Pulls units of stores into ``sink``, telling ``observe``::

        async with SyncEngine(configs, sink, observe) as engine:
            await run_round(engine)          # every unit once (see _schedulers)

    Left, it closes the Redis limiters its stores paced through.
    """

    def __init__(
        self,
        configs: Sequence[Store],
        sink: Sink,
        observe: Observer,
        *,
        max_stores: int = DEFAULT_MAX_STORES,
        user_agent: str | None = None,
    ) -> None:
        self.configs = list(configs)
        self.sink = sink
        self.observe = observe
        self.max_stores = max_stores
        #: Each store's client, starting from what its pools learned in the sink.
        self.clients = StoreClients(
            sink, user_agent=user_agent, note=lambda line: observe(Message(line))
        )
        #: Rounds run, and records committed in all of them.
        self.rounds = 0
        self.records = 0
        self._running: dict[tuple[str, str], Unit] = {}

    async def __aenter__(self) -> SyncEngine:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.clients.aclose()

    async def open_client(self, config: Store) -> AdminClient:
        """The client of one store, starting from what its pools learned in earlier syncs."""
        on_retry = functools.partial(self._retried, config.name)
        return await self.clients.open(config, on_retry=on_retry)

    def _retried(self, store: str, event: RetryEvent) -> None:
        unit = self._running.get((store, event.path))  # a list request's path is its resource
        if unit is not None:
            unit.retried(event)

    async def pull(self, client: AdminClient, config: Store, resource: str) -> str | None:
        """One run of ``(config.name, resource)``; None once done (or stopped by a lost
        lease), the failure in one line when the API or the transport refused it (the other
        units go on). A DatabaseError is raised: the sink failed, which stops everything."""
        store = config.name
        unit = Unit(client, store, resource, self.observe)
        self._running[(store, resource)] = unit
        try:
            await self._pull(unit, config)
            await self.clients.keep(client)
        except LeaseLostError as exc:
            unit.note(f"{exc.why}; stopped")
            unit.stopped(await self._rows(store, resource))
        except asyncio.CancelledError:
            unit.stopped(await self._rows(store, resource))
            raise
        except DatabaseError:
            raise
        except AsyncSubsError as exc:
            log.debug("store %s, %s failed", store, resource, exc_info=True)
            with contextlib.suppress(DatabaseError):
                await self.clients.keep(client)
            error = describe_error(exc)
            unit.failed(error, await self._rows(store, resource))
            return error
        finally:
            del self._running[(store, resource)]
        return None

    async def _rows(self, store: str, resource: str) -> int | None:
        """The unit's rows, for a unit that ended; None if the database cannot say (its error,
        if it matters, is raised elsewhere)."""
        with contextlib.suppress(Exception):
            return await self.sink.count(store, resource)
        return None

    async def _pull(self, unit: Unit, config: Store) -> None:
        store, resource = unit.store, unit.resource
        state = await self.sink.load_state(store, resource)
        incremental = config.incremental.get(resource)
        started = restarted = False
        while True:
            resumed = state.in_progress
            # Resume an interrupted run with its own filter, whatever the config says now.
            params, run_from = self._run_filter(state, incremental)
            if not started:
                unit.start(resumed=resumed, records_before=state.run_records if resumed else 0)
                started = True
            pages = 0
            try:
                async for page in unit.pages(
                    page_size=config.page_size,
                    after_cursor=state.cursor if resumed else None,
                    params=params,
                ):
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
                    pages += 1
            except APIError as exc:
                # A saved cursor the server no longer accepts (expired, a server reset; said with
                # a 400, a 404 or a 410 Gone): start the run over, once. Upserts make the re-read
                # harmless.
                refused = isinstance(exc, BadRequestError | NotFoundError) or exc.status == 410
                if refused and resumed and pages == 0 and not restarted:
                    unit.note(f"saved cursor rejected ({exc.code or exc.status}); starting over")
                    state, restarted = attrs.evolve(state, done=True), True
                    continue
                raise
            break
        unit.done(await self.sink.count(store, resource))

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

    async def _commit(self, write: PageWrite, unit: Unit) -> None:
        """Commit ``write`` and count it once committed (handed over after it too): when the
        run is stopped meanwhile, the commit under way still lands, the sink's write does not
        stop half-way."""
        commit = asyncio.ensure_future(self.sink.commit_page(write))
        try:
            await asyncio.shield(commit)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await commit
            raise
        finally:
            done = commit.done() and not commit.cancelled()
            if done and isinstance(commit.exception(), type(None) | UnitHandedOver):
                self.records += len(write.records)
                unit.committed(len(write.records))
