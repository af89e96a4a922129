"""One run of the source: the stores' clients and pulls, on an event loop of the run's own.

dlt runs a source's resources on a loop of its own, and ends an extract (a resource failed,
Ctrl-C) by cancelling them, closing every async generator on that loop and stopping it, without
waiting for what it cancelled: pulls caught mid-request there would be closed while running
(asyncio logs each) and leave their sessions open. So the clients and the pulls live on a loop
in a thread of the run (``_Run``), the resources on dlt's only await the pages handed over, and
a resource that dlt stops asks the run's loop to wind its pulls down (``Pulls.stop``, no await),
which then finishes there whatever dlt's loop does. The first resource to start opens the
clients (one per store: each store's one budget); the last to finish keeps what they learned
and closes them, and the run's loop ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Coroutine, Mapping, MutableMapping, Sequence
from typing import Any, Self, TypeVar

import attrs

from .. import AdminClient, Page
from ..errors import AsyncSubsError
from ..stores import LearnedState, Store, StoreClients

__all__ = ["SourceClients"]

T = TypeVar("T")

#: What the source's clients say they are, before the library's own user agent.
USER_AGENT = "asyncsubs-dlt"
#: Each store's pages as they arrive, then ``(store, None, its error or None)`` when it is done.
_Handed = tuple[str, Page[Any] | None, Exception | None]


class _Run:
    """One run's event loop, in a thread of its own; its clients, one per store, made by
    ``factory``; and its slots: at most ``max_stores`` stores pulling at once, a store's
    resources sharing its slot."""

    def __init__(self, factory: StoreClients, stores: Sequence[Store], max_stores: int) -> None:
        self.factory = factory
        self.clients: dict[str, AdminClient] = {}
        self.users = 0
        self.loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._free = asyncio.Semaphore(max_stores)
        self._pulls: Counter[str] = Counter()
        self._entering: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        threading.Thread(target=self._serve, name="asyncsubs-dlt-run", daemon=True).start()
        self.opened = self.call(self._open(stores))

    def _serve(self) -> None:
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def call(self, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """``coro`` run on this run's loop, awaitable on the caller's."""
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def _open(self, stores: Sequence[Store]) -> None:
        for store in stores:
            self.clients[store.name] = await self.factory.open(store)

    def start(self, store: str, pages: AsyncIterator[Page[Any]], pulls: Pulls) -> None:
        """``store``'s pull into ``pulls``, a task on this loop."""
        task = asyncio.create_task(self._pull(store, pages, pulls))
        for known in (self._tasks, pulls.tasks):
            known.add(task)
            task.add_done_callback(known.discard)

    async def _pull(self, store: str, pages: AsyncIterator[Page[Any]], pulls: Pulls) -> None:
        """``store``'s pages to ``pulls``, in a slot of its own or the one it pulls in already."""
        error = None
        async with self._entering[store]:
            if not self._pulls[store]:
                await self._free.acquire()
            self._pulls[store] += 1
        try:
            async for page in pages:
                await pulls.hand_over((store, page, None))
        except Exception as exc:
            error = exc
        finally:
            self._pulls[store] -= 1
            if not self._pulls[store]:
                self._free.release()
        await pulls.hand_over((store, None, error))

    async def aclose(self, *, keep: bool) -> None:
        """Stop what still pulls, close the clients (first keeping what they learned, unless
        the run failed), and end the loop."""
        try:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            for client in self.clients.values():
                if keep:
                    await self.factory.keep(client)
                await client.aclose()
            await self.factory.aclose()
        finally:
            self.loop.call_soon(self.loop.stop)


class Pulls:
    """Every store's pull of one list endpoint, a task each on the run's loop, pages handed over
    to dlt's loop as they arrive (``async for store, page in pulls`` there), a page per store
    buffered.

    Each side wakes the other's loop only when it waits: a wake-up across threads waits for the
    GIL, up to a switch interval (5 ms) while dlt writes, and one per page both ways held the
    pulls back by a third (docs/dlt.md, "Many stores and how dlt runs them")."""

    def __init__(self, run: _Run, pages: Mapping[str, AsyncIterator[Page[Any]]]) -> None:
        self._run = run
        self._home = asyncio.get_running_loop()  # dlt's
        self._arrived: asyncio.Queue[_Handed] = asyncio.Queue()  # on dlt's loop
        self._room = max(1, len(pages))
        self._handed = 0  # written on the run's loop only
        self._taken = 0  # written on dlt's loop only
        self._wanting = False  # the run's loop waits for room
        self._freed = asyncio.Event()  # on the run's loop
        self._running = len(pages)
        self.tasks: set[asyncio.Task[None]] = set()  # on the run's loop
        for store, store_pages in pages.items():
            run.loop.call_soon_threadsafe(run.start, store, store_pages, self)

    async def hand_over(self, item: _Handed) -> None:
        """``item`` to dlt's loop, once there is room (on the run's loop)."""
        while self._handed - self._taken >= self._room:
            self._freed.clear()
            self._wanting = True  # then look again: a page taken before this is seen below,
            if self._handed - self._taken < self._room:  # one taken after it wakes us
                break
            await self._freed.wait()
        self._handed += 1
        with contextlib.suppress(RuntimeError):  # dlt's loop closed: the extract has ended
            self._home.call_soon_threadsafe(self._arrived.put_nowait, item)

    def stop(self) -> None:
        """Cancel the pulls on the run's loop, without waiting (from dlt's loop)."""
        self._run.loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        for task in self.tasks:
            task.cancel()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> tuple[str, Page[Any]]:
        """The next page of any store. A store's failure is raised, its message naming the
        store: dlt fails the run, and nothing is committed."""
        while self._running:
            store, page, error = await self._arrived.get()
            self._taken += 1
            if self._wanting:
                self._wanting = False
                self._run.loop.call_soon_threadsafe(self._freed.set)
            if error is not None:
                if isinstance(error, AsyncSubsError):
                    error.args = (f"store {store}: {error}", *error.args[1:])
                raise error
            if page is not None:
                return store, page
            self._running -= 1
        raise StopAsyncIteration


class SourceClients:
    """The stores' clients for every run of a source object, one ``_Run`` per dlt loop."""

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
        """This loop's run, its clients opened by the first resource to start (from what
        ``learned``, the source's state, holds). Every resource that enters must ``leave``, or
        ``abandon`` the run once it fails or dlt stops it."""
        loop = asyncio.get_running_loop()
        run = self._runs.get(loop)
        if run is None:
            factory = self._factory(LearnedState(learned))
            run = self._runs[loop] = _Run(factory, self.stores, self.max_stores)
        run.users += 1
        try:
            # Shielded: a resource stopped while the clients open does not stop their opening.
            await asyncio.shield(run.opened)
        except BaseException:  # a client refused (a Redis URL without redis-py installed)
            self.abandon(run)
            raise
        return run

    async def leave(self, run: _Run) -> None:
        """The last resource to leave keeps what the clients learned and closes them."""
        if self._release(run):
            await asyncio.shield(run.call(run.aclose(keep=True)))

    def abandon(self, run: _Run) -> None:
        """``leave`` for a resource that failed or that dlt stopped, without waiting: dlt may be
        stopping its loop. The last to go closes the clients on the run's loop, keeping nothing."""
        if self._release(run):
            asyncio.run_coroutine_threadsafe(run.aclose(keep=False), run.loop)

    def _release(self, run: _Run) -> bool:
        run.users -= 1
        if run.users:
            return False
        del self._runs[asyncio.get_running_loop()]
        return True
