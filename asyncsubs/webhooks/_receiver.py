"""``WebhookReceiver``: verify, dedupe, acknowledge, queue, and hand events to a handler."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Final

import attrs
import orjson
from aiohttp import web

from .. import _retry
from ..errors import ConfigError
from ._binding import check_store
from ._config import WebhookConfig
from ._dead_letters import (
    DeadLetter,
    DeadLetterStore,
    MemoryDeadLetters,
    remove_store_letters,
)
from ._events import DedupeWindow, EventParseError, WebhookEvent, parse_event
from ._inbox import Inbox, InboxEntry
from ._listener import BodyBudget, GuardedConnection, Listener, ListenerLimits, guarded
from ._refusals import DeliveryRefused, Refusal
from ._signing import verify_delivery

__all__ = ["Handler", "ReceiverStats", "WebhookReceiver"]

log = logging.getLogger("asyncsubs.webhooks")

#: An async function called once per accepted event; raising means "try again later".
Handler = Callable[[WebhookEvent], Awaitable[None]]
DEFAULT_PATH: Final = "/webhooks"
_READ_CHUNK: Final = 64 * 1024


@attrs.define
class ReceiverStats:
    """Counters since the receiver was made. ``received`` counts every request; each ends as
    exactly one of accepted, duplicates, unauthorized (bad signature or timestamp: 401; signed
    for another store: 403), bad_request, too_large, unavailable (queue or body budget full,
    inbox not writable, or closing), disconnected (the client went away mid-body) or errors
    (unexpected, answered 500). ``refusals`` splits unauthorized and bad_request by reason: a
    ``Refusal`` value (``"bad_signature"``, ``"wrong_store"``, ...) -> deliveries refused for
    it; ``refused`` is their sum (a body that could not be read, bad_request too, is not
    checked for a signature, so it has no such reason). ``resumed`` counts events queued from
    the inbox on start or requeued from the dead letters; ``unsaved`` dead letters kept only in
    memory because the dead-letter store failed (lost if the process ends). Accepted or
    resumed, and neither handled nor dead-lettered: still to do (kept in the inbox, if there is
    one)."""

    received: int = 0
    accepted: int = 0
    duplicates: int = 0
    unauthorized: int = 0
    bad_request: int = 0
    too_large: int = 0
    unavailable: int = 0
    disconnected: int = 0
    errors: int = 0
    handled: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0
    resumed: int = 0
    unsaved: int = 0
    refusals: dict[str, int] = attrs.field(factory=dict)

    @property
    def refused(self) -> int:
        """Deliveries refused as not genuine or not for this store (401, 403) or not events
        (400): the sum of ``refusals``."""
        return sum(self.refusals.values())

    @property
    def unfinished(self) -> int:
        """Accepted or resumed events neither handled nor dead-lettered (yet)."""
        return self.accepted + self.resumed - self.handled - self.dead_lettered


@attrs.frozen
class _Item:
    event: WebhookEvent
    body: bytes
    #: Handler attempts spent before this queueing (a requeued dead letter's).
    attempts: int = 0


class _Refused(Exception):
    """The body is not read: answered with ``response``."""

    def __init__(self, response: web.Response, reason: str) -> None:
        self.response = response
        self.reason = reason


_REFUSED_STATES: Final = {401: "unauthorized", 403: "wrong store", 400: "bad request"}


def _answer(
    status: int,
    state: str,
    headers: dict[str, str] | None = None,
    *,
    reason: str | None = None,
) -> web.Response:
    answer = {"status": state} if reason is None else {"status": state, "reason": reason}
    return web.Response(
        status=status,
        body=orjson.dumps(answer),
        content_type="application/json",
        headers=headers,
    )


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class WebhookReceiver:
    """Receives webhook deliveries and hands the events to ``handler``.

    ::

        receiver = WebhookReceiver(WebhookConfig(secret), handler, inbox=SQLiteInbox("hooks.db"))
        url = await receiver.listen("0.0.0.0", 8080)     # a server of its own in your loop, or
        web.run_app(receiver.app())                      # its own aiohttp application, or
        receiver.attach(app, "/hooks")                   # a route in yours

    Answers: 200 ``accepted`` (queued; with an ``inbox``, written to it first) or
    ``duplicate`` (seen in the dedupe window, or already in the inbox); 401 missing or bad
    signature, or a signed timestamp missing or out of tolerance; 403 signed for another store;
    400 body not an event (each refusal's body names its ``Refusal`` as ``reason``; each is
    counted in ``stats.refusals``, and the first of each reason logged as a WARNING saying
    what to check); 413 body above ``max_body_bytes``; 503 + Retry-After while the queue is
    full, the inbox cannot be written, or the receiver closes, so the sender retries. An event
    id enters the dedupe window only once its event is accepted, so a 503'd delivery is not
    mistaken for a duplicate when it comes again; a copy arriving while the original is
    written to the inbox waits for that write (200 ``duplicate`` once committed, 503 if it
    failed).

    ``store``: the store this receiver serves: its inbox entries, dead letters and log lines
    are that store's. Which deliveries are its own follows the config's binding: with
    ``store_id``, only those whose signed body carries it in ``store_key`` (a secret shared by
    several stores); with ``shared_secret=False``, all that are signed (a secret of its own);
    not said, those whose body names this ``store`` or no store at all.

    ``on_refused``: called with the ``DeliveryRefused`` (its ``refusal`` and ``detail``) of each
    delivery refused as 401, 403 or 400, once it is counted, in the task answering it: an event
    hook for what the WARNING says in a log, e.g. to show refusals in a program's own display.
    Keep it short (the answer waits for it); what it raises is logged, and the answer stays.

    ``inbox``: without one, an accepted event lives in memory until handled, and a crash loses
    it. With one (``SQLiteInbox``), a delivery is acknowledged only once written there; it is
    removed when handled or dead-lettered, and ``start()`` queues again whatever is left.

    Events are handled by ``config.workers`` tasks (1 by default: in arrival order). A handler
    that raises is retried up to ``max_handler_attempts`` times with backoff, then the event goes
    to ``dead_letters`` (default ``MemoryDeadLetters()``; ``SQLiteDeadLetters(path)`` to keep them).
    """

    def __init__(
        self,
        config: WebhookConfig,
        handler: Handler,
        *,
        store: str | None = None,
        inbox: Inbox | None = None,
        dead_letters: DeadLetterStore | None = None,
        clock: Callable[[], float] = time.time,
        on_refused: Callable[[DeliveryRefused], object] | None = None,
    ) -> None:
        if not isinstance(config, WebhookConfig):
            raise ConfigError(f"config must be a WebhookConfig, got {type(config).__name__}")
        if not callable(handler):
            raise ConfigError("handler must be an async function taking a WebhookEvent")
        if on_refused is not None and not callable(on_refused):
            raise ConfigError("on_refused must be a function taking a DeliveryRefused")
        if store is not None and (not isinstance(store, str) or not store):
            raise ConfigError(f"store must be a non-empty string or None, got {store!r}")
        if inbox is not None and not isinstance(inbox, Inbox):
            raise ConfigError("inbox must have async add(), pending() and remove()")
        self.config: Final = config
        self.store: Final = store
        self.inbox: Final = inbox
        self._handler = handler
        self.dead_letters: Final[DeadLetterStore] = (
            MemoryDeadLetters() if dead_letters is None else dead_letters
        )
        # Used only when the configured store fails and there is no inbox to keep the event.
        self.unsaved_dead_letters: Final = MemoryDeadLetters()
        self._clock = clock
        self._on_refused = on_refused
        self._seen = DedupeWindow(config.dedupe_window, config.dedupe_max_entries)
        # Unbounded: accepting checks ``queue_size``, and events resumed from the inbox on
        # start must all fit.
        self._queue: asyncio.Queue[_Item] = asyncio.Queue()
        self._adding = 0  # deliveries being written to the inbox
        self._inbox_failures = 0  # inbox writes failed since the last that succeeded
        self._busy_refusals = 0  # deliveries answered 503 since one was last accepted
        self._refused_unread: set[int] = set()  # statuses of bodies refused unread so far
        # Event id -> whether it was kept, for deliveries being written to the inbox: a copy
        # arriving meanwhile waits for it rather than being acknowledged before it is kept.
        self._keeping: dict[str, asyncio.Future[bool]] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._accepting = True
        self._resumed = False
        self._resume_lock = asyncio.Lock()
        self._listener: Listener | None = None
        self._url: str | None = None
        self._stats = ReceiverStats()
        self._for = "" if store is None else f" for store {store}"

    def __repr__(self) -> str:
        where = self._url or "not listening"
        return f"<WebhookReceiver {where} pending={self._queue.qsize()}>"

    # --- state --------------------------------------------------------------------------------

    @property
    def stats(self) -> ReceiverStats:
        """A snapshot of the counters."""
        return attrs.evolve(self._stats, refusals=dict(self._stats.refusals))

    @property
    def pending(self) -> int:
        """Accepted events not yet taken by a worker."""
        return self._queue.qsize()

    @property
    def url(self) -> str | None:
        """Where ``listen`` serves, e.g. ``http://127.0.0.1:8080/webhooks``."""
        return self._url

    @property
    def _key(self) -> str:
        return self.store or ""

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the workers and queue what the inbox holds from before (``handle`` also does
        this on the first delivery)."""
        self._accepting = True
        self._ensure_workers()
        if self.inbox is None or self._resumed:
            return
        async with self._resume_lock:
            if self._resumed:
                return
            entries = await self.inbox.pending(self._key)
            self._resumed = True
        for entry in entries:
            self._seen.add(entry.event_id)
            self._stats.resumed += 1
            try:
                event = parse_event(
                    self.config, entry.body, received_at=entry.received_at, event_id=entry.event_id
                )
            except EventParseError as exc:
                # Accepted under another configuration: kept as a dead letter, not dropped.
                letter = self._letter(entry.event_id, None, entry.body, str(exc), entry.attempts)
                await self._keep_dead(letter)
                continue
            self._ensure_workers()
            self._queue.put_nowait(_Item(event, entry.body, entry.attempts))
        if entries:
            log.info(
                "webhooks%s: %d accepted events resumed from the inbox", self._for, len(entries)
            )

    def _ensure_workers(self) -> None:
        self._workers = [w for w in self._workers if not w.done()]
        while len(self._workers) < self.config.workers:
            self._workers.append(asyncio.create_task(self._work(), name="asyncsubs-webhooks"))

    async def join(self) -> None:
        """Wait until every accepted event has been handled or dead-lettered."""
        if self._queue.qsize():
            self._ensure_workers()
        await self._queue.join()

    async def aclose(self, timeout: float = 30.0) -> None:
        """Stop accepting (503), stop listening, let the workers finish the queue for up to
        ``timeout`` seconds, then stop them. Events still unhandled stay in the inbox for the
        next start, or without one go to the dead letters. Safe to call twice."""
        self._accepting = False
        listener, self._listener = self._listener, None
        if listener is not None:
            # Waits for deliveries being received right now to be answered.
            await listener.aclose()
        if self._queue.qsize():
            self._ensure_workers()
        if self._workers:
            try:
                await asyncio.wait_for(self._queue.join(), timeout)
            except TimeoutError:
                where = "kept in the inbox" if self.inbox is not None else "dead-lettering"
                log.warning(
                    "webhooks%s: queue not drained in %.1fs; %s the rest",
                    self._for,
                    timeout,
                    where,
                )
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        while not self._queue.empty():
            item = self._queue.get_nowait()
            self._queue.task_done()
            if self.inbox is None:
                await self._dead(item, "receiver closed before the event was handled", 0)
        # A later start() takes up what the inbox still holds.
        self._resumed = False

    async def __aenter__(self) -> WebhookReceiver:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- serving ------------------------------------------------------------------------------

    def _route_app(self, path: str) -> web.Application:
        app = web.Application()
        app.router.add_post(path, self.handle)
        return app

    def attach(self, app: web.Application, path: str = DEFAULT_PATH) -> None:
        """Serve deliveries at ``POST path`` of ``app``; the workers start and stop with it."""
        app.router.add_post(path, self.handle)

        async def on_startup(_: web.Application) -> None:
            await self.start()

        async def on_cleanup(_: web.Application) -> None:
            await self.aclose()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)

    def app(self, path: str = DEFAULT_PATH) -> web.Application:
        """An application serving deliveries at ``POST path`` (for ``web.run_app`` and the
        like); the workers start and stop with it."""
        app = web.Application()
        self.attach(app, path)
        return app

    async def listen(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        path: str = DEFAULT_PATH,
        limits: ListenerLimits | None = None,
    ) -> str:
        """Serve on ``host:port`` (0: a free port) in the running loop, under ``limits``
        (timeouts and caps for an open port); returns the URL to give the sender. ``aclose()``
        stops it."""
        if self._listener is not None:
            raise RuntimeError(f"already listening on {self._url}")
        await self.start()
        listener = Listener(self._route_app(path), limits or ListenerLimits())
        bound_host, bound_port = await listener.start(host, port)
        self._listener = listener
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self._url = f"http://{shown}:{bound_port}{path}"
        return self._url

    # --- receiving ----------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        """The route handler: ``app.router.add_post("/webhooks", receiver.handle)``.

        Never raises: anything unexpected is logged and answered 500 (the sender retries)."""
        self._stats.received += 1
        connection = guarded(request)
        try:
            return await self._receive(request, connection)
        except ConnectionResetError:
            # The client went away (or was cut off by the read timeout): nothing to answer,
            # and not worth more than a debug line (a flood of them must not flood the log).
            self._stats.disconnected += 1
            log.debug("webhook delivery%s: client disconnected mid-body", self._for)
            return _answer(400, "disconnected")
        except Exception:
            self._stats.errors += 1
            log.exception("webhook delivery%s failed unexpectedly", self._for)
            return _answer(500, "error")
        finally:
            if connection is not None:
                connection.answered()

    async def _read(self, request: web.Request, budget: BodyBudget | None) -> bytes:
        limit = self.config.max_body_bytes
        too_large = _Refused(_answer(413, "too large"), f"body above {limit} bytes")
        length = request.content_length
        if length is not None and length > limit:
            raise too_large
        # Streamed with a running total: chunked bodies announce no length.
        body = bytearray()
        try:
            async for chunk in request.content.iter_chunked(_READ_CHUNK):
                if budget is not None and not budget.take(len(chunk)):
                    raise _Refused(self._busy("busy"), "bodies being read fill the listener")
                body += chunk
                if len(body) > limit:
                    raise too_large
        except web.RequestPayloadError as exc:  # e.g. a Content-Encoding it does not decode
            # The rest of the request cannot be found in the stream: the connection ends here.
            closing = {"Connection": "close"}
            unreadable = _answer(400, "bad request", closing, reason="unreadable_body")
            raise _Refused(unreadable, f"body cannot be read ({_describe(exc)})") from None
        finally:
            if budget is not None:
                budget.give(len(body))
        return bytes(body)

    def _refuse(self, refused: DeliveryRefused) -> web.Response:
        """Count the refusal; the first of its reason is a WARNING saying what to check, the
        next ones DEBUG lines (a sender retrying a thousand deliveries must not flood the log,
        and the counters say how many)."""
        refusal = refused.refusal
        status = refusal.status
        if status == 400:
            self._stats.bad_request += 1
        else:
            self._stats.unauthorized += 1
        counts = self._stats.refusals
        first = refusal.value not in counts
        counts[refusal.value] = counts.get(refusal.value, 0) + 1
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "webhook delivery%s refused: %s [%s, HTTP %d]. Check %s.%s",
            self._for,
            refused.detail,
            refusal.value,
            status,
            refusal.hint,
            f" Further {refusal.value} refusals are counted in stats.refusals and logged at DEBUG."
            if first
            else "",
            extra={"webhook_store": self.store, "webhook_refusal": refusal.value},
        )
        if self._on_refused is not None:
            try:
                self._on_refused(refused)
            except Exception:
                log.exception("webhooks%s: on_refused raised", self._for)
        return _answer(status, _REFUSED_STATES[status], reason=refusal.value)

    def _busy(self, state: str) -> web.Response:
        return _answer(503, state, {"Retry-After": str(self.config.retry_after)})

    def _unavailable(self, why: str) -> web.Response:
        """A 503 for a full queue or body budget: a WARNING for the first of a burst, DEBUG
        lines until a delivery is accepted again (a burst of a thousand must not flood the
        log; the sender retries each)."""
        self._stats.unavailable += 1
        self._busy_refusals += 1
        first = self._busy_refusals == 1
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "webhook delivery%s answered 503: %s%s",
            self._for,
            why,
            " (until one is accepted again, further ones are logged at DEBUG)" if first else "",
        )
        return self._busy("busy")

    def _duplicate(self, event: WebhookEvent) -> web.Response:
        self._stats.duplicates += 1
        log.debug("duplicate webhook event %s%s ignored", event.id, self._for)
        return _answer(200, "duplicate")

    async def _receive(
        self, request: web.Request, connection: GuardedConnection | None
    ) -> web.Response:
        config = self.config
        if not self._accepting:
            self._stats.unavailable += 1
            return self._busy("closing")
        if not self._resumed and self.inbox is not None:
            await self.start()
        self._ensure_workers()
        try:
            body = await self._read(request, None if connection is None else connection.budget)
        except _Refused as refused:
            status = refused.response.status
            if status == 503:
                return self._unavailable(refused.reason)
            if status == 413:
                self._stats.too_large += 1
            else:
                self._stats.bad_request += 1
            # Anyone who reaches the port can send these, a thousand times: the first of each
            # status is a WARNING, the next ones are counted (stats) and logged at DEBUG.
            first = status not in self._refused_unread
            self._refused_unread.add(status)
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "webhook delivery%s refused: %s%s",
                self._for,
                refused.reason,
                " (further ones are counted, and logged at DEBUG)" if first else "",
            )
            return refused.response
        if connection is not None:
            connection.request_read()  # read in full: no deadline while it is answered

        try:
            signed_id = verify_delivery(config, request.headers, body, self._clock())
            try:
                event = parse_event(config, body, received_at=self._clock(), event_id=signed_id)
            except EventParseError as exc:
                raise DeliveryRefused(Refusal.NOT_AN_EVENT, str(exc)) from None
            check_store(config, self.store, event.store)
        except DeliveryRefused as refused:
            return self._refuse(refused)
        return await self._accept(event, body)

    async def _accept(self, event: WebhookEvent, body: bytes) -> web.Response:
        if not self._accepting:
            # aclose() began while the body was arriving: its workers may be gone already, so
            # a queued event would be neither handled nor dead-lettered. The sender retries.
            self._stats.unavailable += 1
            return self._busy("closing")
        keeping = self._keeping.get(event.id)
        if keeping is not None:
            # A copy of an event still being written to the inbox: a duplicate only once the
            # original is kept (if that fails, both get 503 and the sender keeps the event).
            if not await asyncio.shield(keeping):
                self._stats.unavailable += 1
                return self._busy("busy")
            return self._duplicate(event)
        # No await between the dedupe check and remembering the id: concurrent copies of one
        # delivery cannot both get in.
        if event.id in self._seen:
            return self._duplicate(event)
        if self._queue.qsize() + self._adding >= self.config.queue_size:
            return self._unavailable(f"the queue is full ({self.config.queue_size} events)")
        if self._busy_refusals:
            log.warning(
                "webhooks%s: accepting again, after %d deliveries answered 503",
                self._for,
                self._busy_refusals,
            )
            self._busy_refusals = 0
        self._seen.add(event.id)
        if self.inbox is not None:
            entry = InboxEntry(self._key, event.id, body, event.received_at)
            kept: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._keeping[event.id] = kept
            self._adding += 1
            try:
                added = await self.inbox.add(entry)
            except Exception as exc:
                self._seen.discard(event.id)
                self._stats.unavailable += 1
                # An ERROR for the first failure, DEBUG for the next until the inbox takes one
                # again: a sender retrying through a database's outage must not flood the log.
                self._inbox_failures += 1
                log.log(
                    logging.ERROR if self._inbox_failures == 1 else logging.DEBUG,
                    "webhook event %s%s not written to the inbox (%s); answering 503%s",
                    event.id,
                    self._for,
                    _describe(exc),
                    " until it can be written (further failures are logged at DEBUG)"
                    if self._inbox_failures == 1
                    else "",
                )
                return self._busy("busy")
            except BaseException:
                self._seen.discard(event.id)
                raise
            else:
                kept.set_result(True)
                if self._inbox_failures:
                    log.warning(
                        "webhooks%s: the inbox is written again, after %d deliveries answered 503",
                        self._for,
                        self._inbox_failures,
                    )
                    self._inbox_failures = 0
            finally:
                self._adding -= 1
                del self._keeping[event.id]
                if not kept.done():  # not written: copies waiting on it get 503 too
                    kept.set_result(False)
            if not added:  # kept from before a restart, and queued from there
                return self._duplicate(event)
            if not self._accepting:
                # aclose() began during the write: kept in the inbox for the next start(), which
                # queues it (the sender's retry is then a duplicate); not queued here, where the
                # workers may be gone.
                self._stats.unavailable += 1
                return self._busy("closing")
        self._queue.put_nowait(_Item(event, body))
        self._stats.accepted += 1
        return _answer(200, "accepted")

    # --- handling -----------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            try:
                await self._deliver(item)
            finally:
                self._queue.task_done()

    async def _deliver(self, item: _Item) -> None:
        config = self.config
        event = item.event
        attempts = 0
        try:
            while True:
                attempts += 1
                try:
                    await self._handler(event)
                except Exception as exc:
                    self._stats.failed_attempts += 1
                    if attempts >= config.max_handler_attempts:
                        log.error(
                            "webhook event %s (%s)%s failed %d times; dead-lettered: %s",
                            event.id,
                            event.topic,
                            self._for,
                            attempts,
                            _describe(exc),
                            exc_info=exc,
                        )
                        await self._dead(item, _describe(exc), attempts)
                        return
                    delay = config.backoff(attempts) if _retry.waiting_enabled() else 0.0
                    log.warning(
                        "webhook event %s (%s)%s: handler attempt %d/%d failed (%s); "
                        "retrying in %.2fs",
                        event.id,
                        event.topic,
                        self._for,
                        attempts,
                        config.max_handler_attempts,
                        _describe(exc),
                        delay,
                        exc_info=exc,
                    )
                    await asyncio.sleep(delay)
                else:
                    self._stats.handled += 1
                    await self._forget(event.id)
                    return
        except asyncio.CancelledError:
            if self.inbox is None:
                await self._dead(
                    item, "receiver closed while the event was being handled", attempts
                )
            raise

    async def _forget(self, event_id: str) -> None:
        """Remove a handled (or dead-lettered) event from the inbox."""
        if self.inbox is None:
            return
        try:
            await self.inbox.remove(self._key, event_id)
        except Exception as exc:
            # It stays there and is handled again at the next start: handlers are idempotent.
            log.error(
                "webhook event %s%s: could not remove it from the inbox (%s)",
                event_id,
                self._for,
                _describe(exc),
            )

    def _letter(
        self, event_id: str, topic: str | None, body: bytes, error: str, attempts: int
    ) -> DeadLetter:
        return DeadLetter(
            event_id=event_id,
            topic=topic,
            body=body,
            error=error,
            attempts=attempts,
            failed_at=self._clock(),
            store=self.store,
        )

    async def _dead(self, item: _Item, error: str, attempts: int) -> None:
        event = item.event
        letter = self._letter(event.id, event.topic, item.body, error, item.attempts + attempts)
        await self._keep_dead(letter)

    async def _keep_dead(self, letter: DeadLetter) -> None:
        """Store a dead letter, then take its event out of the inbox."""
        try:
            await self.dead_letters.add(letter)
        except Exception:
            if self.inbox is not None:
                log.exception(
                    "could not store dead letter for event %s%s; it stays in the inbox and is "
                    "handled again at the next start",
                    letter.event_id,
                    self._for,
                )
                return
            log.exception(
                "could not store dead letter for event %s%s; kept in unsaved_dead_letters "
                "(in memory only)",
                letter.event_id,
                self._for,
            )
            self._stats.unsaved += 1
            await self.unsaved_dead_letters.add(letter)
        self._stats.dead_lettered += 1
        await self._forget(letter.event_id)

    async def requeue_dead_letters(self, *, max_attempts: int | None = None) -> int:
        """Queue this receiver's dead letters (those of its ``store``) again, after fixing what
        made the handler fail; returns how many. With ``max_attempts``, only letters that have
        had fewer handler attempts in all. Each leaves the dead-letter store as it is queued
        (into the inbox first, when there is one); if it fails again, it returns there with
        its attempts added up. Before :meth:`start`, a receiver with an inbox leaves them to it:
        ``start`` queues them with what else the inbox holds."""
        count = 0
        for letter in await self.dead_letters.all():
            if letter.store != self.store:
                continue
            if max_attempts is not None and letter.attempts >= max_attempts:
                continue
            try:
                event = parse_event(
                    self.config, letter.body, received_at=self._clock(), event_id=letter.event_id
                )
            except EventParseError:
                log.error("dead letter %s cannot be parsed; left in place", letter.event_id)
                continue
            queue = True
            if self.inbox is not None:
                entry = InboxEntry(
                    self._key, event.id, letter.body, event.received_at, letter.attempts
                )
                queue = await self.inbox.add(entry)  # False: already pending
            # Only this store's: other stores' letters may share the event id.
            await remove_store_letters(self.dead_letters, self.store, letter.event_id)
            count += queue
            if queue and (self.inbox is None or self._resumed):
                self._ensure_workers()
                self._queue.put_nowait(_Item(event, letter.body, letter.attempts))
                self._stats.resumed += 1
        return count
