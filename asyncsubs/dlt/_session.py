"""The clients of one run of the source, in the event loop that runs its resources.

dlt runs every async resource of a source's extract on one event loop of its own, in a
background thread (see the package's docstring); a client belongs to the loop of its first
request. So the clients are made there, by the first resource that starts, shared by every
resource of the run (each store's one budget), and closed by the last one to finish; what they
learned of the servers is written to the source's state on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import AdminClient
from ..errors import ConfigError
from ..sync import DEFAULT_MAX_STORES
from ._stores import Store, client_settings

if TYPE_CHECKING:
    from ..redis import RedisLimiter

__all__ = ["DEFAULT_MAX_STORES", "StoreClients", "StoreSlots"]

log = logging.getLogger("asyncsubs.dlt")


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
        stores: Sequence[Store],
        list_paths: Sequence[str],
        learned: MutableMapping[str, Any],
        redis_url: str | None,
        max_stores: int,
    ) -> None:
        self.users = 0
        self.slots = StoreSlots(max_stores)
        self.learned = learned
        self.limiters: dict[str, RedisLimiter] = {}
        self.clients: dict[str, AdminClient] = {}
        for store in stores:
            url = store.redis or redis_url
            settings = client_settings(store, list_paths)
            if url is not None:
                settings["limiter"] = self._redis(url)
            previous = learned.get(store.name)
            if previous is not None:
                try:
                    self.clients[store.name] = AdminClient(**settings, learned=previous)
                    continue
                except ConfigError as exc:  # another base URL since: another server's limits
                    log.info("store %s: not starting from what was learned (%s)", store.name, exc)
            self.clients[store.name] = AdminClient(**settings)

    def _redis(self, url: str) -> RedisLimiter:
        if url not in self.limiters:
            try:
                from ..redis import RedisLimiter
            except ImportError:
                raise ConfigError(
                    "a Redis URL needs redis-py: pip install 'asyncsubs[redis]'"
                ) from None
            self.limiters[url] = RedisLimiter(url)
        return self.limiters[url]

    async def aclose(self) -> None:
        for name, client in self.clients.items():
            self.learned[name] = client.export_learned()
        for client in self.clients.values():
            await client.aclose()
        for limiter in self.limiters.values():
            with contextlib.suppress(Exception):  # the run's outcome is decided; Redis is not it
                await limiter.aclose()


class StoreClients:
    """The stores' clients for every run of a source object, one set per event loop."""

    def __init__(
        self,
        stores: Sequence[Store],
        list_paths: Sequence[str],
        redis_url: str | None,
        max_stores: int = DEFAULT_MAX_STORES,
    ) -> None:
        self.stores = tuple(stores)
        self._max_stores = max_stores
        self._list_paths = tuple(list_paths)
        self._redis_url = redis_url
        self._runs: dict[asyncio.AbstractEventLoop, _Run] = {}

    def check(self, store: Store) -> None:
        """ConfigError if a client of ``store`` could not be made (it sends nothing)."""
        AdminClient(**client_settings(store, self._list_paths), telemetry=False)

    def open(self, learned: MutableMapping[str, Any]) -> _Opened:
        """This loop's run (``async with``): its ``clients`` by store name, made by the first
        resource to start (from what ``learned``, the source's state, holds) and closed when
        the last one leaves, and its ``slots``."""
        return _Opened(self, learned)

    def _enter(self, learned: MutableMapping[str, Any]) -> _Run:
        loop = asyncio.get_running_loop()
        run = self._runs.get(loop)
        if run is None:
            run = _Run(self.stores, self._list_paths, learned, self._redis_url, self._max_stores)
            self._runs[loop] = run
        run.users += 1
        return run

    async def _leave(self, run: _Run) -> None:
        run.users -= 1
        if run.users == 0:
            del self._runs[asyncio.get_running_loop()]
            await run.aclose()


class _Opened:
    """A resource's use of its loop's run (plain methods: see ``_source._Pulls``)."""

    def __init__(self, clients: StoreClients, learned: MutableMapping[str, Any]) -> None:
        self._clients, self._learned = clients, learned
        self._run: _Run | None = None

    async def __aenter__(self) -> _Run:
        self._run = self._clients._enter(self._learned)
        return self._run

    async def __aexit__(self, *exc_info: object) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            await self._clients._leave(run)
