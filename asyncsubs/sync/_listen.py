"""``ListenSync``: webhooks applied to the sync database, reconciled by incremental pulls.

One aiohttp application serves ``POST /webhooks/<store>`` for every configured store, each with
its own ``WebhookReceiver`` (its own ``WebhookConfig``) behind one listener's timeouts and caps.
Which deliveries are a store's follows ``resolve_store_binding``. The first refusal of each
reason of each store is told as a ``WebhookRefused`` event saying what to check; the rest are
counted (``WebhookCounts``).

A delivery is answered 200 only once it is in the database's ``webhook_inbox``, and removed
when applied or dead-lettered: nothing acknowledged is lost to a crash. Events go through the
same sink as pulls; the upsert's newer-or-equal rule and the deleted ids make their order
irrelevant. Webhooks can be lost, so every ``reconcile_every`` seconds an incremental pull of
every unit fetches what they missed (not deletes: a lost delete leaves its row).

A service outlives its database's bad moments (SQLite locked by another process, PostgreSQL
restarted): opening it at start, and a pull it fails, are told and tried again after a
backoff, as often as it takes, while the listener keeps serving (a delivery the inbox cannot
take is answered 503); events accepted before wait until the database takes them rather than
spending their handler attempts. Once a pull succeeds again, dead letters of other database
failures are requeued.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, TypeVar
from urllib.parse import quote

import attrs
from aiohttp import web

from ..errors import ConfigError
from ..json import dumps
from ..stores import (
    DEFAULT_MAX_STORES,
    Message,
    Observer,
    WebhookCounts,
    WebhookRefused,
    describe_error,
)
from ..stores import Store as StoreConfig
from ..webhooks import (
    DeliveryRefused,
    Handler,
    Listener,
    ListenerLimits,
    Refusal,
    WebhookConfig,
    WebhookEvent,
    WebhookReceiver,
    resolve_store_binding,
)
from ._engine import SyncEngine
from ._schedulers import run_round
from ._sink import DatabaseError, DatabaseUnavailable, Sink

__all__ = [
    "APPLY_RETRY_MAX",
    "DATABASE_RETRY_FIRST",
    "DATABASE_RETRY_MAX",
    "DEFAULT_RECONCILE_EVERY",
    "ListenSync",
    "REQUEUE_BELOW_ATTEMPTS",
    "WebhookApplyError",
]

T = TypeVar("T")
DEFAULT_RECONCILE_EVERY: Final = 300.0
WEBHOOK_ROUTE: Final = "/webhooks/{store}"
#: Dead letters are requeued on start until they have had this many handler attempts in all
#: (three rounds of ``max_handler_attempts``): a cause fixed in between (a locked or full
#: disk) is recovered by a restart, a poison event is not retried for ever.
REQUEUE_BELOW_ATTEMPTS: Final = 3 * WebhookConfig("-").max_handler_attempts
#: Seconds before a write the database failed is tried again, doubled at each failure in a row
#: up to ``DATABASE_RETRY_MAX`` for a pull (and never beyond the reconciliation interval):
#: a lock or a restart usually ends within seconds, a longer outage is not polled more than
#: once a minute; up to ``APPLY_RETRY_MAX`` for an event (a try is one write, not a round).
DATABASE_RETRY_FIRST: Final = 1.0
DATABASE_RETRY_MAX: Final = 60.0
APPLY_RETRY_MAX: Final = 5.0
#: Seconds between looks at the receivers' counters (told only when they changed).
COUNTS_EVERY: Final = 1.0
#: The stores.toml keys to check for each reason a delivery is refused (a payload that is
#: not an event has none: ``sync --listen`` reads ``WebhookConfig``'s default shape).
KEYS_TO_CHECK: Final[Mapping[Refusal, tuple[str, ...]]] = {
    Refusal.NO_SIGNATURE: (
        "webhook_scheme",
        "webhook_signature_header",
        "webhook_encoding",
        "webhook_signature_prefix",
    ),
    Refusal.BAD_SIGNATURE: (
        "webhook_secret_env",
        "webhook_previous_secrets_env",
        "webhook_scheme",
        "webhook_algorithm",
        "webhook_encoding",
    ),
    Refusal.BAD_TIMESTAMP: ("webhook_scheme", "webhook_timestamp_header"),
    Refusal.STALE_TIMESTAMP: ("webhook_timestamp_tolerance",),
    Refusal.WRONG_STORE: ("webhook_store_id", "webhook_store_key"),
}


def what_to_check(refusal: Refusal) -> str:
    """What to check when deliveries are refused for ``refusal``: its hint, and the keys."""
    keys = KEYS_TO_CHECK.get(refusal)
    if keys is None:
        return refusal.hint + '; the listener reads the default shape, {"id", "topic", "data"}'
    return f"{refusal.hint}; in stores.toml: {', '.join(keys)}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"


def _failed_attempts(failures: int) -> str:
    return f"{failures} failed attempt{'s' * (failures > 1)}"


async def _until_written(
    attempt: Callable[[], Awaitable[T]],
    retry: type[DatabaseError],
    most: float,
    failed: Callable[[DatabaseError, int, float], None],
) -> tuple[T, int]:
    """``attempt()`` until the database takes it, and how many tries failed: after each
    ``retry`` error, ``failed(error, failures, delay)`` and a wait of ``delay`` seconds,
    ``DATABASE_RETRY_FIRST`` doubling up to ``most``."""
    failures = 0
    while True:
        try:
            return await attempt(), failures
        except retry as exc:
            failures += 1
            delay = min(DATABASE_RETRY_FIRST * 2.0 ** (failures - 1), most)
            failed(exc, failures, delay)
            await asyncio.sleep(delay)


class WebhookApplyError(Exception):
    """Applying an event failed; the message names the store, as the dead-letter table is
    shared by all stores."""


@attrs.define
class _Applied:
    applied: int = 0
    deletes: int = 0
    stale: int = 0
    ignored: int = 0


class ListenSync:
    """The sync database, one webhook receiver per store and the pulls that reconcile them::

        async with ListenSync(configs, sink, observe) as listening:
            urls = await listening.listen("0.0.0.0", 8080)   # store -> its webhook URL
            await listening.pull()                           # the initial sync
            ...
            await listening.pull()                           # a reconciliation pull

    or ``await listening.run(host, port, reconcile_every)`` until cancelled. It opens ``sink``
    (waiting, as often as it takes, while it is ``DatabaseUnavailable``: locked or its server
    down) and closes it on leaving, after it stops listening and lets the receivers finish what they
    accepted (or dead-letter it).
    """

    def __init__(
        self,
        configs: Sequence[StoreConfig],
        sink: Sink,
        observe: Observer,
        *,
        max_stores: int = DEFAULT_MAX_STORES,
        limits: ListenerLimits | None = None,
        user_agent: str | None = None,
    ) -> None:
        self.configs = list(configs)
        self.sink = sink
        self.observe = observe
        self.engine = SyncEngine(
            configs, sink, observe, max_stores=max_stores, user_agent=user_agent
        )
        self.limits = limits or ListenerLimits()
        missing = [config.store for config in configs if config.webhook is None]
        if missing:
            raise ConfigError(
                f"stores {', '.join(missing)} have no webhook config: load_config(listen=True) "
                "makes it, or give StoreConfig(webhook=WebhookConfig(...))"
            )
        # Said here too for configs not from load_config: a shared secret must be bound.
        self.webhooks = resolve_store_binding(
            {config.store: config.webhook for config in configs if config.webhook is not None}
        )
        self.receivers: dict[str, WebhookReceiver] = {}
        self._applied = {config.store: _Applied() for config in configs}
        self._told: dict[str, WebhookCounts] = {}
        self._exit = contextlib.AsyncExitStack()
        #: Dead letters to requeue once a pull succeeds: the database failed in between.
        self._requeue_after_pull = False

    async def __aenter__(self) -> ListenSync:
        # A service started while the database is locked or down waits for it, as it does
        # when that happens later; a database that is wrong in another way fails at once.
        retrying = self._retrying("opening the database")
        _, failures = await _until_written(
            self._open, DatabaseUnavailable, DATABASE_RETRY_MAX, retrying
        )
        if failures:
            after = _failed_attempts(failures)
            self.observe(Message(f"database {self.sink.where} opened after {after}"))
        return self

    def _retrying(self, what: str) -> Callable[[DatabaseError, int, float], None]:
        """What tells, for ``_until_written``, that ``what`` failed and when it is tried again."""

        def failed(error: DatabaseError, failures: int, delay: float) -> None:
            self.observe(Message(f"{what} failed: {error}; trying again in {_seconds(delay)}"))

        return failed

    async def _open(self) -> None:
        try:
            await self._exit.enter_async_context(self.sink)
            await self._exit.enter_async_context(self.engine)
            inbox, dead_letters = await self.sink.webhook_stores()
        except BaseException:
            await self._exit.aclose()
            raise
        for config in self.configs:
            self.receivers[config.store] = WebhookReceiver(
                self.webhooks[config.store],
                self._handler(config),
                store=config.store,
                inbox=inbox,
                dead_letters=dead_letters,
                on_refused=self._refused(config.store),
            )
        self._exit.push_async_callback(self._close_receivers)

    async def _close_receivers(self) -> None:
        await asyncio.gather(*(r.aclose() for r in self.receivers.values()))
        self._tell_counts()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def counts(self, store: str) -> WebhookCounts:
        """``store``'s webhook counters now."""
        applied = self._applied[store]
        receiver = self.receivers.get(store)
        stats = WebhookCounts(store) if receiver is None else WebhookCounts(store, receiver.stats)
        return attrs.evolve(stats, **attrs.asdict(applied))

    def _tell_counts(self) -> None:
        for store in self.receivers:
            counts = self.counts(store)
            if self._told.get(store) != counts:
                self._told[store] = counts
                self.observe(counts)

    async def _watch_counts(self) -> None:
        while True:
            self._tell_counts()
            await asyncio.sleep(COUNTS_EVERY)

    def _refused(self, store: str) -> Callable[[DeliveryRefused], None]:
        told: set[Refusal] = set()

        def tell(refused: DeliveryRefused) -> None:
            # The first of each reason; WebhookCounts count them all.
            refusal = refused.refusal
            if refusal not in told:
                told.add(refusal)
                check = what_to_check(refusal)
                event = WebhookRefused(store, refusal.value, refusal.status, refused.detail, check)
                self.observe(event)

        return tell

    def _handler(self, config: StoreConfig) -> Handler:
        store, sink = config.store, self.sink
        resources = frozenset(config.resources)
        counts = self._applied[store]
        waiting = False

        def wait(error: DatabaseError, failures: int, delay: float) -> None:
            nonlocal waiting
            if not waiting:
                waiting = True
                said = f"{error}; events wait until the database takes them"
                self.observe(Message(f"webhooks of store {store}: {said}"))

        async def wait_for_database(event: WebhookEvent) -> None:
            # A database that cannot be written now is no fault of the event: it waits (the
            # receiver's queue behind it) instead of spending its attempts and being
            # dead-lettered by an outage longer than them.
            nonlocal waiting
            await _until_written(lambda: apply(event), DatabaseUnavailable, APPLY_RETRY_MAX, wait)
            if waiting:
                waiting = False
                self.observe(Message(f"webhooks of store {store}: applied again"))

        async def apply(event: WebhookEvent) -> None:
            # The store is the one whose URL the delivery came through: signed with the store's
            # own secret, or, with a secret shared by several stores, carrying the store's
            # store_id in its signed body (the receiver has checked which).
            if event.resource not in resources:
                counts.ignored += 1  # also keeps unknown resources out of the SQL
                return
            try:
                if event.is_delete:
                    if event.record_id is None:
                        raise ValueError("a delete event without the record's id")
                    await sink.delete_record(store, event.resource, event.record_id)
                    counts.deletes += 1
                    counts.applied += 1
                elif event.record is None or event.record.get("id") is None:
                    raise ValueError("an event without a record with an id")
                elif await sink.upsert_record(store, event.resource, event.record):
                    counts.applied += 1
                else:
                    counts.stale += 1
            except DatabaseUnavailable:
                raise
            except Exception as exc:
                # Raising has the receiver retry, then dead-letter the event.
                raise WebhookApplyError(f"store {store}: {describe_error(exc)}") from exc

        return wait_for_database

    async def listen(self, host: str, port: int) -> dict[str, str]:
        """Serve every store's webhooks at ``/webhooks/<store>`` on ``host:port``, resume what
        the inbox kept and requeue dead letters; returns the URLs. A port that cannot be bound
        is a ConfigError."""
        app = web.Application()
        app.router.add_post(WEBHOOK_ROUTE, self._dispatch)
        listener = Listener(app, self.limits)
        try:
            _, bound_port = await listener.start(host, port)
        except OSError as exc:
            problem = f"{host}:{port}: cannot listen ({exc.strerror or exc})"
            raise ConfigError(problem, key="listen", sep=" ") from None
        self._exit.push_async_callback(listener.aclose)
        # Before the inbox resumes: a resumed event that fails again now waits for the next start.
        try:
            await self._requeue_dead_letters()
        except Exception as exc:  # the database failing since it opened: a pull's end does it
            self._requeue_after_pull = True
            self.observe(Message(f"dead letters not requeued yet: {describe_error(exc)}"))
        for receiver in self.receivers.values():
            await receiver.start()
        self._exit.callback(asyncio.create_task(self._watch_counts()).cancel)
        shown = f"[{host}]" if ":" in host else host
        return {
            store: f"http://{shown}:{bound_port}/webhooks/{quote(store, safe='')}"
            for store in self.receivers
        }

    async def _requeue_dead_letters(self) -> None:
        """Queue again the dead letters with fewer than ``REQUEUE_BELOW_ATTEMPTS`` attempts:
        those whose cause (a locked or unreachable database) may be gone."""
        for store, receiver in self.receivers.items():
            requeued = await receiver.requeue_dead_letters(max_attempts=REQUEUE_BELOW_ATTEMPTS)
            if requeued:
                self.observe(
                    Message(f"webhooks of store {store}: dead letters requeued: {requeued}")
                )

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        store = request.match_info["store"]
        receiver = self.receivers.get(store)
        if receiver is None:
            body = dumps({"status": "unknown store", "store": store})
            return web.Response(status=404, body=body, content_type="application/json")
        return await receiver.handle(request)

    async def pull(self) -> int:
        """One pull of every configured (store, resource): the initial sync the first time
        (resuming an interrupted one), incremental afterwards; returns how many units failed
        (each told to the observer). A DatabaseError is raised."""
        return await run_round(self.engine)

    async def join(self) -> None:
        """Wait until every webhook accepted so far is applied or dead-lettered."""
        await asyncio.gather(*(r.join() for r in self.receivers.values()))

    async def run(self, host: str, port: int, reconcile_every: float) -> None:
        """Listen, run the initial sync, then reconcile every ``reconcile_every`` seconds (from
        the start of the previous pull), until cancelled (Ctrl-C, SIGTERM). A pull the
        database fails is told and tried again after a backoff (see the module's notes)."""
        loop = asyncio.get_running_loop()
        # Listening before the initial sync: changes made while it runs arrive as webhooks
        # rather than being refused (the upsert rule keeps its older pages from winning).
        for store, url in (await self.listen(host, port)).items():
            self.observe(Message(f"webhooks of store {store}: POST {url}"))
        pulled, started = 0, 0.0

        async def pull() -> int:
            nonlocal started
            started = loop.time()
            return await self.pull()

        while True:
            what = "initial sync" if pulled == 0 else f"reconciliation {pulled}"
            before = self.engine.records  # what failed attempts committed counts too
            most = min(DATABASE_RETRY_MAX, reconcile_every)
            retrying = self._retrying(what)
            units_failed, failures = await _until_written(pull, DatabaseError, most, retrying)
            pulled += 1
            # Reconciliations keep their pace however long one takes (one longer than the
            # interval is followed at once by the next).
            delay = max(0.0, started + reconcile_every - loop.time())
            after = f" after {_failed_attempts(failures)}" if failures else ""
            units = f", {units_failed} failed (retried next time)" if units_failed else ""
            records = self.engine.records - before
            self.observe(
                Message(
                    f"{what} done{after}: {records:,} records pulled{units}; "
                    f"next reconciliation in {_seconds(delay)}"
                )
            )
            if failures or self._requeue_after_pull:
                self._requeue_after_pull = False
                try:
                    await self._requeue_dead_letters()
                except Exception as exc:  # the database failing again: the next start does it
                    self.observe(Message(f"dead letters not requeued: {describe_error(exc)}"))
            await asyncio.sleep(delay)

    async def aclose(self) -> None:
        """Stop listening (answering the deliveries in progress), let the receivers finish their
        queues into the still-open database (what is left stays in the inbox), close it."""
        await self._exit.aclose()
