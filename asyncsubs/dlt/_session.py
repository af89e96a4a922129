"""One run of the source on dlt's extract loop: the stores' clients, slots and pulls.

A client belongs to the loop of its first request, and dlt runs all of a source's resources on
one loop (docs/dlt.md): the first resource to start makes the clients there, all share them
(each store's one budget), and the last to finish closes them, keeping what they learned.
No async generators: dlt ends an extract by closing every one of its loop at once
(``shutdown_asyncgens``), so the resource's own generator is the one that cleans up.
"""

from __future__ import annotations

import asyncio
import functools
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Mapping, MutableMapping, Sequence
from typing import Any, Self

import attrs

from .. import AdminClient, Page
from ..errors import AsyncSubsError
from ..stores import LearnedState, Store, StoreClients

__all__ = ["SourceClients"]

#: What the source's clients say they are, before the library's own user agent.
USER_AGENT = "asyncsubs-dlt"
#: Each store's pages as they arrive, then ``(store, None, its error or None)`` when it is done.
_Queue = asyncio.Queue[tuple[str, Page[Any] | None, Exception | None]]


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

    async def pull(self, store: str, pages: AsyncIterator[Page[Any]], queue: _Queue) -> None:
        """``store``'s pages into ``queue``, in a slot of its own or the one it pulls in already."""
        error = None
        async with self._entering[store]:
            if not self._pulls[store]:
                await self._free.acquire()
            self._pulls[store] += 1
        try:
            async for page in pages:
                await queue.put((store, page, None))
        except Exception as exc:
            error = exc
        finally:
            self._pulls[store] -= 1
            if not self._pulls[store]:
                self._free.release()
        await queue.put((store, None, error))

    async def aclose(self) -> None:
        for client in self.clients.values():
            await self.factory.keep(client)
            await client.aclose()
        await self.factory.aclose()


class Pulls:
    """Every store's pull of one list endpoint, a task each in its slot of ``run``, pages
    handed over as they arrive (``async for store, page in pulls``)."""

    def __init__(self, run: _Run, pages: Mapping[str, AsyncIterator[Page[Any]]]) -> None:
        self._queue: _Queue = asyncio.Queue(maxsize=max(1, len(pages)))
        self._tasks = [asyncio.create_task(run.pull(*p, self._queue)) for p in pages.items()]
        self._running = len(self._tasks)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> tuple[str, Page[Any]]:
        """The next page of any store. A store's failure is raised, its message naming the
        store: dlt fails the run, and nothing is committed."""
        while self._running:
            store, page, error = await self._queue.get()
            if error is not None:
                if isinstance(error, AsyncSubsError):
                    error.args = (f"store {store}: {error}", *error.args[1:])
                raise error
            if page is not None:
                return store, page
            self._running -= 1
        raise StopAsyncIteration

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class SourceClients:
    """The stores' clients for every run of a source object, one ``_Run`` per event loop."""

    def __init__(
        self, stores: Sequence[Store], list_paths: Sequence[str], redis: str | None, max_stores: int
    ) -> None:
        self.stores, self.max_stores = tuple(stores), max_stores
        self._factory = functools.partial(
            StoreClients, user_agent=USER_AGENT, list_paths=list_paths, redis=redis
        )
        self._runs: dict[asyncio.AbstractEventLoop, _Run] = {}
        # Each client's settings checked now (no I/O): a bad URL or token fails here, not later.
        checker = StoreClients(None, list_paths=list_paths)
        for store in self.stores:
            checker.client(attrs.evolve(store, redis=None), telemetry=False)

    async def enter(self, learned: MutableMapping[str, Any]) -> _Run:
        """This loop's run, its clients made by the first resource to start (from what
        ``learned``, the source's state, holds); every resource that enters must ``leave``."""
        loop = asyncio.get_running_loop()
        run = self._runs.get(loop)
        if run is None:
            factory = self._factory(LearnedState(learned))
            run = self._runs[loop] = _Run(factory, self.max_stores)
            try:
                for store in self.stores:
                    run.clients[store.name] = await factory.open(store)
            except BaseException:  # a client refused (a Redis URL without redis-py installed)
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
