"""Which units run, and when: one round of every ``(store, resource)`` of a ``SyncEngine``.

- **One process** (a sink without leases, SQLite): every store's units at once, ``max_stores``
  stores at a time, one client per store.
- **Leased workers** (a sink with ``Leases``, PostgreSQL): the workers running the same sync on
  the same database share the round. Each claims a pending unit nobody holds (stores it has a
  client for first), pulls it (each commit renews the lease, and a page commits only under
  it), and claims the next; a heartbeat renews its leases each ``lease / 3`` seconds. A killed
  worker's units are resumed by a survivor from their committed cursors once its leases
  expire; one stopped cleanly releases them at once. A worker with nothing to claim waits for
  a release or the earliest expiry, and ends once no unit of the round is pending; one that
  found nothing while another held two or more is handed units at their next page commits
  (``postgres``), or says why it was idle (``WorkerIdle``).

A unit the API refuses is reported (``UnitFailed``) and the others go on; a ``DatabaseError``
stops the round.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Iterable

from .. import AdminClient
from ..stores import Message, RunStarted, Store, WorkerIdle
from ._engine import SyncEngine
from ._sink import DatabaseError, Leases

__all__ = ["run_round"]


async def run_round(engine: SyncEngine) -> int:
    """Every unit of ``engine``'s stores once, here or shared with the sink's other workers;
    returns how many units failed."""
    engine.rounds += 1
    leases = engine.sink.leases
    if leases is None:
        units = tuple((c.name, r) for c in engine.configs for r in c.resources)
        engine.observe(RunStarted(engine.rounds, units))
        return await _in_this_process(engine)
    engine.observe(RunStarted(engine.rounds))
    return await _with_workers(engine, leases)


async def _all(tasks: Iterable[Awaitable[object]]) -> None:
    try:
        async with asyncio.TaskGroup() as group:
            for task in tasks:
                group.create_task(task)  # type: ignore[arg-type]
    except BaseExceptionGroup as group_exc:
        # The first real error rather than a group: a DatabaseError, or a bug.
        raise _first(group_exc) from None


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first(exc)
        if isinstance(exc, DatabaseError):
            return exc
    return group.exceptions[0]


async def _in_this_process(engine: SyncEngine) -> int:
    # Waiting stores hold no connections; the progress shows their units waiting.
    slots = asyncio.Semaphore(engine.max_stores)
    failed = 0

    async def unit(client: AdminClient, config: Store, resource: str) -> None:
        nonlocal failed
        # Awaited before the addition: ``failed += await ...`` would read ``failed`` before
        # the pull and lose the failures counted by other units meanwhile.
        error = await engine.pull(client, config, resource)
        failed += error is not None

    async def store(config: Store) -> None:
        async with slots, await engine.open_client(config) as client:
            await _all(unit(client, config, resource) for resource in config.resources)

    await _all(store(config) for config in engine.configs)
    return failed


class _Clients:
    """One client per store with units held here, closed when its last unit ends."""

    def __init__(self, engine: SyncEngine) -> None:
        self.engine = engine
        self.users: dict[str, tuple[AdminClient, int]] = {}

    @contextlib.asynccontextmanager
    async def of(self, config: Store) -> AsyncIterator[AdminClient]:
        if config.name not in self.users:
            client = await self.engine.open_client(config)
            if self.users.setdefault(config.name, (client, 0))[0] is not client:
                await client.aclose()  # another unit's was opened meanwhile
        client, users = self.users[config.name]
        self.users[config.name] = (client, users + 1)
        try:
            yield client
        finally:
            client, users = self.users.pop(config.name)
            if users > 1:
                self.users[config.name] = (client, users - 1)
            else:
                await client.aclose()


async def _with_workers(engine: SyncEngine, leases: Leases) -> int:
    by_store = {config.name: config for config in engine.configs}
    units = [(config.name, resource) for config in engine.configs for resource in config.resources]
    if not units:
        return 0
    await leases.join_round(units)
    # As many pulls at once as the one-process sync runs.
    slots = asyncio.Semaphore(engine.max_stores * max(len(c.resources) for c in engine.configs))
    clients = _Clients(engine)
    running: dict[tuple[str, str], asyncio.Task[None]] = {}
    claimed = 0
    failed: set[tuple[str, str]] = set()

    async def pull(unit: tuple[str, str]) -> None:
        store, resource = unit
        try:
            async with clients.of(by_store[store]) as client:
                error = await engine.pull(client, by_store[store], resource)
            if error is not None:
                failed.add(unit)
                await leases.release(unit, error=error)  # not retried this round
        finally:
            running.pop(unit, None)
            slots.release()

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(leases.lease / 3)
            for unit in await leases.renew(list(running)):
                # Only when this worker stalled past its lease: the commit check already keeps
                # its pages out; this stops the pull itself.
                task = running.get(unit)
                if task is not None:
                    task.cancel()
                    engine.observe(Message(f"{unit[0]}/{unit[1]}: lease lost to another worker"))

    try:
        async with asyncio.TaskGroup() as group:
            beat = group.create_task(heartbeat())
            while True:
                await slots.acquire()
                # Not one still running here (handed over or lost, its pull still ending).
                free = [unit for unit in units if unit not in running]
                unit = await leases.claim(free, prefer=list(clients.users))
                if unit is not None:
                    running[unit] = group.create_task(pull(unit))
                    claimed += 1
                    continue
                slots.release()
                wait = await leases.pending_wait(units)
                if wait is None:
                    break  # every unit of the round is done or failed
                # Woken by a unit released or finished anywhere (ours included), or when
                # another worker's lease may have expired.
                await leases.wait_for_release(min(wait, leases.lease) + 0.05)
            beat.cancel()
        if not claimed:
            held = f"other workers held all {len(units)} units of the round until they finished"
            engine.observe(WorkerIdle(f"this worker pulled nothing: {held} them"))
        # Said by every worker, not only by the one whose pull failed (its token, say), in
        # this round or one before: each one's summary would otherwise call its units done.
        for (store, resource), error in (await leases.failures(units)).items():
            if (store, resource) not in failed:
                said = f"failed, and not pulled in this round (a new round will): {error}"
                engine.observe(Message(f"{store}/{resource}: {said}"))
    except BaseExceptionGroup as group_exc:
        raise _first(group_exc) from None
    finally:
        with contextlib.suppress(Exception):
            await asyncio.shield(leases.release_all())
    return len(failed)
