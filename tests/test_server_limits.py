"""A server's rate-limit headers: parsing (asyncsubs._server_limits) and what a client does with
them, on a virtual loop clock with a scripted transport (so seconds of pacing take no time)."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

import orjson
import pytest
from hostile import WireServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from virtual_clock import VirtualClock

from asyncsubs import AdminClient, Limits, Rate, errors
from asyncsubs._protocol import RawResponse, Request
from asyncsubs._server_limits import ServerLimit, parse_server_limit
from asyncsubs.limiting import Limiter
from asyncsubs.testing import FakeAdminServer, ServerRateLimits, set_waiting

NOW = 1_700_000_000.0  # a Unix time, for epoch resets

# --- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # IETF draft: policy and current state.
        (
            {"ratelimit-policy": '"default";q=40;w=1', "ratelimit": '"default";r=12;t=1'},
            ServerLimit(quota=40, window=1.0, remaining=12, reset=1.0),
        ),
        ({"ratelimit-policy": '"p";q=100;w=60'}, ServerLimit(quota=100, window=60.0)),
        # No w: the pool's own window.
        ({"ratelimit-policy": '"p";q=40'}, ServerLimit(quota=40, window=None)),
        # qu other than requests says nothing about request starts; pk is ignored.
        ({"ratelimit-policy": '"bytes";q=10;w=1;qu="content-bytes"'}, None),
        (
            {"ratelimit-policy": '"p";q=30;w=1;qu="requests";pk=:cHJvamVjdA==:'},
            ServerLimit(quota=30, window=1.0),
        ),
        # Several policies: the lowest quota per second wins (100/60 s < 10/1 s).
        (
            {"ratelimit-policy": '"burst";q=10;w=1, "hour";q=100;w=60, "b";q=5;w=1;qu="x"'},
            ServerLimit(quota=100, window=60.0),
        ),
        (
            {"ratelimit-policy": '"a";q=200;w=2, "b";q=40;w=1'},
            ServerLimit(quota=40, window=1.0),
        ),
        # RateLimit with one item per policy: the one with the fewest left binds.
        (
            {"ratelimit": '"burst";r=5;t=1, "day";r=0;t=3600'},
            ServerLimit(remaining=0, reset=3600.0),
        ),
        ({"ratelimit": '"p";r=0;t=2.5'}, ServerLimit(remaining=0, reset=2.5)),
        ({"ratelimit": '"p";r=7'}, ServerLimit(remaining=7)),
        # Older drafts: RateLimit-Limit / -Remaining / -Reset (reset in delta seconds).
        (
            {"ratelimit-limit": "40", "ratelimit-remaining": "0", "ratelimit-reset": "3"},
            ServerLimit(quota=40, remaining=0, reset=3.0),
        ),
        ({"ratelimit-limit": "40, 40;w=1"}, ServerLimit(quota=40, window=None)),
        # The current quota, then a policy naming the window: 100 per minute, not per second.
        ({"ratelimit-limit": "100, 100;w=60"}, ServerLimit(quota=100, window=60.0)),
        # X-RateLimit-*: delta seconds, or a Unix time.
        (
            {"x-ratelimit-limit": "40", "x-ratelimit-remaining": "3", "x-ratelimit-reset": "1"},
            ServerLimit(quota=40, remaining=3, reset=1.0),
        ),
        (
            {
                "x-ratelimit-limit": "40",
                "x-ratelimit-remaining": "0",
                "x-ratelimit-reset": "1700000002",
            },
            ServerLimit(quota=40, remaining=0, reset=2.0),
        ),
        # An epoch reset already past: nothing to wait for.
        (
            {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(NOW) - 5)},
            ServerLimit(remaining=0, reset=0.0),
        ),
        ({"x-ratelimit-remaining": "0"}, ServerLimit(remaining=0)),
        # Spaces around a number are allowed; a fractional reset is read; the IETF policy wins
        # over X- headers.
        ({"x-ratelimit-limit": " 12 "}, ServerLimit(quota=12)),
        (
            {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "2.5"},
            ServerLimit(remaining=0, reset=2.5),
        ),
        (
            {"ratelimit-policy": '"p";q=20;w=1', "x-ratelimit-limit": "5"},
            ServerLimit(quota=20, window=1.0),
        ),
    ],
)
def test_header_forms(headers: dict[str, str], expected: ServerLimit | None) -> None:
    assert parse_server_limit(headers, now=NOW) == expected


def test_no_rate_headers_is_none() -> None:
    assert parse_server_limit({}) is None
    assert parse_server_limit({"content-type": "application/json", "retry-after": "1"}) is None
    # A reset alone says nothing of a quota or of what is left.
    assert parse_server_limit({"x-ratelimit-reset": "5"}, now=NOW) is None


# Values the structured-field syntax (RFC 9651) allows that are no count or duration, and values
# it rejects, which make the whole field ignored, as the draft says.
NOT_NUMBERS = ["abc", "nan", "inf", "-1", "-0.5", '""', '"5"', "?1"]
NOT_SYNTAX = ["", " ", "-inf", "1e400", "0x10", "1e1", "1_0", "\u0665", "(1 2)", '"a']


@pytest.mark.parametrize("value", NOT_NUMBERS + NOT_SYNTAX)
def test_malformed_values_are_ignored(value: str) -> None:
    for name in ("ratelimit-limit", "x-ratelimit-limit", "x-ratelimit-remaining"):
        assert parse_server_limit({name: value}, now=NOW) is None
    assert parse_server_limit({"ratelimit-policy": f'"p";q={value};w=1'}, now=NOW) is None
    assert parse_server_limit({"ratelimit": f'"p";r={value};t=1'}, now=NOW) is None
    assert parse_server_limit({"ratelimit-policy": f'"p";q=5;w={value}'}, now=NOW) is None
    # A bad plain reset leaves the rest standing.
    assert parse_server_limit(
        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": value}, now=NOW
    ) == ServerLimit(remaining=0)


@pytest.mark.parametrize("value", NOT_NUMBERS)
def test_a_parameter_that_is_no_number_leaves_its_item(value: str) -> None:
    limit = parse_server_limit({"ratelimit": f'"p";r=0;t={value}'}, now=NOW)
    assert limit == ServerLimit(remaining=0)


@pytest.mark.parametrize("value", NOT_SYNTAX)
def test_a_field_that_does_not_parse_is_ignored_whole(value: str) -> None:
    assert parse_server_limit({"ratelimit": f'"p";r=0;t={value}'}, now=NOW) is None
    policies = f'"a";q=10;w=1, "b";q=20;w={value}'
    assert parse_server_limit({"ratelimit-policy": policies}, now=NOW) is None


def test_counts_are_integers() -> None:
    """``q`` and ``r`` are Integers in the draft: a fraction there makes the item malformed."""
    assert parse_server_limit({"ratelimit-policy": '"p";q=12.9;w=1'}) is None
    assert parse_server_limit({"ratelimit": '"p";r=0.5;t=3'}) is None
    assert parse_server_limit({"x-ratelimit-remaining": "0.5"}) is None
    # Durations may be fractions (a server that means finer than the draft's whole seconds).
    assert parse_server_limit({"ratelimit-policy": '"p";q=20;w=0.5'}) == ServerLimit(20, 0.5)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # A String may hold what separates items and parameters elsewhere.
        ({"ratelimit-policy": '"p";q=100;w=1;note="max 5, 2"'}, ServerLimit(100, 1.0)),
        ({"ratelimit-policy": '"5, 10";q=100;w=1'}, ServerLimit(100, 1.0)),
        ({"ratelimit": '"x;t=86400";r=0'}, ServerLimit(remaining=0)),
        (
            {"ratelimit": '"p";r=50;t=30;x="a, b;r=0;t=86400"'},
            ServerLimit(remaining=50, reset=30.0),
        ),
        # Of several policies with nothing left, the one that resets last binds.
        (
            {"ratelimit": '"burst";r=0;t=1, "day";r=0;t=3600'},
            ServerLimit(remaining=0, reset=3600.0),
        ),
        ({"ratelimit": '"a";r=0, "b";r=0;t=60'}, ServerLimit(remaining=0, reset=60.0)),
        # The IETF items and the plain fields are read together: the fewest left binds.
        (
            {"ratelimit": '"p";r=5;t=1', "x-ratelimit-remaining": "0", "x-ratelimit-reset": "3"},
            ServerLimit(remaining=0, reset=3.0),
        ),
    ],
)
def test_structured_lists(headers: dict[str, str], expected: ServerLimit) -> None:
    assert parse_server_limit(headers, now=NOW) == expected


def test_zero_and_huge_values_are_ignored() -> None:
    assert parse_server_limit({"x-ratelimit-limit": "0"}) is None  # a quota below 1
    assert parse_server_limit({"ratelimit-policy": '"p";q=10;w=0'}) is None
    assert parse_server_limit({"x-ratelimit-limit": "1" + "0" * 30}) is None
    assert parse_server_limit({"ratelimit-policy": '"p";q=1000000000;w=1'}) is None
    # A window or a reset of more than a day would pace the pool, or hold it, for good.
    assert parse_server_limit({"ratelimit-policy": '"p";q=1;w=86401'}) is None
    assert parse_server_limit({"ratelimit": '"p";r=0;t=86401'}) == ServerLimit(remaining=0)
    far = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "999999999"}
    assert parse_server_limit(far, now=NOW) == ServerLimit(remaining=0)
    # A good policy beside ones that say nothing still counts.
    mixed = {"ratelimit-policy": '"a";q=0;w=1, "b";q=20;w=100000, "c";q=30;w=1'}
    assert parse_server_limit(mixed) == ServerLimit(quota=30, window=1.0)


def test_epoch_reset_defaults_to_the_wall_clock() -> None:
    limit = parse_server_limit(
        {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(time.time()) + 30)}
    )
    assert limit is not None
    assert limit.reset is not None
    assert 28 <= limit.reset <= 30


def test_an_epoch_reset_is_read_in_either_header_style() -> None:
    """A reset of 10**9 and more is a Unix time, in the IETF ``t`` as in ``X-RateLimit-Reset``
    (servers that mean delta seconds never send one that large)."""
    limit = parse_server_limit({"ratelimit": '"p";r=0;t=1700000030'}, now=1_700_000_000.0)
    assert limit == ServerLimit(remaining=0, reset=30.0)


_NAMES = (
    "ratelimit-policy",
    "ratelimit",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
)
_FRAGMENTS = st.sampled_from(
    ['"p"', ";", ",", "=", "q", "w", "r", "t", "qu", "pk", "1", "0", "-", ".", "e", "nan", " "]
)


# A loaded machine draws the first text examples slowly; nothing here is about speed.
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(_NAMES),
        st.one_of(st.text(max_size=40), st.lists(_FRAGMENTS, max_size=20).map("".join)),
    ),
    st.floats(allow_nan=True, allow_infinity=True),
)
def test_arbitrary_header_text_never_raises(headers: dict[str, str], now: float) -> None:
    limit = parse_server_limit(headers, now=now)
    if limit is not None:
        assert limit.quota is None or 1 <= limit.quota < 10**9
        assert limit.window is None or 0 < limit.window <= 86_400
        assert limit.remaining is None or limit.remaining >= 0
        assert limit.reset is None or 0 <= limit.reset <= 86_400


# --- what a client does with them ----------------------------------------------------------------


@pytest.fixture
def waiting() -> Iterator[None]:
    """429 pauses on (the suite turns them off): what Retry-After does is under test."""
    previous = set_waiting(True)
    try:
        yield
    finally:
        set_waiting(previous)


_OK = orjson.dumps({"success": True, "code": "SUCCESS", "message": "OK", "data": {}})
_REFUSED = orjson.dumps({"success": False, "code": "RATE_LIMITED", "message": "slow down"})


class Scripted:
    """A transport: answers (status, headers) in turn, the last one repeated; notes each send's
    loop time."""

    def __init__(self, *answers: tuple[int, Mapping[str, str]]) -> None:
        self._answers = list(answers)
        self.sends: list[float] = []

    async def send(self, request: Request, *, timeout: float) -> RawResponse:
        self.sends.append(asyncio.get_running_loop().time())
        status, headers = self._answers[min(len(self.sends), len(self._answers)) - 1]
        body = _OK if status == 200 else _REFUSED
        return RawResponse(status=status, headers=dict(headers), body=body)

    async def aclose(self) -> None:
        pass


def scripted_client(transport: Scripted, **limits: Any) -> AdminClient:
    return AdminClient(
        token="t0ken",
        base_url="https://shop.example",
        store="shop",
        limits=Limits(global_rate=Rate(10, per=1.0), heavy={}, **limits),
        transport=transport,
        limiter=Limiter(),
    )


async def send(client: AdminClient, count: int) -> None:
    for _ in range(count):
        await client.request("GET", "orders/1")


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


START = 1 + Limits().max_margin  # no samples yet: every pool paces at the cap

ANNOUNCE: dict[str, Callable[[int], dict[str, str]]] = {
    "ietf": lambda q: {
        "ratelimit-policy": f'"default";q={q};w=1',
        "ratelimit": '"default";r=3;t=1',
    },
    "x": lambda q: {"x-ratelimit-limit": str(q), "x-ratelimit-remaining": "3"},
    "older draft": lambda q: {"ratelimit-limit": f"{q}, {q};w=1", "ratelimit-remaining": "3"},
}


@pytest.mark.parametrize("style", list(ANNOUNCE))
async def test_lower_announced_quota_paces_the_pool(clock: VirtualClock, style: str) -> None:
    transport = Scripted((200, ANNOUNCE[style](5)))
    async with scripted_client(transport) as client:
        await send(client, 4)
        pool = client.stats.pools["global"]
    assert pool.paced_by == "server"
    assert pool.interval == pytest.approx(0.2 * START)
    # The first start was paced before any answer; every later one at 5/s.
    assert gaps(transport.sends) == pytest.approx([0.1 * START] + [0.2 * START] * 2)


@pytest.mark.parametrize(
    ("server_limits", "quota", "interval", "paced_by"),
    [
        ("ignore", 5, 0.1, "start"),  # headers are not read at all
        ("lower", 20, 0.1, "start"),  # a higher quota is not taken up unasked
        ("follow", 20, 0.05, "server"),  # ... unless the user opts in
        ("follow", 5, 0.2, "server"),
    ],
)
async def test_server_limits_setting(
    clock: VirtualClock, server_limits: str, quota: int, interval: float, paced_by: str
) -> None:
    transport = Scripted((200, ANNOUNCE["ietf"](quota)))
    async with scripted_client(transport, server_limits=server_limits) as client:
        await send(client, 4)
        pool = client.stats.pools["global"]
    assert pool.paced_by == paced_by
    assert pool.interval == pytest.approx(interval * START)
    assert gaps(transport.sends)[1:] == pytest.approx([interval * START] * 2)


async def test_a_later_higher_quota_lifts_the_lower_one(clock: VirtualClock) -> None:
    transport = Scripted((200, ANNOUNCE["x"](5)), (200, ANNOUNCE["x"](40)))
    async with scripted_client(transport) as client:
        await send(client, 3)
        pool = client.stats.pools["global"]
    assert pool.paced_by == "start"
    assert pool.interval == pytest.approx(0.1 * START)


@pytest.mark.parametrize(
    "exhausted",
    [
        {"x-ratelimit-limit": "10", "x-ratelimit-remaining": "0", "x-ratelimit-reset": "3"},
        {"ratelimit-policy": '"d";q=10;w=1', "ratelimit": '"d";r=0;t=3'},
    ],
    ids=["x", "ietf"],
)
async def test_nothing_remaining_holds_the_pool_until_the_reset(
    clock: VirtualClock, exhausted: dict[str, str], waiting: None
) -> None:
    transport = Scripted((200, exhausted), (200, {}))
    async with scripted_client(transport) as client:
        await send(client, 3)
    assert gaps(transport.sends) == pytest.approx([3.0, 0.1 * START])


async def test_no_waiting_turns_the_hold_off(clock: VirtualClock) -> None:
    exhausted = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "30"}
    transport = Scripted((200, exhausted), (200, {}))
    async with scripted_client(transport) as client:
        await send(client, 2)
    assert gaps(transport.sends) == pytest.approx([0.1 * START])


async def test_the_testing_switch_is_not_read_while_requests_succeed(
    clock: VirtualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``no_waiting``'s switch is a module global: it is read only on failure paths (a retry, a
    429, none left), never for an answer that announces a quota with some left."""

    def read() -> bool:
        raise AssertionError("the testing switch was read on the success path")

    monkeypatch.setattr("asyncsubs._client.waiting_enabled", read)
    announced = {"x-ratelimit-limit": "10", "x-ratelimit-remaining": "5"}
    transport = Scripted((200, announced), (200, announced))
    async with scripted_client(transport) as client:
        await send(client, 2)
    assert len(transport.sends) == 2


async def test_an_epoch_reset_holds_the_pool_by_the_wall_clock(
    clock: VirtualClock, waiting: None
) -> None:
    reset = math.ceil(time.time()) + 3
    exhausted = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
    transport = Scripted((200, exhausted), (200, {}))
    async with scripted_client(transport) as client:
        await send(client, 2)
    assert gaps(transport.sends)[0] == pytest.approx(reset - time.time(), abs=0.2)


async def test_nothing_remaining_within_the_announced_pacing_holds_nothing(
    clock: VirtualClock,
) -> None:
    """Paced at 5/s by the server's own quota, a reset within that window is already waited
    out: a hold on top would only lose time."""
    headers = {"ratelimit-policy": '"d";q=5;w=1', "ratelimit": '"d";r=0;t=1'}
    transport = Scripted((200, headers))
    async with scripted_client(transport) as client:
        await send(client, 3)
    assert gaps(transport.sends) == pytest.approx([0.1 * START, 0.2 * START])


async def test_retry_after_takes_precedence_over_the_reset(
    clock: VirtualClock, waiting: None
) -> None:
    refused = {
        "retry-after": "1",
        "x-ratelimit-limit": "10",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": "5",
    }
    transport = Scripted((429, refused), (200, {}))
    async with scripted_client(transport) as client:
        await send(client, 1)
        pool = client.stats.pools["global"]
    assert gaps(transport.sends) == pytest.approx([1.0])
    assert (pool.rate_limited, pool.retries) == (1, 1)


@pytest.mark.parametrize("style", ["ietf", "x"])
async def test_fake_server_headers_reach_the_pacer(style: Literal["ietf", "x"]) -> None:
    """End to end on loopback: a server enforcing half the configured rate, and saying so."""
    limits = ServerRateLimits(global_rate=Rate(100, per=1.0), headers=style)
    async with FakeAdminServer(stores=["s"], rate_limits=limits) as server:
        client = AdminClient(
            token=server.store("s").token,
            base_url=server.base_url,
            store="s",
            limits=Limits(global_rate=Rate(200, per=1.0), heavy={}),
            limiter=Limiter(),
        )
        async with client:
            for _ in range(6):
                with pytest.raises(errors.NotFoundError):
                    await client.request("GET", "orders/1")
            pool = client.stats.pools["global"]
    assert pool.paced_by == "server"
    assert pool.interval == pytest.approx(0.01 * START)
    assert server.stats("s").rejected == 0


async def test_a_policy_sent_in_several_field_lines_is_read_whole() -> None:
    """A structured-field list may come as several lines of one field (RFC 9110, 5.3): the
    lower quota on the first line still paces the pool."""
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\n"
        b'RateLimit-Policy: "second";q=40;w=1\r\nRateLimit-Policy: "hour";q=360000;w=3600\r\n'
        b'Connection: close\r\n\r\n{"success": true}'
    )
    async with WireServer(lambda _: answer) as server:
        client = AdminClient(
            token="t",
            base_url=server.base_url,
            store="s",
            limits=Limits(global_rate=Rate(50, per=1.0), heavy={}),
            limiter=Limiter(),
        )
        async with client:
            for _ in range(2):  # the second paced by what the first's answer said
                response = await client.request("GET", "shop")
            pool = client.stats.pools["global"]
    assert response.headers["ratelimit-policy"].startswith('"second";q=40;w=1, "hour"')
    assert pool.paced_by == "server"
    assert pool.interval == pytest.approx(START / 40)


async def test_a_retry_after_longer_than_the_policy_allows_fails_a_503_at_once(
    clock: VirtualClock, waiting: None
) -> None:
    transport = Scripted((503, {"retry-after": "600"}), (200, {}))
    async with scripted_client(transport) as client:
        with pytest.raises(errors.ServerError) as info:
            await send(client, 1)
    assert (info.value.retry_after, info.value.attempts, len(transport.sends)) == (600.0, 1, 1)


@pytest.mark.parametrize(
    ("status", "headers", "wait"),
    [
        # Paced by a quota of 100 a minute, a pool told none is left for 45 s (spent by another
        # client of the store) holds: its pacing would start again within a second.
        (200, {"ratelimit-policy": '"m";q=100;w=60', "ratelimit": '"m";r=0;t=45'}, 45.0),
        # A 503's Retry-After says when the service expects to be back (RFC 9110 10.2.3), and
        # a Retry-After takes precedence over a reset (the draft).
        (503, {"retry-after": "2", "ratelimit": '"d";r=0;t=600'}, 2.0),
        # A malformed Retry-After is none: the reset holds the pool.
        (429, {"retry-after": "-1", "ratelimit": '"d";r=0;t=30'}, 30.0),
    ],
    ids=["reset beyond a second", "503 retry-after", "malformed retry-after"],
)
async def test_the_wait_after_an_answer(
    clock: VirtualClock, waiting: None, status: int, headers: dict[str, str], wait: float
) -> None:
    transport = Scripted((status, headers), (200, {}))
    async with scripted_client(transport) as client:
        await send(client, 1 if status != 200 else 2)
    assert gaps(transport.sends) == pytest.approx([wait])
