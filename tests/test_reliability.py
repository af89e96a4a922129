"""Retries, injected faults, exactly-once pulls, hostile responses and token safety.

Everything runs against real aiohttp servers on loopback; retry backoffs are switched off by the
autouse ``no_retry_waits`` fixture, so no test waits out a backoff.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import ssl
import zlib
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from app_server import serving
from hostile import WireServer, assert_printable, places_holding, untrusted_tls_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncsubs import AdminClient, Limits, Rate, RetryPolicy, _json, errors
from asyncsubs.testing import FakeAdminServer, FakeStoreConfig, Faults

MakeClient = Callable[..., AdminClient]


async def all_ids(call: Any) -> list[Any]:
    return [r["id"] async for r in call]


async def test_transient_failures_are_retried_transparently(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    server.enqueue(500, {"success": False, "code": "INTERNAL_ERROR"}, path="orders")
    server.enqueue(502, b"<html>Bad Gateway</html>", {"Content-Type": "text/html"}, "orders")
    server.enqueue(200, b'{"success": true, "data": [{"id"', path="orders")  # truncated
    server.enqueue(503, b"", path="orders")
    server.enqueue(200, {"success": False, "code": "INTERNAL_ERROR"}, path="orders")  # a 500's
    async with make_client() as client:
        got = await all_ids(client.orders.list(page_size=250, model=dict))
        stats = client.stats
    assert got == [r["id"] for r in server.records("acme", "orders")]
    assert stats.pools["orders"].retries == 5


async def test_errors_after_retries_carry_attempts_and_cause(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    server.enqueue(503, {"success": False, "code": "UNAVAILABLE"}, times=None)
    async with make_client(retry=RetryPolicy(max_attempts=3)) as client:
        with pytest.raises(errors.ServerError) as info:
            await client.request("GET", "subscriptions/1")
    assert info.value.attempts == 3
    assert len(server.requests) == 3


async def test_connection_refused_is_retried_even_for_post() -> None:
    with socket.socket() as sock:  # a port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with AdminClient(
        token="t", base_url=f"http://127.0.0.1:{port}", retry=RetryPolicy(max_attempts=3)
    ) as client:
        with pytest.raises(errors.TransportError, match="cannot connect") as info:
            await client.request("POST", "subscriptions/1/pause", json={})
    assert info.value.attempts == 3
    assert not info.value.maybe_processed
    assert info.value.transient


async def test_post_not_retried_after_a_5xx_unless_opted_in(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    sub_id = server.records("acme", "subscriptions")[0]["id"]
    server.enqueue(500, {"success": False, "code": "INTERNAL_ERROR"}, method="POST")
    async with make_client() as client:
        with pytest.raises(errors.ServerError) as info:
            await client.request("POST", f"subscriptions/{sub_id}/pause", json={})
    assert info.value.attempts == 1
    server.enqueue(500, {"success": False, "code": "INTERNAL_ERROR"}, method="POST")
    async with make_client(retry=RetryPolicy(retry_non_idempotent=True)) as client:
        resp = await client.request("POST", f"subscriptions/{sub_id}/pause", json={})
    assert resp.data["status"] == "PAUSED"


async def test_post_retried_after_429(server: FakeAdminServer, make_client: MakeClient) -> None:
    sub_id = server.records("acme", "subscriptions")[0]["id"]
    server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "1"})
    async with make_client() as client:
        resp = await client.request("POST", f"subscriptions/{sub_id}/pause", json={})
    assert resp.status == 200


async def test_retry_after_beyond_cap_fails_fast(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    server.enqueue(429, {"success": False, "code": "RATE_LIMITED"}, {"Retry-After": "3600"})
    async with make_client(retry=RetryPolicy(max_retry_after=60)) as client:
        with pytest.raises(errors.RateLimitError) as info:
            await client.request("GET", "subscriptions/1")
    assert info.value.retry_after == 3600
    assert info.value.attempts == 1


def test_no_attempt_is_made_past_max_total() -> None:
    """A Retry-After that ends after the budget fails at once; a backoff is cut to what is
    left of it."""
    from asyncsubs._protocol import build_request
    from asyncsubs._retry import retry_delay, set_waiting

    policy = RetryPolicy(max_total=2.0, backoff_initial=30.0, backoff_max=30.0)
    get = build_request("https://x.test/admin/2026-04/", "t", "GET", "subscriptions/1")
    unavailable = errors.ServerError("503", status=503, retry_after=8.0)
    limited = errors.RateLimitError("429", status=429, retry_after=8.0)
    previous = set_waiting(True)  # the autouse fixture turned waits off
    try:
        assert retry_delay(policy, get, unavailable, 1, elapsed=0.0) is None
        assert retry_delay(policy, get, limited, 1, elapsed=0.0) is None
        unavailable.retry_after = limited.retry_after = 1.5
        assert retry_delay(policy, get, unavailable, 1, elapsed=0.5) == 1.5
        assert retry_delay(policy, get, limited, 1, elapsed=0.5) == 0.0  # the pool's pause
        # Without a Retry-After, a 429's pool pauses for the backoff's ceiling (30 s here).
        assert retry_delay(policy, get, errors.RateLimitError("429", status=429), 1, 0.5) is None
        reset = errors.TransportError("reset", maybe_processed=False)
        delays = [retry_delay(policy, get, reset, 1, elapsed=1.5) for _ in range(50)]
        assert all(delay is not None and delay <= 0.5 for delay in delays)
    finally:
        set_waiting(previous)


async def test_timeout_is_retried_then_surfaces_as_transport_error(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    server.faults = Faults(slow=1.0, slow_seconds=30)
    async with make_client(timeout=0.2, retry=RetryPolicy(max_attempts=2)) as client:
        with pytest.raises(errors.TransportError, match=r"within 0\.2s") as info:
            await client.request("GET", "subscriptions/1")
    assert info.value.attempts == 2


async def test_pull_through_every_fault_kind_is_exact() -> None:
    faults = Faults(
        seed=7,
        error_500=0.1,
        html_502=0.1,
        reset=0.1,
        truncate=0.1,
        rate_limit_no_retry_after=0.05,
    )
    async with FakeAdminServer(
        stores=[FakeStoreConfig("s", records={"subscriptions": 3_000})],
        rate_limits=None,
        faults=faults,
    ) as server:
        async with AdminClient(
            token=server.store("s").token,
            base_url=server.base_url,
            store="s",
            limits=Limits(heavy={"subscriptions": Rate(10_000)}),
            retry=RetryPolicy(max_attempts=10),
        ) as client:
            got = await all_ids(client.subscriptions.list(page_size=50, model=dict))
            retries = client.stats.pools["subscriptions"].retries
        assert got == [r["id"] for r in server.records("s", "subscriptions")]
        injected = server.fault_counts
        assert sum(injected.values()) == retries > 0
        assert {k for k, v in injected.items() if v} >= {"error_500", "html_502", "reset"}


async def test_interrupted_pull_resumes_exactly(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    expected = [r["id"] for r in server.records("acme", "subscriptions")]
    for k in (1, 3, 7):
        got: list[Any] = []
        checkpoint = None
        async with make_client() as client:
            async for page in client.subscriptions.list(page_size=100, model=dict).pages():
                got.extend(r["id"] for r in page.data)
                checkpoint = page.next_cursor
                if len(got) >= k * 100:
                    break  # the process "dies" here, after committing page k
        async with make_client() as client:
            got += await all_ids(
                client.subscriptions.list(page_size=100, after_cursor=checkpoint, model=dict)
            )
        assert got == expected


async def test_oversized_body_refused(server: FakeAdminServer, make_client: MakeClient) -> None:
    big = b'{"success": true, "data": "' + b"x" * 300_000 + b'"}'
    server.enqueue(200, big, path="subscriptions/1")
    async with make_client(max_response_bytes=100_000) as client:
        with pytest.raises(errors.ProtocolError, match="max_response_bytes"):
            await client.request("GET", "subscriptions/1")


async def test_oversized_chunked_body_refused_without_reading_it_all(
    make_client: MakeClient,
) -> None:
    sent = 0

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for _ in range(1_000):  # up to 64 MiB, far beyond the cap
                await resp.write(b"x" * 65_536)
                sent += 65_536
        except (ConnectionResetError, RuntimeError):
            pass
        return resp

    app = web.Application()
    app.router.add_get("/admin/2026-04/huge", endless)
    async with (
        serving(app) as origin,
        make_client(base_url=origin, max_response_bytes=1_000_000) as client,
    ):
        with pytest.raises(errors.ProtocolError, match="exceeds"):
            await client.request("GET", "huge")
    assert sent < 64 * 1024 * 1024


async def test_redirect_never_carries_the_token_to_another_origin(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"success": True, "data": None})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    async with serving(app, host="127.0.0.2" if _has_127_0_0_2() else "127.0.0.1") as origin:
        server.redirect("subscriptions/1", f"{origin}/steal", times=None)
        async with make_client() as client:
            with pytest.raises(errors.ProtocolError, match="not followed") as info:
                await client.request("GET", "subscriptions/1")
    assert seen == []
    assert server.store("acme").token not in str(info.value)


def _has_127_0_0_2() -> bool:
    try:
        with socket.socket() as sock:
            sock.bind(("127.0.0.2", 0))
    except OSError:
        return False
    return True


_STATUSES = [200, 201, 204, 301, 302, 307, 400, 401, 403, 404, 408, 409, 418, 422, 429, 500, 502]
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
_envelopes = st.fixed_dictionaries(
    {},
    optional={
        "success": st.sampled_from([True, False, None, "true", 1]),
        "data": st.one_of(st.lists(_json_values, max_size=3), _json_values),
        "code": st.one_of(st.none(), st.text(max_size=10), st.integers()),
        "message": st.one_of(st.none(), st.text(max_size=10)),
        "pageInfo": st.one_of(
            _json_values,
            st.fixed_dictionaries(
                {},
                optional={
                    "hasNextPage": st.one_of(st.booleans(), _json_values),
                    "nextCursor": st.one_of(st.none(), st.text(max_size=6), st.integers()),
                },
            ),
        ),
    },
)


def _nested(depth: int, shape: str) -> bytes:
    """A JSON value ``depth`` levels deep: lists, objects, or both in turn."""
    if shape == "lists":
        return b"[" * depth + b"]" * depth
    if shape == "objects":
        return b'{"a":' * depth + b"1" + b"}" * depth
    pairs, odd = divmod(depth, 2)
    return b'[{"a":' * pairs + b"[]" * odd + b"}]" * pairs


#: JSON nested about as deep as the parser allows (orjson: 1024 levels) and beyond, where an
#: error's body would overflow the recursion limit of whoever prints it; alone, or under a key
#: of an error envelope or a page.
_deep_bodies = st.builds(
    lambda depth, shape, place: place.replace(b"DEEP", _nested(depth, shape)),
    st.one_of(st.sampled_from([33, 999, 1000, 1023, 1024, 1100]), st.integers(1, 1100)),
    st.sampled_from(["lists", "objects", "mixed"]),
    st.sampled_from(
        [
            b"DEEP",
            b'{"success": false, "code": "BAD_REQUEST", "errors": DEEP}',
            b'{"success": false, "message": DEEP, "code": DEEP}',
            b'{"success": true, "data": [DEEP], "pageInfo": {"hasNextPage": false}}',
            b'{"success": false, "data": DEEP, "n": 18446744073709551617}',
        ]
    ),
)
_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"[-9223372036854775809]", b'{"success": true, "data": [1e999]}', b"\xff"]),
    _envelopes,
    _json_values.map(lambda v: v if isinstance(v, dict | list) else [v]),
    _deep_bodies,
)
_headers = st.fixed_dictionaries(
    {},
    optional={
        "Retry-After": st.sampled_from(["1", "0", "-1", "nan", "1e9", "soon", "Wed, 21 Oct 2015"]),
        "Content-Type": st.sampled_from(["application/json", "text/html", "text/plain"]),
    },
)


def test_hostile_responses_raise_only_asyncsubs_errors() -> None:
    """Generated statuses, bodies (JSON nested a thousand deep among them) and headers: every
    call ends, within its timeout, either with a result or an asyncsubs error, which prints,
    serialises and pickles with every attribute; nothing else escapes."""
    loop = asyncio.new_event_loop()
    server = FakeAdminServer(stores=[FakeStoreConfig("h", records=3)], rate_limits=None)
    loop.run_until_complete(server.start())
    client = AdminClient(
        token=server.store("h").token,
        base_url=server.base_url,
        store="h",
        timeout=2.0,
        retry=RetryPolicy(max_attempts=2),
        limits=Limits(global_rate=Rate(100_000), heavy={"subscriptions": Rate(100_000)}),
    )

    async def one_call(kind: int) -> None:
        if kind == 0:
            await client.request("GET", "subscriptions/1")
        elif kind == 1:
            await client.request("POST", "subscriptions/1/pause", json={})
        else:
            async for _ in client.list_endpoint("subscriptions").list(page_size=2):
                pass

    @settings(
        max_examples=120,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(
        status=st.sampled_from(_STATUSES),
        body=_bodies,
        headers=_headers,
        kind=st.integers(0, 2),
    )
    def check(status: int, body: Any, headers: dict[str, str], kind: int) -> None:
        server.clear_scripted()
        if status == 204:
            body = None
        server.enqueue(status, body, headers, times=None)
        try:
            loop.run_until_complete(asyncio.wait_for(one_call(kind), timeout=10))
        except errors.AsyncSubsError as exc:
            assert_printable(exc)

    try:
        check()
    finally:
        loop.run_until_complete(client.aclose())
        loop.run_until_complete(server.aclose())
        loop.close()


CANARY = "CANARY-token-5b1f0e"
_ECHO = CANARY.encode()
_OK = b'{"success": true, "data": null}'


def _http(status: str, body: bytes = b"", *headers: bytes) -> bytes:
    head = [b"HTTP/1.1 " + status.encode(), *headers]
    if not any(h.lower().startswith(b"content-length") for h in headers):
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


#: Wire-level answers, each a different way for a response to be broken or an error.
_WIRE_ANSWERS = {
    "bad Content-Length": b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\nxx",
    "bad status line": b"HTTZ/1.1 200\r\n\r\n",
    "bad chunking": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx",
    "NUL in a header": b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nxx",
    "truncated body": b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nxx",
    "not HTTP": b"\x16\x03\x01\x00\xff garbage\r\n\r\n",
    "closed at once": b"",
    "401": _http("401 Unauthorized", b'{"success": false, "code": "UNAUTHORIZED"}'),
    "429": _http("429 Too Many Requests", b"{}", b"Retry-After: 0"),
    "503 html": _http("503 Unavailable", b"<html>down</html>", b"X-Request-Id: r-1"),
    "bad JSON": _http("200 OK", b'{"success": tr'),
    "bad envelope": _http("200 OK", b'{"success": "yes"}'),
    "redirect": _http("302 Found", b"", b"Location: http://127.0.0.1:9/steal"),
    "too large": _http("200 OK", b'{"x": "' + b"y" * 2_000 + b'"}'),
    # A server or a proxy that echoes the token: the client knows it and leaves it out.
    "401 echo": _http(
        "401 Unauthorized",
        b'{"success": false, "code": "UNAUTHORIZED", "message": "bad token ' + _ECHO + b'"}',
    ),
    "500 html echo": _http("500 Oops", b"<pre>X-Service-Token: " + _ECHO + b"</pre>"),
    "bad JSON echo": _http("200 OK", b'{"token": "' + _ECHO + b'", "success": tr'),
    "redirect echo": _http("302 Found", b"", b"Location: https://login.example/?t=" + _ECHO),
    "request id echo": _http("503 Unavailable", b"{}", b"X-Request-Id: " + _ECHO),
}


#: A token with characters JSON and Python's repr escape, and its echoes in other forms.
ESCAPABLE = 'CANARY/tok"en\\5b1f0e'
_RAW = ESCAPABLE.encode()
_IN_JSON = json.dumps(ESCAPABLE)[1:-1].replace("/", "\\/").encode()  # "\/" as PHP writes it
_ESCAPED = "".join(f"\\u{ord(ch):04x}" for ch in ESCAPABLE).encode()
_ESCAPED_ECHOES = {
    "401 JSON-escaped echo": _http(
        "401 Unauthorized", b'{"message": "bad token ' + _IN_JSON + b'"}'
    ),
    "400 \\u-escaped echo": _http("400 Bad Request", b'{"code": "' + _ESCAPED + b'"}'),
    "NUL after an echoed header": (
        b"HTTP/1.1 200 OK\r\nX-A: " + _RAW + b"\x00\r\nContent-Length: 2\r\n\r\nxx"
    ),
    "echo in the status line": b"HTTP/1.1 2x0 " + _RAW + b"\r\n\r\n",
    "echo as a header line": b"HTTP/1.1 200 OK\r\n" + _RAW + b"\r\nContent-Length: 2\r\n\r\nxx",
}


#: Each answer, and the token its client sends.
_ECHO_CASES = {
    **{kind: (CANARY, answer) for kind, answer in _WIRE_ANSWERS.items()},
    **{kind: (ESCAPABLE, answer) for kind, answer in _ESCAPED_ECHOES.items()},
}


@pytest.mark.parametrize("kind", sorted(_ECHO_CASES))
async def test_no_error_carries_the_token_anywhere_in_its_chain(
    make_client: MakeClient, kind: str
) -> None:
    """Nor a piece of it: escaped in JSON, or quoted by aiohttp's parser from a line it could
    not read, either."""
    token, answer = _ECHO_CASES[kind]
    async with (
        WireServer(lambda _: answer) as wire,
        make_client(
            token=token,
            base_url=wire.base_url,
            retry=RetryPolicy(max_attempts=2),
            max_response_bytes=1_000,
        ) as client,
    ):
        with pytest.raises(errors.AsyncSubsError) as info:
            await client.request("GET", "subscriptions/1")
    assert token.encode() in wire.requests[0]  # the token was sent, and still is nowhere:
    for piece in ("CANARY", "5b1f0e"):  # in both tokens
        assert places_holding(info.value, piece) == []


async def test_no_error_of_the_connection_itself_carries_the_token(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{sock.getsockname()[1]}"
    hanging = WireServer(lambda _: None)
    async with hanging, untrusted_tls_server() as (untrusted, _):
        for base_url in (
            refused,
            hanging.base_url,
            server.base_url.replace("http://", "https://"),
            untrusted,
        ):
            client = make_client(token=CANARY, base_url=base_url, timeout=0.2)
            async with client:
                with pytest.raises(errors.TransportError) as info:
                    await client.request("POST", "subscriptions/1/pause", json={})
            assert places_holding(info.value, CANARY) == [], base_url
        with pytest.raises(errors.ConfigError) as closed:
            await client.request("GET", "subscriptions/1")
        assert places_holding(closed.value, CANARY) == []


async def test_hopeless_connection_errors_fail_at_the_first_attempt(
    server: FakeAdminServer, make_client: MakeClient
) -> None:
    async with untrusted_tls_server() as (untrusted, _):
        cases = [
            (server.base_url.replace("http://", "https://"), r"https:// for a plain-http port"),
            (untrusted, "certificate failed verification .*certificate"),
            ("http://[::1]x", "invalid"),
        ]
        for base_url, cause in cases:
            async with make_client(base_url=base_url, retry=RetryPolicy(max_attempts=5)) as client:
                with pytest.raises(errors.TransportError, match=cause) as info:
                    await client.request("GET", "subscriptions/1")
            assert info.value.attempts == 1
            assert not info.value.transient


async def test_the_certificate_hint_works_a_session_trusting_the_ca_gets_through() -> None:
    async with untrusted_tls_server() as (base_url, ca):
        context = ssl.create_default_context()
        ca.configure_trust(context)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))
        async with session, AdminClient(token="t", base_url=base_url, session=session) as client:
            resp = await client.request("GET", "subscriptions/1")
    assert resp.data is None
    assert resp.status == 200


async def test_decompressed_size_is_capped(make_client: MakeClient) -> None:
    inflated = b'{"success": true, "data": "' + b"0" * (16 << 20) + b'"}'
    bomb = gzip.compress(inflated, compresslevel=1)
    assert len(bomb) < 100_000
    answer = _http("200 OK", bomb, b"Content-Encoding: gzip", b"Content-Type: application/json")
    wire = WireServer(lambda _: answer)
    async with wire, make_client(base_url=wire.base_url, max_response_bytes=1 << 20) as client:
        with pytest.raises(errors.ProtocolError, match="exceeds max_response_bytes"):
            await client.request("GET", "subscriptions/1")
        small = _http("200 OK", gzip.compress(_OK), b"Content-Encoding: gzip")
        wire.answer = lambda _: small
        assert (await client.request("GET", "subscriptions/1")).status == 200


async def test_head_with_a_large_content_length_has_no_body_to_refuse(
    make_client: MakeClient,
) -> None:
    answer = _http("200 OK", b"", b"Content-Length: 999999999", b"X-Request-Id: req-9")
    wire = WireServer(lambda _: answer)
    async with wire, make_client(base_url=wire.base_url, max_response_bytes=1_000) as client:
        resp = await client.request("HEAD", "subscriptions/1")
    assert (resp.status, resp.data) == (200, None)
    assert wire.requests[0].startswith(b"HEAD ")


_DEEP = _nested(1_000, "lists")
_wire_bodies = st.one_of(
    _bodies.map(lambda b: b if isinstance(b, bytes) else _json.dumps(b)),
    st.sampled_from(
        [
            b'{"success": false, "code": ' + _DEEP + b', "message": ' + _DEEP + b"}",
            b'{"success": true, "data": [' + _DEEP + b"]}",
            b'{"success": false, "code": "X", "errors": ' + _nested(1_000, "mixed") + b"}",
            _nested(700, "objects"),
            b'{"success": true, "data": [{"id": 18446744073709551617}],'
            b' "pageInfo": {"hasNextPage": true, "nextCursor": "c"}}',
            b'{"success": true, "data": [], "pageInfo": {"hasNextPage": true, "nextCursor": "c"}}',
        ]
    ),
)
_status_lines = st.one_of(
    st.sampled_from([b"HTTP/1.1 %d X" % s for s in (*_STATUSES, 100, 304, 599)]),
    st.sampled_from([b"HTTP/1.0 200 OK", b"HTTP/1.1 999 X", b"HTTP/1.1 abc", b"HTTZ/1.1 200", b""]),
)
_extra_headers = st.tuples(
    st.lists(
        st.sampled_from(
            [
                b"Retry-After: 1e308",
                b"Retry-After: -5",
                b"Retry-After: Wed, 21 Oct 2015 07:28:00 GMT",
                b"Location: http://127.0.0.1:9/steal",
                b"Content-Type: text/html; charset=utf-9",
                b"X-Request-Id: " + b"r" * 500,
            ]
        ),
        max_size=3,
    ),
    st.sampled_from(
        [
            [],
            [],
            [b"X-Request-Id: r\x00"],
            [b"X-Bad\x00Name: 1"],
            [b"Content-Length: 1"],
            [b"Transfer-Encoding: gzip"],
            [b"no colon here"],
        ]
    ),
).map(lambda pair: pair[0] + pair[1])


def _framed(body: bytes, framing: str, encoding: str | None) -> tuple[list[bytes], bytes]:
    """Headers and payload putting ``body`` on the wire in one of many (mostly broken) ways."""
    headers = []
    if encoding == "gzip":
        body = gzip.compress(body)
    elif encoding == "deflate":
        body = zlib.compress(body)
    if encoding is not None:
        headers.append(b"Content-Encoding: " + encoding.encode())
    if framing == "length":
        return [*headers, b"Content-Length: %d" % len(body)], body
    if framing == "long length":
        return [*headers, b"Content-Length: %d" % (len(body) + 5)], body
    if framing == "bad length":
        return [*headers, b"Content-Length: 1x"], body
    if framing == "chunked":
        chunk = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
        return [*headers, b"Transfer-Encoding: chunked"], chunk + b"0\r\n\r\n"
    if framing == "bad chunks":
        return [*headers, b"Transfer-Encoding: chunked"], b"zz\r\n" + body
    return headers, body  # read to the close


def test_wire_level_hostile_answers_raise_only_asyncsubs_errors_without_the_token() -> None:
    """Generated raw answers (status lines, headers, framings, encodings, bodies): every call
    ends in time with a value or an asyncsubs error, no error holds the token anywhere, and
    every error prints, serialises and pickles with every attribute."""
    loop = asyncio.new_event_loop()
    wire = WireServer(lambda _: b"")
    loop.run_until_complete(wire.__aenter__())
    client = AdminClient(
        token=CANARY,
        base_url=wire.base_url,
        timeout=1.0,
        retry=RetryPolicy(max_attempts=2),
        max_response_bytes=4_096,
        limits=Limits(global_rate=Rate(100_000), heavy={"subscriptions": Rate(100_000)}),
    )

    async def one_call(kind: int) -> None:
        if kind == 0:
            await client.request("GET", "subscriptions/1")
        elif kind == 1:
            await client.request("POST", "subscriptions/1/pause", json={"id": 2**70})
        elif kind == 2:
            await client.request("HEAD", "subscriptions/1")
        else:
            async for _ in client.list_endpoint("subscriptions").list(page_size=2):
                pass

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        status_line=_status_lines,
        headers=_extra_headers,
        body=_wire_bodies,
        framing=st.sampled_from(
            ["length", "long length", "bad length", "chunked", "bad chunks", "close"]
        ),
        encoding=st.sampled_from([None, None, "gzip", "deflate", "br"]),
        kind=st.integers(0, 3),
    )
    def check(
        status_line: bytes,
        headers: list[bytes],
        body: bytes,
        framing: str,
        encoding: str | None,
        kind: int,
    ) -> None:
        framing_headers, payload = _framed(body, framing, encoding)
        answer = b"\r\n".join([status_line, *headers, *framing_headers]) + b"\r\n\r\n" + payload
        wire.answer = lambda _: answer
        failure: errors.AsyncSubsError | None = None
        try:
            loop.run_until_complete(asyncio.wait_for(one_call(kind), timeout=10))
        except errors.AsyncSubsError as exc:
            failure = exc
        if failure is not None:
            assert places_holding(failure, CANARY) == []
            assert_printable(failure)

    try:
        check()
    finally:
        loop.run_until_complete(client.aclose())
        loop.run_until_complete(wire.__aexit__())
        loop.close()
