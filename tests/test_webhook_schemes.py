"""The signing schemes real senders use, the store binding, and loud refusals.

Each scheme is checked against test vectors from its specification's own sources, and against a
sender written here from the specification (hashlib, hmac, base64: neither ``WebhookSender`` nor
``signed_headers``), posting store-less bodies over HTTP to a listening receiver.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import pickle
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict

from asyncsubs import ConfigError
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig
from asyncsubs.webhooks import (
    DeliveryRefused,
    Refusal,
    WebhookConfig,
    WebhookEvent,
    WebhookReceiver,
    resolve_store_binding,
    signed_headers,
    verify_delivery,
)

# --- senders written from the specifications ----------------------------------------------------


def hmac_headers(secret: str, body: bytes, *, encoding: str = "hex") -> dict[str, str]:
    """The default scheme: HMAC-SHA256 of the raw body, hex or base64, in one header."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).digest()
    text = digest.hex() if encoding == "hex" else base64.b64encode(digest).decode()
    return {"X-Service-Signature": text}


def timestamped_headers(
    secrets: Iterable[str], body: bytes, t: int, header: str = "Stripe-Signature"
) -> dict[str, str]:
    """Stripe's scheme (docs.stripe.com/webhooks/signatures, "Verify signatures manually"):
    ``t=<timestamp>,v1=<signature>``, one v1 per active secret, each the hex HMAC-SHA256 of
    ``"{t}.{payload}"`` keyed with the endpoint's secret as it is shown (whsec_... included)."""
    signatures = [
        "v1=" + hmac.new(s.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
        for s in secrets
    ]
    return {header: ",".join([f"t={t}", *signatures])}


def standard_headers(secrets: Iterable[str], msg_id: str, t: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks specification 1.0.0 (spec/standard-webhooks.md, "Signature scheme"
    and "Webhook headers"): the key is the base64 after ``whsec_``; the content signed is
    ``msg_id.timestamp.payload``; ``webhook-signature`` is space-separated ``v1,<base64>``."""
    signatures = []
    for secret in secrets:
        key = base64.b64decode(secret.removeprefix("whsec_"))
        digest = hmac.new(key, f"{msg_id}.{t}.".encode() + body, hashlib.sha256).digest()
        signatures.append("v1," + base64.b64encode(digest).decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(t),
        "webhook-signature": " ".join(signatures),
    }


# --- test vectors from the specifications' own sources ------------------------------------------

# Standard Webhooks: github.com/standard-webhooks/standard-webhooks, libraries/go/webhook_test.go
# (TestWebhookSign; the same vector in libraries/csharp/StandardWebhooks.Tests/WebhookTest.cs and
# libraries/java/.../TestScenario.java).
SW_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SW_MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SW_TIMESTAMP = 1614265330
SW_PAYLOAD = b'{"test": 2432232314}'
SW_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
# libraries/python/tests/test_webhooks.py (test_invalid_signature_raises_error) and
# libraries/go/webhook_test.go ("valid multi sig is valid"): signatures that must not match.
SW_WRONG = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OA="
SW_OTHERS = [
    "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
    "v2,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
]

# Stripe: github.com/stripe/stripe-dotnet, src/StripeTests/Services/Events/EventUtilityTest.cs
# (its header, secret and timestamp) over src/StripeTests/Resources/event_test_signature.json
# (the body, newline-terminated, as signed there with `openssl sha256 -hmac`).
STRIPE_SECRET = "webhook_secret"
STRIPE_TIMESTAMP = 1533204620
STRIPE_HEADER = (
    "t=1533204620,v1=2220f87ef101a04665f11cdf770523143f875572008577fa0f20882ddb9cc3c7,"
    "v0=63f3a72374a733066c4be69ed7f8e5ac85c22c9f0a6a612ab9a025a9e4ee7eef"
)
STRIPE_BODY = b"""{
  "id": "evt_123",
  "object": "event",
  "account": "acct_123",
  "api_version": "2017-05-25",
  "created": 1533204620,
  "data": {
    "object": {
      "id": "cus_123",
      "object": "customer",
      "created": 123456789,
      "email": "test@stripe.com",
      "livemode": false,
      "metadata": {}
    }
  },
  "livemode": false,
  "pending_webhooks": 1,
  "request": {
    "id": "req_123",
    "idempotency_key": "idempotency-key-123"
  },
  "type": "customer.created"
}
"""
STRIPE_CONFIG: dict[str, Any] = {
    "scheme": "timestamped",
    "signature_header": "Stripe-Signature",
    "topic_key": "type",
    "store_key": None,
}


def refusal_of(config: WebhookConfig, headers: Mapping[str, str], body: bytes, now: float) -> str:
    with pytest.raises(DeliveryRefused) as info:
        verify_delivery(config, CIMultiDict(headers), body, now)
    return info.value.refusal.value


def test_standard_webhooks_vector_verifies_and_is_what_signed_headers_sends() -> None:
    for secret in (SW_SECRET, SW_SECRET.removeprefix("whsec_")):  # the prefix is optional
        config = WebhookConfig(secret, scheme="standard-webhooks")
        headers = {
            "webhook-id": SW_MSG_ID,
            "webhook-timestamp": str(SW_TIMESTAMP),
            "webhook-signature": SW_SIGNATURE,
        }
        assert verify_delivery(config, CIMultiDict(headers), SW_PAYLOAD, SW_TIMESTAMP + 10) == (
            SW_MSG_ID
        )
        sent = signed_headers(config, SW_PAYLOAD, timestamp=SW_TIMESTAMP, event_id=SW_MSG_ID)
        assert sent == headers
        assert standard_headers([SW_SECRET], SW_MSG_ID, SW_TIMESTAMP, SW_PAYLOAD) == headers
        several = {**headers, "webhook-signature": " ".join([*SW_OTHERS, SW_SIGNATURE])}
        assert verify_delivery(config, CIMultiDict(several), SW_PAYLOAD, SW_TIMESTAMP) == SW_MSG_ID
        now = SW_TIMESTAMP
        wrong = {**headers, "webhook-signature": SW_WRONG}
        assert refusal_of(config, wrong, SW_PAYLOAD, now) == "bad_signature"
        only_others = {**headers, "webhook-signature": " ".join(SW_OTHERS)}
        assert refusal_of(config, only_others, SW_PAYLOAD, now) == "bad_signature"
        v2_only = {**headers, "webhook-signature": SW_OTHERS[1]}
        assert refusal_of(config, v2_only, SW_PAYLOAD, now) == "no_signature"
        assert refusal_of(config, headers, SW_PAYLOAD + b" ", now) == "bad_signature"
        # The id is signed: another id (to slip past the dedupe) breaks the signature.
        other_id = {**headers, "webhook-id": "msg_other"}
        assert refusal_of(config, other_id, SW_PAYLOAD, now) == "bad_signature"
        for name in ("webhook-id", "webhook-signature"):
            missing = {k: v for k, v in headers.items() if k != name}
            assert refusal_of(config, missing, SW_PAYLOAD, now) == "no_signature"
        for stamp in (None, "hello", "1614265330.5", "-1614265330"):
            bad = {k: v for k, v in headers.items() if k != "webhook-timestamp"}
            if stamp is not None:
                bad["webhook-timestamp"] = stamp
            assert refusal_of(config, bad, SW_PAYLOAD, now) == "bad_timestamp"
        # Five minutes either way (the specification's tolerance), then a replay.
        assert refusal_of(config, headers, SW_PAYLOAD, now + 301) == "stale_timestamp"
        assert refusal_of(config, headers, SW_PAYLOAD, now - 301) == "stale_timestamp"
        assert verify_delivery(config, CIMultiDict(headers), SW_PAYLOAD, now + 300) == SW_MSG_ID


def test_stripe_vector_verifies_within_the_tolerance_only() -> None:
    config = WebhookConfig(STRIPE_SECRET, **STRIPE_CONFIG)
    header = {"Stripe-Signature": STRIPE_HEADER}
    # EventUtilityTest.ConstructEvent: 100 s after the timestamp, tolerance 300 s.
    assert verify_delivery(config, CIMultiDict(header), STRIPE_BODY, STRIPE_TIMESTAMP + 100) is None
    # RejectOutdatedTimestamp: 400 s after it.
    assert refusal_of(config, header, STRIPE_BODY, STRIPE_TIMESTAMP + 400) == "stale_timestamp"
    # RejectIncorrectSignature: the body changed.
    changed = STRIPE_BODY + b"this_changes_the_json"
    assert refusal_of(config, header, changed, STRIPE_TIMESTAMP) == "bad_signature"
    # ValidateSignatureHandlesIncorrectHeaderValues.
    for value in (
        "t=," + STRIPE_HEADER.split(",", 1)[1],
        "t,v1=,v0=",
        "t,v1=,v0",
        "t,,",
        ",,",
        "t",
    ):
        assert refusal_of(config, {"Stripe-Signature": value}, STRIPE_BODY, STRIPE_TIMESTAMP) in (
            "bad_timestamp",
            "no_signature",
        ), value
    # Only v0 (Stripe's test-mode scheme): no signature this receiver reads.
    v0 = {"Stripe-Signature": f"t={STRIPE_TIMESTAMP},v0=" + "ab" * 32}
    assert refusal_of(config, v0, STRIPE_BODY, STRIPE_TIMESTAMP) == "no_signature"
    two_stamps = {"Stripe-Signature": f"t={STRIPE_TIMESTAMP},{STRIPE_HEADER}"}
    assert refusal_of(config, two_stamps, STRIPE_BODY, STRIPE_TIMESTAMP) == "bad_timestamp"
    ours = timestamped_headers([STRIPE_SECRET], STRIPE_BODY, STRIPE_TIMESTAMP)
    assert ours["Stripe-Signature"] == STRIPE_HEADER.rsplit(",v0=", 1)[0]
    tight = WebhookConfig(STRIPE_SECRET, **STRIPE_CONFIG, timestamp_tolerance=30)
    assert refusal_of(tight, header, STRIPE_BODY, STRIPE_TIMESTAMP + 31) == "stale_timestamp"


# --- over HTTP, from the senders above ----------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[WebhookEvent] = []

    async def __call__(self, event: WebhookEvent) -> None:
        self.events.append(event)


Post = Callable[[bytes, Mapping[str, str]], Awaitable[tuple[int, dict[str, Any]]]]
Start = Callable[..., Awaitable[tuple[WebhookReceiver, Recorder, Post]]]


@pytest.fixture
async def started() -> AsyncIterator[Start]:
    """``await started(secret, store=, clock=, **config)`` -> (a listening receiver, its handler,
    ``post(body, headers)`` -> (status, answer))."""
    receivers: list[WebhookReceiver] = []
    async with aiohttp.ClientSession() as session:

        async def start(
            secret: str,
            *,
            store: str | None = None,
            clock: Callable[[], float] = time.time,
            **options: Any,
        ) -> tuple[WebhookReceiver, Recorder, Post]:
            handler = Recorder()
            config = WebhookConfig(secret, **options)
            receiver = WebhookReceiver(config, handler, store=store, clock=clock)
            url = await receiver.listen("127.0.0.1", 0)
            receivers.append(receiver)

            async def post(body: bytes, headers: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
                async with session.post(url, data=body, headers=dict(headers)) as response:
                    return response.status, orjson.loads(await response.read() or b"{}")

            return receiver, handler, post

        yield start
        for receiver in receivers:
            await receiver.aclose(timeout=1.0)


def storeless(event_id: str, topic: str = "subscriptions/update", record_id: int = 7) -> bytes:
    """What the sender of the issue sent: no store field."""
    return orjson.dumps({"id": event_id, "topic": topic, "data": {"id": record_id}})


SECRET = "per-store-secret-acme"
NEW, OLD = "rotated-secret-new", "rotated-secret-old"
SW_NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()
SW_OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()


@pytest.mark.parametrize("encoding", ["hex", "base64"])
async def test_hmac_of_the_body_with_store_less_bodies(started: Start, encoding: str) -> None:
    receiver, handler, post = await started(SECRET, store="acme", encoding=encoding)
    update, delete = storeless("e-1"), storeless("e-2", "subscriptions/delete")
    assert (await post(update, hmac_headers(SECRET, update, encoding=encoding)))[0] == 200
    assert (await post(delete, hmac_headers(SECRET, delete, encoding=encoding)))[0] == 200
    other = "base64" if encoding == "hex" else "hex"
    answer = await post(storeless("e-3"), hmac_headers(SECRET, storeless("e-3"), encoding=other))
    assert answer[0] == 401
    await receiver.join()
    assert [(e.id, e.is_delete, e.store) for e in handler.events] == [
        ("e-1", False, None),
        ("e-2", True, None),
    ]


async def test_timestamped_scheme_from_a_stripe_style_sender(started: Start) -> None:
    receiver, handler, post = await started(SECRET, store="acme", **STRIPE_CONFIG)
    now = int(time.time())
    body = orjson.dumps({"id": "evt_1", "type": "subscription.deleted", "data": {"id": 9}})
    assert await post(body, timestamped_headers([SECRET], body, now)) == (
        200,
        {"status": "accepted"},
    )
    # The same delivery captured and replayed an hour later: its signed t= gives it away.
    replay = orjson.dumps({"id": "evt_2", "type": "subscription.deleted", "data": {"id": 9}})
    old = timestamped_headers([SECRET], replay, now - 3600)
    assert await post(replay, old) == (401, {"status": "unauthorized", "reason": "stale_timestamp"})
    await receiver.join()
    assert [(e.id, e.resource, e.is_delete) for e in handler.events] == [
        ("evt_1", "subscriptions", True)
    ]


async def test_standard_webhooks_from_a_sender_written_from_the_spec(started: Start) -> None:
    receiver, handler, post = await started(
        SW_NEW, store="acme", scheme="standard-webhooks", topic_key="type"
    )
    now = int(time.time())
    # The body's "id" is not the event id: the signed webhook-id is.
    body = orjson.dumps({"id": "body-id", "type": "subscription.updated", "data": {"id": 3}})
    assert (await post(body, standard_headers([SW_NEW], "msg_1", now, body)))[0] == 200
    # The sender's retry: same message id, a fresh timestamp and signature.
    assert await post(body, standard_headers([SW_NEW], "msg_1", now + 5, body)) == (
        200,
        {"status": "duplicate"},
    )
    assert (await post(body, standard_headers([SW_NEW], "msg_2", now, body)))[0] == 200
    stale = standard_headers([SW_NEW], "msg_3", now - 301, body)
    assert await post(body, stale) == (401, {"status": "unauthorized", "reason": "stale_timestamp"})
    # Unsigned headers of another scheme decide nothing.
    assert (await post(body, hmac_headers(SW_NEW, body)))[1]["reason"] == "no_signature"
    await receiver.join()
    assert [e.id for e in handler.events] == ["msg_1", "msg_2"]


@pytest.mark.parametrize("scheme", ["hmac", "timestamped", "standard-webhooks"])
async def test_rotation_with_two_secrets(started: Start, scheme: str) -> None:
    new, old = (SW_NEW, SW_OLD) if scheme == "standard-webhooks" else (NEW, OLD)
    stranger = "whsec_" + base64.b64encode(b"s" * 32).decode() if scheme != "hmac" else "x"
    receiver, handler, post = await started(new, previous_secrets=[old], scheme=scheme)
    now = int(time.time())

    def headers(secrets: list[str], body: bytes, msg_id: str) -> dict[str, str]:
        if scheme == "standard-webhooks":
            return standard_headers(secrets, msg_id, now, body)
        if scheme == "timestamped":
            return timestamped_headers(secrets, body, now, header="X-Service-Signature")
        values = [hmac_headers(s, body)["X-Service-Signature"] for s in secrets]
        return {"X-Service-Signature": ", ".join(values)}

    for i, secrets in enumerate([[old], [new], [new, old], [stranger, new]]):
        body = storeless(f"r-{i}")
        assert (await post(body, headers(secrets, body, f"msg_{i}")))[0] == 200, secrets
    body = storeless("r-9")
    assert (await post(body, headers([stranger], body, "msg_9")))[1]["reason"] == "bad_signature"
    await receiver.join()
    assert len(handler.events) == 4
    # A receiver that knows only the new secret accepts a sender that signs with both.
    receiver2, handler2, post2 = await started(new, scheme=scheme)
    body = storeless("r-10")
    assert (await post2(body, headers([old, new], body, "msg_10")))[0] == 200
    await receiver2.join()
    assert len(handler2.events) == 1


@pytest.mark.parametrize("scheme", ["hmac", "timestamped", "standard-webhooks"])
def test_a_signature_field_sent_in_several_lines_is_one_list(scheme: str) -> None:
    """A rotation's signatures, each in a line of its own (RFC 9110 5.3: one list), as a
    sender or a proxy may split them: the receiver's own is read from the second line."""
    new, old = (SW_NEW, SW_OLD) if scheme == "standard-webhooks" else (NEW, OLD)
    sender = WebhookConfig(old, previous_secrets=[new], scheme=scheme)
    receiver = WebhookConfig(new, scheme=scheme)
    body, now = storeless("r-1"), time.time()
    sent = signed_headers(sender, body, timestamp=now, event_id="msg_1")
    name = sender.signature_header
    lines = CIMultiDict((k, v) for k, v in sent.items() if k != name)
    for value in sent[name].split(" " if scheme == "standard-webhooks" else ","):
        lines.add(name, value)
    assert len(lines.getall(name)) >= 2
    verify_delivery(receiver, lines, body, now)  # raises DeliveryRefused otherwise
    one_line = CIMultiDict((k, v) for k, v in lines.items() if k != name)
    one_line.add(name, lines.getall(name)[0])  # the old secret's only
    with pytest.raises(DeliveryRefused):
        verify_delivery(receiver, one_line, body, now)


def test_a_timestamped_sender_with_a_line_per_secret_is_read_line_by_line() -> None:
    """t=...,v1=... once per secret, each in a line of its own: two t= in one list."""
    receiver = WebhookConfig(NEW, scheme="timestamped")
    body, now = storeless("r-1"), time.time()
    name = receiver.signature_header
    lines: CIMultiDict[str] = CIMultiDict()
    for secret in (OLD, NEW):  # the receiver's own in the second line
        lines.add(name, timestamped_headers([secret], body, int(now), header=name)[name])
    verify_delivery(receiver, lines, body, now)  # raises DeliveryRefused otherwise
    old_only: CIMultiDict[str] = CIMultiDict()
    for _ in range(2):
        old_only.add(name, lines.getall(name)[0])
    with pytest.raises(DeliveryRefused):
        verify_delivery(receiver, old_only, body, now)


# --- stores --------------------------------------------------------------------------------------


async def test_per_store_secrets_take_bodies_that_name_no_store_or_name_it_otherwise(
    started: Start,
) -> None:
    """Each store's own secret: its URL and signature say which store a delivery is for."""
    acme, acme_events, post_acme = await started("acme-secret", store="acme")
    globex, globex_events, post_globex = await started(
        "globex-secret", store="globex", shared_secret=False
    )
    body = storeless("s-1")
    assert (await post_acme(body, hmac_headers("acme-secret", body)))[0] == 200
    assert (await post_globex(body, hmac_headers("globex-secret", body)))[0] == 200
    # Said to be the store's own, a secret takes a body naming the store by its shop domain.
    named = orjson.dumps({"id": "s-2", "topic": "orders/create", "store": "globex.example"})
    assert (await post_globex(named, hmac_headers("globex-secret", named)))[0] == 200
    # Another store's secret is another store's delivery.
    assert (await post_acme(body, hmac_headers("globex-secret", body)))[0] == 401
    await acme.join()
    await globex.join()
    assert [e.id for e in acme_events.events] == ["s-1"]
    assert [(e.id, e.store) for e in globex_events.events] == [
        ("s-1", None),
        ("s-2", "globex.example"),
    ]


def test_a_shared_secret_without_a_way_to_bind_is_refused_before_starting() -> None:
    shared = "one-secret-for-all"
    configs = {name: WebhookConfig(shared) for name in ("acme", "globex")}
    configs["initech"] = WebhookConfig("initech-own")
    with pytest.raises(ConfigError) as info:
        resolve_store_binding(configs, name=lambda store, key: f"stores.{store}.webhook_{key}")
    message = str(info.value)
    assert "stores acme, globex share a webhook secret" in message
    assert "stores.acme.webhook_store_id, stores.globex.webhook_store_id" in message
    assert "initech" not in message
    assert shared not in message
    # A previous secret shared with another store's current one is sharing too.
    rotated = {"acme": WebhookConfig("new", previous_secrets=[shared]), "globex": configs["globex"]}
    with pytest.raises(ConfigError, match="store_id of store acme, store_id of store globex"):
        resolve_store_binding(rotated)
    same_id = {n: WebhookConfig(shared, store_id="shop") for n in ("acme", "globex")}
    with pytest.raises(ConfigError, match="the same store id 'shop'"):
        resolve_store_binding(same_id)
    no_field = {n: WebhookConfig(shared, store_key=None) for n in ("acme", "globex")}
    with pytest.raises(ConfigError, match="store_key of store acme"):
        resolve_store_binding(no_field)
    with pytest.raises(ConfigError, match="shared_secret=True needs store_id"):
        WebhookConfig(shared, shared_secret=True)

    bound = resolve_store_binding(
        {
            "acme": WebhookConfig(shared, store_id="acme.example"),
            "globex": WebhookConfig(shared, store_id="globex.example"),
            "initech": WebhookConfig("initech-own"),
        }
    )
    assert {n: (c.shared_secret, c.store_id) for n, c in bound.items()} == {
        "acme": (True, "acme.example"),
        "globex": (True, "globex.example"),
        "initech": (False, None),
    }


async def test_a_shared_secret_binds_by_the_value_the_service_sends(started: Start) -> None:
    shared = "one-secret-for-all"
    receiver, handler, post = await started(
        shared, store="acme", store_key="shop", store_id="acme.example", shared_secret=True
    )

    def body(event_id: str, shop: str | None) -> bytes:
        payload = {"id": event_id, "topic": "subscriptions/delete", "data": {"id": 1}}
        return orjson.dumps(payload if shop is None else {**payload, "shop": shop})

    for event_id, shop, status in [
        ("b-1", "acme.example", 200),
        ("b-2", "globex.example", 403),  # a genuine globex delivery replayed to acme's URL
        ("b-3", None, 403),  # cannot be told apart from one for globex
        ("b-4", "acme", 403),  # the user's name for the store is not what the service sends
    ]:
        sent = body(event_id, shop)
        assert (await post(sent, hmac_headers(shared, sent)))[0] == status, event_id
    await receiver.join()
    assert [e.id for e in handler.events] == ["b-1"]
    assert receiver.stats.refusals == {"wrong_store": 3}


# --- refusals ------------------------------------------------------------------------------------


async def test_refusals_are_counted_per_reason_and_warned_once_each(
    started: Start, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="asyncsubs.webhooks")
    now = 1_800_000_000
    receiver, handler, post = await started(
        SECRET,
        store="acme",
        clock=lambda: now,
        scheme="timestamped",
        signature_header="Stripe-Signature",
    )
    body = storeless("x-1")
    for _ in range(3):
        assert (await post(body, timestamped_headers(["wrong"], body, now)))[0] == 401
    for _ in range(2):
        assert (await post(body, {}))[0] == 401
        assert (await post(body, timestamped_headers([SECRET], body, now - 900)))[0] == 401
    assert (await post(b"[]", timestamped_headers([SECRET], b"[]", now)))[0] == 400
    stats = receiver.stats
    assert stats.refusals == {
        "bad_signature": 3,
        "no_signature": 2,
        "stale_timestamp": 2,
        "not_an_event": 1,
    }
    assert (stats.refused, stats.unauthorized, stats.bad_request) == (8, 7, 1)
    records = [r for r in caplog.records if r.name == "asyncsubs.webhooks" and "refused" in r.msg]
    warnings = [r for r in records if r.levelno == logging.WARNING]
    assert sorted(r.webhook_refusal for r in warnings) == sorted(stats.refusals)
    assert all(r.webhook_store == "acme" for r in records)
    assert len(records) - len(warnings) == 4  # the rest at DEBUG
    by_reason = {r.webhook_refusal: r.getMessage() for r in warnings}
    assert "Check the webhook secret" in by_reason["bad_signature"]
    assert "Check the signature scheme" in by_reason["no_signature"]
    assert "is 900 s in the past" in by_reason["stale_timestamp"]
    assert "this host's clock" in by_reason["stale_timestamp"]
    assert all(SECRET not in r.getMessage() for r in records)
    assert Refusal("wrong_store").status == 403
    assert "store_id" in Refusal.WRONG_STORE.hint
    # A snapshot: later refusals do not change it.
    await post(body, {})
    assert stats.refusals["no_signature"] == 2
    assert receiver.stats.refusals["no_signature"] == 3
    assert handler.events == []


async def test_on_refused_is_told_each_refusal_and_cannot_change_its_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    told: list[DeliveryRefused] = []

    def on_refused(refused: DeliveryRefused) -> None:
        told.append(refused)
        if len(told) == 2:
            raise RuntimeError("a bug in the display")

    config = WebhookConfig(SECRET)
    receiver = WebhookReceiver(config, Recorder(), store="acme", on_refused=on_refused)
    url = await receiver.listen("127.0.0.1", 0)
    body = storeless("o-1")
    statuses = []
    try:
        async with aiohttp.ClientSession() as session:
            for headers in ({}, hmac_headers("wrong", body), hmac_headers("wrong", body)):
                async with session.post(url, data=body, headers=headers) as response:
                    statuses.append(response.status)
    finally:
        await receiver.aclose(timeout=1.0)
    assert statuses == [401, 401, 401]
    assert [r.refusal for r in told] == [
        Refusal.NO_SIGNATURE,
        Refusal.BAD_SIGNATURE,
        Refusal.BAD_SIGNATURE,
    ]
    assert "no signature" in told[1].detail
    assert "webhooks for store acme: on_refused raised" in caplog.text
    with pytest.raises(ConfigError, match="on_refused must be a function"):
        WebhookReceiver(config, Recorder(), on_refused=5)  # type: ignore[arg-type]


def test_scheme_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="scheme must be one of"):
        WebhookConfig(SECRET, scheme="svix")
    with pytest.raises(ConfigError) as info:
        WebhookConfig("whsec_not base64!", scheme="standard-webhooks")
    assert "not base64" not in str(info.value)
    with pytest.raises(ConfigError, match="HMAC-SHA256 in base64"):
        WebhookConfig(SW_SECRET, scheme="standard-webhooks", encoding="hex")
    with pytest.raises(ConfigError, match="timestamp_header is for the hmac scheme"):
        WebhookConfig(SECRET, scheme="timestamped", timestamp_header="X-Time")
    with pytest.raises(ConfigError, match="id_header is for the standard-webhooks scheme"):
        WebhookConfig(SECRET, id_header="X-Service-Event-Id")
    with pytest.raises(ConfigError, match="signature_prefix is for the hmac scheme"):
        WebhookConfig(SW_SECRET, scheme="standard-webhooks", signature_prefix="v1,")
    svix = WebhookConfig(
        SW_SECRET,
        scheme="standard-webhooks",
        id_header="svix-id",
        timestamp_header="svix-timestamp",
        signature_header="svix-signature",
    )
    headers = signed_headers(svix, SW_PAYLOAD, timestamp=SW_TIMESTAMP, event_id=SW_MSG_ID)
    assert headers == {
        "svix-id": SW_MSG_ID,
        "svix-timestamp": str(SW_TIMESTAMP),
        "svix-signature": SW_SIGNATURE,
    }
    assert SW_SECRET not in repr(svix)
    assert pickle.loads(pickle.dumps(svix)) == svix
    refused = pickle.loads(pickle.dumps(DeliveryRefused(Refusal.BAD_SIGNATURE, "no match")))
    assert (refused.refusal, str(refused)) == (Refusal.BAD_SIGNATURE, "bad_signature: no match")


@pytest.mark.parametrize(
    ("options", "config"),
    [
        ({"scheme": "standard-webhooks", "store_key": None}, {"scheme": "standard-webhooks"}),
        (
            {"scheme": "timestamped", "store_ids": {"acme": "acme.example"}},
            {"scheme": "timestamped", "store_id": "acme.example", "shared_secret": True},
        ),
    ],
    ids=["standard-webhooks", "timestamped"],
)
async def test_the_fake_sender_signs_with_the_other_schemes(
    options: dict[str, Any], config: dict[str, Any]
) -> None:
    secret = SW_NEW
    handler = Recorder()
    receiver = WebhookReceiver(WebhookConfig(secret, **config), handler, store="acme")
    async with FakeAdminServer(stores=[FakeStoreConfig("acme", records=20)]) as server:
        url = await receiver.listen()
        try:
            sender = await server.deliver_webhooks(url, secret, drop_fraction=0.0, **options)
            await server.mutator("acme", seed=3).run(steps=15)
            await sender.join()
            await receiver.join()
        finally:
            await receiver.aclose()
    assert sender.stats.delivered == sender.stats.events > 0
    assert [e.id for e in handler.events] == [d.event_id for d in sender.deliveries]
    expected_store = None if options.get("store_key", "store") is None else "acme.example"
    assert {e.store for e in handler.events} == {expected_store}
