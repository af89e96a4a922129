"""The clients of one run of the source, in the event loop that runs its resources.

dlt runs every async resource of a source's extract on one event loop of its own, in a
background thread (see the package's docstring); a client belongs to the loop of its first
request. So the clients are made there, by the first resource that starts, shared by every
resource of the run (each store's one budget), and closed by the last one to finish; what they
learned of the servers is written to the source's state on the way out.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import MutableMapping, Sequence
from typing import Any

import attrs

from .. import AdminClient
from ..stores import DEFAULT_MAX_STORES, LearnedState, Store, StoreClients

__all__ = ["DEFAULT_MAX_STORES", "SourceClients", "StoreSlots"]

#: What the source's clients say they are, before the library's own user agent.
USER_AGENT = "asyncsubs-dlt"


class _Slot:
    """A store's hold on a slot, for one of its pulls (``async with``)."""

    def __init__(self, slots: StoreSlots, store: str) -> None:
        self._slots, self._store = slots, store

    async def __aenter__(self) -> None:
        await self._slots.enter(self._store)

    async def __aexit__(self, *exc_info: object) -> None:
        self._slots.leave(self._store)


class StoreSlots:
    """At most ``limit`` stores pulling at once; the resources of a store pulling already join
    it without a slot of their own."""

    def __init__(self, limit: int) -> None:
        self._free = asyncio.Semaphore(limit)
        self._pulls: Counter[str] = Counter()
        self._entering: dict[str, asyncio.Lock] = {}

    def hold(self, store: str) -> _Slot:
        return _Slot(self, store)

    async def enter(self, store: str) -> None:
        async with self._entering.setdefault(store, asyncio.Lock()):
            if not self._pulls[store]:
                await self._free.acquire()
            self._pulls[store] += 1

    def leave(self, store: str) -> None:
        self._pulls[store] -= 1
        if not self._pulls[store]:
            self._free.release()


class _Run:
    """One event loop's clients, one per store, and the Redis limiters they pace through."""

    def __init__(
        self,
        clients: SourceClients,
        learned: MutableMapping[str, Any],
    ) -> None:
        self.users = 0
        self.slots = StoreSlots(clients.max_stores)
        self.stores = clients.stores
        self.factory = StoreClients(
            LearnedState(learned),
            user_agent=USER_AGENT,
            list_paths=clients.list_paths,
            redis=clients.redis_url,
        )
        self.clients: dict[str, AdminClient] = {}

    async def open(self) -> None:
        for store in self.stores:
            self.clients[store.name] = await self.factory.open(store)

    async def aclose(self) -> None:
        for client in self.clients.values():
            await self.factory.keep(client)
            await client.aclose()
        await self.factory.aclose()


class SourceClients:
    """The stores' clients for every run of a source object, one set per event loop."""

    def __init__(
        self,
        stores: Sequence[Store],
        list_paths: Sequence[str],
        redis_url: str | None,
        max_stores: int = DEFAULT_MAX_STORES,
    ) -> None:
        self.stores = tuple(stores)
        self.max_stores = max_stores
        self.list_paths = tuple(list_paths)
        self.redis_url = redis_url
        self._runs: dict[asyncio.AbstractEventLoop, _Run] = {}

    def check(self, store: Store) -> None:
        """ConfigError if a client of ``store`` could not be made (it sends nothing)."""
        checker = StoreClients(None, list_paths=self.list_paths)
        checker.client(attrs.evolve(store, redis=None), telemetry=False)

    def open(self, learned: MutableMapping[str, Any]) -> _Opened:
        """This loop's run (``async with``): its ``clients`` by store name, made by the first
        resource to start (from what ``learned``, the source's state, holds) and closed when
        the last one leaves, and its ``slots``."""
        return _Opened(self, learned)

    async def _enter(self, learned: MutableMapping[str, Any]) -> _Run:
        loop = asyncio.get_running_loop()
        run = self._runs.get(loop)
        if run is None:
            run = self._runs[loop] = _Run(self, learned)
            try:
                await run.open()
            except BaseException:  # a client the settings refuse (checked before: unlikely)
                del self._runs[loop]
                await run.aclose()
                raise
        run.users += 1
        return run

    async def _leave(self, run: _Run) -> None:
        run.users -= 1
        if run.users == 0:
            del self._runs[asyncio.get_running_loop()]
            await run.aclose()


class _Opened:
    """A resource's use of its loop's run (plain methods: see ``_source._Pulls``)."""

    def __init__(self, clients: SourceClients, learned: MutableMapping[str, Any]) -> None:
        self._clients, self._learned = clients, learned
        self._run: _Run | None = None

    async def __aenter__(self) -> _Run:
        self._run = await self._clients._enter(self._learned)
        return self._run

    async def __aexit__(self, *exc_info: object) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            await self._clients._leave(run)
