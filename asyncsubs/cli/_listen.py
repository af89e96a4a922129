"""``sync --listen``: webhooks applied to the sync database, reconciled by incremental pulls.

One aiohttp application serves ``POST /webhooks/<store>`` for every configured store, each with
its own ``WebhookReceiver`` (its own secret, dedupe window, queue and worker) bound to its store,
behind one listener's timeouts and caps. A delivery is answered 200 only once it is in the
database's ``webhook_inbox``; it is removed when applied or dead-lettered, and a restart applies
what is left, so nothing acknowledged is lost to a crash. Dead letters of earlier runs are
requeued on start while they have had fewer than ``REQUEUE_BELOW_ATTEMPTS`` handler attempts.

Events are written on the SyncDB's one writer thread, the same as pulls, so the two never
interleave inside a transaction; the upsert's newer-or-equal rule and the deleted-ids table make
their order irrelevant.

Webhooks can be lost, so after the initial sync every ``reconcile_every`` seconds an incremental
pull of every (store, resource) fetches what changed since before the previous pull began, and
so whatever the webhooks missed. It cannot see deletes: a delete whose webhook was lost leaves
its row in place.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Final
from urllib.parse import quote

import orjson
from aiohttp import web

from ..errors import ConfigError
from ..limiting import Limiter
from ..webhooks import (
    DeadLetter,
    DeadLetterStore,
    Handler,
    Inbox,
    InboxEntry,
    Listener,
    ListenerLimits,
    ReceiverStats,
    SQLiteDeadLetters,
    SQLiteInbox,
    WebhookConfig,
    WebhookEvent,
    WebhookReceiver,
)
from ._config_file import PostgresURL, StoreConfig, parse_db_url
from ._progress import Tracker, print_table
from ._sync import (
    DEFAULT_LEASE,
    DEFAULT_MAX_STORES,
    Sink,
    SyncDB,
    describe_error,
    redis_limiters,
    sync_pass,
)
from ._workers import run_workers

if TYPE_CHECKING:
    from ._postgres import PostgresSink

__all__ = [
    "DEFAULT_RECONCILE_EVERY",
    "ListenSync",
    "WebhookApplyError",
    "add_dead_letters_parser",
    "dead_letters",
    "parse_listen",
    "run_listen",
]

DEFAULT_RECONCILE_EVERY: Final = 300.0
WEBHOOK_ROUTE: Final = "/webhooks/{store}"
#: Dead letters are requeued on start until they have had this many handler attempts in all
#: (three rounds of ``max_handler_attempts``): a cause fixed in between (a locked or full
#: disk) is recovered by a restart, a poison event is not retried for ever.
REQUEUE_BELOW_ATTEMPTS: Final = 3 * WebhookConfig("-").max_handler_attempts


class WebhookApplyError(Exception):
    """Applying an event failed; the message names the store, as the dead-letter table is
    shared by all stores."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6; port 0: any free port) -> (host, port)."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"--listen takes HOST:PORT (e.g. 0.0.0.0:8080), got {text!r}")
    return host, int(port_text)


def _stats_of(receiver: WebhookReceiver) -> Callable[[], ReceiverStats]:
    return lambda: receiver.stats


def _not_found(store: str) -> web.Response:
    body = orjson.dumps({"status": "unknown store", "store": store})
    return web.Response(status=404, body=body, content_type="application/json")


class ListenSync:
    """The sync database, one webhook receiver per store and the pulls that reconcile them.

    ::

        async with ListenSync(configs, db_path, tracker) as engine:
            urls = await engine.listen("0.0.0.0", 8080)   # store -> its webhook URL
            await engine.pull()                           # the initial sync
            ...
            await engine.pull()                           # a reconciliation pull

    ``aclose()`` (on leaving the block) stops listening, lets the receivers finish what they
    accepted (or dead-letter it), then closes the database.
    """

    def __init__(
        self,
        configs: Sequence[StoreConfig],
        db_path: Path | PostgresURL,
        tracker: Tracker,
        *,
        max_stores: int = DEFAULT_MAX_STORES,
        limits: ListenerLimits | None = None,
        lease: float = DEFAULT_LEASE,
        limiters: Mapping[str, Limiter] | None = None,
    ) -> None:
        self.configs = list(configs)
        self.db_path = db_path
        self.tracker = tracker
        self.max_stores = max_stores
        self.limiters = limiters
        self.db: Sink
        self.inbox: Inbox
        self.dead_letters: DeadLetterStore
        self._postgres: PostgresSink | None = None
        if isinstance(db_path, PostgresURL):
            from ._postgres import PostgresDeadLetters, PostgresInbox, PostgresSink

            # One pool: an inbox write takes its own connection, never waiting for a page.
            self.db = self._postgres = PostgresSink(db_path.url, lease=lease)
            self.inbox = PostgresInbox(self._postgres)
            self.dead_letters = PostgresDeadLetters(self._postgres)
        else:
            self.db = SyncDB(db_path)
            # Their own connections: acknowledging a delivery must not wait for a page's
            # transaction on the writer thread. One table each for all stores, keyed by store.
            self.inbox = SQLiteInbox(db_path)
            self.dead_letters = SQLiteDeadLetters(db_path)
        self.limits = limits
        self.receivers: dict[str, WebhookReceiver] = {}
        #: Store -> the URL its webhooks are served at, once listening.
        self.urls: dict[str, str] = {}
        #: Pulls of every store done so far (the initial sync is the first).
        self.passes = 0
        self._listener: Listener | None = None

    async def __aenter__(self) -> ListenSync:
        try:
            await self.open()
        except BaseException:
            await self.aclose()  # the database's worker thread, if it was started
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        for config in self.configs:
            for resource in config.resources:
                self.tracker.add(config.store, resource)
        await self.db.open()
        # Both tables exist from the start, so monitoring queries work before the first event
        # (the PostgreSQL sink creates them with its own).
        if isinstance(self.inbox, SQLiteInbox):
            await self.inbox.open()
        if isinstance(self.dead_letters, SQLiteDeadLetters):
            await self.dead_letters.open()
        for config in self.configs:
            receiver = WebhookReceiver(
                WebhookConfig(config.webhook_secret),
                self._handler(config),
                store=config.store,
                inbox=self.inbox,
                dead_letters=self.dead_letters,
            )
            self.receivers[config.store] = receiver
            self.tracker.webhook(config.store).receiver_stats = _stats_of(receiver)

    def _handler(self, config: StoreConfig) -> Handler:
        store = config.store
        resources = frozenset(config.resources)
        hook = self.tracker.webhook(store)
        db = self.db

        async def apply(event: WebhookEvent) -> None:
            # The store is the one whose URL (and secret) the delivery came through; the
            # receiver has checked that the signed body names the same store.
            if event.resource not in resources:
                hook.ignored += 1  # also keeps unknown resources out of the SQL
                return
            try:
                if event.is_delete:
                    if event.record_id is None:
                        raise ValueError("a delete event without the record's id")
                    await db.delete_record(store, event.resource, event.record_id)
                    hook.deletes += 1
                    hook.applied += 1
                elif event.record is None or event.record.get("id") is None:
                    raise ValueError("an event without a record with an id")
                elif await db.upsert_record(store, event.resource, event.record):
                    hook.applied += 1
                else:
                    hook.stale += 1
            except Exception as exc:
                # Raising has the receiver retry, then dead-letter the event.
                raise WebhookApplyError(f"store {store}: {describe_error(exc)}") from exc

        return apply

    async def listen(self, host: str, port: int) -> dict[str, str]:
        """Serve every store's webhooks at ``/webhooks/<store>`` on ``host:port``, resume what
        the inbox kept and requeue dead letters; returns the URLs. A port that cannot be bound
        is a ConfigError."""
        app = web.Application()
        app.router.add_post(WEBHOOK_ROUTE, self._dispatch)
        listener = Listener(app, self.limits or ListenerLimits())
        try:
            _, bound_port = await listener.start(host, port)
        except OSError as exc:
            raise ConfigError(
                f"--listen {host}:{port}: cannot listen ({exc.strerror or exc})"
            ) from None
        self._listener = listener
        for store, receiver in self.receivers.items():
            await receiver.start()
            requeued = await receiver.requeue_dead_letters(max_attempts=REQUEUE_BELOW_ATTEMPTS)
            if requeued:
                self.tracker.message(f"webhooks of store {store}: {requeued} dead letters requeued")
        shown = f"[{host}]" if ":" in host else host
        for store in self.receivers:
            url = f"http://{shown}:{bound_port}/webhooks/{quote(store, safe='')}"
            self.urls[store] = self.tracker.webhook(store).url = url
        return dict(self.urls)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        store = request.match_info["store"]
        receiver = self.receivers.get(store)
        if receiver is None:
            return _not_found(store)
        return await receiver.handle(request)

    async def pull(self) -> None:
        """One pull of every configured (store, resource): the initial sync the first time
        (resuming an interrupted one), incremental afterwards. Failures of a store are
        recorded in the tracker; a DatabaseError is raised."""
        if self.passes:
            for row in self.tracker.rows.values():
                self.tracker.reset(row)
        self.passes += 1
        self.tracker.runs += 1
        if self._postgres is not None:
            # With other workers: each pull is a round they share (see _workers).
            await run_workers(
                self.configs,
                self._postgres,
                self.tracker,
                max_stores=self.max_stores,
                limiters=self.limiters,
            )
            return
        await sync_pass(
            self.configs, self.db, self.tracker, max_stores=self.max_stores, limiters=self.limiters
        )

    async def join(self) -> None:
        """Wait until every webhook accepted so far is applied or dead-lettered."""
        await asyncio.gather(*(r.join() for r in self.receivers.values()))

    async def aclose(self) -> None:
        listener, self._listener = self._listener, None
        try:
            if listener is not None:
                # Answers the deliveries in progress, then refuses connections.
                await listener.aclose()
        finally:
            try:
                # Each finishes its queue into the still-open database; what is left stays in
                # the inbox for the next start.
                await asyncio.gather(*(r.aclose() for r in self.receivers.values()))
            finally:
                try:
                    if isinstance(self.inbox, SQLiteInbox):
                        await self.inbox.aclose()
                    if isinstance(self.dead_letters, SQLiteDeadLetters):
                        await self.dead_letters.aclose()
                finally:
                    await self.db.aclose()


async def run_listen(
    configs: Sequence[StoreConfig],
    db_path: Path | PostgresURL,
    tracker: Tracker,
    *,
    host: str,
    port: int,
    reconcile_every: float = DEFAULT_RECONCILE_EVERY,
    max_stores: int = DEFAULT_MAX_STORES,
    lease: float = DEFAULT_LEASE,
) -> None:
    """Listen for webhooks, run the initial sync, then reconcile every ``reconcile_every``
    seconds, until cancelled (Ctrl-C, SIGTERM); cleanup commits what was done."""
    async with redis_limiters(configs) as limiters:
        await _listen_until_cancelled(
            configs,
            db_path,
            tracker,
            host=host,
            port=port,
            reconcile_every=reconcile_every,
            max_stores=max_stores,
            lease=lease,
            limiters=limiters,
        )


async def _listen_until_cancelled(
    configs: Sequence[StoreConfig],
    db_path: Path | PostgresURL,
    tracker: Tracker,
    *,
    host: str,
    port: int,
    reconcile_every: float,
    max_stores: int,
    lease: float,
    limiters: Mapping[str, Limiter],
) -> None:
    loop = asyncio.get_running_loop()
    async with ListenSync(
        configs, db_path, tracker, max_stores=max_stores, lease=lease, limiters=limiters
    ) as engine:
        # Listening before the initial sync: changes made while it runs arrive as webhooks
        # rather than being refused (the upsert rule keeps its older pages from winning).
        urls = await engine.listen(host, port)
        for store, url in urls.items():
            tracker.message(f"webhooks of store {store}: POST {url}")
        while True:
            started = loop.time()
            before = tracker.pulled
            await engine.pull()
            what = "initial sync" if engine.passes == 1 else f"reconciliation {engine.passes - 1}"
            failed = len(tracker.failed)
            # Measured from the start of the pull: reconciliations keep their pace however long
            # one takes (one longer than the interval is followed at once by the next).
            delay = max(0.0, started + reconcile_every - loop.time())
            tracker.message(
                f"{what} done: {tracker.pulled - before:,} records pulled"
                + (f", {failed} failed (retried next time)" if failed else "")
                + f"; next reconciliation in {delay:.0f}s"
            )
            await asyncio.sleep(delay)


# ---------------------------------------------------------------------------------------------
# asyncsubs dead-letters


def add_dead_letters_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "dead-letters",
        help="list (or requeue) the webhook events sync --listen could not apply",
        description=(
            "List the dead letters of a sync database: webhook events that sync --listen "
            "accepted but could not apply. sync --listen requeues them itself on start while "
            f"they have had fewer than {REQUEUE_BELOW_ATTEMPTS} attempts; --requeue moves them "
            "(all, or those of --store) back to the inbox, whatever their attempts, for the "
            "next start of sync --listen to apply (restart a running one)."
        ),
    )
    parser.add_argument(
        "--db", required=True, metavar="URL", help="sqlite:///path.db or postgresql://..."
    )
    parser.add_argument(
        "--store", action="append", metavar="ID", help="only this store's (repeatable)"
    )
    parser.add_argument("--requeue", action="store_true", help="move them back to the inbox")
    parser.set_defaults(handler=cmd_dead_letters, debug=False)


async def dead_letters(
    db: Path | PostgresURL, *, stores: Sequence[str] | None = None, requeue: bool = False
) -> tuple[list[DeadLetter], int]:
    """The dead letters (of ``stores``, or all), and how many were moved back to the inbox
    with ``requeue`` (letters without a store, from before they named one, stay)."""
    if isinstance(db, PostgresURL):
        from ._postgres import PostgresDeadLetters, PostgresInbox, PostgresSink

        sink = PostgresSink(db.url)
        await sink.open()
        try:
            return await _dead_letters(
                PostgresDeadLetters(sink), PostgresInbox(sink), stores, requeue
            )
        finally:
            await sink.aclose()
    dead = SQLiteDeadLetters(db)
    inbox = SQLiteInbox(db)
    try:
        return await _dead_letters(dead, inbox, stores, requeue)
    finally:
        await inbox.aclose()
        await dead.aclose()


async def _dead_letters(
    dead: DeadLetterStore, inbox: Inbox, stores: Sequence[str] | None, requeue: bool
) -> tuple[list[DeadLetter], int]:
    from ..webhooks._dead_letters import remove_store_letters

    letters = [x for x in await dead.all() if stores is None or x.store in stores]
    moved = 0
    if requeue:
        for letter in letters:
            if letter.store is None:
                continue
            # Attempts start over: requeueing by hand says the cause is fixed.
            await inbox.add(InboxEntry(letter.store, letter.event_id, letter.body, time.time()))
            # Only this store's: other stores' letters may share the event id.
            await remove_store_letters(dead, letter.store, letter.event_id)
            moved += 1
    return letters, moved


def cmd_dead_letters(args: argparse.Namespace, *, stream: IO[str] | None = None) -> int:
    stream = stream or sys.stdout
    db_path = parse_db_url(args.db)
    if isinstance(db_path, Path) and not db_path.is_file():
        raise ConfigError(f"--db: {db_path} does not exist")
    letters, moved = asyncio.run(dead_letters(db_path, stores=args.store, requeue=args.requeue))
    rows = [
        [
            letter.store or "",
            letter.event_id,
            letter.topic or "",
            str(letter.attempts),
            datetime.fromtimestamp(letter.failed_at, UTC).strftime("%Y-%m-%d %H:%M:%S"),
            letter.error,
        ]
        for letter in letters
    ]
    where = db_path if isinstance(db_path, Path) else db_path.where
    footer = [f"{len(letters)} dead letters in {where} (table webhook_dead_letters)"]
    if args.requeue:
        footer.append(
            f"{moved} moved to webhook_inbox: sync --listen applies them when it next starts"
        )
    print_table(
        "webhook dead letters",
        ["store", "event", "topic", "attempts", "failed at (UTC)", "error"],
        rows,
        stream=stream,
        footer=footer,
    )
    return 0
