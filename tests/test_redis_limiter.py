"""asyncsubs.redis against a real redis-server (started by the fixtures in redis_fixtures.py).

Real time is kept short: big intervals are checked through the delays Redis hands out (nothing
sleeps them), and what must really run (processes, pauses, expiry) uses fractions of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis_fixtures import (  # noqa: F401 - the fixtures register by their name=
    RedisServer,
    free_port,
    own_redis_server_fixture,
    redis_cluster_fixture,
    redis_cluster_node_fixture,
    redis_server_fixture,
)

import asyncsubs.redis
from asyncsubs import AdminClient, Limits, Rate, RetryPolicy
from asyncsubs._calibration import SLOWDOWN_HALF_LIFE, Slowdown
from asyncsubs._retry import set_waiting
from asyncsubs.errors import ConfigError, LimiterUnavailableError, RateLimitError
from asyncsubs.limiting import PacingBackend
from asyncsubs.redis import FORGET_AFTER, RedisLimiter, RedisPacing
from asyncsubs.stores import check_redis_url
from asyncsubs.testing import FakeAdminServer, ServerRateLimits
from benchmarks.bench_redis import Proxy

# Start the cluster node with the first test, so its start-up delay overlaps the others.
pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("redis_cluster_node")]

ROOT = Path(__file__).resolve().parent.parent
#: Slack for a Redis round trip and scheduling between two reads of the clock.
SLACK = 0.05


@pytest.fixture
def prefix() -> str:
    """A key prefix of this test's own: tests share the session's redis-server."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def server() -> AsyncIterator[FakeAdminServer]:
    """Store "acme" only, unlimited unless a test sets limits (overrides conftest's)."""
    async with FakeAdminServer(stores=["acme"], rate_limits=None, records=50) as fake:
        yield fake


@pytest.fixture
def real_pauses() -> Iterator[None]:
    """429 pauses take their time again (conftest turns them off for functional tests)."""
    previous = set_waiting(True)
    yield
    set_waiting(previous)


def dead_url(password: str = "") -> str:
    auth = f":{password}@" if password else ""
    return f"redis://{auth}127.0.0.1:{free_port()}/0"


async def wait(pacing: RedisPacing, store: str, pool: str, interval: float) -> float:
    """The wait of one reserve, which must carry no slowdown."""
    delay, slowdown = await pacing.reserve(store, pool, interval)
    assert slowdown == 1.0
    return delay


def make_client(server: FakeAdminServer, limiter: RedisLimiter, **kwargs: object) -> AdminClient:
    return AdminClient(
        token=server.store("acme").token,
        base_url=server.base_url,
        store="acme",
        limiter=limiter,
        **kwargs,  # type: ignore[arg-type]
    )


def record_ids(server: FakeAdminServer, count: int) -> list[int]:
    return [r["id"] for r in server.records("acme", "customers")[:count]]


# --------------------------------------------------------------------------------------------
# The backend: GCRA in one script, keys, pauses, expiry


async def test_reserve_paces_by_gcra_per_store_and_pool(
    redis_server: RedisServer, prefix: str
) -> None:
    pacing: PacingBackend = RedisPacing(redis_server.url, prefix=prefix)
    assert isinstance(pacing, RedisPacing)
    try:
        # No initial burst: one slot now, then one every interval; nothing sleeps here.
        delays = [await wait(pacing, "acme", "global", 10.0) for _ in range(4)]
        assert delays[0] == 0.0
        for k in (1, 2, 3):
            assert 10.0 * k - SLACK < delays[k] <= 10.0 * k
        # Other pools and other stores have budgets of their own.
        assert await pacing.reserve("acme", "orders", 10.0) == (0.0, 1.0)
        assert await pacing.reserve("globex", "global", 10.0) == (0.0, 1.0)
    finally:
        await pacing.aclose()


async def test_one_acquire_is_one_evalsha(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    pacing = RedisPacing(redis_server.url, prefix=prefix)
    try:
        await pacing.reserve("acme", "global", 0.001)  # connects and loads the script if needed
        await redis.config_resetstat()
        for _ in range(20):
            await pacing.reserve("acme", "global", 0.001)
        stats = await redis.info("commandstats")
    finally:
        await pacing.aclose()
    # Commands the script runs count too: TIME, the store's workers (read, and this one's
    # entry renewed), the pool's GCRA hash (read, written), its pause and its slowdown.
    calls = {name.removeprefix("cmdstat_"): s["calls"] for name, s in stats.items()}
    calls.pop("config|resetstat", None)
    assert calls == {
        "evalsha": 20,
        "time": 20,
        "hgetall": 20,
        "hset": 40,
        "pexpire": 40,
        "hmget": 40,
        "get": 20,
    }


async def test_very_high_rates_claim_one_slot_per_request(
    redis_server: RedisServer, redis: aioredis.Redis, server: FakeAdminServer, prefix: str
) -> None:
    """A slot whose interval is shorter than a Redis round trip is still used, not re-claimed
    forever (regression: Rate(10**6) never got through a shared backend)."""
    limiter = RedisLimiter(redis_server.url, prefix=prefix)
    limits = Limits(global_rate=Rate(10**6), heavy={"customers": Rate(10**6)})
    try:
        async with make_client(server, limiter, limits=limits) as client:
            first, *rest = record_ids(server, 21)
            await client.request("GET", f"customers/{first}")  # connects, loads the script
            await redis.config_resetstat()
            for record_id in rest:
                await asyncio.wait_for(client.request("GET", f"customers/{record_id}"), 5)
        stats = await redis.info("commandstats")
    finally:
        await limiter.aclose()
    assert stats["cmdstat_evalsha"]["calls"] == 20


async def test_stores_claiming_at_once_wait_for_a_connection_not_failing(
    redis_server: RedisServer, prefix: str
) -> None:
    """More claims in flight than the pool's connections (a process syncing a few hundred
    stores): they wait for a connection. redis-py's default pool failed the one past its 100th,
    which read as Redis down and failed the requests of every store."""
    stores = asyncsubs.redis.MAX_CONNECTIONS * 3
    pacing = RedisPacing(redis_server.url, prefix=prefix)
    try:
        claims = [pacing.reserve(f"store-{i}", "global", 0.02) for i in range(stores)]
        results = await asyncio.gather(*claims, return_exceptions=True)
        assert results == [(0.0, 1.0)] * stores
        in_use = pacing.client().connection_pool._in_use_connections  # type: ignore[attr-defined]
        assert len(in_use) <= asyncsubs.redis.MAX_CONNECTIONS
    finally:
        await pacing.aclose()


async def test_a_clean_up_request_of_a_cancelled_task_is_paced_through_redis(
    redis_server: RedisServer, prefix: str, server: FakeAdminServer
) -> None:
    """A task handling its cancellation (``except CancelledError: <clean up>; raise``) gets a
    slot for its clean-up request, as with the in-process limiter."""
    outcomes: list[object] = []
    path = f"customers/{record_ids(server, 1)[0]}"
    limiter = RedisLimiter(redis_server.url, prefix=prefix)
    async with limiter, make_client(server, limiter) as client:

        async def cleaning_up() -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                try:
                    outcomes.append((await client.request("GET", path)).status)
                except BaseException as exc:
                    outcomes.append(type(exc))
                raise

        task = asyncio.create_task(cleaning_up())
        await asyncio.sleep(0)  # the task waits
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert outcomes == [200]


async def test_script_is_reloaded_after_a_flush(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    pacing = RedisPacing(redis_server.url, prefix=prefix)
    try:
        assert await pacing.reserve("acme", "global", 5.0) == (0.0, 1.0)
        await redis.script_flush()  # as after a Redis restart or failover
        assert 5.0 - SLACK < await wait(pacing, "acme", "global", 5.0) <= 5.0
    finally:
        await pacing.aclose()


async def test_a_key_of_another_type_is_dropped_not_failing_every_store(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    """Keys of ours that someone else overwrote with another type, or with values that are not
    ours: Redis answered WRONGTYPE (or the script failed) at each reserve, which read as Redis
    down for every store of the limiter, for good (such a key has no expiry)."""
    pacing = RedisPacing(redis_server.url, prefix=prefix, fallback_fraction=0.5)
    keys = pacing.keys("acme", "global")
    try:
        await pacing.reserve("acme", "global", 0.001)
        await redis.delete(*keys)
        await redis.set(keys[0], "not-a-hash")
        await redis.hset(keys[1], "not", "a-string")  # type: ignore[misc]
        await redis.hset(keys[2], mapping={"excess": "x", "at": "y"})  # type: ignore[misc]
        await redis.hset(pacing.workers_key("acme"), "other", "no-separator")  # type: ignore[misc]
        for store in ("acme", "globex", "acme"):
            assert await pacing.reserve(store, "global", 0.001) == (
                pytest.approx(0, abs=0.002),
                1.0,
            )
        await pacing.pause("acme", "global", 0.5, 1.5)  # the pause script reads them too
        assert not pacing._down
        assert await redis.type(keys[0]) == b"hash"
        assert await redis.hget(pacing.workers_key("acme"), "other") is None  # type: ignore[misc]
    finally:
        await pacing.aclose()


async def test_keys_of_a_store_share_one_cluster_slot(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    pacing = RedisPacing(redis_server.url, prefix=prefix)
    try:
        for store in ("acme", "we{ird}:store%"):
            for pool in ("global", "orders"):
                await pacing.reserve(store, pool, 1.0)
                await pacing.pause(store, pool, 5.0, 1.5)
        keys = sorted(k.decode() for k in await redis.keys(f"{prefix}:*"))
    finally:
        await pacing.aclose()
    tags = ("acme", "we%7Bird%7D:store%25")
    assert keys == sorted(
        [
            *(
                f"{prefix}:{{{tag}}}:{kind}:{pool}"
                for tag in tags
                for kind in ("gcra", "pause", "slowdown")
                for pool in ("global", "orders")
            ),
            *(f"{prefix}:{{{tag}}}:workers" for tag in tags),
        ]
    )
    # A worker that closes leaves the stores' worker lists (an emptied hash is deleted).
    assert await redis.exists(*(f"{prefix}:{{{tag}}}:workers" for tag in tags)) == 0
    for tag in ("acme", "we%7Bird%7D:store%25"):
        slots = {key_slot(k.encode()) for k in keys if f"{{{tag}}}" in k}
        assert slots == {key_slot(tag.encode())}


async def test_idle_keys_expire(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    pacing = RedisPacing(redis_server.url, prefix=prefix, idle_ttl=0.2)
    tat_key, pause_key, slowdown_key = pacing.keys("acme", "global")
    try:
        await pacing.reserve("acme", "global", 0.1)
        await pacing.pause("acme", "global", 0.25, 2.0)
    finally:
        await pacing.aclose()
    # A TAT key lives until its slot has passed plus idle_ttl; a pause key until the pause ends;
    # a slowdown key for ten half-lives after it was last raised.
    assert 0 < await redis.pttl(tat_key) <= 300
    assert 0 < await redis.pttl(pause_key) <= 250
    assert await redis.pttl(slowdown_key) > 10 * SLOWDOWN_HALF_LIFE * 1000 - 1000
    await asyncio.sleep(0.35)
    assert await redis.exists(tat_key, pause_key) == 0


async def test_a_pause_is_shared_and_never_shortened(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    # Two backends with connections of their own: two processes, as far as Redis can tell.
    a = RedisPacing(redis_server.url, prefix=prefix)
    b = RedisPacing(redis_server.url, prefix=prefix)
    try:
        # What is left of the pause shrinks by the time the calls take (more on a busy machine).
        started = time.monotonic()
        await a.pause("acme", "global", 5.0, 1.0)
        await b.pause("acme", "global", 1.0, 1.0)  # shorter: no effect
        assert 4000 < await redis.pttl(a.keys("acme", "global")[1]) <= 5000
        delay = await wait(b, "acme", "global", 0.5)
        assert 5.0 - (time.monotonic() - started) - SLACK < delay <= 5.0
        # Pacing resumes one interval at a time after the pause, not in a burst.
        delay = await wait(a, "acme", "global", 0.5)
        assert 5.5 - (time.monotonic() - started) - SLACK < delay <= 5.5
        # Other pools are not paused.
        assert await b.reserve("acme", "orders", 0.5) == (0.0, 1.0)
    finally:
        await a.aclose()
        await b.aclose()


async def redis_micros(redis: aioredis.Redis) -> int:
    seconds, micros = await redis.time()
    return seconds * 1_000_000 + micros


async def test_a_slowdown_is_shared_and_decays_as_in_process(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    a = RedisPacing(redis_server.url, prefix=prefix)
    b = RedisPacing(redis_server.url, prefix=prefix)
    slowdown_key = a.keys("acme", "global")[2]
    try:
        await a.pause("acme", "global", 0.0, 2.0)
        await b.pause("acme", "global", 0.0, 1.5)  # lower: no effect
        _, slowdown = await b.reserve("acme", "global", 0.001)
        assert slowdown == pytest.approx(2.0, abs=1e-3)  # decaying since
        assert await a.reserve("acme", "orders", 0.001) == (0.0, 1.0)  # per pool

        # Decay on Redis's clock, as Slowdown.value computes it: the widening is moved back in
        # time through its stored 'at' rather than waited for.
        for factor, age in ((3.0, SLOWDOWN_HALF_LIFE), (1.8, 2.5 * SLOWDOWN_HALF_LIFE)):
            at = await redis_micros(redis) - int(age * 1_000_000)
            await redis.hset(slowdown_key, mapping={"excess": str(factor - 1), "at": str(at)})
            expected = Slowdown()
            expected.set(at / 1e6, factor)
            _, shared = await b.reserve("acme", "global", 0.001)
            now = await redis_micros(redis) / 1e6
            assert expected.value(now) - 1e-4 < shared <= expected.value(at / 1e6 + age) + 1e-9

        # A decayed slowdown is raised by a smaller factor than it started from.
        await a.pause("acme", "global", 0.0, 1.3)
        _, slowdown = await b.reserve("acme", "global", 0.001)
        assert slowdown == pytest.approx(1.3, abs=1e-3)
    finally:
        await a.aclose()
        await b.aclose()


# --------------------------------------------------------------------------------------------
# Through AdminClient


@pytest.mark.usefixtures("real_pauses")
async def test_a_429_pauses_the_pool_for_other_clients(
    redis_server: RedisServer, server: FakeAdminServer, prefix: str
) -> None:
    # Separate RedisLimiters: separate queues and connections, only Redis in common.
    limits = Limits(global_rate=Rate(50, per=1.0))
    ids = record_ids(server, 2)
    async with (
        RedisLimiter(redis_server.url, prefix=prefix) as limiter_a,
        RedisLimiter(redis_server.url, prefix=prefix) as limiter_b,
        make_client(server, limiter_a, limits=limits, retry=RetryPolicy(max_attempts=1)) as a,
        make_client(server, limiter_b, limits=limits) as b,
    ):
        server.enqueue(429, {"success": False}, {"Retry-After": "0.6"}, path=f"customers/{ids[0]}")
        with pytest.raises(RateLimitError):
            await a.request("GET", f"customers/{ids[0]}")
        # The pause goes to Redis in the background; wait for that task (test-only peek).
        await asyncio.gather(*a._bound_limiter().learning._background)
        await b.request("GET", f"customers/{ids[1]}")
    first, second = server.requests
    assert (first.status, second.status) == (429, 200)
    assert second.time - first.time >= 0.6 - SLACK


async def test_a_429_slows_down_the_pool_of_other_clients(
    redis_server: RedisServer, server: FakeAdminServer, prefix: str
) -> None:
    ids = record_ids(server, 3)
    async with (
        RedisLimiter(redis_server.url, prefix=prefix) as limiter_a,
        RedisLimiter(redis_server.url, prefix=prefix) as limiter_b,
        make_client(server, limiter_a, retry=RetryPolicy(max_attempts=1)) as a,
        make_client(server, limiter_b) as b,
    ):
        server.enqueue(429, {"success": False}, path=f"customers/{ids[0]}")
        with pytest.raises(RateLimitError):
            await a.request("GET", f"customers/{ids[0]}")
        await asyncio.gather(*a._bound_limiter().learning._background)
        widened = a.stats.pools["global"]
        learnt = a._bound_limiter()._global.slowdown.value(asyncio.get_running_loop().time())
        assert learnt > 1.04  # at least one step (decaying since)
        # b's first start brings the shared slowdown back; its next one is paced by it.
        for record_id in ids[1:]:
            await b.request("GET", f"customers/{record_id}")
        pool = b.stats.pools["global"]
        assert pool.paced_by == "429"
        assert pool.interval == pytest.approx(
            Limits().global_rate.interval * (1 + pool.margin) * learnt, rel=1e-3
        )
        assert widened.rate_limited == 1


async def test_processes_share_the_rate(
    redis_server: RedisServer, server: FakeAdminServer, prefix: str
) -> None:
    """Two worker processes, 15 requests each, 20/s together, measured by the server."""
    rate, each = Rate(20, per=1.0), 15
    server.set_rate_limits(ServerRateLimits(global_rate=rate))
    # A wider margin than the default, for the scheduling jitter of three processes on a
    # loaded test machine (20 starts paced 10% apart span 0.1 s beyond the window: a start
    # stalled longer draws a 429; 20% leaves 0.2 s); the server's sliding window is the judge.
    margin = 0.2
    ids = record_ids(server, 2 * each)
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WORKER,
            json.dumps(
                {
                    "redis": redis_server.url,
                    "prefix": prefix,
                    "base_url": server.base_url,
                    "token": server.store("acme").token,
                    "name": f"worker-{w}",
                    "rate": [rate.n, rate.per],
                    "margin": margin,
                    "ids": ids[w::2],
                }
            ),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for w in range(2)
    ]
    try:
        # Start both at once, so that their requests overlap.
        for worker in workers:
            assert worker.stdout is not None
            assert (await asyncio.wait_for(worker.stdout.readline(), 30)).strip() == b"ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"go\n")
            await worker.stdin.drain()
        outputs = [await asyncio.wait_for(w.communicate(), 30) for w in workers]
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
    assert [w.returncode for w in workers] == [0, 0], outputs
    assert [json.loads(out) for out, _ in outputs] == [{"ok": each}, {"ok": each}]

    stats = server.stats("acme").pool("global")
    assert (stats.accepted, stats.rejected) == (2 * each, 0)
    assert stats.max_in_window(rate.per) <= rate.n
    # Shared, not each at the full rate: the 30 starts span about 29 intervals.
    interval = rate.interval * (1 + margin)
    starts = sorted(stats.starts)
    assert starts[-1] - starts[0] >= (2 * each - 1) * interval - 0.1
    # And the two processes really ran side by side.
    by_worker = [
        r.headers["user-agent"].split()[0] for r in sorted(server.requests, key=lambda r: r.time)
    ]
    assert set(by_worker[:each]) == {"worker-0", "worker-1"}


WORKER = """
import asyncio, json, sys
from asyncsubs import AdminClient, Limits, Rate
from asyncsubs.redis import RedisLimiter

async def main(cfg):
    margin = cfg["margin"]
    limits = Limits(global_rate=Rate(*cfg["rate"]), safety_margin=margin, max_margin=margin)
    async with RedisLimiter(cfg["redis"], prefix=cfg["prefix"]) as limiter, AdminClient(
        token=cfg["token"], base_url=cfg["base_url"], store="acme", limits=limits,
        limiter=limiter, user_agent=cfg["name"],
    ) as client:
        await limiter.pacing.client().ping()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        done = await asyncio.gather(
            *(client.request("GET", f"customers/{i}") for i in cfg["ids"])
        )
    print(json.dumps({"ok": sum(r.status == 200 for r in done)}))

asyncio.run(main(json.loads(sys.argv[1])))
"""


# --------------------------------------------------------------------------------------------
# Redis down


async def test_redis_down_fails_fast_with_limiter_unavailable(server: FakeAdminServer) -> None:
    limiter = RedisLimiter(dead_url(password="hunter2"), timeout=0.5)
    async with limiter, make_client(server, limiter) as client:
        for _ in range(2):  # every request, not just the first: never silently unlimited
            started = time.monotonic()
            with pytest.raises(LimiterUnavailableError) as info:
                await client.request("GET", "customers/1")
            assert time.monotonic() - started < 1.0
            assert "hunter2" not in str(info.value)
            assert "fallback_fraction" in str(info.value)  # says what else one can do
    assert server.requests == []


async def test_a_hung_redis_fails_within_the_timeout() -> None:
    # Accepts connections (the kernel does) and never answers: a stuck or overloaded Redis.
    with socket.create_server(("127.0.0.1", 0)) as hung:
        url = f"redis://127.0.0.1:{hung.getsockname()[1]}/0"
        strict = RedisPacing(url, timeout=0.3)
        lenient = RedisPacing(url, timeout=0.3, fallback_fraction=0.5, recheck_after=0.05)
        try:
            started = time.monotonic()
            with pytest.raises(LimiterUnavailableError):
                await strict.reserve("acme", "global", 1.0)
            assert time.monotonic() - started < 0.55  # a timeout is not retried
            started = time.monotonic()
            assert await lenient.reserve("acme", "global", 1.0) == (0.0, 1.0)
            assert time.monotonic() - started < 0.55
            # Known down: later acquires do not wait for Redis at all (the PING runs aside).
            started = time.monotonic()
            assert 2.0 - SLACK < await wait(lenient, "acme", "global", 1.0) <= 2.0
            assert time.monotonic() - started < SLACK
        finally:
            await strict.aclose()
            await lenient.aclose()


class _CancelledAsTimeout(aioredis.Redis):
    """A command that reports its cancellation as redis-py 8.1 can: a cancel landing while
    it reads the reply comes out of its ``asyncio.timeout`` as redis-py's TimeoutError."""

    entered: asyncio.Event

    async def evalsha(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise RedisTimeoutError("Timeout reading from 127.0.0.1:6379") from None


class _CancelledThenRetried(aioredis.Redis):
    """A command whose cancellation redis-py takes for a timeout and retries: the reply comes
    back, and the cancellation is spent."""

    entered: asyncio.Event

    async def evalsha(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        return [0, "1.0", 0, 0]  # the retry's reply: a slot now


@pytest.mark.parametrize(
    "fake", [_CancelledAsTimeout, _CancelledThenRetried], ids=["timeout", "retried reply"]
)
async def test_a_cancelled_reserve_stays_cancelled(fake: type[aioredis.Redis]) -> None:
    """Regression, both ways redis-py can spend a cancellation (as its TimeoutError, or in a
    retry that brings the reply): the request went out anyway and the task went on sending; a
    bulk job cancelling its tasks then waited on it (a benchmark worker outlived its watchdog)."""
    client: Any = fake()
    client.entered = asyncio.Event()
    pacing = RedisPacing(client, fallback_fraction=0.5)
    reserving = asyncio.create_task(pacing.reserve("acme", "global", 0.1))
    await client.entered.wait()
    reserving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reserving
    assert not pacing.down
    await pacing.aclose()


async def test_fallback_paces_in_process_at_the_fraction_with_a_warning(
    server: FakeAdminServer, caplog: pytest.LogCaptureFixture
) -> None:
    limits = Limits(global_rate=Rate(20, per=1.0), safety_margin=0.0)
    limiter = RedisLimiter(dead_url(), fallback_fraction=0.5, timeout=0.5, recheck_after=60)
    ids = record_ids(server, 6)
    with caplog.at_level(logging.WARNING, logger="asyncsubs.redis"):
        async with limiter, make_client(server, limiter, limits=limits) as client:
            done = await asyncio.gather(*(client.request("GET", f"customers/{i}") for i in ids))
            assert limiter.pacing.fallback_active
    assert [r.status for r in done] == [200] * 6
    # Half of 20/s: one start every 0.1 s (0.05 s would be the full rate). Arrival times at
    # the server carry some jitter, hence the slack.
    times = [r.time for r in server.requests]
    assert times[-1] - times[0] >= 5 * 0.1 - 0.03
    assert all(b - a >= 0.075 for a, b in itertools.pairwise(times))
    warnings = [r for r in caplog.records if r.name == "asyncsubs.redis"]
    assert len(warnings) == 1  # once per outage, not per request
    assert "50%" in warnings[0].getMessage()


async def test_redis_failing_midway_and_coming_back(
    own_redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    kwargs: dict[str, Any] = {"prefix": prefix, "timeout": 0.5, "recheck_after": 0.05}
    strict = RedisPacing(own_redis_server.url, **kwargs)
    lenient = RedisPacing(own_redis_server.url, fallback_fraction=0.25, **kwargs)
    try:
        assert await strict.reserve("acme", "global", 1.0) == (0.0, 1.0)
        claimed = await wait(lenient, "acme", "global", 1.0)
        assert 1.0 - SLACK < claimed <= 1.0
        claim_end = time.monotonic() + claimed + 1.0  # as Redis holds it, give or take SLACK
        # lenient's next start, at the soonest: an interval after the slot it claimed in Redis.
        soonest = time.monotonic() + claimed + 1.0
        own_redis_server.stop()

        with caplog.at_level(logging.WARNING, logger="asyncsubs.redis"):
            with pytest.raises(LimiterUnavailableError, match="failed"):
                await strict.reserve("acme", "global", 1.0)
            # Down: later requests fail at once, without trying Redis, until a recheck works.
            started = time.monotonic()
            with pytest.raises(LimiterUnavailableError, match="is down"):
                await strict.reserve("acme", "global", 1.0)
            assert time.monotonic() - started < SLACK

            # In-process at a quarter of the rate: one slot every 4 s, after a hold until the
            # slot it claimed in Redis is an interval behind (the others, which can have seen
            # that Redis no longer hears from this one after the timeout, 0.5 s, use it).
            hold, _ = await lenient.reserve("acme", "global", 1.0)
            assert lenient.fallback_active
            assert abs(hold - (soonest - time.monotonic())) < SLACK
            assert 4.0 + hold - SLACK < await wait(lenient, "acme", "global", 1.0) <= 4.0 + hold
            await lenient.pause("acme", "global", 10.0, 1.0)  # kept in memory, Redis not tried
            paused = await wait(lenient, "acme", "global", 1.0)
            assert 10.0 - SLACK < paused <= 10.0
            soonest = time.monotonic() + paused + 4.0  # after its last start alone

            own_redis_server.start()  # empty: as after a restart without persistence
            for pacing in (strict, lenient):
                assert pacing._probe is not None
                await asyncio.wait_for(pacing._probe, 5)  # the background check finds it
                assert not pacing.down
        messages = [r.getMessage() for r in caplog.records if r.name == "asyncsubs.redis"]
        assert len(messages) == 4
        assert "fail with LimiterUnavailableError" in messages[0]
        assert "25%" in messages[1]
        assert all("answers again" in m for m in messages[2:])

        # Shared again, through the restarted server, not before lenient's last start alone
        # is an interval behind (Redis never saw it).
        assert (
            abs(await wait(lenient, "acme", "global", 1.0) - (soonest - time.monotonic())) < SLACK
        )
        # The restarted server lost lenient's claim, still ahead: the pool's next slot is after
        # it, and an interval for a claim strict may have made since. Until strict is heard of
        # again, lenient leaves it the share a worker pacing alone takes (its own, 0.25): its
        # own interval is 1 / 0.75.
        after = claim_end - time.monotonic() + 1.0 + 1.0 / 0.75
        assert abs(await wait(strict, "acme", "global", 1.0) - after) < SLACK
    finally:
        await strict.aclose()
        await lenient.aclose()


async def test_claims_a_flush_lost_are_waited_out(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    """FLUSHALL (or a restart, an eviction) while claims are queued ahead: the next claim
    starts after them (this worker's last claim, and an interval for each other worker's
    claim since), not beside them: an early start a claim."""
    one, other = (
        RedisPacing(redis_server.url, prefix=prefix),
        RedisPacing(redis_server.url, prefix=prefix),
    )
    try:
        waits = [await wait(p, "acme", "global", 0.5) for p in (one, other, one, other)]
        assert waits == pytest.approx([0.0, 0.5, 1.0, 1.5], abs=SLACK)
        await redis.delete(*one.keys("acme", "global"))
        # The queue ran to 2.0 (other's last claim); without the rule, one's own hold: 1.5.
        assert 2.0 - SLACK < await wait(one, "acme", "global", 0.5) <= 2.0
    finally:
        await one.aclose()
        await other.aclose()


async def test_a_lost_key_is_waited_out_as_far_as_the_claims_go(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    """The claims a lost key held end where they end: time passed since the last of them is
    not waited again, nor, where others share the pool, at the pace of a share left free."""
    pacing = RedisPacing(redis_server.url, prefix=prefix)
    try:
        waits = [await wait(pacing, "acme", "global", 0.1) for _ in range(10)]
        assert waits[-1] == pytest.approx(0.9, abs=SLACK)
        ends = time.monotonic() + 1.0
        await asyncio.sleep(0.5)  # time passing, not a synchronisation
        await redis.delete(*pacing.keys("acme", "global"))
        assert abs(await wait(pacing, "acme", "global", 0.1) - (ends - time.monotonic())) < SLACK
    finally:
        await pacing.aclose()


async def test_workers_redis_lost_keep_their_share_until_heard_of_again(
    own_redis_server: RedisServer, prefix: str
) -> None:
    """Redis restarted empty: a worker back from the outage leaves the share of each worker
    that paced the store before and is not back yet (it may still pace alone) free."""
    kwargs: dict[str, Any] = {"prefix": prefix, "recheck_after": 0.05, "fallback_fraction": 0.25}
    back, behind = (
        RedisPacing(own_redis_server.url, **kwargs),
        RedisPacing(own_redis_server.url, **kwargs),
    )
    try:
        await wait(back, "acme", "global", 0.001)
        await wait(behind, "acme", "global", 0.001)
        await wait(back, "acme", "global", 0.001)  # it has seen both
        assert back.sharers("acme") == 2
        own_redis_server.stop()
        await back.reserve("acme", "global", 0.001)  # down: alone at its fraction
        own_redis_server.start()
        assert back._probe is not None
        await asyncio.wait_for(back._probe, 5)
        # A pool it did not pace alone (no start of its own to hold back for).
        assert await wait(back, "acme", "orders", 1.0) == 0.0
        assert 1 / 0.75 - SLACK < await wait(back, "acme", "orders", 1.0) <= 1 / 0.75
    finally:
        await back.aclose()
        await behind.aclose()


async def test_a_stopped_redis_fails_a_pools_queue_at_once(
    own_redis_server: RedisServer, server: FakeAdminServer, prefix: str
) -> None:
    """Regression: with Redis stopped, each queued request waited out a timeout of its own."""
    ids = record_ids(server, 8)
    limiter = RedisLimiter(own_redis_server.url, prefix=prefix, timeout=0.3, recheck_after=0.05)
    process = own_redis_server.process
    assert process is not None
    async with limiter, make_client(server, limiter) as client:
        await client.request("GET", f"customers/{ids[0]}")
        process.send_signal(signal.SIGSTOP)  # hung: connections open, nothing answers
        try:
            started = time.monotonic()
            results = await asyncio.gather(
                *(client.request("GET", f"customers/{i}") for i in ids[1:7]),
                return_exceptions=True,
            )
            # One timeout for the pool's head, then its whole queue at once (not 6 x 0.3 s).
            assert time.monotonic() - started < 0.3 + 0.2
            assert all(isinstance(r, LimiterUnavailableError) for r in results), results
            assert limiter.pacing.down
        finally:
            process.send_signal(signal.SIGCONT)
        assert limiter.pacing._probe is not None
        await asyncio.wait_for(limiter.pacing._probe, 5)
        await client.request("GET", f"customers/{ids[7]}")
    assert len(server.requests) == 2


async def test_a_script_refused_while_ping_answers_keeps_redis_down(
    own_redis_server: RedisServer,
    redis: aioredis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Regression: a recheck by PING called a Redis up that refused every script (out of
    memory), and the WARNINGs alternated every second."""
    own = aioredis.Redis.from_url(own_redis_server.url)
    pacing = RedisPacing(own_redis_server.url, prefix=prefix, recheck_after=0.02)
    try:
        with caplog.at_level(logging.DEBUG, logger="asyncsubs.redis"):
            for _ in range(2):  # two outages in a row
                await own.config_set("maxmemory", 1)
                with pytest.raises(LimiterUnavailableError, match="OutOfMemoryError"):
                    await pacing.reserve("acme", "global", 0.01)
                assert await own.ping()
                probe = pacing._probe
                assert probe is not None
                with pytest.raises(TimeoutError):  # some rechecks run, and fail
                    await asyncio.wait_for(asyncio.shield(probe), 0.2)
                assert pacing.down
                await own.config_set("maxmemory", 0)
                await asyncio.wait_for(probe, 5)
                assert not pacing.down
            # A third outage close after, which lasts: told at WARNING once it has lasted.
            monkeypatch.setattr(asyncsubs.redis, "_LOG_EVERY", 0.1)
            pacing._down_logged_at = time.monotonic()
            await own.config_set("maxmemory", 1)
            with pytest.raises(LimiterUnavailableError):
                await pacing.reserve("acme", "global", 0.01)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pacing._probe), 0.3)
            await own.config_set("maxmemory", 0)
            await asyncio.wait_for(pacing._probe, 5)
        records = [(r.levelno, r.getMessage()) for r in caplog.records]
        levels = [level for level, _ in records]
        assert levels == [logging.WARNING] * 2 + [logging.DEBUG] * 3 + [logging.WARNING] * 2
        assert "failed (OutOfMemoryError)" in records[0][1]
        assert "answers again" in records[1][1]
        assert "still fails (OutOfMemoryError)" in records[5][1]
    finally:
        await pacing.aclose()
        await own.aclose()


async def test_workers_that_may_pace_alone_leave_their_fraction_unused(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    """A worker not heard of for longer than the lapse (timeout) may be pacing alone at its
    fallback fraction: the others pace at what is left. Its entry is moved back in time."""
    pacing = RedisPacing(redis_server.url, prefix=prefix, timeout=1.0)
    now = await redis_micros(redis)
    cases = {  # store -> the other worker's entry, and the wait of a second reserve
        "lapsed": (f"{now - 2_000_000}:0.5", 2.0),  # paces alone: half the rate is left
        "heard": (f"{now - 200_000}:0.5", 1.0),  # shares through Redis
        "strict": (f"{now - 2_000_000}:0.0", 1.0),  # down, it sends nothing
        "forgotten": (f"{now - int((FORGET_AFTER + 1) * 1e6)}:0.5", 1.0),
    }
    try:
        for store, (entry, second) in cases.items():
            await redis.hset(pacing.workers_key(store), "other", entry)
            assert await pacing.reserve(store, "global", 1.0) == (0.0, 1.0)
            assert second - SLACK < await wait(pacing, store, "global", 1.0) <= second, store
        assert not await redis.hexists(pacing.workers_key("forgotten"), "other")
        assert await redis.hexists(pacing.workers_key("lapsed"), "other")
    finally:
        await pacing.aclose()


async def test_a_partitioned_worker_leaves_its_fraction_to_itself(
    redis_server: RedisServer, prefix: str
) -> None:
    """One worker cut off from Redis (a proxy that drops its connections and leaves new ones
    unanswered) paces alone; the other, once it has missed it for ``timeout``, paces at what
    is left."""
    proxy = Proxy(redis_server.url)
    cut_off = RedisPacing(proxy.url, prefix=prefix, fallback_fraction=0.5, timeout=0.3)
    other = RedisPacing(redis_server.url, prefix=prefix, timeout=0.3)
    try:
        assert await cut_off.reserve("acme", "global", 1.0) == (0.0, 1.0)
        assert 1.0 - SLACK < await wait(other, "acme", "global", 1.0) <= 1.0
        proxy.cut()
        await cut_off.reserve("acme", "global", 1.0)  # times out, then paces alone
        assert cut_off.fallback_active
        # More than the lapse (0.3 s) since Redis last heard of cut_off: half the rate is left,
        # so each slot other claims now is two intervals from the next.
        first = await wait(other, "acme", "global", 1.0)
        second = await wait(other, "acme", "global", 1.0)
        assert 2.0 - SLACK < second - first < 2.0 + SLACK
    finally:
        proxy.heal()
        await cut_off.aclose()
        await other.aclose()
        proxy.close()


async def test_an_idle_worker_that_may_pace_alone_keeps_its_heartbeat(
    redis_server: RedisServer, redis: aioredis.Redis, prefix: str
) -> None:
    pacing = RedisPacing(redis_server.url, prefix=prefix, fallback_fraction=0.5, timeout=0.4)
    key = pacing.workers_key("acme")
    try:
        await pacing.reserve("acme", "global", 0.01)
        at, fraction = (await redis.hget(key, pacing.worker)).decode().split(":")
        assert fraction == "0.5"
        await redis.hset(key, pacing.worker, f"{int(at) - 10**6}:0.5")
        pacing._used["acme"] -= 1.0  # last heard of a second ago: idle since
        await pacing._beat_once()
        renewed = int((await redis.hget(key, pacing.worker)).decode().split(":")[0])
        assert 0 <= await redis_micros(redis) - renewed < SLACK * 1e6
    finally:
        await pacing.aclose()
    assert not await redis.hexists(key, pacing.worker)  # gone, not lapsed


async def test_workers_with_other_limits_are_told_once(
    redis_server: RedisServer, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Regression: workers at Rate(50) and Rate(100) for one store drew 429s, nothing logged."""
    async with (
        RedisLimiter(redis_server.url, prefix=prefix) as fifty,
        RedisLimiter(redis_server.url, prefix=prefix) as hundred,
        RedisLimiter(redis_server.url, prefix=prefix) as same,
    ):
        fifty.bind("acme", Limits(global_rate=Rate(50)))
        hundred.bind("acme", Limits(global_rate=Rate(100)))
        same.bind("acme", Limits(global_rate=Rate(50)))
        with caplog.at_level(logging.WARNING, logger="asyncsubs.redis"):
            for _ in range(3):
                for limiter in (fifty, hundred):
                    await limiter.pacing.reserve("acme", "global", 0.001)
        messages = [r.getMessage() for r in caplog.records]
        assert len(messages) == 2  # once by each worker
        assert "one start every 0.02s, this one for every 0.01s" in messages[0]
        assert "one start every 0.01s, this one for every 0.02s" in messages[1]
        caplog.clear()
        fifty.bind("acme", Limits(global_rate=Rate(50)))
        await fifty.pacing.reserve("acme", "global", 0.001)
        await same.pacing.reserve("acme", "global", 0.001)
        assert caplog.records == []


async def test_a_redis_clock_step_back_is_repaired_and_logged(
    redis_server: RedisServer,
    redis: aioredis.Redis,
    prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: a key written 5 s ahead of Redis's clock (a failover to a node that is
    behind) stopped every worker for 5 s, nothing logged."""
    pacing = RedisPacing(redis_server.url, prefix=prefix)
    gcra = pacing.keys("acme", "global")[0]
    try:
        assert await pacing.reserve("acme", "global", 1.0) == (0.0, 1.0)
        ahead = await redis_micros(redis) + 5_000_000
        await redis.hset(gcra, mapping={"tat": ahead + 1_000_000, "at": ahead})
        with caplog.at_level(logging.WARNING, logger="asyncsubs.redis"):
            assert 1.0 - SLACK < await wait(pacing, "acme", "global", 1.0) <= 1.0
            assert 2.0 - SLACK < await wait(pacing, "acme", "global", 1.0) <= 2.0
        (record,) = caplog.records
        assert "earlier than when it last paced the pool" in record.getMessage()
        assert isinstance(record.args, tuple)
        assert 5.0 - SLACK < record.args[-1] <= 5.0  # the step, in seconds
    finally:
        await pacing.aclose()


# --------------------------------------------------------------------------------------------
# Construction


async def test_a_given_client_is_used_and_left_open(
    redis_server: RedisServer, server: FakeAdminServer, prefix: str
) -> None:
    redis = aioredis.Redis.from_url(redis_server.url)
    try:
        async with (
            RedisLimiter(redis, prefix=prefix) as limiter,
            make_client(server, limiter) as client,
        ):
            assert limiter.pacing.client() is redis
            await client.request("GET", f"customers/{record_ids(server, 1)[0]}")
        assert await redis.exists(*limiter.pacing.keys("acme", "global")) == 1
        assert await redis.ping()
    finally:
        await redis.aclose()


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        (("redis://localhost",), {"prefix": "a{b}"}),
        (("redis://localhost",), {"prefix": ""}),
        (("redis://localhost",), {"fallback_fraction": 0}),
        (("redis://localhost",), {"fallback_fraction": 1.5}),
        (("redis://localhost",), {"fallback_fraction": True}),
        (("redis://localhost",), {"timeout": 0}),
        (("redis://localhost",), {"idle_ttl": -1}),
        (("redis://localhost",), {"recheck_after": float("inf")}),
        (("http://localhost",), {}),
        ((42,), {}),
    ],
)
def test_bad_configuration_is_a_config_error(
    args: tuple[object], kwargs: dict[str, object]
) -> None:
    with pytest.raises(ConfigError):
        RedisLimiter(*args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("redis://user:hunter2@cache.internal:6380/2", "redis://cache.internal:6380/2"),
        ("redis://default:hunter2%2Fabcd@cache.internal", "redis://cache.internal"),
        ("redis://cache.internal/0?password=hunter2", "redis://cache.internal/0"),
        ("rediss://u:hunter2@[fe80::1]:7000/3", "rediss://[fe80::1]:7000/3"),
        ("unix://:hunter2@/run/redis.sock?db=1", "unix:///run/redis.sock"),
    ],
)
def test_the_url_password_never_shows(url: str, where: str) -> None:
    limiter = RedisLimiter(url)
    assert limiter.pacing.where == where
    message = str(limiter.pacing._unavailable("acme", OSError()))
    assert "hunter2" not in repr(limiter) + repr(limiter.pacing) + message
    assert where in message


def test_a_malformed_url_shows_no_password_in_the_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        RedisLimiter("redis:/:hunter2@cache.internal")
    assert "hunter2" not in str(info.value)
    assert "redis://cache.internal" in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://default:hunter2/abcd@cache.internal",  # a password's '/', '#' not encoded
        "redis://:hunter2#xy@cache.internal",
        "redis://cache.internal:hunter2",
        "redis://:2024/hunter2@cache.internal:6379/0",  # read as port 2024 of no host
        "redis://:hunter2?x@cache.internal",
    ],
)
def test_a_url_redis_py_cannot_read_is_a_config_error_up_front(url: str) -> None:
    """Accepted, it failed at the first request, in a background task's unretrieved
    exception that quoted the password (and a fallback paced on as if Redis were down)."""
    shown = []
    for check in (RedisLimiter, check_redis_url):
        with pytest.raises(ConfigError, match="percent-encoded") as info:
            check(url)
        assert "hunter2" not in str(info.value)
        assert info.value.__cause__ is None
        assert info.value.__context__ is None
        shown.append(str(info.value))
    assert "redis://cache.internal" in shown[0]


@pytest.mark.parametrize("url", ["redis://:hunter2@[::1/0", "redis://:hunter2@::1]:6379/0"])
def test_a_url_with_a_bracket_unmatched_is_a_config_error(url: str) -> None:
    """urlsplit's ValueError was an internal error (exit 1) on the command line."""
    for check in (RedisLimiter, check_redis_url):
        with pytest.raises(ConfigError, match=r"a '\[' or '\]' unmatched") as info:
            check(url)
        assert "hunter2" not in str(info.value)
        assert info.value.__context__ is None


async def test_tls_against_a_plain_port_says_so(redis_server: RedisServer) -> None:
    pacing = RedisPacing(redis_server.url.replace("redis://", "rediss://"), timeout=0.3)
    try:
        with pytest.raises(LimiterUnavailableError, match="does that port serve TLS"):
            await pacing.reserve("acme", "global", 1.0)
    finally:
        await pacing.aclose()


# --------------------------------------------------------------------------------------------
# Redis Cluster (last: its node has needed ~2 s since the session started before it takes writes)


async def test_works_on_redis_cluster(redis_cluster: RedisServer, prefix: str) -> None:
    # Each script touches three keys; Redis Cluster refuses that unless they share a slot.
    # The scripts read the clock (TIME) before writing, which a cluster replicates by effects.
    cluster = aioredis.RedisCluster.from_url(redis_cluster.url)
    try:
        async with RedisLimiter(cluster, prefix=prefix) as limiter:
            pacing = limiter.pacing
            for store in ("acme", "we{ird}"):
                assert await pacing.reserve(store, "global", 2.0) == (0.0, 1.0)
                assert 2.0 - SLACK < (await pacing.reserve(store, "global", 2.0))[0] <= 2.0
                await pacing.pause(store, "global", 5.0, 1.5)
                delay, slowdown = await pacing.reserve(store, "global", 2.0)
                assert 5.0 - SLACK < delay <= 5.0
                assert slowdown == pytest.approx(1.5, abs=1e-3)
        slot = await cluster.cluster_keyslot("{acme}")
        assert {key_slot(k.encode()) for k in pacing.keys("acme", "orders")} == {slot}
    finally:
        await cluster.aclose()
