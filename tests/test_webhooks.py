"""asyncsubs.webhooks: signatures, dedupe, bounded queue, retries and dead letters; and the whole
loop end to end (fake server mutating records, lossy signed webhooks, one reconciliation pull).

Nothing sleeps to synchronise: ``receiver.join()``/``sender.join()`` wait for work to finish,
and handlers block on events the test controls.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from app_server import serving
from yarl import URL

from asyncsubs import AdminClient, ConfigError, Limits
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig
from asyncsubs.testing._data import iso
from asyncsubs.webhooks import (
    DeadLetter,
    DeadLetterStore,
    InboxEntry,
    MemoryDeadLetters,
    SQLiteDeadLetters,
    WebhookConfig,
    WebhookEvent,
    WebhookReceiver,
    signature_header_value,
    supersedes,
)
from asyncsubs.webhooks._events import DedupeWindow, parse_event
from asyncsubs.webhooks._signing import timestamp_within

SECRET = "whsec-test-0123456789"
RESOURCES = ("subscriptions", "customers", "orders")


def hex_sig(body: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def b64_sig(body: bytes, secret: str = SECRET) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def event_body(event_id: str = "evt-1", topic: str = "subscriptions/update", **data: Any) -> bytes:
    record = {"id": 200_000_001, "status": "PAUSED", "updatedAt": "2026-01-02T03:04:05Z", **data}
    return orjson.dumps(
        {
            "id": event_id,
            "topic": topic,
            "store": "acme",
            "createdAt": "2026-01-02T03:04:06Z",
            "data": record,
        }
    )


class Recorder:
    """A handler that records events; optionally fails the first ``failures`` calls, or waits
    for ``gate`` before returning."""

    def __init__(self, failures: int = 0, gate: asyncio.Event | None = None) -> None:
        self.events: list[WebhookEvent] = []
        self.calls = 0
        self.failures = failures
        self.gate = gate
        self.entered = asyncio.Event()

    async def __call__(self, event: WebhookEvent) -> None:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.calls <= self.failures:
            raise RuntimeError(f"handler failure {self.calls}")
        self.events.append(event)


Post = Callable[..., Awaitable[tuple[int, dict[str, Any]]]]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


Start = Callable[..., Awaitable[tuple[WebhookReceiver, Post]]]


@pytest.fixture
async def started(session: aiohttp.ClientSession) -> AsyncIterator[Start]:
    """``await started(handler, **config)`` -> (a listening receiver, ``post(body, ...)``)."""
    receivers: list[WebhookReceiver] = []

    async def start(
        handler: Callable[[WebhookEvent], Awaitable[None]] | None = None, **options: Any
    ) -> tuple[WebhookReceiver, Post]:
        bindings = {k: options.pop(k) for k in ("dead_letters", "inbox", "store") if k in options}
        limits = options.pop("limits", None)
        config = WebhookConfig(options.pop("secret", SECRET), **options)
        receiver = WebhookReceiver(config, handler or Recorder(), **bindings)
        url = await receiver.listen("127.0.0.1", 0, limits=limits)
        receivers.append(receiver)

        async def post(
            body: bytes,
            signature: str | None = "auto",
            headers: Mapping[str, str] | None = None,
        ) -> tuple[int, dict[str, Any]]:
            sent = dict(headers or {})
            if signature == "auto":
                sent["X-Service-Signature"] = hex_sig(body)
            elif signature is not None:
                sent["X-Service-Signature"] = signature
            async with session.post(url, data=body, headers=sent) as response:
                answer = orjson.loads(await response.read() or b"{}")
                if response.status == 503:
                    answer["retry_after"] = response.headers.get("Retry-After")
                return response.status, answer

        return receiver, post

    yield start
    for receiver in receivers:
        await receiver.aclose(timeout=1.0)


# --- signatures ---------------------------------------------------------------------------------


async def test_valid_signature_is_accepted_and_handed_to_the_handler(started: Start) -> None:
    handler = Recorder()
    receiver, post = await started(handler)
    body = event_body()
    assert await post(body) == (200, {"status": "accepted"})
    await receiver.join()
    [event] = handler.events
    assert (event.id, event.topic, event.resource, event.action) == (
        "evt-1",
        "subscriptions/update",
        "subscriptions",
        "update",
    )
    assert event.record is not None
    assert event.record["status"] == "PAUSED"
    assert event.record_id == 200_000_001
    assert (event.store, event.created_at, event.is_delete) == (
        "acme",
        "2026-01-02T03:04:06Z",
        False,
    )
    assert event.raw == orjson.loads(body)
    stats = receiver.stats
    assert (stats.received, stats.accepted, stats.handled) == (1, 1, 1)


async def test_invalid_and_missing_signatures_are_401(
    started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Recorder()
    receiver, post = await started(handler)
    body = event_body()
    caplog.set_level(logging.DEBUG, logger="asyncsubs")
    assert (await post(body, signature=hex_sig(body, "another-secret")))[0] == 401
    assert (await post(body + b" ", signature=hex_sig(body)))[0] == 401  # body changed
    assert (await post(body, signature=None))[0] == 401
    assert (await post(body, signature=""))[0] == 401
    assert (await post(body, signature="zz" * 32))[0] == 401
    assert (await post(body, signature=hex_sig(body)[:-2]))[0] == 401  # truncated
    await receiver.join()
    assert handler.calls == 0
    assert receiver.stats.unauthorized == 6
    assert SECRET not in caplog.text
    assert hex_sig(body) not in caplog.text


async def test_wrong_encoding_is_401_and_each_encoding_works_when_configured(
    started: Start,
) -> None:
    body = event_body()
    _, hex_post = await started()
    assert (await hex_post(body, signature=b64_sig(body)))[0] == 401
    assert (await hex_post(body, signature=hex_sig(body).upper()))[0] == 200

    _, b64_post = await started(encoding="base64")
    assert (await b64_post(body, signature=hex_sig(body)))[0] == 401
    assert (await b64_post(body, signature=b64_sig(body)))[0] == 200
    urlsafe = b64_sig(event_body("evt-2")).translate(str.maketrans("+/", "-_")).rstrip("=")
    assert (await b64_post(event_body("evt-2"), signature=urlsafe))[0] == 200


async def test_header_prefix_rotation_and_algorithm(started: Start) -> None:
    body = event_body()
    _, post = await started(
        secret="new-secret",
        previous_secrets=[SECRET],
        signature_header="X-Hub-Signature-256",
        signature_prefix="sha256=",
        algorithm="sha512",
    )
    old = signature_header_value(SECRET, body, algorithm="sha512", prefix="sha256=")
    new = signature_header_value("new-secret", body, algorithm="sha512", prefix="sha256=")
    header = "X-Hub-Signature-256"
    assert (await post(body, None, {header: hex_sig(body)}))[0] == 401  # sha256, no prefix
    assert (await post(body, None, {header: old.removeprefix("sha256=")}))[0] == 401
    assert (await post(body, None, {header: f"sha256=deadbeef, {old}"}))[0] == 200
    assert (await post(event_body("evt-2"), None, {header: new}))[0] == 401  # other body
    body2 = event_body("evt-2")
    new2 = signature_header_value("new-secret", body2, algorithm="sha512", prefix="sha256=")
    assert (await post(body2, None, {header: new2}))[0] == 200


async def test_timestamped_signatures_refuse_stale_deliveries(
    session: aiohttp.ClientSession,
) -> None:
    now = 1_800_000_000.0
    config = WebhookConfig(SECRET, timestamp_header="X-Service-Timestamp")
    handler = Recorder()
    receiver = WebhookReceiver(config, handler, clock=lambda: now)
    url = await receiver.listen()
    try:

        async def post(body: bytes, stamp: str | None, signed_stamp: str | None) -> int:
            headers = {}
            if stamp is not None:
                headers["X-Service-Timestamp"] = stamp
            signed = body if signed_stamp is None else f"{signed_stamp}.".encode() + body
            headers["X-Service-Signature"] = hex_sig(signed)
            async with session.post(url, data=body, headers=headers) as response:
                return response.status

        fresh = str(int(now - 10))
        assert await post(event_body("a"), fresh, fresh) == 200
        assert await post(event_body("b"), None, None) == 401  # no timestamp
        stale = str(int(now - 301))
        assert await post(event_body("c"), stale, stale) == 401  # outside the tolerance
        assert await post(event_body("d"), fresh, str(int(now))) == 401  # not what was signed
        assert await post(event_body("e"), fresh, None) == 401  # body alone is not enough
        # A captured delivery re-sent an hour later with a fresh (unsigned) stamp: refused.
        old = str(int(now - 3600))
        assert await post(event_body("g"), fresh, old) == 401
        iso_stamp = "2027-01-15T08:00:00+00:00"  # == now, as ISO-8601
        assert await post(event_body("f"), iso_stamp, iso_stamp) == 200
        await receiver.join()
    finally:
        await receiver.aclose()
    assert [e.id for e in handler.events] == ["a", "f"]


async def test_a_timestamp_in_other_digits_is_401_not_500() -> None:
    """``float()`` reads fullwidth or Arabic-Indic digits; they cannot be signed as ASCII, so
    such a stamp (sent by anyone, no secret needed) must be refused, not crash the request."""
    now = 1_800_000_000.0
    for stamp in ("1800000000", "1800000000.25"):
        assert timestamp_within(stamp, now, 300.0)
    for stamp in (
        "\uff11\uff18" + "\uff10" * 8,
        "\u0661\u0668" + "\u0660" * 8,
        "1.8e9",
        "+1800000000",
    ):
        assert not timestamp_within(stamp, now, 300.0), stamp

    config = WebhookConfig(SECRET, timestamp_header="X-Service-Timestamp")
    receiver = WebhookReceiver(config, Recorder(), clock=lambda: now)
    url = await receiver.listen()
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    body = event_body()
    fullwidth = "\uff11\uff18" + "\uff10" * 8  # == now
    head = (
        f"POST /webhooks HTTP/1.1\r\nHost: x\r\nX-Service-Timestamp: {fullwidth}\r\n"
        f"X-Service-Signature: {hex_sig(body)}\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    try:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(head.encode() + body)
        status = await reader.readline()
        writer.close()
        assert status.startswith(b"HTTP/1.1 401"), status
    finally:
        await receiver.aclose()
    assert (receiver.stats.unauthorized, receiver.stats.errors) == (1, 0)


# --- body ----------------------------------------------------------------------------------------


async def test_unparseable_bodies_are_400_after_the_signature_check(started: Start) -> None:
    handler = Recorder()
    receiver, post = await started(handler)
    for body in (
        b"{not json",
        b"[1, 2]",
        b'"text"',
        b"",
        orjson.dumps({"id": "no-topic"}),
        orjson.dumps({"id": "number-topic", "topic": 5}),
    ):
        status, answer = await post(body)
        assert (status, answer) == (400, {"status": "bad request", "reason": "not_an_event"}), body
    # Signature first: an unsigned bad body says nothing about parsing.
    assert (await post(b"{not json", signature=None))[0] == 401
    await receiver.join()
    assert handler.calls == 0
    assert receiver.stats.bad_request == 6
    assert receiver.stats.refusals == {"not_an_event": 6, "no_signature": 1}


async def test_oversized_bodies_are_refused_with_or_without_a_length(
    started: Start, session: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Recorder()
    receiver, post = await started(handler, max_body_bytes=1000)
    big = event_body(note="x" * 2000)
    assert (await post(big))[0] == 413

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 100):
            yield big[i : i + 100]

    assert receiver.url is not None
    headers = {"X-Service-Signature": hex_sig(big)}
    async with session.post(receiver.url, data=chunks(), headers=headers) as response:
        assert response.status == 413
    just_fits = event_body()
    assert len(just_fits) <= 1000
    assert (await post(just_fits))[0] == 200
    await receiver.join()
    assert [e.id for e in handler.events] == ["evt-1"]
    assert receiver.stats.too_large == 2
    # Anyone can send these: the first is a warning, the second only counted.
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and "above" in r.message]
    assert len(warned) == 1


async def test_garbage_http_and_unreadable_bodies_are_400s_without_a_traceback(
    started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """What aiohttp cannot parse or decode is the sender's fault: a 400, a warning for the first
    body only, and never an ERROR or a traceback (shown by a command as they are)."""
    receiver, post = await started(Recorder())
    body = b"not gzip at all"
    for _ in range(2):
        headers = {"Content-Encoding": "gzip"}
        answer = await post(body, signature=hex_sig(body), headers=headers)
        assert answer == (400, {"status": "bad request", "reason": "unreadable_body"})
    assert receiver.url is not None
    port = int(receiver.url.rsplit(":", 1)[1].split("/")[0])
    for garbage in (
        b"POST /webhooks HTTP/1.1\r\nHost x\r\n\r\n",
        b"POST /webhooks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(garbage)
        assert (await reader.readline()).startswith(b"HTTP/1.0 400")
        writer.close()
        await writer.wait_closed()
    assert receiver.stats.bad_request == 2
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.message.split(" (")[0] for r in loud] == [
        "webhook delivery refused: body cannot be read"
    ]
    assert not any(r.exc_info for r in loud)


async def test_event_shape_is_configurable(started: Start) -> None:
    handler = Recorder()
    receiver, post = await started(
        handler, event_id_key="eventId", topic_key="kind", data_key=None, store_key=None
    )
    record = {"eventId": "e-1", "kind": "subscription.deleted", "id": 42}
    body = orjson.dumps(record)
    assert (await post(body))[0] == 200
    assert (await post(body))[1] == {"status": "duplicate"}
    await receiver.join()
    [event] = handler.events
    assert (event.id, event.resource, event.action, event.is_delete) == (
        "e-1",
        "subscriptions",
        "deleted",
        True,
    )
    assert (event.record, event.record_id, event.store) == (record, 42, None)


async def test_unsigned_headers_decide_nothing(started: Start) -> None:
    """A captured update re-sent with a topic or event-id header (which no signature covers)
    is still the same update: headers cannot turn it into a delete, nor past the dedupe, nor
    make a forged id shadow the real event."""
    handler = Recorder()
    receiver, post = await started(handler)
    body = event_body("real")
    forged = {"X-Service-Topic": "subscriptions/delete", "X-Service-Event-Id": "fresh"}
    assert (await post(body, headers=forged))[1] == {"status": "accepted"}
    assert (await post(body, headers={"X-Service-Event-Id": "other"}))[1] == {"status": "duplicate"}
    assert (await post(event_body("next"), headers={"X-Service-Event-Id": "real"}))[1] == {
        "status": "accepted"
    }
    await receiver.join()
    assert [(e.id, e.is_delete) for e in handler.events] == [("real", False), ("next", False)]


async def test_a_store_not_said_to_share_its_secret_refuses_only_other_stores_bodies(
    started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """Sharing not said: a genuine delivery naming globex re-posted to acme's receiver is
    refused (403, naming both), one naming no store is acme's (its URL and secret say so)."""
    handler = Recorder()
    receiver, post = await started(handler, store="acme")
    globex = orjson.loads(event_body("g-1", topic="subscriptions/delete"))
    globex["store"] = "globex"
    nameless = orjson.loads(event_body("n-1"))
    del nameless["store"]
    assert await post(orjson.dumps(globex)) == (
        403,
        {"status": "wrong store", "reason": "wrong_store"},
    )
    assert (await post(orjson.dumps(nameless)))[0] == 200
    assert (await post(event_body("a-1")))[0] == 200
    assert (await post(b"{}", signature="00"))[0] == 401
    await receiver.join()
    assert [e.id for e in handler.events] == ["n-1", "a-1"]
    assert receiver.stats.unauthorized == 2
    assert receiver.stats.refusals == {"wrong_store": 1, "bad_signature": 1}
    assert "for store acme refused: its signed body names store 'globex' in 'store'" in caplog.text
    assert "for store acme refused: no signature in X-Service-Signature matches" in caplog.text
    with pytest.raises(ConfigError, match="store_id needs store_key"):
        WebhookConfig(SECRET, store_key=None, store_id="acme")
    with pytest.raises(ConfigError, match="shared_secret=True needs store_id"):
        WebhookConfig(SECRET, shared_secret=True)


def test_a_topic_that_is_not_a_string_is_a_bad_request() -> None:
    from asyncsubs.webhooks._events import EventParseError

    config = WebhookConfig(SECRET)
    for topic in (5, None, "", ["subscriptions/update"]):
        with pytest.raises(EventParseError, match="no topic"):
            parse_event(config, orjson.dumps({"id": "e", "topic": topic, "data": {"id": 1}}))


def test_parse_event_without_an_id_uses_the_body_digest() -> None:
    config = WebhookConfig(SECRET)
    body = orjson.dumps({"topic": "orders/create", "data": [1]})
    event = parse_event(config, body)
    assert event.id == "sha256:" + hashlib.sha256(body).hexdigest()
    assert (event.record, event.record_id) == (None, None)
    assert parse_event(config, body).id == event.id


def test_parse_event_keeps_ids_beyond_64_bits_exact() -> None:
    body = b'{"id": "e1", "topic": "orders/update", "data": {"id": 18446744073709551617}}'
    event = parse_event(WebhookConfig(SECRET), body)
    assert event.record_id == 2**64 + 1


# --- dedupe --------------------------------------------------------------------------------------


async def test_replayed_delivery_is_ignored(started: Start) -> None:
    handler = Recorder()
    receiver, post = await started(handler)
    body = event_body()
    assert (await post(body))[1] == {"status": "accepted"}
    assert (await post(body))[1] == {"status": "duplicate"}
    # The same event id with another body (a re-signed retry) is still the same event.
    assert (await post(event_body(status="ACTIVE")))[1] == {"status": "duplicate"}
    await receiver.join()
    assert len(handler.events) == 1
    assert receiver.stats.duplicates == 2


class GatedInbox:
    """An inbox whose writes wait for ``gate``, then fail (``fail``) or are kept."""

    def __init__(self, *, fail: bool) -> None:
        self.fail = fail
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()
        self.entries: list[InboxEntry] = []

    async def add(self, entry: InboxEntry) -> bool:
        self.writing.set()
        await self.gate.wait()
        if self.fail:
            raise OSError("disk I/O error")
        self.entries.append(entry)
        return True

    async def pending(self, store: str) -> list[InboxEntry]:
        return []

    async def remove(self, store: str, event_id: str) -> None:
        pass


@pytest.mark.parametrize("fail", [True, False], ids=["write-fails", "write-commits"])
async def test_a_resend_waits_until_the_original_is_kept(
    session: aiohttp.ClientSession, fail: bool
) -> None:
    """A copy arriving while the original is written to the inbox is acknowledged only once the
    original is kept: never a 200 for an event that was not."""
    inbox = GatedInbox(fail=fail)
    at_accept = asyncio.Event()
    stamps = itertools.count()

    def clock() -> float:
        # Read just before a delivery is accepted (no await between): the second read says
        # the resend has reached the dedupe check.
        if next(stamps) == 1:
            at_accept.set()
        return 1_800_000_000.0

    receiver = WebhookReceiver(WebhookConfig(SECRET), Recorder(), inbox=inbox, clock=clock)
    url = await receiver.listen()
    body = event_body()

    async def post() -> tuple[int, dict[str, Any]]:
        async with session.post(
            url, data=body, headers={"X-Service-Signature": hex_sig(body)}
        ) as r:
            return r.status, orjson.loads(await r.read())

    try:
        original = asyncio.create_task(post())
        await inbox.writing.wait()
        resend = asyncio.create_task(post())
        await at_accept.wait()
        assert receiver.stats.duplicates == 0  # not answered while the original is written
        inbox.gate.set()
        if fail:
            assert [(await original)[0], (await resend)[0]] == [503, 503]
            inbox.fail = False  # the id was not remembered: the sender's retry gets in
            assert await post() == (200, {"status": "accepted"})
        else:
            assert await original == (200, {"status": "accepted"})
            assert await resend == (200, {"status": "duplicate"})
        await receiver.join()
    finally:
        inbox.gate.set()  # so that closing does not wait for a write held forever
        await receiver.aclose()
    assert [e.event_id for e in inbox.entries] == ["evt-1"]
    assert receiver.stats.accepted == 1


def test_dedupe_window_expires_and_is_bounded() -> None:
    now = [0.0]
    window = DedupeWindow(10.0, 3, clock=lambda: now[0])
    window.add("a")
    now[0] = 5.0
    window.add("b")
    assert "a" in window
    assert "b" in window
    now[0] = 10.0
    assert "a" not in window
    assert "b" in window
    for name in ("c", "d", "e"):
        window.add(name)
    assert len(window) == 3
    assert "b" not in window  # evicted by the size bound, oldest first
    now[0] = 100.0
    assert len(window) == 0


# --- queue, retries, dead letters ----------------------------------------------------------------


async def test_full_queue_answers_503_and_the_retry_is_not_deduped(
    started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    handler = Recorder(gate=gate)
    receiver, post = await started(handler, queue_size=2, retry_after=7)
    assert (await post(event_body("e1")))[0] == 200
    await handler.entered.wait()  # the worker holds e1, so the queue has room for two
    assert (await post(event_body("e2")))[0] == 200
    assert (await post(event_body("e3")))[0] == 200
    status, answer = await post(event_body("e4"))
    assert (status, answer["retry_after"]) == (503, "7")
    assert (await post(event_body("e5")))[0] == 503
    assert receiver.pending == 2
    gate.set()
    await receiver.join()
    assert (await post(event_body("e4")))[1] == {"status": "accepted"}
    await receiver.join()
    assert [e.id for e in handler.events] == ["e1", "e2", "e3", "e4"]
    assert receiver.stats.unavailable == 2
    # A burst is one warning, and its end another.
    warned = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert [m.split(":")[0] for m in warned] == ["webhook delivery answered 503", "webhooks"]
    assert "accepting again, after 2 deliveries answered 503" in warned[1]


async def test_handler_failures_are_retried(
    started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Recorder(failures=2)
    receiver, post = await started(handler, max_handler_attempts=3)
    await post(event_body())
    await receiver.join()
    assert handler.calls == 3
    assert [e.id for e in handler.events] == ["evt-1"]
    assert await receiver.dead_letters.all() == []
    assert receiver.stats.failed_attempts == 2
    assert "handler attempt 1/3 failed (RuntimeError: handler failure 1)" in caplog.text


async def test_handler_that_keeps_failing_goes_to_the_dead_letters(
    started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    handler = Recorder(failures=100)
    receiver, post = await started(handler, max_handler_attempts=4)
    body = event_body()
    await post(body)
    await receiver.join()
    assert handler.calls == 4
    [letter] = await receiver.dead_letters.all()
    assert (letter.event_id, letter.topic, letter.body, letter.attempts) == (
        "evt-1",
        "subscriptions/update",
        body,
        4,
    )
    assert letter.error == "RuntimeError: handler failure 4"
    assert "failed 4 times; dead-lettered" in caplog.text
    assert receiver.stats.dead_lettered == 1

    # Once whatever broke the handler is fixed, the letters can be handled after all.
    handler.failures = 0
    assert await receiver.requeue_dead_letters() == 1
    await receiver.join()
    assert [e.id for e in handler.events] == ["evt-1"]
    assert await receiver.dead_letters.all() == []


async def test_sqlite_dead_letters(started: Start, tmp_path: Path) -> None:
    path = tmp_path / "sync.db"
    store = SQLiteDeadLetters(path)
    receiver, post = await started(
        Recorder(failures=100), max_handler_attempts=2, dead_letters=store
    )
    await post(event_body("a"))
    await post(event_body("b", topic="orders/create"))
    await receiver.join()
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            "SELECT event_id, topic, body, error, attempts, failed_at FROM webhook_dead_letters"
        ).fetchall()
    assert [(r[0], r[1], r[4]) for r in rows] == [
        ("a", "subscriptions/update", 2),
        ("b", "orders/create", 2),
    ]
    assert bytes(rows[0][2]) == event_body("a")
    assert rows[0][3] == "RuntimeError: handler failure 2"
    assert rows[0][5].endswith("+00:00")
    letters = await store.all()
    assert [x.event_id for x in letters] == ["a", "b"]
    assert await store.remove("a") == 1
    assert [x.event_id for x in await store.all()] == ["b"]
    await store.aclose()


class LegacyDeadLetters:
    """A dead-letter store written before ``remove_for_store``: removes by event id alone."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []

    async def add(self, letter: DeadLetter) -> None:
        self.letters.append(letter)

    async def all(self) -> list[DeadLetter]:
        return list(self.letters)

    async def remove(self, event_id: str) -> int:
        before = len(self.letters)
        self.letters = [x for x in self.letters if x.event_id != event_id]
        return before - len(self.letters)


def letter_of(store: str | None, event_id: str = "1") -> DeadLetter:
    return DeadLetter(event_id, "subscriptions/update", event_body(event_id), "boom", 5, 0.0, store)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "legacy"])
async def test_requeueing_one_stores_dead_letters_keeps_other_stores_with_the_same_id(
    tmp_path: Path, kind: str
) -> None:
    """Event ids are unique per store only: requeueing acme's letter must not take globex's."""
    dead: DeadLetterStore = {
        "memory": MemoryDeadLetters,
        "sqlite": lambda: SQLiteDeadLetters(tmp_path / "hooks.db"),
        "legacy": LegacyDeadLetters,
    }[kind]()
    for store in ("acme", "globex", None):
        await dead.add(letter_of(store))
    handler = Recorder()
    receiver = WebhookReceiver(WebhookConfig(SECRET), handler, store="acme", dead_letters=dead)
    try:
        assert await receiver.requeue_dead_letters() == 1
        await receiver.join()
    finally:
        await receiver.aclose()
    assert [e.id for e in handler.events] == ["1"]
    assert sorted((x.store or "", x.event_id) for x in await dead.all()) == [
        ("", "1"),
        ("globex", "1"),
    ]
    if isinstance(dead, SQLiteDeadLetters):
        await dead.aclose()


async def test_the_command_requeues_one_stores_dead_letters_only(tmp_path: Path) -> None:
    from asyncsubs.cli._dead_letters import dead_letters
    from asyncsubs.sync import sink_for

    db = tmp_path / "sync.db"
    dead = SQLiteDeadLetters(db)
    for store in ("acme", "globex"):
        await dead.add(letter_of(store))
    await dead.aclose()
    found = await dead_letters(sink_for(str(db)), stores=["acme"], requeue=True)
    assert found is not None
    letters, moved = found
    assert ([x.store for x in letters], moved) == (["acme"], 1)
    with sqlite3.connect(db) as conn:
        left = conn.execute("SELECT store, event_id FROM webhook_dead_letters").fetchall()
        queued = conn.execute("SELECT store, event_id FROM webhook_inbox").fetchall()
    assert (left, queued) == ([("globex", "1")], [("acme", "1")])


async def test_the_command_says_when_a_store_has_no_dead_letters(
    tmp_path: Path, capsys: Any
) -> None:
    from asyncsubs.__main__ import main

    db = tmp_path / "sync.db"
    dead = SQLiteDeadLetters(db)
    for store in ("acme", "globex"):
        await dead.add(letter_of(store))
    await dead.aclose()
    argv = ["dead-letters", "--db", str(db), "--store", "unknown", "--requeue"]
    assert await asyncio.to_thread(main, argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 moved to webhook_inbox" in out
    assert (
        "--store unknown: no dead letters of that store id (stores with dead letters: acme, globex)"
    ) in out


async def test_close_dead_letters_what_was_accepted_but_not_handled(started: Start) -> None:
    handler = Recorder(gate=asyncio.Event())  # never opened: the handler hangs
    receiver, post = await started(handler)
    await post(event_body("stuck"))
    await post(event_body("queued"))
    await handler.entered.wait()
    await receiver.aclose(timeout=0.01)
    letters = {x.event_id: x for x in await receiver.dead_letters.all()}
    assert set(letters) == {"stuck", "queued"}
    assert letters["stuck"].error == "receiver closed while the event was being handled"
    assert letters["queued"].error == "receiver closed before the event was handled"
    # Closed: deliveries are refused with 503, so the sender keeps them.
    assert (await receiver.handle(make_request(event_body("late")))).status == 503


async def test_a_failing_dead_letter_store_falls_back_to_memory(started: Start) -> None:
    class Broken(MemoryDeadLetters):
        async def add(self, letter: Any) -> None:
            raise OSError("disk full")

    receiver, post = await started(
        Recorder(failures=100), max_handler_attempts=1, dead_letters=Broken()
    )
    await post(event_body())
    await receiver.join()
    assert [x.event_id for x in await receiver.unsaved_dead_letters.all()] == ["evt-1"]


# --- in a user's own application ------------------------------------------------------------------


async def test_handle_inside_a_users_app(session: aiohttp.ClientSession) -> None:
    handler = Recorder()
    receiver = WebhookReceiver(WebhookConfig(SECRET), handler)
    app = web.Application()

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/health", health)
    receiver.attach(app, "/hooks/acme")
    body = event_body()
    async with serving(app) as origin:  # its end runs on_cleanup, which closes the receiver
        headers = {"X-Service-Signature": hex_sig(body)}
        async with session.post(f"{origin}/hooks/acme", data=body, headers=headers) as response:
            assert response.status == 200
        await receiver.join()
    assert [e.id for e in handler.events] == ["evt-1"]
    status = await receiver.handle(make_request(body))
    assert status.status == 503  # closed with the app


def users_app(receiver: WebhookReceiver, entered: asyncio.Event) -> web.Application:
    """``receiver.handle`` as a route of a user's app (started and closed by hand); ``entered``
    is set as each delivery's headers have arrived and the receiver starts reading its body."""

    async def route(request: web.Request) -> web.Response:
        entered.set()
        return await receiver.handle(request)

    app = web.Application()
    app.router.add_post("/hooks", route)
    return app


@pytest.mark.parametrize("with_inbox", [False, True], ids=["memory", "inbox"])
async def test_a_delivery_completed_while_closing_is_refused_not_dropped(
    with_inbox: bool,
) -> None:
    """aclose() while a delivery's body (or, with an inbox, its write) is under way: 503, so
    the sender keeps it; not a 200 for an event no worker is left to handle."""
    handler = Recorder()
    inbox = GatedInbox(fail=False) if with_inbox else None
    receiver = WebhookReceiver(WebhookConfig(SECRET), handler, inbox=inbox)
    await receiver.start()
    entered = asyncio.Event()
    body = event_body("late")
    head = (
        f"POST /hooks HTTP/1.1\r\nHost: x\r\nX-Service-Signature: {hex_sig(body)}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    async with serving(users_app(receiver, entered)) as origin:
        address = URL(origin)
        reader, writer = await asyncio.open_connection(address.host, address.port)
        if inbox is None:
            writer.write(head.encode() + body[:5])
            await entered.wait()  # reading the body
            await receiver.aclose(timeout=1.0)
            writer.write(body[5:])
        else:
            writer.write(head.encode() + body)
            await inbox.writing.wait()
            await receiver.aclose(timeout=1.0)
            inbox.gate.set()
        status = await reader.readline()
        writer.close()
    assert status.startswith(b"HTTP/1.1 503"), status
    assert (receiver.pending, receiver.stats.accepted, receiver.stats.unavailable) == (0, 0, 1)
    assert handler.events == []
    if inbox is not None:  # it was written: the next start() queues it
        assert [e.event_id for e in inbox.entries] == ["late"]


def make_request(body: bytes) -> web.Request:
    from aiohttp.test_utils import make_mocked_request

    return make_mocked_request("POST", "/hooks", headers={"X-Service-Signature": hex_sig(body)})


async def test_unexpected_errors_are_500_not_exceptions(
    started: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    receiver, post = await started()

    def boom(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("asyncsubs.webhooks._receiver.parse_event", boom)
    assert (await post(event_body()))[0] == 500
    assert receiver.stats.errors == 1


def test_config_validation_and_secret_hygiene() -> None:
    config = WebhookConfig(SECRET, previous_secrets=["older-secret"])
    assert SECRET not in repr(config)
    assert "older-secret" not in repr(config)
    assert config.secrets == (SECRET.encode(), b"older-secret")
    bad: list[dict[str, Any]] = [
        {"encoding": "base32"},
        {"algorithm": "rot13"},
        {"algorithm": "shake_128"},  # a hashlib name HMAC cannot use: every delivery would 500
        {"signature_header": "bad header"},
        {"queue_size": 0},
        {"max_body_bytes": -1},
        {"dedupe_window": float("nan")},
        {"max_handler_attempts": 1.5},
        {"handler_backoff_initial": 5.0, "handler_backoff_max": 1.0},
        {"topic_key": None},
        {"timestamp_header": "bad header"},
        {"data_key": ""},
    ]
    for options in bad:
        with pytest.raises(ConfigError):
            WebhookConfig(SECRET, **options)
    for secret in ("", b"", None):
        with pytest.raises(ConfigError) as info:
            WebhookConfig(secret)  # type: ignore[arg-type]
        assert "non-empty" in str(info.value)
    with pytest.raises(ConfigError):
        WebhookReceiver(config, "not callable")  # type: ignore[arg-type]


def test_supersedes() -> None:
    old = {"id": 1, "updatedAt": "2026-01-01T00:00:00Z"}
    new = {"id": 1, "updatedAt": "2026-01-01T00:00:01Z"}
    assert supersedes(new, old)
    assert not supersedes(old, new)
    assert supersedes(old, old)  # equal stamps: the later arrival wins
    assert supersedes(old, None)
    assert supersedes({"id": 1}, new)
    assert supersedes(new, {"id": 1})
    assert supersedes({"id": 1, "updatedAt": "2026-01-01T01:00:00+01:00"}, old)
    # As instants, not as text: 01:30+02:00 is 23:30 the day before.
    assert not supersedes({"id": 1, "updatedAt": "2026-01-01T01:30:00+02:00"}, old)
    assert not supersedes({"id": 1, "updatedAt": 5}, {"id": 1, "updatedAt": 7})
    assert supersedes({"id": 1, "updatedAt": 7}, {"id": 1, "updatedAt": "7"})  # no order


# --- end to end --------------------------------------------------------------------------------


def state(server: FakeAdminServer, store: str) -> dict[str, dict[int, dict[str, Any]]]:
    return {r: {rec["id"]: rec for rec in server.records(store, r)} for r in RESOURCES}


class Replica:
    """A local copy fed by pulls and webhooks: a newer-or-equal version replaces the stored one,
    so late or out-of-order deliveries never roll a record back."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[int, dict[str, Any]]] = {r: {} for r in RESOURCES}

    def put(self, resource: str, record: Mapping[str, Any]) -> None:
        table = self.tables[resource]
        if supersedes(record, table.get(record["id"])):
            table[record["id"]] = dict(record)

    async def apply(self, event: WebhookEvent) -> None:
        if event.is_delete:
            self.tables[event.resource].pop(event.record_id, None)
        elif event.record is not None:
            self.put(event.resource, event.record)

    async def pull(self, client: AdminClient, params: Mapping[str, Any] | None = None) -> int:
        count = 0
        for resource in RESOURCES:
            endpoint = getattr(client, resource)
            async for record in endpoint.list(page_size=37, params=params, model=dict):
                self.put(resource, record)
                count += 1
        return count


def stepping_clock(start: float, step: float = 0.3) -> Callable[[], float]:
    """Mutation stamps far from today, several per second (equal stamps happen)."""
    ticks = itertools.count()
    return lambda: start + step * next(ticks)


async def test_end_to_end_lossy_webhooks_then_one_reconciliation_pull(
    fast_limits: Limits,
) -> None:
    stores = [FakeStoreConfig("acme", records=150)]
    async with FakeAdminServer(stores=stores, rate_limits=None, seed=3) as server:
        replica = Replica()
        receiver = WebhookReceiver(WebhookConfig(SECRET), replica.apply)
        url = await receiver.listen("127.0.0.1", 0)
        sender = await server.deliver_webhooks(url, SECRET, drop_fraction=0.1, seed=11)
        start = 1_900_000_000.0  # 2030: after every generated record
        mutator = server.mutator("acme", seed=5, clock=stepping_clock(start))
        async with AdminClient(
            token=server.store("acme").token,
            base_url=server.base_url,
            store="acme",
            limits=fast_limits,
            timeout=5.0,
        ) as client:
            total = await replica.pull(client)  # (1) the initial full pull
            assert replica.tables == state(server, "acme")

            since = iso(start)  # taken before the first change
            await mutator.run(steps=400)  # (2) changes, sent as webhooks, 10% dropped
            await sender.join()
            await receiver.join()
            stats = sender.stats
            assert stats.events >= 400  # status changes also touch customers
            assert 0.05 * stats.events < stats.dropped < 0.15 * stats.events
            assert stats.delivered == stats.events - stats.dropped
            assert receiver.stats.handled == stats.delivered
            assert replica.tables != state(server, "acme")  # the dropped changes are missing

            # (3) one incremental pull from before the changes began reconciles everything.
            pulled = await replica.pull(client, {"updatedAtMin": since})
            await receiver.aclose()
        assert replica.tables == state(server, "acme")
        assert 0 < pulled < total  # only what changed, not whole lists
        assert set(mutator.counts) >= {"subscription_action", "order_create", "customer_create"}


async def test_end_to_end_deletes_via_webhooks(fast_limits: Limits) -> None:
    stores = [FakeStoreConfig("acme", records=60)]
    async with FakeAdminServer(stores=stores, rate_limits=None, seed=4) as server:
        replica = Replica()
        receiver = WebhookReceiver(WebhookConfig(SECRET), replica.apply)
        url = await receiver.listen("127.0.0.1", 0)
        sender = await server.deliver_webhooks(url, SECRET, drop_fraction=0.0)
        mutator = server.mutator(
            "acme", seed=2, weights={"subscription_delete": 3.0}, clock=stepping_clock(2e9)
        )
        async with AdminClient(
            token=server.store("acme").token,
            base_url=server.base_url,
            store="acme",
            limits=fast_limits,
            timeout=5.0,
        ) as client:
            await replica.pull(client)
        await mutator.run(steps=150)
        await sender.join()
        await receiver.join()
        await receiver.aclose()
        assert mutator.counts["subscription_delete"] > 10
        assert replica.tables == state(server, "acme")
        assert sender.stats.delivered == sender.stats.events
