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
from collections.abc import AsyncIterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import AdminClient
from ..errors import ConfigError
from ._stores import Store, client_settings

if TYPE_CHECKING:
    from ..redis import RedisLimiter

__all__ = ["StoreClients"]

log = logging.getLogger("asyncsubs.dlt")


class _Run:
    """One event loop's clients, one per store, and the Redis limiters they pace through."""

    def __init__(
        self,
        stores: Sequence[Store],
        list_paths: Sequence[str],
        learned: MutableMapping[str, Any],
        redis_url: str | None,
    ) -> None:
        self.users = 0
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
        self, stores: Sequence[Store], list_paths: Sequence[str], redis_url: str | None
    ) -> None:
        self.stores = tuple(stores)
        self._list_paths = tuple(list_paths)
        self._redis_url = redis_url
        self._runs: dict[asyncio.AbstractEventLoop, _Run] = {}

    def check(self, store: Store) -> None:
        """ConfigError if a client of ``store`` could not be made (it sends nothing)."""
        AdminClient(**client_settings(store, self._list_paths), telemetry=False)

    @contextlib.asynccontextmanager
    async def open(
        self, learned: MutableMapping[str, Any]
    ) -> AsyncIterator[Mapping[str, AdminClient]]:
        """The clients by store name, made in this loop by the first resource to start (from
        what ``learned``, the source's state, holds) and closed when the last one leaves."""
        loop = asyncio.get_running_loop()
        run = self._runs.get(loop)
        if run is None:
            run = self._runs[loop] = _Run(self.stores, self._list_paths, learned, self._redis_url)
        run.users += 1
        try:
            yield run.clients
        finally:
            run.users -= 1
            if run.users == 0:
                del self._runs[loop]
                await run.aclose()
