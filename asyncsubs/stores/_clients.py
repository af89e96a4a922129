"""Opening a store's client: the one place that makes an ``AdminClient`` for the doors.

``StoreClients`` belongs to one run of a door: each store's client has the door's user agent,
paces through the Redis limiter the store names (one per URL, closed with the run) and starts
from what its pools learned in earlier runs (a ``LearnedStore``); ``keep`` saves what they learn.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .. import AdminClient, Limits, Rate, RetryEvent
from ..errors import ConfigError
from ..settings import versioned_base
from ._learned import LearnedStore
from ._store import RESOURCES, Store

if TYPE_CHECKING:
    from ..redis import RedisLimiter

__all__ = ["StoreClients"]

log = logging.getLogger("asyncsubs.stores")


def _limits(store: Store, list_paths: Sequence[str]) -> Limits:
    """The store's limits, each of ``list_paths`` a heavy pool: discovered unless the store's
    limits are given (then a path they do not name is paced at 1/s, not on the global pool)."""
    if store.limits is None:
        return Limits(discover=True, heavy=dict.fromkeys(list_paths, Rate.discover()))
    missing = [path for path in list_paths if path not in store.limits.heavy]
    if not missing:
        return store.limits
    heavy = {**store.limits.heavy, **dict.fromkeys(missing, Rate(1, per=1.0))}
    return attrs.evolve(store.limits, heavy=heavy)


class StoreClients:
    """The clients of one run of a door. ``learned``: where learned limits are kept (None:
    nowhere); ``list_paths``: the list endpoints the door pulls (each a heavy pool); ``redis``:
    a Redis URL for the stores that name none; ``note``: says learned limits not used."""

    def __init__(
        self,
        learned: LearnedStore | None,
        *,
        user_agent: str | None = None,
        list_paths: Sequence[str] = RESOURCES,
        redis: str | None = None,
        note: Callable[[str], object] = log.info,
    ) -> None:
        self.learned = learned
        self.user_agent = user_agent
        self.list_paths = tuple(list_paths)
        self.redis = redis
        self.note = note
        self.limiters: dict[str, RedisLimiter] = {}

    def client(
        self,
        store: Store,
        learned: Mapping[str, Any] | None = None,
        *,
        on_retry: Callable[[RetryEvent], object] | None = None,
        telemetry: bool = True,
    ) -> AdminClient:
        """``store``'s client, starting from what its pools ``learned`` (ConfigError for
        settings the client refuses)."""
        url = store.redis or self.redis
        settings: dict[str, Any] = {
            "token": store.token,
            "base_url": store.base_url,
            "store": store.name,
            "limits": _limits(store, self.list_paths),
            "retry": store.retry,
            "timeout": store.timeout,
            "version": store.version,
            "allow_insecure": store.allow_insecure,
            "user_agent": self.user_agent,
            "limiter": None if url is None else self._limiter(url, store.redis_fallback),
            "on_retry": on_retry,
            "telemetry": telemetry,
        }
        if learned is not None and learned.get("store") == store.name:
            try:
                # The store's own: where it is reached now is where its limits apply.
                base = versioned_base(store.base_url, store.version, allow_insecure=True)
                return AdminClient(**settings, learned={**learned, "base_url": base})
            except ConfigError as exc:
                self.note(f"store {store.name}: learned limits not used ({exc})")
        return AdminClient(**settings)

    async def open(
        self, store: Store, *, on_retry: Callable[[RetryEvent], object] | None = None
    ) -> AdminClient:
        """``store``'s client, starting from what its pools learned in earlier runs."""
        learned = None if self.learned is None else await self.learned.load_learned(store.name)
        return self.client(store, learned, on_retry=on_retry)

    async def keep(self, client: AdminClient) -> None:
        """Keep what the client's pools learned, for the next run of its store."""
        learned = client.export_learned()
        if self.learned is not None and learned["pools"]:
            await self.learned.save_learned(client.store, learned)

    def _limiter(self, url: str, fallback: float | None) -> RedisLimiter:
        # One per Redis and fallback share: stores with different shares differ only while
        # that Redis fails.
        key = url if fallback is None else f"{url}#{fallback}"
        if key not in self.limiters:
            try:
                from ..redis import RedisLimiter
            except ImportError:
                raise ConfigError(
                    "a Redis URL needs redis-py: pip install 'asyncsubs[redis]'"
                ) from None
            self.limiters[key] = RedisLimiter(url, fallback_fraction=fallback)
        return self.limiters[key]

    async def aclose(self) -> None:
        """Close the Redis limiters (the clients are their users')."""
        limiters, self.limiters = self.limiters, {}
        for limiter in limiters.values():
            try:
                await limiter.aclose()
            except Exception:  # the run's outcome is decided; Redis is not it
                log.debug("closing a Redis limiter failed", exc_info=True)
