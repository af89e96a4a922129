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
  pool's GCRA hash holds its *theoretical arrival time* (TAT) in microseconds of Redis
  ``TIME``; the script claims ``slot = max(now, tat, pause_end)``, stores ``tat = slot +
  interval`` and returns ``slot - now``, which the client sleeps exactly (a timer, no polling),
  with the pool's shared 429 slowdown. Every clock reading is Redis's, so host clocks never
  matter.
- Keys per ``(store, pool)``: ``{prefix}:{{store}}:gcra:{pool}`` (TAT, the configured
  interval, when written), ``...:pause:{pool}``, ``...:slowdown:{pool}``, and
  ``...:learned:{pool}`` (what a discovering pool, or a list path's page size, learned: a
  versioned record written compare-and-set, see :meth:`RedisPacing.exchange`); per store
  ``{prefix}:{{store}}:workers``. The ``{store}`` hash tag keeps a store's keys in one Redis
  Cluster slot. Every key expires on its own: the GCRA hash ``idle_ttl`` seconds after its last
  slot, a pause when it ends, a slowdown after ten half-lives, the workers hash
  :data:`FORGET_AFTER` seconds after its last entry, a learned record a week after its last
  change.
- A 429 seen by any process sets the pool's pause (never shortening a longer one) and raises
  its slowdown (never lowering it); every process's next slot comes after and slower.
- Each pool's configured interval goes with its key: a worker configured otherwise than the
  last one logs a WARNING once per pool (``Limits`` must be the same in every worker).
- A key written later than Redis's clock now reads (a failover to a node that is behind)
  has its TAT moved back by as much, with a WARNING, instead of stalling the pool.

When Redis fails
----------------
Redis unreachable, timing out or answering with an error (``timeout`` seconds for connects and
commands): the backend is *down* from that failure until a background recheck, the reserve
script on keys of its own every ``recheck_after`` seconds, succeeds. While down no request
waits on Redis, so a pool's queue does not wait out one timeout per request (those already
waiting for one of the ``MAX_CONNECTIONS`` connections fail in turn). A WARNING says
when it goes down and when it answers again (at most once a minute; DEBUG otherwise).

- by default, requests fail with :class:`~asyncsubs.errors.LimiterUnavailableError` and are
  not sent (never silently unlimited).
- with ``fallback_fraction=f``, each process paces on its own at ``f`` times each rate (use
  ``1 / number of processes`` or less), less one start per window (see ``_alone``).

A partial outage (some workers lose Redis, the others do not) keeps the budget: every worker
records itself in the store's workers hash with each reserve (and, with a fallback, with a
heartbeat every ``timeout / 4`` while idle). A worker with a fallback not heard of for
``timeout`` seconds may be pacing alone: the others pace at ``1 - sum of such fractions`` of
each rate (at least a tenth) until it is back or forgotten. A worker that falls back first
holds until ``timeout`` after Redis last heard of it for the store, so that the others have
noticed before it starts on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import ssl
import time
import uuid
import weakref
from types import TracebackType
from typing import Any, Final, TypeAlias

import attrs
import orjson

from ._calibration import SLOWDOWN_HALF_LIFE
from ._config import Limits, check_redis_url
from ._discovery import LEARNED_MAX_AGE, Learned
from ._limiter import Limiter, MemoryPacing, StoreLimiter
from ._retry import cancellations
from .errors import ConfigError, LimiterUnavailableError

try:
    import redis.asyncio as aioredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import NoScriptError, RedisError, ResponseError
    from redis.exceptions import TimeoutError as RedisTimeoutError
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("asyncsubs.redis needs redis-py: pip install 'asyncsubs[redis]'") from exc

__all__ = ["FORGET_AFTER", "MAX_CONNECTIONS", "RedisClient", "RedisLimiter", "RedisPacing"]

logger = logging.getLogger("asyncsubs.redis")

#: A redis-py asyncio client, single node or cluster.
RedisClient: TypeAlias = aioredis.Redis | aioredis.RedisCluster

_US: Final = 1_000_000
_HALF_LIFE_US: Final = int(SLOWDOWN_HALF_LIFE * _US)
#: A slowdown key outlives its last widening by ten half-lives (its excess then < 0.1%).
_SLOWDOWN_TTL_MS: Final = int(SLOWDOWN_HALF_LIFE * 10 * 1000)
#: Seconds after which a worker that has not been heard of is forgotten (one killed without
#: ``aclose()``): until then, if it may pace alone, the others leave its fraction unused.
FORGET_AFTER: Final = 60.0
_FORGET_MS: Final = int(FORGET_AFTER * 1000)
#: Connections to Redis a limiter made from a URL opens at most in a loop, where a command waits
#: for one (a URL's ``max_connections`` option overrides it).
MAX_CONNECTIONS: Final = 100
#: The least share of a rate left to the workers that still see Redis, however many pace alone.
_LEAST_SHARE: Final = 0.1
#: A step back of Redis's clock this large (seconds) is logged; smaller ones are repaired quietly.
_LOGGED_STEP: Final = 0.01
#: A worker whose limiter backend is down logs it at most once per this many seconds.
_LOG_EVERY: Final = 60.0

# A slowdown's excess (a hash: excess, at), decayed by its half-life; 0 when its fields are not
# numbers (someone else wrote them), as when they are missing.
_EXCESS: Final = """
local function excess(key, now, half_life)
  local slow = redis.call('HMGET', key, 'excess', 'at')
  local value, at = tonumber(slow[1]), tonumber(slow[2])
  if not (value and at) then return 0 end
  return value * math.pow(0.5, math.max(0, now - at) / tonumber(half_life))
end
"""

# GCRA without burst on Redis's clock. Integers of microseconds since the epoch are exact in
# Lua's doubles (up to 2**53); '%.0f' writes them whole (tostring() would keep 14 digits only).
# Redis >= 5 replicates scripts by effects, so TIME before a write is allowed; the guarded
# replicate_commands() call makes Redis 3.2/4 do the same.
#
# KEYS: gcra (hash: tat, interval, at: when written), pause, slowdown (hash: excess, at),
# workers (hash: worker -> "at:fraction", one per store). ARGV: interval, idle ms, slowdown
# half-life, configured interval (0: unknown), worker id, its fallback fraction (0: none),
# lapse, forget ms, least share, this worker's last claim's end (0: none) and how far ahead it
# was then, the workers it heard of before Redis lost them (0: none), the workers pacing the
# store at its last reserve; times in microseconds.
# Returns {wait, slowdown, another worker's configured interval or 0, how far Redis's clock
# went back since the key was written or 0, the workers heard of within the lapse, this one
# included, the claim's end, how far ahead it is}.
RESERVE_SCRIPT: Final = (
    _EXCESS
    + """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local configured = tonumber(ARGV[4])
local lapse = tonumber(ARGV[7])
local forget = tonumber(ARGV[8]) * 1000
-- Workers not heard of for longer than the lapse may be pacing alone at their fallback
-- fraction: the others leave that much of the rate unused.
local workers = redis.call('HGETALL', KEYS[4])
local alone = 0
local live = 1
for i = 1, #workers, 2 do
  if workers[i] ~= ARGV[5] then
    local sep = string.find(workers[i + 1], ':', 1, true) or 0
    local age = now - (tonumber(string.sub(workers[i + 1], 1, sep - 1)) or 0)
    if sep == 0 or age >= forget then
      redis.call('HDEL', KEYS[4], workers[i])
    elseif age > lapse then
      alone = alone + (tonumber(string.sub(workers[i + 1], sep + 1)) or 0)
    else
      live = live + 1
    end
  end
end
-- Redis lost the workers' entries (a restart): those heard of before that are not back yet
-- may still pace alone, at this one's fraction.
alone = math.max(alone, (tonumber(ARGV[12]) - live) * tonumber(ARGV[6]))
redis.call('HSET', KEYS[4], ARGV[5], string.format('%.0f', now) .. ':' .. ARGV[6])
redis.call('PEXPIRE', KEYS[4], ARGV[8])
local shared = interval
interval = interval / math.max(1 - alone, tonumber(ARGV[9]))
local state = redis.call('HMGET', KEYS[1], 'tat', 'interval', 'at')
local tat = tonumber(state[1]) or 0
-- The key lost (a restart, a flush) while this worker's last claim is still ahead: the claims
-- made before end with it (or as far ahead as it was then, should the clock have stepped
-- back), plus one for each other worker, which may have claimed since, at the shared pace.
if not state[1] and tonumber(ARGV[10]) > now then
  tat = math.min(tonumber(ARGV[10]), now + tonumber(ARGV[11]))
    + (tonumber(ARGV[13]) - 1) * shared
end
local stored = tonumber(state[2]) or 0
local other = 0
if configured > 0 and stored > 0 and stored ~= configured then other = stored end
if configured > 0 then stored = configured end
-- Written later than now: Redis's clock went back (a failover to a node that is behind).
-- The TAT moves back as far, so the wait stays what the claims made it.
local stepped = math.max(0, (tonumber(state[3]) or 0) - now)
tat = tat - stepped
local pause_end = tonumber(redis.call('GET', KEYS[2])) or 0
local slot = math.max(now, tat, pause_end)
local new_tat = slot + interval
local ttl = math.ceil((new_tat - now) / 1000) + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'tat', string.format('%.0f', new_tat), 'interval',
  string.format('%.0f', stored), 'at', string.format('%.0f', now))
redis.call('PEXPIRE', KEYS[1], string.format('%.0f', ttl))
local slowdown = 1 + excess(KEYS[3], now, ARGV[3])
return {slot - now, tostring(slowdown), string.format('%.0f', other),
  string.format('%.0f', stepped), live, string.format('%.0f', new_tat),
  string.format('%.0f', new_tat - now)}
"""
)

# A pause never shortens a longer one (its key expires when it ends); a slowdown never lowers
# the current, decayed one (its key expires once the excess has decayed to nothing).
PAUSE_SCRIPT: Final = (
    _EXCESS
    + """
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
if factor > 1 and factor > 1 + excess(KEYS[2], now, ARGV[3]) then
  redis.call('HSET', KEYS[2], 'excess', tostring(factor - 1), 'at', string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
end
return 1
"""
)

# A worker that may pace alone, idle for a store, says it is alive (KEYS: workers; ARGV: worker
# id, fraction, forget ms) or, closing, that it is gone (fraction empty).
HEARTBEAT_SCRIPT: Final = """
if ARGV[2] == '' then return redis.call('HDEL', KEYS[1], ARGV[1]) end
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%.0f', now) .. ':' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# What a pool learned, one versioned record per (store, key), written compare-and-set: a write
# made from another version than the stored one is refused and the stored record returned.
# KEYS: learned (hash: version, state: the record as JSON, at: when written). ARGV: the version
# the write was made from, the record ('' to read only), ttl ms. Returns {version, state or '',
# microseconds since it was written, 1 if written}.
EXCHANGE_SCRIPT: Final = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local current = redis.call('HMGET', KEYS[1], 'version', 'state', 'at')
local version = tonumber(current[1]) or 0
if ARGV[2] ~= '' and tonumber(ARGV[1]) == version then
  version = version + 1
  redis.call('HSET', KEYS[1], 'version', version, 'state', ARGV[2], 'at',
    string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {version, ARGV[2], 0, 1}
end
if not current[2] then return {0, '', 0, 0} end
return {version, current[2], string.format('%.0f', now - (tonumber(current[3]) or now)), 0}
"""
# Keys of ours that hold another type than ours (KEYS, each with its type in ARGV), written by
# someone else, are dropped as lost keys are.
REPAIR_SCRIPT: Final = """
for i, key in ipairs(KEYS) do
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' and found ~= ARGV[i] then redis.call('DEL', key) end
end
return 1
"""
#: A learned record outlives its last change by a week in Redis (it is probed again after a day).
_LEARNED_TTL_MS: Final = int(7 * LEARNED_MAX_AGE * 1000)

#: What counts as Redis failing (redis-py wraps most socket errors; OSError covers the rest,
#: TimeoutError included).
_FAILURES: Final = (RedisError, OSError)


class _Script:
    """A Lua script run by ``EVALSHA``, loaded on the server's first ``NOSCRIPT`` only.
    ``kinds``: the type of each of its keys. A key of another type (someone else wrote it) is
    dropped and the script run again: its ``WRONGTYPE`` would read as Redis failing, for every
    store of the limiter, for as long as the key stays (it may never expire)."""

    def __init__(self, source: str, *kinds: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()
        self.kinds = list(kinds)

    async def __call__(self, client: RedisClient, keys: list[str], args: list[int | str]) -> Any:
        try:
            return await self._run(client, keys, args)
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc) or not self.kinds:
                raise
        await client.eval(REPAIR_SCRIPT, len(keys), *keys, *self.kinds)
        return await self._run(client, keys, args)

    async def _run(self, client: RedisClient, keys: list[str], args: list[int | str]) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # A restarted or flushed server: EVAL runs the script and caches it again.
            return await client.eval(self.source, len(keys), *keys, *args)


_RESERVE: Final = _Script(RESERVE_SCRIPT, "hash", "string", "hash", "hash")
_PAUSE: Final = _Script(PAUSE_SCRIPT, "string", "hash")
_HEARTBEAT: Final = _Script(HEARTBEAT_SCRIPT, "hash")
_EXCHANGE: Final = _Script(EXCHANGE_SCRIPT, "hash")


def _escape(text: str) -> str:
    # Braces would move the Cluster hash tag; '%' is escaped so the mapping stays one-to-one.
    return text.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def _micros(seconds: float) -> int:
    # Rounded up: pacing a microsecond slower is safe, a microsecond faster is not.
    return max(1, math.ceil(seconds * _US))


def _redacted(url: str) -> str:
    """``scheme://host:port/db`` without credentials, for messages and logs.

    Read by hand rather than with urlsplit: in a malformed URL (a password holding '/' or '#',
    a missing slash) the parser takes part of the password for a path, port or fragment.
    Everything up to the last '@' is taken for credentials, the query and fragment are dropped,
    and a path is shown only when it is a database number.
    """
    scheme, sep, rest = url.partition(":")
    if not sep:
        return "<unparsable Redis URL>"
    rest = rest.lstrip("/").rpartition("@")[2]
    if scheme == "unix":
        return f"unix:///{rest.split('?')[0].split('#')[0].lstrip('/')}"
    cut = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    host, path = rest[:cut], rest[cut:].split("?")[0].split("#")[0]
    name, colon, port = host.rpartition(":")
    if colon and not name.endswith("]") and ":" not in name and not port.isdigit():
        host = name  # "host:secret": not a port, keep it out
    db = path if path[1:].isdigit() else ""
    return f"{scheme}://{host}{db}"


def _describe(client: RedisClient) -> str:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if isinstance(kwargs, dict) and "host" in kwargs:
        host = str(kwargs["host"])
        host = f"[{host}]" if ":" in host else host  # IPv6
        return f"redis://{host}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
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
            check_redis_url(url_or_client, where=f"url_or_client {_redacted(url_or_client)}")
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
        #: Each store's Limits, as bound (RedisLimiter.bind): the configured interval of each
        #: pool goes with its key, so that workers configured differently are told.
        self.limits: dict[str, Limits] = {}
        self.worker = uuid.uuid4().hex[:16]  #: this backend's name among a store's workers
        self._used: dict[str, float] = {}  # store -> last time this worker was heard of for it
        # (store, pool) -> the soonest this worker's next start may be (time.monotonic()): Redis
        # holds none of the starts this worker paced alone, its fallback none of Redis's.
        self._next: dict[tuple[str, str], float] = {}
        self._mismatched: set[tuple[str, str]] = set()  # (store, pool) told once
        self._sharers: dict[str, int] = {}  # store -> workers pacing it, at the last reserve
        # (store, pool) -> this worker's last claim's end (Redis's clock, us), how far ahead.
        self._claimed: dict[tuple[str, str], tuple[int, int]] = {}
        # After an outage, until _expected_until: store -> workers that paced it before. Redis
        # may have lost their entries, and those not back yet may still pace alone.
        self._expected: dict[str, int] = {}
        self._expected_until = -math.inf
        # Down state: requests neither wait on Redis nor call it until the recheck succeeds.
        self._memory = MemoryPacing()  # fallback pacing while down
        self._down = False
        self._down_logged_at = -math.inf
        self._down_level = logging.WARNING
        self._probe: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        state = ""
        if self._down:
            state = " (down, in-process fallback)" if self.fallback_fraction else " (down)"
        return f"<RedisPacing {self.where} prefix={self.prefix!r}{state}>"

    @property
    def fallback_active(self) -> bool:
        """True while Redis is known to be down and this process paces on its own."""
        return self._down and self.fallback_fraction is not None

    @property
    def down(self) -> bool:
        """True while Redis is known to be down (until a background recheck succeeds)."""
        return self._down

    @property
    def lapse(self) -> float:
        """Seconds without news of a worker after which the others take it to pace alone."""
        return self.timeout

    def keys(self, store: str, pool: str) -> tuple[str, str, str]:
        """The GCRA (next slot and configured interval), pause and slowdown keys of a pool."""
        base = f"{self.prefix}:{{{_escape(store)}}}"
        return f"{base}:gcra:{pool}", f"{base}:pause:{pool}", f"{base}:slowdown:{pool}"

    def learned_key(self, store: str, key: str) -> str:
        """The record of what ``key`` (a pool or list path) of ``store`` learned."""
        return f"{self.prefix}:{{{_escape(store)}}}:learned:{key}"

    def workers_key(self, store: str) -> str:
        """The hash of the workers using ``store``: when each was last heard of, its fraction."""
        return f"{self.prefix}:{{{_escape(store)}}}:workers"

    def client(self) -> RedisClient:
        """The Redis client for the running loop (made on first use from a URL)."""
        if self._client is not None:
            return self._client
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            assert self._url is not None
            # A command waits for one of the pool's connections: the default pool fails at once
            # past 100 commands in flight, which a process pacing a few hundred stores has (their
            # pools claim at once), and that read as Redis down. The wait is not timed: a loop
            # that busy (a thousand stores' first requests) would read as Redis down too. With
            # Redis hung, those waiting then fail in turn, ``timeout`` for each hundred.
            pool = aioredis.BlockingConnectionPool.from_url(
                self._url,
                max_connections=MAX_CONNECTIONS,
                timeout=None,
                socket_connect_timeout=self.timeout,
                socket_timeout=self.timeout,
                # One immediate retry, on a broken connection only, heals a pooled connection
                # that Redis closed (a restart); a timeout is not retried, so a hung Redis
                # fails within ``timeout``. (The default, 10 retries with backoff, would hold
                # every request for seconds.) A retried reserve may claim two slots: that only
                # slows the pool down.
                retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            )
            client = self._clients[loop] = aioredis.Redis.from_pool(pool)
        return client

    async def aclose(self) -> None:
        """Leave the stores' worker lists and close the client made for the running loop (a
        given client stays open)."""
        loop = asyncio.get_running_loop()
        for name in ("_probe", "_heartbeat"):
            task: asyncio.Task[None] | None = getattr(self, name)
            setattr(self, name, None)
            if task is not None and not task.done():
                task.cancel()
                if task.get_loop() is loop:
                    # Wait for it to end, so that closing the loop finds no pending task.
                    await asyncio.gather(task, return_exceptions=True)
        if not self._down and (self._client is not None or loop in self._clients):
            # Gone, not lapsed: the others need not keep this worker's fraction free.
            stores, self._used = list(self._used), {}
            left = [
                _HEARTBEAT(self.client(), [self.workers_key(s)], [self.worker, ""]) for s in stores
            ]
            await asyncio.gather(*left, return_exceptions=True)
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    # -- PacingBackend ---------------------------------------------------------------------------

    async def reserve(self, store: str, pool: str, interval: float) -> tuple[float, float]:
        fraction, cancelling = self.fallback_fraction, cancellations()
        if self._down:
            self._start_probe()
            if fraction is None:
                raise self._unavailable(store, None)
            return await self._alone(store, pool, interval / fraction)
        limits = self.limits.get(store)
        configured = 0 if limits is None else _micros(limits.rate_for(pool).interval)
        args: list[int | str] = [
            _micros(interval),
            self._idle_ms,
            _HALF_LIFE_US,
            configured,
            self.worker,
            repr(fraction or 0.0),
            _micros(self.lapse),
            _FORGET_MS,
            repr(_LEAST_SHARE),
            *self._claimed.get((store, pool), (0, 0)),
            self._expected.get(store, 0) if time.monotonic() < self._expected_until else 0,
            self._sharers.get(store, 1),
        ]
        try:
            reply = await _RESERVE(
                self.client(), [*self.keys(store, pool), self.workers_key(store)], args
            )
            wait, slowdown = int(reply[0]) / _US, float(reply[1])
            other, stepped = int(reply[2]), int(reply[3]) / _US
            self._sharers[store] = max(1, int(reply[4]))
            self._claimed[store, pool] = (int(reply[5]), int(reply[6]))
        except (*_FAILURES, ValueError, TypeError, IndexError) as exc:  # or a malformed reply
            failure: Exception | None = exc
        else:
            failure = None
        if cancellations() > cancelling:
            # redis-py can spend a cancellation that lands in a command: it reports it as its
            # TimeoutError, or retries the command and brings the reply. The caller is cancelled
            # all the same (a slot claimed is lost, the safe side): no request goes out.
            raise asyncio.CancelledError from None
        if failure is not None:
            self._enter_down(store, failure)
            if fraction is None:
                raise self._unavailable(store, failure) from failure
            return await self._alone(store, pool, interval / fraction)
        self._used[store] = now = time.monotonic()
        wait = max(wait, self._next.get((store, pool), now) - now)  # after a start made alone
        self._next[store, pool] = now + wait + interval
        if fraction is not None:
            self._start_heartbeat()
        if other and (store, pool) not in self._mismatched:
            self._mismatched.add((store, pool))
            logger.warning(
                "store %r pool %r: another worker sharing Redis at %s is configured for one"
                " start every %.6gs, this one for every %.6gs: give every worker of a store the"
                " same Limits, or together they exceed its budget",
                store,
                pool,
                self.where,
                other / _US,
                configured / _US,
            )
        if stepped >= _LOGGED_STEP:
            logger.warning(
                "store %r pool %r: Redis at %s reads %.3fs earlier than when it last paced the"
                " pool (a failover to a node whose clock is behind?); the pool's next slot was"
                " moved back as far",
                store,
                pool,
                self.where,
                stepped,
            )
        return wait, slowdown

    def sharers(self, store: str) -> int:
        """How many workers paced ``store`` through Redis lately, this one included (as the
        last reserve saw them): a 429's count of the starts the server accepted, made from
        this worker's alone, is scaled by it."""
        return self._sharers.get(store, 1)

    async def exchange(
        self, store: str, key: str, version: int, learned: Learned | None
    ) -> tuple[int, Learned | None, bool]:
        """The shared record of what ``key`` of ``store`` learned, written compare-and-set
        (see :class:`~asyncsubs._learned.LearningBackend`); raises while Redis is down, and the
        pool then learns in this process alone until it answers."""
        if self._down:
            raise self._unavailable(store, None)
        state = "" if learned is None else orjson.dumps(attrs.asdict(learned)).decode()
        args: list[int | str] = [version, state, _LEARNED_TTL_MS]
        reply = await _EXCHANGE(self.client(), [self.learned_key(store, key)], args)
        shared_version, written = int(reply[0]), bool(int(reply[3]))
        try:  # another worker's record; one that is not a record is ignored, and overwritten
            fields = orjson.loads(reply[1]) if reply[1] else None
            elapsed = int(reply[2]) / _US
            shared = None if fields is None else Learned(**fields)
        except (TypeError, ValueError):
            return shared_version, None, written
        return shared_version, None if shared is None else shared.aged(elapsed), written

    async def pause(self, store: str, pool: str, seconds: float, slowdown: float) -> None:
        # Also kept in memory, so a fallback that starts during the pause still honours it.
        await self._memory.pause(store, pool, seconds, slowdown)
        if self._down:
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
            self._enter_down(store, exc)
            if self.fallback_fraction is None:
                raise self._unavailable(store, exc) from exc

    async def _alone(self, store: str, pool: str, interval: float) -> tuple[float, float]:
        """Pace in this process. Until the others can have noticed this worker's silence
        (``lapse`` after Redis last heard of it for the store), it holds: until then they
        still use the whole rate; and not before a start it claimed in Redis is an interval
        behind it."""
        soonest = max(
            self._used.get(store, -math.inf) + self.lapse, self._next.get((store, pool), -math.inf)
        )
        if (hold := soonest - time.monotonic()) > 0:
            await self._memory.pause(store, pool, hold, 1.0)
        limits = self.limits.get(store)
        if limits is not None and self.fallback_fraction is not None:
            # One start less per window: the others' starts and these are two streams that
            # each may round up by one in a window, and the margin leaves room for one only.
            share = self.fallback_fraction * limits.rate_for(pool).n
            interval *= share / max(share - 1, share / 2)
        wait, slowdown = await self._memory.reserve(store, pool, interval)
        self._next[store, pool] = time.monotonic() + wait + interval
        return wait, slowdown

    # -- failures ----------------------------------------------------------------------------

    def _unavailable(self, store: str, exc: BaseException | None) -> LimiterUnavailableError:
        # The exception's type only: redis-py messages are safe today, but a URL with its
        # password must never reach a log through one. The cause stays chained.
        what = "is down" if exc is None else f"failed ({type(exc).__name__}{self._hint(exc)})"
        return LimiterUnavailableError(
            f"Redis rate limiter at {self.where} {what}; the request for store {store!r} was"
            " not sent. A fallback (RedisLimiter's fallback_fraction=f, sync's config key"
            " redis_fallback = f) paces each process on its own at f x the rate instead"
        )

    def _hint(self, exc: BaseException) -> str:
        if self.where.startswith("rediss://") and isinstance(
            exc, TimeoutError | ssl.SSLError | RedisConnectionError | RedisTimeoutError
        ):
            return "; rediss:// speaks TLS: does that port serve TLS?"
        return ""

    def _enter_down(self, store: str, exc: BaseException) -> None:
        if self._down:
            return
        self._down = True
        now = time.monotonic()
        # A Redis that fails every few seconds is told at most once a minute at WARNING.
        self._down_level = (
            logging.DEBUG if now - self._down_logged_at < _LOG_EVERY else logging.WARNING
        )
        if self._down_level == logging.WARNING:
            self._down_logged_at = now
        if self.fallback_fraction is None:
            then = "requests of every store of this limiter fail with LimiterUnavailableError"
        else:
            then = (
                f"store {store!r} and every other store of this limiter now paced in this"
                f" process alone at {self.fallback_fraction * 100:.0f}% of each rate"
            )
        logger.log(
            self._down_level,
            "Redis rate limiter at %s failed (%s%s): %s until it answers again",
            self.where,
            type(exc).__name__,
            self._hint(exc),
            then,
        )
        self._start_probe()

    def _start_probe(self) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._recheck())

    async def _recheck(self) -> None:
        """While down: every ``recheck_after`` seconds, in the background, run the reserve
        script on keys of its own (a PING can answer while scripts fail) until it works."""
        base = f"{self.prefix}:{{%probe}}"  # '%' never starts an escaped store name
        keys = [f"{base}:gcra", f"{base}:pause", f"{base}:slowdown", f"{base}:workers"]
        args: list[int | str] = [1, 0, _HALF_LIFE_US, 0, self.worker, "0", 1, 1000, "1", 0, 0, 0, 1]
        while self._down:
            await asyncio.sleep(self.recheck_after)
            try:
                await _RESERVE(self.client(), keys, args)
            except Exception as exc:  # whatever it is, the task goes on: it alone ends the outage
                now = time.monotonic()
                if self._down_level != logging.WARNING and now - self._down_logged_at >= _LOG_EVERY:
                    # An outage told at DEBUG only (it followed another closely) that lasts.
                    self._down_level, self._down_logged_at = logging.WARNING, now
                    logger.warning(
                        "Redis rate limiter at %s still fails (%s%s)",
                        self.where,
                        type(exc).__name__,
                        self._hint(exc),
                    )
                continue
            self._down = False
            # Others that paced alone notice within their own recheck; till then (and for their
            # first reserve) their fractions stay free, if Redis lost their entries.
            self._expected = dict(self._sharers)
            self._expected_until = time.monotonic() + self.recheck_after + 2 * self.timeout
            logger.log(
                self._down_level,
                "Redis rate limiter at %s answers again: pacing is shared again",
                self.where,
            )

    def _start_heartbeat(self) -> None:
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        """A worker that may pace alone tells the workers of each store it used lately that it
        is alive, where no reserve said so within ``lapse / 4``: the others must tell its
        silence (pacing alone) from an idle pool."""
        while True:
            await asyncio.sleep(self.lapse / 4)
            if not self._down:
                await self._beat_once()

    async def _beat_once(self) -> None:
        now = time.monotonic()
        stores = [s for s, at in self._used.items() if self.lapse / 4 <= now - at < FORGET_AFTER]
        args: list[int | str] = [self.worker, repr(self.fallback_fraction), _FORGET_MS]
        replies = await asyncio.gather(
            *(_HEARTBEAT(self.client(), [self.workers_key(s)], args) for s in stores),
            return_exceptions=True,
        )
        for store, reply in zip(stores, replies, strict=True):
            if not isinstance(reply, BaseException):
                self._used[store] = now


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
    - ``timeout``: seconds for connecting to Redis and for each command (URL only); also how
      long a silent worker is waited for before the others take it to pace alone.
    - ``idle_ttl``: seconds a pool's key outlives its last slot before Redis deletes it.
    - ``recheck_after``: seconds between background rechecks while Redis is down.

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

    def bind(self, store: str, limits: Limits) -> StoreLimiter:
        bound = super().bind(store, limits)
        self.pacing.limits[store] = limits  # its pools' configured intervals go to Redis
        return bound

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
