"""Prefetch through the transport seam: an in-memory Transport, no sockets."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from asyncsubs import AdminClient, Limits, Rate, errors
from asyncsubs._protocol import RawResponse, Request

PAGES = 6


class PagedTransport:
    """Serves PAGES pages of 2 records; page i is fetched with afterCursor=c{i}."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.sent: list[str] = []
        self.fail_on = fail_on
        self.closed = False

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        self.sent.append(request.url)
        index = (
            int(request.url.rsplit("afterCursor=c", 1)[1]) if "afterCursor" in request.url else 0
        )
        if index == self.fail_on:
            return RawResponse(400, {}, b'{"success": false, "code": "BAD_REQUEST"}')
        has_next = index < PAGES - 1
        body = {
            "success": True,
            "code": "SUCCESS",
            "data": [{"id": 2 * index}, {"id": 2 * index + 1}],
            "pageInfo": {
                "hasNextPage": has_next,
                "nextCursor": f"c{index + 1}" if has_next else None,
            },
        }
        return RawResponse(200, {}, orjson.dumps(body))

    async def aclose(self) -> None:
        self.closed = True


def client_for(transport: PagedTransport) -> AdminClient:
    return AdminClient(
        token="t",
        base_url="https://subs.example",
        transport=transport,
        limits=Limits(heavy={"orders": Rate(100_000)}),
    )


async def drain_loop() -> None:
    """Let every ready task run (no time passes; this is not a timed wait)."""
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.mark.parametrize("prefetch", [0, 1, 2, 10])
async def test_prefetch_stays_within_n_pages_ahead(prefetch: int) -> None:
    transport = PagedTransport()
    async with client_for(transport) as client:
        seen: list[Any] = []
        number = 0
        async for page in client.orders.list(page_size=2, prefetch=prefetch, model=dict).pages():
            number += 1
            await drain_loop()  # give the producer every chance to run ahead
            assert len(transport.sent) == min(number + prefetch, PAGES)
            seen.extend(r["id"] for r in page.data)
    assert seen == list(range(2 * PAGES))
    assert transport.closed


async def test_prefetch_error_surfaces_after_earlier_pages() -> None:
    transport = PagedTransport(fail_on=3)
    got: list[Any] = []

    async def consume(client: AdminClient) -> None:
        async for page in client.orders.list(prefetch=3, model=dict).pages():
            got.append(page.next_cursor)

    async with client_for(transport) as client:
        with pytest.raises(errors.BadRequestError):
            await consume(client)
    assert got == ["c1", "c2", "c3"]  # every page before the failing one, checkpoint intact


async def test_breaking_out_stops_the_producer() -> None:
    transport = PagedTransport()
    async with client_for(transport) as client:
        pages = client.orders.list(prefetch=2, model=dict).pages()
        async for _ in pages:
            break
        await pages.aclose()  # type: ignore[attr-defined]
        await drain_loop()
        sent = len(transport.sent)
        await drain_loop()
    assert sent == len(transport.sent) <= 3


class StallingTransport(PagedTransport):
    """Pages as PagedTransport, but from the second page on each request stalls, and a
    cancelled one takes until ``released`` to end (a connection's orderly teardown)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.stalled = asyncio.Event()

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        if "afterCursor" not in request.url:
            return await super().send(request, timeout=timeout)
        self.stalled.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.released.wait()
            raise
        raise AssertionError("unreachable")


async def test_a_cancellation_while_the_producer_stops_is_not_lost() -> None:
    transport = StallingTransport()
    after_the_pull: list[str] = []

    async def consume(client: AdminClient) -> None:
        pages = client.orders.list(prefetch=1, model=dict).pages()
        async for _ in pages:
            await transport.stalled.wait()
            break
        await pages.aclose()  # type: ignore[attr-defined]  # waits for the producer to end
        after_the_pull.append("ran on")

    async with client_for(transport) as client:
        consumer = asyncio.create_task(consume(client))
        await transport.stalled.wait()
        await drain_loop()  # the consumer now waits in the close for the producer's end
        consumer.cancel()
        await drain_loop()
        transport.released.set()
        with pytest.raises(asyncio.CancelledError):
            await consumer
    assert after_the_pull == []


class Stop(BaseException):
    """What ``pytest.fail`` raises in a hook is a BaseException too."""


@pytest.mark.parametrize("prefetch", [0, 1, 3])
async def test_a_hook_raising_a_base_exception_ends_a_prefetching_pull(prefetch: int) -> None:
    def on_retry(event: Any) -> None:
        raise Stop(event.attempt)

    transport = PagedTransport()
    answers = [RawResponse(500, {}, b'{"success": false, "code": "INTERNAL_ERROR"}')]
    send = transport.send

    async def failing_once(request: Request, *, timeout: float) -> RawResponse:
        return answers.pop() if answers else await send(request, timeout=timeout)

    transport.send = failing_once  # type: ignore[method-assign]
    async with AdminClient(
        token="t",
        base_url="https://subs.example",
        transport=transport,
        limits=Limits(heavy={"orders": Rate(100_000)}),
        on_retry=on_retry,
    ) as client:
        pull = asyncio.create_task(anext(aiter(client.orders.list(prefetch=prefetch))))
        await drain_loop()
        assert pull.done()  # it waited for good before, for a page the producer never sent
        with pytest.raises(Stop):
            pull.result()


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_prefetch(bad: Any) -> None:
    with pytest.raises(errors.ConfigError):
        client_for(PagedTransport()).orders.list(prefetch=bad)
