"""The clients of one run of the source, in the event loop that runs its resources.

dlt runs every async resource of a source's extract on one event loop of its own, in a
background thread (see the package's docstring); a client belongs to the loop of its first
request. So the clients are made there, by the first resource that starts, shared by every
resource of the run (each store's one budget), and closed by the last one to finish; what they
learned of the servers is written to the source's state on the way out.

Plain methods, no async generators or context managers made of them: when dlt stops an extract
it closes every async generator of its loop at once (``shutdown_asyncgens``), the ones in use
by others included, so the resource's own generator is the one that does the cleaning up.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import MutableMapping, Sequence
from typing import Any

import attrs

from .. import AdminClient
from ..stores import LearnedState, Store, StoreClients

__all__ = ["SourceClients"]

#: What the source's clients say they are, before the library's own user agent.
USER_AGENT = "asyncsubs-dlt"


class _Run:
    """One event loop's clients, one per store, made by ``factory``; and its slots: at most
    ``max_stores`` stores pulling at once, a store's resources sharing its slot."""

    def __init__(self, factory: StoreClients, max_stores: int) -> None:
        self.factory = factory
        self.clients: dict[str, AdminClient] = {}
        self.users = 0
        self._free = asyncio.Semaphore(max_stores)
        self._pulls: Counter[str] = Counter()
        self._entering: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    async def enter(self, store: str) -> None:
        """Start a pull of ``store``: in a slot of its own, or in the one it pulls in already."""
        async with self._entering[store]:
            if not self._pulls[store]:
                await self._free.acquire()
            self._pulls[store] += 1

    def leave(self, store: str) -> None:
        self._pulls[store] -= 1
        if not self._pulls[store]:
            self._free.release()

    async def aclose(self) -> None:
        for client in self.clients.values():
            await self.factory.keep(client)
            await client.aclose()
        await self.factory.aclose()


class SourceClients:
    """The stores' clients for every run of a source object, one ``_Run`` per event loop."""

    def __init__(
        self, stores: Sequence[Store], list_paths: Sequence[str], redis: str | None, max_stores: int
    ) -> None:
        self.stores, self.list_paths = tuple(stores), tuple(list_paths)
        self.redis, self.max_stores = redis, max_stores
        self._runs: dict[asyncio.AbstractEventLoop, _Run] = {}
        # The settings each client will be made with, checked now (no I/O): a bad URL or token
        # fails when the source is made rather than inside the extract.
        checker = StoreClients(None, list_paths=self.list_paths)
        for store in self.stores:
            checker.client(attrs.evolve(store, redis=None), telemetry=False)

    async def enter(self, learned: MutableMapping[str, Any]) -> _Run:
        """This loop's run, its clients made by the first resource to start (from what
        ``learned``, the source's state, holds); every resource that enters must ``leave``."""
        loop = asyncio.get_running_loop()
        run = self._runs.get(loop)
        if run is None:
            factory = StoreClients(
                LearnedState(learned),
                user_agent=USER_AGENT,
                list_paths=self.list_paths,
                redis=self.redis,
            )
            run = self._runs[loop] = _Run(factory, self.max_stores)
            try:
                for store in self.stores:
                    run.clients[store.name] = await factory.open(store)
            except BaseException:  # a client the settings refuse (checked before: unlikely)
                del self._runs[loop]
                await run.aclose()
                raise
        run.users += 1
        return run

    async def leave(self, run: _Run) -> None:
        """The last resource to leave closes the clients, keeping what they learned."""
        run.users -= 1
        if not run.users:
            del self._runs[asyncio.get_running_loop()]
            await run.aclose()
