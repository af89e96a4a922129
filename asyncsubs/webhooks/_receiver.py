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
from ._config import WebhookConfig, signed_bytes, timestamp_within, verify
from ._dead_letters import DeadLetter, DeadLetterStore, MemoryDeadLetters
from ._events import DedupeWindow, EventParseError, WebhookEvent, parse_event

__all__ = ["Handler", "ReceiverStats", "WebhookReceiver"]

log = logging.getLogger("asyncsubs.webhooks")

#: An async function called once per accepted event; raising means "try again later".
Handler = Callable[[WebhookEvent], Awaitable[None]]
DEFAULT_PATH: Final = "/webhooks"
_READ_CHUNK: Final = 64 * 1024


@attrs.define
class ReceiverStats:
    """Counters since the receiver was made. ``received`` counts every request; each ends as
    exactly one of accepted, duplicates, unauthorized, bad_request, too_large, unavailable
    (queue full or closing) or errors (unexpected, answered 500)."""

    received: int = 0
    accepted: int = 0
    duplicates: int = 0
    unauthorized: int = 0
    bad_request: int = 0
    too_large: int = 0
    unavailable: int = 0
    errors: int = 0
    handled: int = 0
    failed_attempts: int = 0
    dead_lettered: int = 0


@attrs.frozen
class _Item:
    event: WebhookEvent
    body: bytes


class _TooLarge(Exception):
    pass


def _answer(status: int, state: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=orjson.dumps({"status": state}),
        content_type="application/json",
        headers=headers,
    )


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class WebhookReceiver:
    """Receives webhook deliveries and hands the events to ``handler``.

    ::

        receiver = WebhookReceiver(WebhookConfig(secret), handler)
        web.run_app(receiver.app())                 # its own aiohttp application, or
        app.router.add_post("/hooks", receiver.handle)   # inside yours (see ``attach``), or
        url = await receiver.listen("0.0.0.0", 8080)     # a server of its own in your loop

    Answers: 200 ``accepted`` (queued) or ``duplicate`` (seen in the dedupe window); 401 missing
    or bad signature (or timestamp); 400 body not an event; 413 body above ``max_body_bytes``;
    503 + Retry-After while the queue is full or the receiver closes, so the sender retries.
    An event id enters the dedupe window only once its event is queued, so a 503'd delivery is
    not mistaken for a duplicate when it comes again.

    Events are handled by ``config.workers`` tasks (1 by default: in arrival order). A handler
    that raises is retried up to ``max_handler_attempts`` times with backoff, then the event goes
    to ``dead_letters`` (default ``MemoryDeadLetters()``; ``SQLiteDeadLetters(path)`` to keep them).
    """

    def __init__(
        self,
        config: WebhookConfig,
        handler: Handler,
        *,
        dead_letters: DeadLetterStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(config, WebhookConfig):
            raise ConfigError(f"config must be a WebhookConfig, got {type(config).__name__}")
        if not callable(handler):
            raise ConfigError("handler must be an async function taking a WebhookEvent")
        self.config: Final = config
        self._handler = handler
        self.dead_letters: Final[DeadLetterStore] = (
            MemoryDeadLetters() if dead_letters is None else dead_letters
        )
        # Used only when the configured store fails, so a letter is never lost to a disk error.
        self.unsaved_dead_letters: Final = MemoryDeadLetters()
        self._clock = clock
        self._seen = DedupeWindow(config.dedupe_window, config.dedupe_max_entries)
        self._queue: asyncio.Queue[_Item] = asyncio.Queue(maxsize=config.queue_size)
        self._workers: list[asyncio.Task[None]] = []
        self._accepting = True
        self._runner: web.AppRunner | None = None
        self._url: str | None = None
        self._stats = ReceiverStats()

    def __repr__(self) -> str:
        where = self._url or "not listening"
        return f"<WebhookReceiver {where} pending={self._queue.qsize()}>"

    # --- state --------------------------------------------------------------------------------

    @property
    def stats(self) -> ReceiverStats:
        """A snapshot of the counters."""
        return attrs.evolve(self._stats)

    @property
    def pending(self) -> int:
        """Accepted events not yet taken by a worker."""
        return self._queue.qsize()

    @property
    def url(self) -> str | None:
        """Where ``listen`` serves, e.g. ``http://127.0.0.1:8080/webhooks``."""
        return self._url

    # --- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the workers (``handle`` also starts them on the first delivery)."""
        self._accepting = True
        self._ensure_workers()

    def _ensure_workers(self) -> None:
        self._workers = [w for w in self._workers if not w.done()]
        while len(self._workers) < self.config.workers:
            self._workers.append(asyncio.create_task(self._work(), name="asyncsubs-webhooks"))

    async def join(self) -> None:
        """Wait until every accepted event has been handled or dead-lettered."""
        if self._queue.qsize():
            self._ensure_workers()
        await self._queue.join()

    async def close(self, timeout: float = 30.0) -> None:
        """Stop accepting (503), stop listening, let the workers finish the queue for up to
        ``timeout`` seconds, then stop them. Events still unhandled go to the dead letters, so
        nothing accepted is lost. Safe to call twice."""
        self._accepting = False
        runner, self._runner = self._runner, None
        if runner is not None:
            # Waits for deliveries being received right now to be answered.
            await runner.cleanup()
        if self._queue.qsize():
            self._ensure_workers()
        if self._workers:
            try:
                await asyncio.wait_for(self._queue.join(), timeout)
            except TimeoutError:
                log.warning("webhook queue not drained in %.1fs; dead-lettering the rest", timeout)
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        while not self._queue.empty():
            item = self._queue.get_nowait()
            self._queue.task_done()
            await self._dead(item, "receiver closed before the event was handled", 0)

    async def __aenter__(self) -> WebhookReceiver:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

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
            await self.close()

        app.on_startup.append(on_startup)
        app.on_cleanup.append(on_cleanup)

    def app(self, path: str = DEFAULT_PATH) -> web.Application:
        """An application serving deliveries at ``POST path`` (for ``web.run_app`` and the
        like); the workers start and stop with it."""
        app = web.Application()
        self.attach(app, path)
        return app

    async def listen(
        self, host: str = "127.0.0.1", port: int = 0, *, path: str = DEFAULT_PATH
    ) -> str:
        """Serve on ``host:port`` (0: a free port) in the running loop; returns the URL to give
        the sender. ``close()`` stops it."""
        if self._runner is not None:
            raise RuntimeError(f"already listening on {self._url}")
        await self.start()
        runner = web.AppRunner(self._route_app(path), access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self._url = f"http://{shown}:{bound_port}{path}"
        return self._url

    # --- receiving ----------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.Response:
        """The route handler: ``app.router.add_post("/webhooks", receiver.handle)``.

        Never raises: anything unexpected is logged and answered 500 (the sender retries)."""
        self._stats.received += 1
        try:
            return await self._receive(request)
        except Exception:
            self._stats.errors += 1
            log.exception("webhook delivery failed unexpectedly")
            return _answer(500, "error")

    async def _read(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise _TooLarge
        # Streamed with a running total: chunked bodies announce no length.
        body = bytearray()
        async for chunk in request.content.iter_chunked(_READ_CHUNK):
            body += chunk
            if len(body) > limit:
                raise _TooLarge
        return bytes(body)

    async def _receive(self, request: web.Request) -> web.Response:
        config = self.config
        if not self._accepting:
            self._stats.unavailable += 1
            return _answer(503, "closing", {"Retry-After": str(config.retry_after)})
        self._ensure_workers()
        try:
            body = await self._read(request)
        except _TooLarge:
            self._stats.too_large += 1
            log.warning("webhook delivery refused: body above %d bytes", config.max_body_bytes)
            return _answer(413, "too large")

        timestamp = None
        if config.timestamp_header is not None:
            timestamp = request.headers.get(config.timestamp_header)
            if not timestamp_within(timestamp, self._clock(), config.timestamp_tolerance):
                self._stats.unauthorized += 1
                log.warning("webhook delivery refused: missing or stale timestamp")
                return _answer(401, "unauthorized")
        signed = signed_bytes(body, timestamp if config.sign_timestamp else None)
        if not verify(config, request.headers.get(config.signature_header), signed):
            self._stats.unauthorized += 1
            log.warning("webhook delivery refused: missing or invalid signature")
            return _answer(401, "unauthorized")

        try:
            event = parse_event(config, body, headers=request.headers, received_at=self._clock())
        except EventParseError as exc:
            self._stats.bad_request += 1
            log.warning("webhook delivery refused: %s", exc)
            return _answer(400, "bad request")
        return self._accept(event, body)

    def _accept(self, event: WebhookEvent, body: bytes) -> web.Response:
        # No await between the dedupe check and remembering the id: concurrent copies of one
        # delivery cannot both get in.
        if event.id in self._seen:
            self._stats.duplicates += 1
            log.debug("duplicate webhook event %s ignored", event.id)
            return _answer(200, "duplicate")
        try:
            self._queue.put_nowait(_Item(event, body))
        except asyncio.QueueFull:
            self._stats.unavailable += 1
            log.warning("webhook queue full (%d); answering 503", self.config.queue_size)
            return _answer(503, "busy", {"Retry-After": str(self.config.retry_after)})
        self._seen.add(event.id)
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
                            "webhook event %s (%s) failed %d times; dead-lettered: %s",
                            event.id,
                            event.topic,
                            attempts,
                            _describe(exc),
                            exc_info=exc,
                        )
                        await self._dead(item, _describe(exc), attempts)
                        return
                    delay = config.backoff(attempts) if _retry.waiting_enabled() else 0.0
                    log.warning(
                        "webhook event %s (%s): handler attempt %d/%d failed (%s); "
                        "retrying in %.2fs",
                        event.id,
                        event.topic,
                        attempts,
                        config.max_handler_attempts,
                        _describe(exc),
                        delay,
                        exc_info=exc,
                    )
                    await asyncio.sleep(delay)
                else:
                    self._stats.handled += 1
                    return
        except asyncio.CancelledError:
            await self._dead(item, "receiver closed while the event was being handled", attempts)
            raise

    async def _dead(self, item: _Item, error: str, attempts: int) -> None:
        letter = DeadLetter(
            event_id=item.event.id,
            topic=item.event.topic,
            body=item.body,
            error=error,
            attempts=attempts,
            failed_at=self._clock(),
        )
        self._stats.dead_lettered += 1
        try:
            await self.dead_letters.add(letter)
        except Exception:
            log.exception(
                "could not store dead letter for event %s; kept in unsaved_dead_letters",
                item.event.id,
            )
            await self.unsaved_dead_letters.add(letter)

    async def requeue_dead_letters(self) -> int:
        """Queue every dead letter again (after fixing what made the handler fail); returns how
        many. Each is removed from the store as it is queued; if it fails again, it returns."""
        config = self.config
        count = 0
        for letter in await self.dead_letters.all():
            headers = {}
            # Ids and topics that came in headers are not in the body: give them back.
            if config.event_id_header is not None:
                headers[config.event_id_header] = letter.event_id
            if config.topic_header is not None and letter.topic is not None:
                headers[config.topic_header] = letter.topic
            try:
                event = parse_event(config, letter.body, headers=headers, received_at=self._clock())
            except EventParseError:
                log.error("dead letter %s cannot be parsed; left in place", letter.event_id)
                continue
            await self.dead_letters.remove(letter.event_id)
            self._ensure_workers()
            await self._queue.put(_Item(event, letter.body))
            count += 1
        return count
