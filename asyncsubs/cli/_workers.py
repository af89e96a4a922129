"""Many workers on one PostgreSQL database: the work split through row leases.

The unit of work is a (store, resource). Every worker running the same ``sync`` command:

1. joins the current *round* of its units, or starts a new one when every unit of the last is
   finished (a rerun after a finished sync pulls everything again, incrementally where
   configured, as the SQLite sync does); workers started together share one round;
2. claims a pending unit nobody holds with ``SELECT ... FOR UPDATE SKIP LOCKED`` (so concurrent
   claims never wait on each other nor take the same row), setting its lease: ``holder`` and
   ``lease_until`` = now + ``lease`` seconds, on the database's clock;
3. pulls it as the single-process sync does, committing each page with its cursor; each commit
   checks the lease is still its own and renews it, and a heartbeat renews every held lease
   each ``lease / 3`` seconds;
4. marks it done in the transaction of its last page, or failed (with the error, not retried
   this round) when the API refuses it; claims the next one.

A worker killed (SIGKILL, a lost host) stops renewing: once its leases expire a survivor
claims the units and resumes each from its committed cursor, so nothing is lost or doubled. A
worker stopped cleanly (Ctrl-C, SIGTERM, a database error) releases its leases at once. A
worker with nothing to claim waits, on ``LISTEN`` for released units and a timer for the
earliest lease that may expire, and exits once no unit of the round is pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from .. import AdminClient
from ..errors import AsyncSubsError
from ..limiting import Limiter
from ._config_file import StoreConfig
from ._progress import Tracker
from ._sync import (
    DEFAULT_MAX_STORES,
    DatabaseError,
    LeaseLostError,
    _first,
    _sync_resource,
    describe_error,
    make_client,
)

if TYPE_CHECKING:
    from ._postgres import PostgresSink

__all__ = ["run_workers"]

log = logging.getLogger("asyncsubs.cli")


class _Clients:
    """One client per store with units held here, closed when its last unit ends."""

    def __init__(self, limiters: Mapping[str, Limiter] | None) -> None:
        self.limiters = limiters
        self._clients: dict[str, tuple[AdminClient, int]] = {}

    def acquire(self, config: StoreConfig) -> AdminClient:
        client, users = self._clients.get(config.store, (None, 0))
        if client is None:
            client = make_client(config, self.limiters)
        self._clients[config.store] = (client, users + 1)
        return client

    async def release(self, store: str) -> None:
        client, users = self._clients[store]
        if users > 1:
            self._clients[store] = (client, users - 1)
            return
        del self._clients[store]
        await client.aclose()

    @property
    def stores(self) -> list[str]:
        return list(self._clients)


async def run_workers(
    configs: Sequence[StoreConfig],
    sink: PostgresSink,
    tracker: Tracker,
    *,
    max_stores: int = DEFAULT_MAX_STORES,
    limiters: Mapping[str, Limiter] | None = None,
) -> None:
    """Pull units of ``configs`` with other workers sharing ``sink`` until none is pending.

    At most ``max_stores`` times (resources per store) units at once, as many pulls as the
    single-process sync runs. API failures are recorded per unit in the tracker (and in the
    units table); a DatabaseError stops this worker, releasing its leases.
    """
    by_store = {config.store: config for config in configs}
    units = [(config.store, resource) for config in configs for resource in config.resources]
    if not units:
        return
    await sink.join_round(units)
    slots = asyncio.Semaphore(max_stores * max(len(c.resources) for c in configs))
    clients = _Clients(limiters)
    running: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def pull(unit: tuple[str, str]) -> None:
        store, resource = unit
        config = by_store[store]
        row = tracker.add(store, resource)  # the progress shows the units held here
        client: AdminClient | None = None
        try:
            client = clients.acquire(config)
            await _sync_resource(client, config, resource, sink, tracker, row)
        except LeaseLostError:
            tracker.note(row, "lease lost to another worker (this one was too slow); stopped")
            row.state = "interrupted"
        except DatabaseError:
            raise
        except AsyncSubsError as exc:
            log.debug("store %s, %s failed", store, resource, exc_info=True)
            row.client = client
            tracker.fail(row, describe_error(exc))
            await sink.release(unit, error=describe_error(exc))
        finally:
            row.freeze_stats()
            running.pop(unit, None)
            slots.release()
            if client is not None:
                await clients.release(store)

    async def heartbeat() -> None:
        while True:
            await asyncio.sleep(sink.lease / 3)
            for unit in await sink.renew(list(running)):
                # Only when this worker stalled past its lease: the commit check already
                # keeps its pages out; this stops the pull itself.
                task = running.get(unit)
                if task is not None:
                    task.cancel()
                    tracker.message(f"{unit[0]}/{unit[1]}: lease lost to another worker")

    try:
        async with asyncio.TaskGroup() as group:
            beat = group.create_task(heartbeat())
            while True:
                await slots.acquire()
                unit = await sink.claim(units, prefer=clients.stores)
                if unit is not None:
                    running[unit] = group.create_task(pull(unit))
                    continue
                slots.release()
                wait = await sink.pending_wait(units)
                if wait is None:
                    break  # every unit of the round is done or failed
                # Woken by a unit released or finished anywhere (ours included), or when
                # another worker's lease may have expired.
                await sink.wait_for_release(min(wait, sink.lease) + 0.05)
            beat.cancel()
    except BaseExceptionGroup as group_exc:
        raise _first(group_exc) from None
    finally:
        tracker.interrupt_running()
        with contextlib.suppress(Exception):
            await asyncio.shield(sink.release_all())
