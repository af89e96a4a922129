"""A Redis-backed limiter: each store's budget shared by every process and host that uses it.

::

    from asyncsubs.redis import RedisLimiter

    limiter = RedisLimiter("redis://redis.internal:6379/0")    # pip install 'asyncsubs[redis]'
    async with AdminClient(token=..., base_url=..., store="acme", limiter=limiter) as client:
        ...
    await limiter.aclose()

The limiter enforces the same :class:`~asyncsubs.Limits` as the in-process one: per
``(store, pool)``, even pacing, the same safety margin. Queues, the in-flight cap and statistics
stay in each process (:class:`~asyncsubs._limiter.StoreLimiter`); only the pacing is shared,
through :class:`RedisPacing`, the :class:`~asyncsubs._limiter.PacingBackend` for Redis.

Design
------
- One acquire is one round trip: ``EVALSHA`` of a Lua script doing GCRA without burst. The
  pool's key holds its *theoretical arrival time* (TAT) in microseconds of Redis ``TIME``; the
  script claims ``slot = max(now, tat, pause_end)``, stores ``tat = slot + interval`` and returns
  ``slot - now``, which the client sleeps exactly (a timer, no polling). Every clock reading is
  Redis's, so host clocks never matter.
- Keys: ``{prefix}:{{store}}:tat:{pool}`` and ``{prefix}:{{store}}:pause:{pool}``. The ``{store}``
  hash tag keeps a store's keys in one Redis Cluster slot. A TAT key expires ``idle_ttl`` seconds
  after its last slot has passed; a pause key when its pause ends. Nothing else is ever stored.
- A 429 seen by any process sets the pool's pause key (never shortening a longer pause); every
  process's next slot comes after it.

When Redis fails
----------------
Redis unreachable, timing out or answering with an error:

- by default, the request fails with :class:`~asyncsubs.errors.LimiterUnavailableError` and is
  not sent (never silently unlimited). Connect and command timeouts are ``timeout`` seconds.
- with ``fallback_fraction=f``, each process paces on its own at ``f`` times each rate (use
  ``1 / number of processes`` or less) and logs a WARNING on ``asyncsubs.redis``; a background
  ``PING`` every ``recheck_after`` seconds finds Redis again (another WARNING says so), and
  acquisitions never wait on a Redis that is known to be down.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import urllib.parse
import weakref
from types import TracebackType
from typing import Any, Final, TypeAlias

from ._calibration import SLOWDOWN_HALF_LIFE
from ._limiter import Limiter, MemoryPacing
from .errors import ConfigError, LimiterUnavailableError

try:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import NoScriptError, RedisError
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("asyncsubs.redis needs redis-py: pip install 'asyncsubs[redis]'") from exc

__all__ = ["RedisClient", "RedisLimiter", "RedisPacing"]

logger = logging.getLogger("asyncsubs.redis")

#: A redis-py asyncio client, single node or cluster.
RedisClient: TypeAlias = aioredis.Redis | aioredis.RedisCluster

_US: Final = 1_000_000
_HALF_LIFE_US: Final = int(SLOWDOWN_HALF_LIFE * _US)
#: A slowdown key outlives its last widening by ten half-lives (its excess then < 0.1%).
_SLOWDOWN_TTL_MS: Final = int(SLOWDOWN_HALF_LIFE * 10 * 1000)

# GCRA without burst on Redis's clock. Integers of microseconds since the epoch are exact in
# Lua's doubles (up to 2**53); '%.0f' writes them whole (tostring() would keep 14 digits only).
# Redis >= 5 replicates scripts by effects, so TIME before a write is allowed; the guarded
# replicate_commands() call makes Redis 3.2/4 do the same.
RESERVE_SCRIPT: Final = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or 0
local pause_end = tonumber(redis.call('GET', KEYS[2])) or 0
local slot = math.max(now, tat, pause_end)
local new_tat = slot + tonumber(ARGV[1])
local ttl = math.ceil((new_tat - now) / 1000) + tonumber(ARGV[2])
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', string.format('%.0f', ttl))
local slow = redis.call('HMGET', KEYS[3], 'excess', 'at')
local slowdown = 1
if slow[1] and slow[2] then
  local age = math.max(0, now - tonumber(slow[2]))
  slowdown = 1 + tonumber(slow[1]) * math.pow(0.5, age / tonumber(ARGV[3]))
end
return {slot - now, tostring(slowdown)}
"""

# A pause never shortens a longer one (its key expires when it ends); a slowdown never lowers
# the current, decayed one (its key expires once the excess has decayed to nothing).
PAUSE_SCRIPT: Final = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local length = tonumber(ARGV[1])
if length > 0 then
  local pause_end = now + length
  local current = tonumber(redis.call('GET', KEYS[1])) or 0
  if pause_end > current then
    local ttl = math.ceil(length / 1000)
    redis.call('SET', KEYS[1], string.format('%.0f', pause_end), 'PX', string.format('%.0f', ttl))
  end
end
local factor = tonumber(ARGV[2])
if factor > 1 then
  local slow = redis.call('HMGET', KEYS[2], 'excess', 'at')
  local current = 1
  if slow[1] and slow[2] then
    local age = math.max(0, now - tonumber(slow[2]))
    current = 1 + tonumber(slow[1]) * math.pow(0.5, age / tonumber(ARGV[3]))
  end
  if factor > current then
    redis.call('HSET', KEYS[2], 'excess', tostring(factor - 1), 'at', string.format('%.0f', now))
    redis.call('PEXPIRE', KEYS[2], ARGV[4])
  end
end
return 1
"""

#: What counts as Redis failing (redis-py wraps most socket errors; OSError covers the rest,
#: TimeoutError included).
_FAILURES: Final = (RedisError, OSError)


class _Script:
    """A Lua script run by ``EVALSHA``, loaded on the server's first ``NOSCRIPT`` only."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, client: RedisClient, keys: list[str], args: list[int | str]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # A restarted or flushed server: EVAL runs the script and caches it again.
            return await client.eval(self.source, len(keys), *keys, *args)


_RESERVE: Final = _Script(RESERVE_SCRIPT)
_PAUSE: Final = _Script(PAUSE_SCRIPT)


def _escape(text: str) -> str:
    # Braces would move the Cluster hash tag; '%' is escaped so the mapping stays one-to-one.
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _micros(seconds: float) -> int:
    # Rounded up: pacing a microsecond slower is safe, a microsecond faster is not.
    return max(1, math.ceil(seconds * _US))


def _redacted(url: str) -> str:
    """``scheme://host:port/db`` without credentials, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparsable Redis URL>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _describe(client: RedisClient) -> str:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if isinstance(kwargs, dict) and "host" in kwargs:
        return f"redis://{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    return f"the given {type(client).__name__} client"


def _check_seconds(name: str, value: Any, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero):
        raise ConfigError(f"{name} must be {'>= 0' if zero else '> 0'}, got {value!r}")
    return float(value)


class RedisPacing:
    """The :class:`~asyncsubs._limiter.PacingBackend` on Redis; see the module docstring.

    ``url_or_client``: a ``redis://``/``rediss://``/``unix://`` URL (a client is then made per
    event loop, with ``timeout`` for connects and commands and one immediate retry on a broken
    connection; URL query options override both), or a ``redis.asyncio.Redis`` /
    ``RedisCluster`` used as is and never closed here.
    """

    def __init__(
        self,
        url_or_client: str | RedisClient,
        *,
        prefix: str = "asyncsubs",
        fallback_fraction: float | None = None,
        timeout: float = 1.0,
        idle_ttl: float = 10.0,
        recheck_after: float = 1.0,
    ) -> None:
        if not isinstance(prefix, str) or not prefix or "{" in prefix or "}" in prefix:
            raise ConfigError(f"prefix must be a non-empty string without braces, got {prefix!r}")
        if fallback_fraction is not None and (
            isinstance(fallback_fraction, bool)
            or not isinstance(fallback_fraction, int | float)
            or not 0 < fallback_fraction <= 1
        ):
            raise ConfigError(
                f"fallback_fraction must be in (0, 1] or None, got {fallback_fraction!r}"
            )
        self.prefix = prefix
        self.fallback_fraction = None if fallback_fraction is None else float(fallback_fraction)
        self.timeout = _check_seconds("timeout", timeout)
        self.idle_ttl = _check_seconds("idle_ttl", idle_ttl, zero=True)
        self.recheck_after = _check_seconds("recheck_after", recheck_after)
        self._url: str | None = None
        self._client: RedisClient | None = None
        if isinstance(url_or_client, str):
            if not url_or_client.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigError(
                    "url_or_client must be a redis://, rediss:// or unix:// URL"
                    f" or a redis.asyncio client, got {_redacted(url_or_client)!r}"
                )
            self._url = url_or_client
            self.where = _redacted(url_or_client)
        elif isinstance(url_or_client, aioredis.Redis | aioredis.RedisCluster):
            self._client = url_or_client
            self.where = _describe(url_or_client)
        else:
            raise ConfigError(
                f"url_or_client must be a Redis URL or a redis.asyncio client,"
                f" got {type(url_or_client).__name__}"
            )
        # redis-py connections belong to the loop that opened them, and a Limiter may serve
        # several loops (threads), so clients made from a URL are kept per loop.
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aioredis.Redis] = (
            weakref.WeakKeyDictionary()
        )
        self._idle_ms = math.ceil(self.idle_ttl * 1000)
        # Fallback state: pacing in this process while Redis is down, and the recovery probe.
        self._memory = MemoryPacing()
        self._down = False
        self._probe: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = " (down, in-process fallback)" if self._down else ""
        return f"<RedisPacing {self.where} prefix={self.prefix!r}{state}>"

    @property
    def fallback_active(self) -> bool:
        """True while Redis is known to be down and this process paces on its own."""
        return self._down

    def keys(self, store: str, pool: str) -> tuple[str, str, str]:
        """The TAT, pause and slowdown keys of ``(store, pool)``."""
        base = f"{self.prefix}:{{{_escape(store)}}}"
        return f"{base}:tat:{pool}", f"{base}:pause:{pool}", f"{base}:slowdown:{pool}"

    def client(self) -> RedisClient:
        """The Redis client for the running loop (made on first use from a URL)."""
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            assert self._url is not None
            client = self._clients[loop] = aioredis.Redis.from_url(
                self._url,
                socket_connect_timeout=self.timeout,
                socket_timeout=self.timeout,
                # One immediate retry, on a broken connection only, heals a pooled connection
                # that Redis closed (a restart); a timeout is not retried, so a hung Redis
                # fails within ``timeout``. (The default, 10 retries with backoff, would hold
                # every request for seconds.) A retried reserve may claim two slots: that only
                # slows the pool down.
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            )
        return client

    async def aclose(self) -> None:
        """Close the client this backend made for the running loop (a given client stays open)."""
        loop = asyncio.get_running_loop()
        probe, self._probe = self._probe, None
        if probe is not None and not probe.done():
            probe.cancel()
            if probe.get_loop() is loop:
                # Wait for it to end, so that closing the loop finds no pending task.
                await asyncio.gather(probe, return_exceptions=True)
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    # -- PacingBackend ---------------------------------------------------------------------------

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]:
        fraction = self.fallback_fraction
        if fraction is not None and self._down:
            self._start_probe()
            return await self._memory.reserve(store, pool, interval / fraction)
        try:
            reply = await _RESERVE(
                self.client(),
                list(self.keys(store, pool)),
                [_micros(interval), self._idle_ms, _HALF_LIFE_US],
            )
            wait, slowdown = int(reply[0]) / _US, float(reply[1])
        except (*_FAILURES, ValueError, TypeError, IndexError) as exc:  # or a malformed reply
            if fraction is None:
                raise self._unavailable(store, exc) from exc
            self._enter_fallback(store, exc)
            return await self._memory.reserve(store, pool, interval / fraction)
        return wait, slowdown

    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None:
        # Also kept in memory, so a fallback that starts during the pause still honours it.
        await self._memory.pause(store, pool, seconds, slowdown)
        if self.fallback_fraction is not None and self._down:
            return
        _, pause_key, slowdown_key = self.keys(store, pool)
        args: list[int | str] = [
            _micros(seconds) if seconds > 0 else 0,
            repr(float(slowdown)),
            _HALF_LIFE_US,
            _SLOWDOWN_TTL_MS,
        ]
        try:
            await _PAUSE(self.client(), [pause_key, slowdown_key], args)
        except _FAILURES as exc:
            if self.fallback_fraction is None:
                raise self._unavailable(store, exc) from exc
            self._enter_fallback(store, exc)

    # -- failures ----------------------------------------------------------------------------

    def _unavailable(self, store: str, exc: BaseException) -> LimiterUnavailableError:
        # The exception's type only: redis-py messages are safe today, but a URL with its
        # password must never reach a log through one. The cause stays chained.
        return LimiterUnavailableError(
            f"Redis rate limiter at {self.where} failed for store {store!r}"
            f" ({type(exc).__name__}); the request was not sent. RedisLimiter(...,"
            " fallback_fraction=f) paces each process on its own at f x the rate instead"
        )

    def _enter_fallback(self, store: str, exc: BaseException) -> None:
        if self._down:
            return
        self._down = True
        assert self.fallback_fraction is not None
        logger.warning(
            "Redis rate limiter at %s failed (%s): store %r and every other store of this"
            " limiter now paced in this process alone at %.0f%% of each rate until Redis"
            " answers again",
            self.where,
            type(exc).__name__,
            store,
            self.fallback_fraction * 100,
        )
        self._start_probe()

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._recheck())

    async def _recheck(self) -> None:
        """While down: PING every ``recheck_after`` seconds, in the background, until it works."""
        while self._down:
            await asyncio.sleep(self.recheck_after)
            try:
                await self.client().ping()
            except _FAILURES:
                continue
            self._down = False
            logger.warning(
                "Redis rate limiter at %s answers again: pacing is shared again", self.where
            )


class RedisLimiter(Limiter):
    """Each store's budget shared through Redis by every process and host using it.

    ``AdminClient(limiter=RedisLimiter("redis://host:6379/0"), store="acme")`` in every worker:
    the same :class:`~asyncsubs.Limits` semantics as the in-process limiter, for all of them
    together. Arguments are those of :class:`RedisPacing`:

    - ``prefix``: start of every key (no braces), to keep several deployments apart.
    - ``fallback_fraction``: None (default) makes requests fail with
      :class:`~asyncsubs.errors.LimiterUnavailableError` while Redis fails; a fraction in
      (0, 1] makes each process pace alone at that fraction of each rate instead, with a
      WARNING logged on ``asyncsubs.redis`` when it starts and ends.
    - ``timeout``: seconds for connecting to Redis and for each command (URL only).
    - ``idle_ttl``: seconds a pool's key outlives its last slot before Redis deletes it.
    - ``recheck_after``: seconds between background PINGs while falling back.

    Close it with ``await limiter.aclose()`` or ``async with RedisLimiter(...) as limiter``
    (clients are per event loop; a client passed in is left open).
    """

    def __init__(
        self,
        url_or_client: str | RedisClient,
        *,
        prefix: str = "asyncsubs",
        fallback_fraction: float | None = None,
        timeout: float = 1.0,
        idle_ttl: float = 10.0,
        recheck_after: float = 1.0,
    ) -> None:
        self.pacing: Final = RedisPacing(
            url_or_client,
            prefix=prefix,
            fallback_fraction=fallback_fraction,
            timeout=timeout,
            idle_ttl=idle_ttl,
            recheck_after=recheck_after,
        )
        super().__init__(self.pacing)

    def __repr__(self) -> str:
        return f"<RedisLimiter {self.pacing.where} prefix={self.pacing.prefix!r}>"

    async def aclose(self) -> None:
        """Close the Redis connections this limiter opened in the running loop."""
        await self.pacing.aclose()

    async def __aenter__(self) -> RedisLimiter:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
