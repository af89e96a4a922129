"""What a store learned of the server, held per key in each event loop and shared by backends.

A key (a discovering pool, a list path) holds one :class:`~._discovery.Learned` record, which
its parts write: a pool's rate search (:mod:`._limiter`), a path's page-size search
(:mod:`._page_size`). Fields no part holds yet are kept as they came (an import read before
the path's first pull). Through a :class:`LearningBackend` the record is exchanged
compare-and-set: read before the key's first use, written when it changed (merged with a change
made elsewhere meanwhile), another holder's adopted; otherwise once per ``SYNC_EVERY`` seconds
while in use. :class:`MemoryLearning` shares between the loops of a process, Redis between hosts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

import attrs

from ._discovery import LEARNED_MAX_AGE, Learned, merged

__all__ = ["SYNC_EVERY", "LearningBackend", "MemoryLearning", "Part", "StoreLearning"]

logger = logging.getLogger("asyncsubs.limiter")

#: Seconds between two exchanges of what a store learned with a shared backend, while in use.
SYNC_EVERY = 1.0


class LearningBackend(Protocol):
    """``exchange``: the shared record of what ``key`` (a pool, or a list path) of ``store``
    learned, with a version. Given ``learned``, it is written if ``version`` is the shared one's
    (0: none yet), compare-and-set; returns the shared ``(version, record or None, written)``,
    the record's ``hold`` and ``age`` counted to now on the backend's clock. ``sharers``: how
    many processes pace ``store`` through the backend now (optional; 1 without it)."""

    async def exchange(
        self, store: str, key: str, version: int, learned: Learned | None
    ) -> tuple[int, Learned | None, bool]: ...


class Part(Protocol):
    """A search writing some fields of a key's record: ``snapshot`` them, ``take`` them from a
    record (``imported``: from an earlier run, else another holder's); ``stats``: its fields of
    :class:`~._stats.PoolStats`."""

    def snapshot(self, now: float) -> dict[str, Any]: ...
    def take(self, learned: Learned, now: float, *, imported: bool) -> None: ...
    def stats(self) -> dict[str, Any]: ...


P = TypeVar("P", bound=Part)


class MemoryLearning:
    """The records of a process, shared by its threads' loops on one monotonic clock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (store, key) -> (version, record, loop time written).
        self._learned: dict[tuple[str, str], tuple[int, Learned, float]] = {}

    async def exchange(
        self, store: str, key: str, version: int, learned: Learned | None
    ) -> tuple[int, Learned | None, bool]:
        with self._lock:
            now, current = asyncio.get_running_loop().time(), self._learned.get((store, key))
            written = learned is not None and version == (0 if current is None else current[0])
            if written:
                assert learned is not None
                current = self._learned[store, key] = (version + 1, learned, now)
        if current is None:
            return 0, None, False
        shared_version, record, at = current
        return shared_version, record.aged(now - at), written

    def _forget_learned(self, now: float) -> None:
        """Drop records unchanged for twice their useful age (the caller holds the lock)."""
        old = now - 2 * LEARNED_MAX_AGE
        self._learned = {k: v for k, v in self._learned.items() if v[2] > old}


class _Key:
    """One key's parts, the record they started from, and its shared version."""

    __slots__ = ("again", "base", "imported", "parts", "seeded", "sync", "synced", "version")

    def __init__(self) -> None:
        self.parts: dict[type[Any], Part] = {}
        self.base, self.imported = Learned(), False  # the record last taken in, and whence
        self.version: int | None = None  # None: the shared record not read yet
        self.synced: Learned | None = None  # the record as last exchanged
        self.seeded = False  # restored from an import: the shared record, if any, wins
        self.sync: asyncio.Task[None] | None = None  # the exchange with the backend running
        self.again = False  # another asked for while it runs

    def snapshot(self, now: float) -> Learned:
        fields: dict[str, Any] = {}
        for part in self.parts.values():
            fields.update(part.snapshot(now))
        return attrs.evolve(self.base, age=0.0, **fields)

    def take(self, learned: Learned, now: float, *, imported: bool) -> None:
        self.base, self.imported = learned, imported
        for part in self.parts.values():
            part.take(learned, now, imported=imported)


class StoreLearning:
    """What one store learned in one event loop, per key, shared through ``backend`` (if it has
    an ``exchange``); ``on_taken(key, now)`` follows a record taken in (imported or adopted)."""

    def __init__(self, store: str, backend: object, on_taken: Callable[[str, float], None]) -> None:
        self.store, self._on_taken = store, on_taken
        self._loop_ref = weakref.ref(asyncio.get_running_loop())  # weak: not keeping it alive
        self._exchange = getattr(backend, "exchange", None)
        self._sharers = getattr(backend, "sharers", None)
        self._keys: dict[str, _Key] = {}
        self._kinds: list[type[Part]] = []  # parts every key holds
        self._sync_at = -math.inf
        self._background: set[asyncio.Task[None]] = set()  # work with the backend: see background

    def sharers(self) -> int:
        """How many processes pace the store through the backend now (1 unless it says)."""
        return 1 if self._sharers is None else int(self._sharers(self.store))

    def add(self, key: str, part: P) -> P:
        """``part`` writes ``key`` from now on, starting from what it holds."""
        held = self._key(key)
        held.parts[type(part)] = part
        part.take(held.base, asyncio.get_running_loop().time(), imported=held.imported)
        return part

    def part(self, key: str, kind: type[P]) -> P:
        """The ``kind`` part of ``key``, made (of no arguments) if it has none yet."""
        found = self._key(key).parts.get(kind)
        return self.add(key, kind()) if found is None else found  # type: ignore[return-value]

    def everywhere(self, kind: type[Part]) -> None:
        """Every key, held now or later, holds a ``kind`` part (reporting what it took in)."""
        if kind not in self._kinds:
            self._kinds.append(kind)
            for key in self._keys:
                self.part(key, kind)

    def _key(self, key: str) -> _Key:
        if (held := self._keys.get(key)) is None:
            held = self._keys[key] = _Key()
            for kind in self._kinds:
                self.add(key, kind())
        return held

    def stats(self, key: str) -> dict[str, Any]:
        """The fields of PoolStats that the parts of ``key`` report."""
        fields: dict[str, Any] = {}
        for part in getattr(self._keys.get(key), "parts", {}).values():
            fields.update(part.stats())
        return fields

    def learned(self) -> dict[str, Learned]:
        """What each key learned so far, ``hold`` and ``age`` counted to now (also once the loop
        has stopped: an export at the end of a run)."""
        loop = self._loop_ref()
        now = loop.time() if loop is not None else time.monotonic()
        return {key: held.snapshot(now) for key, held in self._keys.items()}

    def restore(self, records: Mapping[str, Learned]) -> None:
        """Start from records learned before (an import): each is used unless the backend
        already holds one for its key (another client or worker learned since)."""
        now = asyncio.get_running_loop().time()
        for key, record in records.items():
            held = self._key(key)
            held.take(record, now, imported=True)
            held.seeded = True
            self._on_taken(key, now)

    async def ready(self, key: str) -> None:
        """Start ``key`` from what the backend's holders learned: one exchange, however many of
        this loop's pulls wait for it."""
        held = self._key(key)
        if held.version is not None:
            return
        if self._exchange is None:
            held.version = 0
            return
        await asyncio.shield(held.sync or self._exchanging(key))

    def share(self, key: str) -> None:
        """Exchange what ``key`` learned with the backend, if it shares."""
        if self._exchange is not None:
            self._exchanging(key)

    def tick(self, now: float) -> None:
        """A request started at loop time ``now``: read what other holders learned, at most
        once per ``SYNC_EVERY``."""
        if self._keys and now >= self._sync_at:
            self._sync_at = now + SYNC_EVERY
            for key in self._keys:
                self.share(key)

    def _exchanging(self, key: str) -> asyncio.Task[None]:
        """The exchange of ``key`` running, one at a time: one asked for meanwhile follows it
        (overlapping, both would write, and the second would adopt the first's record as
        another holder's and repace the pool, discarding its 429s' evidence, for nothing)."""
        held = self._keys[key]
        if held.sync is not None:
            held.again = True
            return held.sync
        task = held.sync = self.background(self._sync(key), "what a pool learned")
        task.add_done_callback(functools.partial(self._exchanged, key))
        return task

    def _exchanged(self, key: str, task: asyncio.Task[None]) -> None:
        held = self._keys[key]
        held.sync = None
        if held.again and not task.cancelled():
            held.again = False
            self._exchanging(key)

    async def _sync(self, key: str) -> None:
        """Exchange what ``key`` learned with the backend's shared record: a change of ours is
        written (merged with one made elsewhere meanwhile), one made elsewhere adopted."""
        held, loop = self._keys[key], asyncio.get_running_loop()
        assert self._exchange is not None
        for _ in range(3):  # a write lost to another writer is merged and written again
            mine = held.snapshot(loop.time())
            known = held.version
            dirty = held.seeded or (known is not None and mine != held.synced)
            try:
                version, shared, written = await self._exchange(
                    self.store, key, known or 0, mine if dirty else None
                )
            except Exception as exc:  # learning alone until the backend answers again
                held.version = known or 0
                message = "store %r: what %r learned was not shared (%s)"
                logger.debug(message, self.store, key, type(exc).__name__)
                return
            if written or (not dirty and (shared is None or version == known)):
                held.version, held.synced, held.seeded = version, mine, False
                return
            if shared is None:  # none (expired since) or none readable: ours is written over it
                held.version = version
                continue
            adopt = shared if held.seeded or not dirty else merged(mine, shared)
            held.take(adopt, now := loop.time(), imported=False)
            held.version, held.seeded = version, False
            held.synced = shared if adopt is shared else None  # a merge is written next
            self._on_taken(key, now)
            if adopt is shared:
                return

    def background(self, sharing: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """Run ``sharing`` with the backend (an exchange, the limiter's pause) in the background;
        a failure is logged once."""
        task = asyncio.get_running_loop().create_task(sharing)
        self._background.add(task)
        task.add_done_callback(functools.partial(self._shared, what))
        return task

    def _shared(self, what: str, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            message = "store %r: could not share %s with the limiter backend (%s)"
            logger.warning(message, self.store, what, type(exc).__name__)
