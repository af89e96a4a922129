"""``WebhookSender``: the fake server's side of webhooks, signed deliveries of store changes.

The interface leaves the webhook format open; this is the format the fake sends (and what
``asyncsubs.webhooks.WebhookConfig`` reads by default)::

    POST <url>
    Content-Type: application/json
    X-Service-Signature: hex(HMAC-SHA256(secret, raw body))
    X-Service-Event-Id: <event id>          (informational; receivers read the signed body)
    X-Service-Topic: subscriptions/update   (informational; receivers read the signed body)

    {"id": "<uuid>", "topic": "subscriptions/update", "store": "acme",
     "createdAt": "2026-01-02T03:04:05Z", "data": {<the whole record after the change>}}

Topics are ``<resource>/<create|update|delete>``; a delete carries the record's last state.
Real services differ, and the sender can play them: ``scheme`` signs as the timestamped scheme
(``t=<unix>,v1=<hex>``) or as Standard Webhooks (``webhook-id``, ``webhook-timestamp``,
``webhook-signature``), with every secret while one is rotated; ``store_key=None`` leaves the
store out of the body, and ``store_ids`` names stores as the service would (a shop domain).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

import aiohttp
import attrs
import orjson

from .._retry import waiting_enabled
from ..webhooks._config import WebhookConfig
from ..webhooks._signing import Encoding, Scheme, signed_headers
from ._data import iso
from ._store import ChangeEvent, FakeStore

__all__ = ["WebhookDelivery", "WebhookSenderStats", "WebhookSender"]

log = logging.getLogger("asyncsubs.testing.webhooks")

_ACTIONS: Final = {"created": "create", "updated": "update", "deleted": "delete"}
_RETRY_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})

Outcome = Literal["delivered", "dropped", "failed", "abandoned"]


@attrs.frozen
class WebhookDelivery:
    """What became of one event: ``delivered`` (2xx), ``dropped`` (on purpose, never sent),
    ``failed`` (refused, or retries spent) or ``abandoned`` (the sender closed first)."""

    event_id: str
    topic: str
    record_id: object
    outcome: Outcome
    attempts: int = 0
    status: int | None = None


@attrs.define
class WebhookSenderStats:
    events: int = 0
    dropped: int = 0
    delivered: int = 0
    failed: int = 0
    abandoned: int = 0
    attempts: int = 0
    retries: int = 0


@attrs.frozen
class _Pending:
    event_id: str
    topic: str
    record_id: object
    body: bytes


class WebhookSender:
    """Posts a signed event to ``url`` for every change of the attached stores.

    - ``drop_fraction``: share of events never sent at all (a lossy network or a sender that
      gave up), drawn from a RNG seeded with ``seed``; ids come from the same seed, so a run is
      reproducible.
    - ``max_attempts``/``backoff``/``backoff_max``: a 408/429/5xx answer or a connection error
      is retried (backoff doubles from ``backoff`` seconds; none under ``no_waiting()``); any
      other non-2xx answer fails the delivery at once.
    - Signing: ``scheme`` (``"hmac"``, ``"timestamped"``, ``"standard-webhooks"``),
      ``previous_secrets`` (each secret signs too, as during a rotation), ``signature_header``,
      ``encoding`` (``"hex"``/``"base64"``), ``algorithm``, ``signature_prefix``,
      ``timestamp_header``, as ``WebhookConfig`` reads them (unset: the scheme's defaults).
      Signed timestamps are the real time at each attempt. ``secret`` never appears in reprs.
    - The body names the store in ``store_key`` (None: not at all), as ``store_ids[store]``
      when given, else by the store's name.
    - Deliveries are sent one at a time, in change order. At most ``max_pending`` wait; beyond
      that new events are dropped (and counted) rather than growing memory without bound.
    """

    def __init__(
        self,
        url: str,
        secret: str | bytes,
        *,
        stores: Iterable[FakeStore] = (),
        drop_fraction: float = 0.1,
        seed: int = 0,
        max_attempts: int = 5,
        backoff: float = 0.05,
        backoff_max: float = 1.0,
        timeout: float = 10.0,
        scheme: Scheme = "hmac",
        previous_secrets: Iterable[str | bytes] = (),
        signature_header: str | None = None,
        encoding: Encoding | None = None,
        algorithm: str = "sha256",
        signature_prefix: str = "",
        timestamp_header: str | None = None,
        store_key: str | None = "store",
        store_ids: Mapping[str, str] | None = None,
        max_pending: int = 100_000,
        history_size: int = 100_000,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0.0 <= drop_fraction <= 1.0:
            raise ValueError(f"drop_fraction must be within [0, 1], got {drop_fraction!r}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.url = url
        # The scheme's defaults for what is not given, as a receiver's WebhookConfig has them.
        given: dict[str, Any] = {
            "signature_header": signature_header,
            "encoding": encoding,
            "timestamp_header": timestamp_header,
        }
        self._signing = WebhookConfig(
            secret,
            previous_secrets=previous_secrets,
            scheme=scheme,
            algorithm=algorithm,
            signature_prefix=signature_prefix,
            **{name: value for name, value in given.items() if value is not None},
        )
        self.store_key = store_key
        self.store_ids = dict(store_ids or {})
        self.drop_fraction = drop_fraction
        self.max_attempts = max_attempts
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.timeout = timeout
        self._drop_rng = random.Random(f"{seed}|webhook-drops")
        self._id_rng = random.Random(f"{seed}|webhook-ids")
        self._clock = clock
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(maxsize=max_pending)
        self._session = session
        self._own_session = session is None
        self._worker: asyncio.Task[None] | None = None
        self._stores: list[FakeStore] = []
        self.stats = WebhookSenderStats()
        #: What became of each event, oldest first (bounded by ``history_size``).
        self.deliveries: collections.deque[WebhookDelivery] = collections.deque(maxlen=history_size)
        for store in stores:
            self.attach(store)

    def __repr__(self) -> str:
        return f"<WebhookSender {self.url} drop={self.drop_fraction:g} pending={self.pending}>"

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    # --- lifecycle ----------------------------------------------------------------------------

    def attach(self, store: FakeStore) -> None:
        """Send the changes of ``store`` too."""
        if store not in self._stores:
            store.listeners.append(self)
            self._stores.append(store)

    def detach(self, store: FakeStore) -> None:
        if store in self._stores:
            store.listeners.remove(self)
            self._stores.remove(store)

    async def start(self) -> None:
        if self._worker is not None:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession()
        self._worker = asyncio.create_task(self._work(), name="asyncsubs-fake-webhooks")

    async def join(self) -> None:
        """Wait until every event so far is delivered, failed or dropped."""
        await self._queue.join()

    async def aclose(self, timeout: float = 0.0) -> None:
        """Stop listening; wait up to ``timeout`` s for pending deliveries, abandon the rest."""
        for store in list(self._stores):
            self.detach(store)
        if timeout > 0 and self._worker is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._queue.join(), timeout)
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            self._queue.task_done()
            self._record(pending, "abandoned", 0, None)
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> WebhookSender:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # --- events -------------------------------------------------------------------------------

    def _event_id(self) -> str:
        return str(uuid.UUID(int=self._id_rng.getrandbits(128), version=4))

    def _payload(self, event: ChangeEvent) -> tuple[str, str, bytes]:
        """(event id, topic, body) for a change."""
        event_id = self._event_id()
        topic = f"{event.resource}/{_ACTIONS[event.kind]}"
        payload: dict[str, Any] = {"id": event_id, "topic": topic}
        if self.store_key is not None:
            payload[self.store_key] = self.store_ids.get(event.store, event.store)
        payload["createdAt"] = iso(self._clock())
        payload["data"] = dict(event.record)
        return event_id, topic, orjson.dumps(payload)

    def __call__(self, event: ChangeEvent) -> None:
        """The store listener: called synchronously on every change."""
        event_id, topic, body = self._payload(event)
        pending = _Pending(event_id, topic, event.record.get("id"), body)
        self.stats.events += 1
        # Drawn for every event, sent or not, so the same run drops the same events.
        if self._drop_rng.random() < self.drop_fraction:
            self._record(pending, "dropped", 0, None)
            return
        try:
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            log.warning("webhook sender backlog full; event %s dropped", event_id)
            self._record(pending, "dropped", 0, None)

    def _record(
        self, pending: _Pending, outcome: Outcome, attempts: int, status: int | None
    ) -> None:
        # Outcomes are named like their counters.
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)
        self.deliveries.append(
            WebhookDelivery(
                pending.event_id, pending.topic, pending.record_id, outcome, attempts, status
            )
        )

    # --- sending ------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            pending = await self._queue.get()
            try:
                await self._send(pending)
            except asyncio.CancelledError:
                self._record(pending, "abandoned", 0, None)
                raise
            finally:
                self._queue.task_done()

    async def _send(self, pending: _Pending) -> None:
        assert self._session is not None
        headers = {
            "Content-Type": "application/json",
            "X-Service-Event-Id": pending.event_id,
            "X-Service-Topic": pending.topic,
        }
        status: int | None = None
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        for attempt in range(1, self.max_attempts + 1):
            self.stats.attempts += 1
            headers.update(
                signed_headers(
                    self._signing, pending.body, timestamp=time.time(), event_id=pending.event_id
                )
            )
            try:
                async with self._session.post(
                    self.url, data=pending.body, headers=headers, timeout=timeout
                ) as response:
                    status = response.status
                    await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                status = None
                log.debug("webhook %s attempt %d: %s", pending.event_id, attempt, exc)
            else:
                if 200 <= status < 300:
                    self._record(pending, "delivered", attempt, status)
                    return
                if status not in _RETRY_STATUSES:
                    break
            if attempt < self.max_attempts:
                self.stats.retries += 1
                if waiting_enabled():
                    await asyncio.sleep(min(self.backoff_max, self.backoff * 2 ** (attempt - 1)))
        log.info(
            "webhook %s (%s) not delivered (last status %s)",
            pending.event_id,
            pending.topic,
            status,
        )
        self._record(pending, "failed", attempt, status)
