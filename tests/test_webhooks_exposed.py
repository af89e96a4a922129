"""Webhook receivers on an open port: what survives a crash (a real process SIGKILLed after
acknowledging), and what slow, idle, numerous or vanishing clients can hold.

The crash tests run the receiver in a child process whose handler never finishes, so every
acknowledged event is still unhandled when the child is killed: without the inbox each one
would be lost. Listener deadlines are real (loopback sockets), kept to fractions of a second.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import signal
import sqlite3
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from asyncsubs import ConfigError
from asyncsubs.webhooks import (
    InboxEntry,
    ListenerLimits,
    SQLiteDeadLetters,
    SQLiteInbox,
    WebhookConfig,
    WebhookEvent,
    WebhookReceiver,
)

SECRET = "whsec-exposed"


def body_of(event_id: str, store: str = "acme", *, topic: str = "subscriptions/update") -> bytes:
    record = {"id": event_id, "updatedAt": "2030-01-01T00:00:00Z"}
    return orjson.dumps({"id": event_id, "topic": topic, "store": store, "data": record})


def signed(body: bytes) -> dict[str, str]:
    return {"X-Service-Signature": hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()}


class Recorder:
    def __init__(self) -> None:
        self.ids: list[str] = []

    async def __call__(self, event: WebhookEvent) -> None:
        self.ids.append(event.id)


# --- the durable inbox ---------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from asyncsubs.webhooks import SQLiteInbox, WebhookConfig, WebhookReceiver

    async def main():
        async def never(event):
            await asyncio.Event().wait()   # acknowledged events pile up unhandled
        inbox = SQLiteInbox(sys.argv[1]) if sys.argv[2] == "inbox" else None
        receiver = WebhookReceiver(
            WebhookConfig(sys.argv[3], queue_size=10_000), never, store="acme", inbox=inbox
        )
        print(await receiver.listen("127.0.0.1", 0), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


async def _flood_then_kill(db: Path, mode: str, count: int) -> list[str]:
    """Start a receiver process, post ``count`` deliveries (8 at a time), SIGKILL it once every
    one is answered; returns the ids answered 200 accepted."""
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", _CHILD, str(db), mode, SECRET),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    accepted: list[str] = []
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            url = (await proc.stdout.readline()).decode().strip()
        assert url.startswith("http://"), url
        slots = asyncio.Semaphore(8)
        async with aiohttp.ClientSession() as session:

            async def post(event_id: str) -> None:
                body = body_of(event_id)
                async with slots, session.post(url, data=body, headers=signed(body)) as resp:
                    if resp.status == 200 and (await resp.json())["status"] == "accepted":
                        accepted.append(event_id)

            await asyncio.gather(*(post(f"e{i}") for i in range(count)))
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
    return accepted


async def test_sigkill_after_acknowledging_loses_nothing_with_an_inbox(tmp_path: Path) -> None:
    db = tmp_path / "hooks.db"
    accepted = await _flood_then_kill(db, "inbox", 300)
    assert len(accepted) == 300

    # A new process (here: this one) with the same inbox handles every acknowledged event.
    handler = Recorder()
    inbox = SQLiteInbox(db)
    receiver = WebhookReceiver(WebhookConfig(SECRET), handler, store="acme", inbox=inbox)
    try:
        await receiver.start()
        await receiver.join()
        assert sorted(handler.ids) == sorted(accepted)  # each exactly once
        assert await inbox.pending("acme") == []  # pruned once handled
    finally:
        await receiver.aclose()
        await inbox.aclose()


async def test_an_inbox_that_cannot_be_written_answers_503_and_nothing_is_acknowledged(
    tmp_path: Path,
) -> None:
    class Broken(SQLiteInbox):
        async def add(self, entry: InboxEntry) -> bool:
            raise sqlite3.OperationalError("database is locked")

    handler = Recorder()
    inbox = Broken(tmp_path / "hooks.db")
    receiver = WebhookReceiver(WebhookConfig(SECRET), handler, inbox=inbox)
    url = await receiver.listen()
    try:
        async with aiohttp.ClientSession() as session:
            body = body_of("e1")
            async with session.post(url, data=body, headers=signed(body)) as resp:
                assert (resp.status, resp.headers["Retry-After"]) == (503, "1")
            # Not remembered as seen: the sender's retry is accepted once the inbox works.
            inbox.add = SQLiteInbox.add.__get__(inbox)  # type: ignore[method-assign]
            async with session.post(url, data=body, headers=signed(body)) as resp:
                assert (await resp.json())["status"] == "accepted"
        await receiver.join()
        assert handler.ids == ["e1"]
    finally:
        await receiver.aclose()
        await inbox.aclose()


async def test_close_leaves_unfinished_events_in_the_inbox_for_the_next_start(
    tmp_path: Path,
) -> None:
    gate = asyncio.Event()
    seen: list[str] = []

    async def stuck(event: WebhookEvent) -> None:
        seen.append(event.id)
        await gate.wait()

    inbox = SQLiteInbox(tmp_path / "hooks.db")
    dead = SQLiteDeadLetters(tmp_path / "hooks.db")
    receiver = WebhookReceiver(WebhookConfig(SECRET), stuck, inbox=inbox, dead_letters=dead)
    url = await receiver.listen()
    async with aiohttp.ClientSession() as session:
        for event_id in ("a", "b"):
            body = body_of(event_id)
            async with session.post(url, data=body, headers=signed(body)) as resp:
                assert resp.status == 200
    await receiver.aclose(timeout=0.01)
    assert await dead.all() == []  # not dead letters: still to do
    assert [e.event_id for e in await inbox.pending("")] == ["a", "b"]

    handler = Recorder()
    again = WebhookReceiver(WebhookConfig(SECRET), handler, inbox=inbox, dead_letters=dead)
    async with again:
        await again.join()
    assert handler.ids == ["a", "b"]
    assert await inbox.pending("") == []
    await inbox.aclose()
    await dead.aclose()


def failing_receiver(tmp_path: Path) -> tuple[WebhookReceiver, list[str]]:
    """A receiver of store acme over a SQLite inbox and dead letters in ``tmp_path``, whose
    handler fails every attempt (two an event), and the event ids it was called with."""
    calls: list[str] = []

    async def failing(event: WebhookEvent) -> None:
        calls.append(event.id)
        raise RuntimeError("still broken")

    inbox = SQLiteInbox(tmp_path / "hooks.db")
    dead = SQLiteDeadLetters(tmp_path / "hooks.db")
    config = WebhookConfig(SECRET, max_handler_attempts=2)
    return WebhookReceiver(config, failing, store="acme", inbox=inbox, dead_letters=dead), calls


async def deliver(receiver: WebhookReceiver, event_id: str) -> None:
    url = await receiver.listen()
    async with aiohttp.ClientSession() as session:
        body = body_of(event_id)
        async with session.post(url, data=body, headers=signed(body)) as resp:
            assert resp.status == 200
    await receiver.join()


async def test_requeued_dead_letters_count_their_attempts_and_stop_at_the_bound(
    tmp_path: Path,
) -> None:
    receiver, calls = failing_receiver(tmp_path)
    inbox, dead = receiver.inbox, receiver.dead_letters
    assert inbox is not None
    async with receiver:
        await deliver(receiver, "x")
        assert [(d.event_id, d.attempts, d.store) for d in await dead.all()] == [("x", 2, "acme")]
        assert await receiver.requeue_dead_letters(max_attempts=4) == 1
        await receiver.join()
        assert [d.attempts for d in await dead.all()] == [4]
        assert await receiver.requeue_dead_letters(max_attempts=4) == 0  # bound reached
    assert len(calls) == 4
    assert await inbox.pending("acme") == []
    await inbox.aclose()
    await dead.aclose()


async def test_dead_letters_requeued_before_start_are_handled_once(tmp_path: Path) -> None:
    """Requeued before the receiver starts, a dead letter goes into the inbox; ``start`` queues
    it with the rest of the inbox, once (not once from each)."""
    first, calls = failing_receiver(tmp_path)
    async with first:
        await deliver(first, "x")
    receiver, more = failing_receiver(tmp_path)
    inbox, dead = receiver.inbox, receiver.dead_letters
    assert inbox is not None
    assert await receiver.requeue_dead_letters() == 1
    assert [e.event_id for e in await inbox.pending("acme")] == ["x"]
    await receiver.start()
    await receiver.join()
    await receiver.aclose()
    assert calls + more == ["x"] * 4  # two attempts in each life
    assert [d.attempts for d in await dead.all()] == [4]
    for stores in ((first.inbox, first.dead_letters), (inbox, dead)):
        for store in stores:
            await store.aclose()


# --- the listener --------------------------------------------------------------------------------


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[WebhookReceiver, str, int]]:
    limits = ListenerLimits(
        read_timeout=0.3, idle_timeout=0.3, max_connections=4, max_buffered_bytes=3000
    )
    receiver = WebhookReceiver(WebhookConfig(SECRET, max_body_bytes=10_000), Recorder())
    url = await receiver.listen(limits=limits)
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    yield receiver, url, port
    await receiver.aclose(timeout=1.0)


async def _open(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


def _head(length: int) -> bytes:
    return (
        f"POST /webhooks HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
        "Content-Type: application/json\r\n\r\n"
    ).encode()


async def _closed_after(reader: asyncio.StreamReader) -> float:
    started = time.monotonic()
    async with asyncio.timeout(5):
        while await reader.read(1024):
            pass
    return time.monotonic() - started


async def test_a_dripping_client_is_cut_off_at_the_read_timeout(
    guarded: tuple[WebhookReceiver, str, int], caplog: pytest.LogCaptureFixture
) -> None:
    receiver, _, port = guarded
    caplog.set_level(logging.DEBUG, logger="asyncsubs")
    # Headers one byte at a time: never complete before the deadline.
    reader, writer = await _open(port)
    writer.write(b"POST /webh")
    # Headers done, body dripping: the handler is reading it when the deadline cuts it.
    reader2, writer2 = await _open(port)
    writer2.write(_head(500) + b"{")
    assert await _closed_after(reader) < 2.0
    assert await _closed_after(reader2) < 2.0
    for w in (writer, writer2):
        w.close()
    await asyncio.sleep(0)
    assert receiver.stats.disconnected == 1  # the one whose handler was reading
    assert "client disconnected mid-body" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_an_idle_kept_alive_connection_is_closed(
    guarded: tuple[WebhookReceiver, str, int],
) -> None:
    receiver, _, port = guarded
    reader, writer = await _open(port)
    body = body_of("k1")
    head = _head(len(body)).replace(b"\r\n\r\n", b"\r\n" + _sig_line(body) + b"\r\n\r\n")
    writer.write(head + body)
    assert b"200 OK" in await reader.readline()
    assert await _closed_after(reader) < 2.0  # idle 0.3 s (+ read 0.3 s) at most
    writer.close()
    await receiver.join()


def _sig_line(body: bytes) -> bytes:
    return f"X-Service-Signature: {signed(body)['X-Service-Signature']}".encode()


async def test_connections_beyond_the_cap_are_answered_503(
    guarded: tuple[WebhookReceiver, str, int],
) -> None:
    _, url, port = guarded
    held = [await _open(port) for _ in range(4)]
    await asyncio.sleep(0.01)  # let the server take them (no event to wait for in a socket)
    reader, writer = await _open(port)
    assert (await reader.read(1024)).startswith(b"HTTP/1.1 503")
    writer.close()
    for _, w in held:
        w.close()
    # Once they are gone, deliveries go through again.
    async with asyncio.timeout(5):
        while True:
            body = body_of("after")
            async with (
                aiohttp.ClientSession() as session,
                session.post(url, data=body, headers=signed(body)) as resp,
            ):
                if resp.status == 200:
                    break


async def test_bodies_being_read_share_one_byte_budget(
    guarded: tuple[WebhookReceiver, str, int],
) -> None:
    receiver, url, port = guarded
    # A stalled client holds 2,500 of the 3,000 bytes (its body is 5,000, below the 10,000 max).
    reader, writer = await _open(port)
    writer.write(_head(5000) + b" " * 2500)
    await writer.drain()
    await asyncio.sleep(0.05)  # the server reads what was sent (no event to wait for)
    body = orjson.dumps({"id": "big", "topic": "orders/create", "pad": "x" * 900})
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=signed(body)) as resp,
    ):
        assert resp.status == 503
    assert await _closed_after(reader) < 2.0  # then the stalled one times out
    writer.close()
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body, headers=signed(body)) as resp,
    ):
        assert resp.status == 200
    assert receiver.stats.unavailable == 1


def test_listener_limits_are_checked() -> None:
    for bad in ({"read_timeout": 0}, {"max_connections": 1.5}, {"idle_timeout": float("inf")}):
        with pytest.raises(ConfigError):
            ListenerLimits(**bad)  # type: ignore[arg-type]


async def test_a_dead_letter_that_cannot_be_saved_stays_in_the_inbox(tmp_path: Path) -> None:
    class Broken(SQLiteDeadLetters):
        async def add(self, letter: object) -> None:
            raise sqlite3.OperationalError("database is locked")

    async def failing(event: WebhookEvent) -> None:
        raise RuntimeError("cannot apply")

    inbox = SQLiteInbox(tmp_path / "hooks.db")
    dead = Broken(tmp_path / "hooks.db")
    config = WebhookConfig(SECRET, max_handler_attempts=1)
    receiver = WebhookReceiver(config, failing, inbox=inbox, dead_letters=dead)
    async with receiver:
        url = await receiver.listen()
        async with aiohttp.ClientSession() as session:
            body = body_of("kept")
            async with session.post(url, data=body, headers=signed(body)) as resp:
                assert resp.status == 200
        await receiver.join()
    stats = receiver.stats
    assert (stats.dead_lettered, stats.unsaved, stats.unfinished) == (0, 0, 1)
    assert [e.event_id for e in await inbox.pending("")] == ["kept"]  # not lost
    await inbox.aclose()
    await dead.aclose()


async def test_concurrent_inbox_writes_share_commits_and_fail_together(tmp_path: Path) -> None:
    class Counting(SQLiteInbox):
        transactions = 0

        def _write_all(self, statements: list[tuple[str, tuple[object, ...]]]) -> list[int]:
            self.transactions += 1
            return super()._write_all(statements)

    inbox = Counting(tmp_path / "hooks.db")
    entries = [InboxEntry("acme", f"e{i}", b"{}", 0.0) for i in range(50)]
    assert await asyncio.gather(*(inbox.add(e) for e in entries)) == [True] * 50
    assert inbox.transactions < 10  # one for the first, then the rest together
    assert await inbox.add(entries[0]) is False  # already kept
    assert len(await inbox.pending("acme")) == 50

    # One transaction: when it fails, no write of it is kept and every caller hears of it.
    with sqlite3.connect(tmp_path / "hooks.db") as conn:
        conn.execute(
            "CREATE TRIGGER no_x BEFORE INSERT ON webhook_inbox WHEN NEW.event_id = 'x'"
            " BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
    results = await asyncio.gather(
        inbox.add(InboxEntry("acme", "y", b"{}", 0.0)),
        inbox.add(InboxEntry("acme", "x", b"{}", 0.0)),
        return_exceptions=True,
    )
    assert all(isinstance(r, sqlite3.IntegrityError) for r in results), results
    assert "y" not in {e.event_id for e in await inbox.pending("acme")}
    assert await inbox.add(InboxEntry("acme", "y", b"{}", 0.0)) is True  # alone, it is fine
    await inbox.aclose()
