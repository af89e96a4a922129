"""Many processes, one store: the Redis limiter against in-process limiters, and under faults.

``python -m benchmarks.bench_redis [--seconds 20] [--redis-url URL] [--no-faults]``

1. ``--processes`` (4) worker processes x ``--tasks`` (50) tasks pull one store of a
   FakeAdminServer (its own process) that enforces 50 req/s in a sliding window, with 10-30 ms
   latency, for ``--seconds``: first with one RedisLimiter per worker, then with the in-process
   limiter. Throughput is counted by the server (accepted starts inside the run's window) and
   shown as a ratio of the allowed 50 req/s, with the server's 429s.
2. Faults (skipped with ``--no-faults``; they need the local redis-server): one worker alone,
   straight to Redis and through a TCP proxy adding 5 ms of round trip; three workers with
   ``fallback_fraction=1/3``, one of them through a proxy that is cut (a network partition:
   connections dropped, new ones never answered) for 15 s of a 25 s run.
3. Arrival jitter shared: 3 workers x ``--tasks`` against a server that stamps each request
   10-30 ms after it arrives (``inbound_delay``), so the measured margin of every worker counts.
4. The cost of one acquire against local Redis, median and p99 in us: the EVALSHA round trip
   alone, and the whole client-side acquire (queue, Redis, in-flight gate) on an idle pool.

PASS: with Redis, together >= 95% of the allowed rate and no 429 at all; with one worker of
three partitioned, >= 90% and at most 2 429s; three workers with the inbound delay, >= 95% and at
most 2 429s. The single worker rows are printed, not judged.
Without ``--redis-url``, a redis-server (on PATH) is started on a free loopback port.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import logging
import multiprocessing
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from multiprocessing.synchronize import Barrier
from typing import Any, Protocol

import attrs
import orjson

from asyncsubs import AdminClient, Limits, Rate
from asyncsubs.errors import AsyncSubsError
from asyncsubs.testing import FakeStoreConfig, ServerRateLimits, run_in_process
from asyncsubs.testing._ports import free_port


@attrs.define(kw_only=True)
class Options:
    seconds: float = 20.0
    processes: int = 4
    tasks: int = 50
    acquires: int = 5000
    redis_url: str | None = None
    skip_local: bool = False
    no_faults: bool = False
    quick: bool = False  #: a shorter partition (4 s of 8)


@attrs.frozen
class Phase:
    name: str
    accepted: int  #: accepted starts inside the run's window, counted by the server
    ratio: float  #: accepted / what the server allows in that window
    server_429: int
    failed: int  #: requests that raised (429s once retries were spent, ...)
    peak: int  #: most accepted starts in any 1 s window


STORE = "acme"
RATE = Rate(50, per=1.0)
LATENCY = (0.010, 0.030)
MIN_RATIO = 0.95
#: One worker of three partitioned from Redis for PARTITION[1] s from PARTITION[0] s on.
PARTITION = (5.0, 15.0)
PARTITION_MIN_RATIO = 0.90
PARTITION_MAX_429 = 2
#: Three workers against a server that stamps requests 10-30 ms after they arrive.
INBOUND = (0.010, 0.030)
INBOUND_WORKERS = 3
INBOUND_MIN_RATIO = 0.95
INBOUND_MAX_429 = 2


# --------------------------------------------------------------------------------------------
# A throwaway redis-server


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis_server() -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: install it or pass --redis-url")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not _pong(port):  # startup only: bounded wait until it listens
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("redis-server did not start")
            time.sleep(0.01)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(5)


# --------------------------------------------------------------------------------------------
# A TCP proxy in front of Redis: a longer round trip, or a partition


class Proxy:
    """Forwards a loopback port to Redis from a thread of its own: each chunk ``delay`` s late
    in each direction; ``cut()`` drops every connection and leaves new ones unanswered (a
    network partition, as a client sees one) until ``heal()``."""

    def __init__(self, upstream: str, delay: float = 0.0) -> None:
        self.upstream_port = int(upstream.rsplit(":", 1)[1].split("/")[0])
        self.delay = delay
        self._cut = False
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/0"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ends = [writer]
        self._writers.add(writer)
        try:
            if self._cut:  # accepted by the kernel, never answered
                await reader.read()
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            ends.append(up_writer)
            self._writers.add(up_writer)
            await asyncio.gather(
                self._pump(reader, up_writer),
                self._pump(up_reader, writer),
                return_exceptions=True,
            )
        finally:
            for end in ends:
                self._writers.discard(end)
                end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while chunk := await reader.read(65536):
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(chunk)
                await writer.drain()
        finally:
            writer.close()

    async def _drop_all(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    def cut(self) -> None:
        self._cut = True
        self._call(self._drop_all())

    def heal(self) -> None:
        self._cut = False
        self._call(self._drop_all())  # the unanswered connections fail; clients reconnect

    async def _shut(self) -> None:
        await self._drop_all()
        self._server.close()
        # Every connection's task ended here: one left pending would end when its coroutine is
        # collected, after the loop closed, closing its stream on a closed loop.
        tasks = asyncio.all_tasks() - {asyncio.current_task()}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        self._call(self._shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


# --------------------------------------------------------------------------------------------
# Workers (spawned processes)


async def _pull(cfg: dict[str, Any], barrier: Barrier) -> dict[str, int]:
    from asyncsubs.redis import RedisLimiter

    limiter = (
        None
        if cfg["redis_url"] is None
        else RedisLimiter(
            cfg["redis_url"], prefix=cfg["prefix"], fallback_fraction=cfg["fallback_fraction"]
        )
    )
    ids: list[int] = cfg["ids"]
    done = {"ok": 0, "failed": 0}
    client = AdminClient(
        token=cfg["token"], base_url=cfg["base_url"], store=STORE, limits=Limits(), limiter=limiter
    )
    try:
        if limiter is not None:
            await limiter.pacing.client().ping()  # connected before the clock starts
        await asyncio.get_running_loop().run_in_executor(None, barrier.wait)

        async def task(k: int) -> None:
            n = k
            while True:
                try:
                    await client.request("GET", f"customers/{ids[n % len(ids)]}")
                    done["ok"] += 1
                except AsyncSubsError:
                    done["failed"] += 1  # e.g. 429s once retries are spent
                    if limiter is not None and limiter.pacing.down:
                        await asyncio.sleep(0.1)  # no fallback: this worker can do nothing
                n += cfg["tasks"]

        tasks = [asyncio.create_task(task(k)) for k in range(cfg["tasks"])]
        await asyncio.sleep(cfg["seconds"])
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stats = client.stats
        done["client_429"] = stats.rate_limited
    finally:
        await client.aclose()
        if limiter is not None:
            await limiter.aclose()
    return done


def _worker(cfg: dict[str, Any], barrier: Barrier, results: Any) -> None:
    # A worker still running well after its run prints where it hangs, and exits.
    faulthandler.dump_traceback_later(cfg["seconds"] + 30, exit=True)
    # Its log lines name their phase: the partitioned worker's fallback is expected.
    logging.basicConfig(format=f"  [{cfg['phase']}] %(levelname)s %(name)s: %(message)s")
    results.put(asyncio.run(_pull(cfg, barrier)))


def run_phase(
    name: str,
    remote: Any,
    ids: list[int],
    opts: Options,
    redis_urls: Sequence[str | None],
    *,
    seconds: float | None = None,
    fallback_fraction: float | None = None,
    during: Callable[[], None] | None = None,
) -> Phase:
    """One load run: a worker per URL for ``seconds``, counted by the server; ``during`` runs
    here (in this process) once the workers have started."""
    seconds = opts.seconds if seconds is None else seconds
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(redis_urls) + 1)
    results = ctx.Queue()
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    cfgs = [
        {
            "phase": name,
            "redis_url": url,
            "prefix": prefix,
            "fallback_fraction": fallback_fraction,
            "base_url": remote.base_url,
            "token": remote.tokens[STORE],
            "ids": ids,
            "tasks": opts.tasks,
            "seconds": seconds,
        }
        for url in redis_urls
    ]
    remote.reset_stats(STORE)
    procs = [ctx.Process(target=_worker, args=(cfg, barrier, results)) for cfg in cfgs]
    for p in procs:
        p.start()
    barrier.wait(60)
    # CLOCK_MONOTONIC is system-wide on Linux, and the server's loop clock is that clock: its
    # recorded start times can be compared with this moment.
    start = time.monotonic()
    if during is not None:
        during()
    workers = [results.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(30)
    pool = remote.stats(STORE).pool("global")
    accepted = sum(start <= t < start + seconds for t in pool.starts)
    return Phase(
        name=name,
        accepted=accepted,
        ratio=accepted / (RATE.per_second * seconds),
        server_429=pool.rejected,
        failed=sum(w["failed"] for w in workers),
        peak=pool.max_in_window(RATE.per),
    )


def fault_phases(remote: Any, ids: list[int], opts: Options, url: str) -> list[Phase]:
    """One worker at 0 and 5 ms round trip; three workers, one partitioned for a while."""
    phases = [run_phase("1 worker, local Redis", remote, ids, opts, [url])]
    slow = Proxy(url, delay=0.0025)
    try:
        phases.append(run_phase("1 worker, 5 ms round trip", remote, ids, opts, [slow.url]))
    finally:
        slow.close()
    cut_at, cut_for = PARTITION if not opts.quick else (2.0, 4.0)
    seconds = cut_at + cut_for + cut_at
    partitioned = Proxy(url)

    def partition() -> None:
        time.sleep(cut_at)
        partitioned.cut()
        time.sleep(cut_for)
        partitioned.heal()

    try:
        phases.append(
            run_phase(
                f"3 workers, 1 partitioned {cut_for:g} s of {seconds:g}",
                remote,
                ids,
                opts,
                [partitioned.url, url, url],
                seconds=seconds,
                fallback_fraction=1 / 3,
                during=partition,
            )
        )
    finally:
        partitioned.close()
    return phases


# --------------------------------------------------------------------------------------------
# Acquire cost


async def acquire_cost(redis_url: str, count: int) -> tuple[float, float, float, float]:
    """(median, p99) in us of one backend reserve, then of a whole acquire+release."""
    from asyncsubs.redis import RedisLimiter

    async with RedisLimiter(redis_url, prefix=f"bench-{uuid.uuid4().hex[:8]}") as limiter:
        pacing = limiter.pacing
        # An interval of 1 us: every reserve is a real claim, and none makes anyone wait.
        for _ in range(200):
            await pacing.reserve("cost", "global", 1e-6)
        reserve = []
        for _ in range(count):
            t0 = time.perf_counter_ns()
            await pacing.reserve("cost", "global", 1e-6)
            reserve.append((time.perf_counter_ns() - t0) / 1000)
        # The whole client-side acquire (queue, Redis, in-flight gate, release), each on an idle
        # pool of its own so that no pacing wait is counted, only the work.
        limits = Limits(global_rate=Rate(50))
        slot = []
        for i in range(count):
            t0 = time.perf_counter_ns()
            async with limiter.bind(f"slot-{i}", limits).slot("global"):
                pass
            slot.append((time.perf_counter_ns() - t0) / 1000)

    def p99(xs: list[float]) -> float:
        return statistics.quantiles(xs, n=100)[98]

    return statistics.median(reserve), p99(reserve), statistics.median(slot), p99(slot)


# --------------------------------------------------------------------------------------------


class _Out(Protocol):
    """What ``benchmarks.__main__`` passes as ``report`` (duck-typed; main() has its own)."""

    quick: bool

    def say(self, text: str = "") -> None: ...

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None: ...

    def check(self, name: str, measured: float, op: str, target: float, fmt: str = ...) -> Any: ...


def run(opts: Options, out: _Out) -> bool:
    """The whole benchmark; True when every target is met."""
    with redis_server() if opts.redis_url is None else nullcontext(opts.redis_url) as url:
        limits = ServerRateLimits(global_rate=RATE, window="sliding")
        remote = run_in_process(
            stores=[FakeStoreConfig(STORE, records=1000)], latency=LATENCY, rate_limits=limits
        )
        with remote:
            ids = _customer_ids(remote)
            out.say(
                f"  {opts.processes} processes x {opts.tasks} tasks pull one store for"
                f" {opts.seconds:g} s; the server allows {RATE} (sliding window), latency"
                f" {LATENCY[0] * 1000:g}-{LATENCY[1] * 1000:g} ms"
            )
            workers = range(opts.processes)
            phases = [run_phase("RedisLimiter", remote, ids, opts, [url for _ in workers])]
            if not opts.skip_local:
                phases.append(run_phase("in-process", remote, ids, opts, [None for _ in workers]))
            faults = [] if opts.no_faults else fault_phases(remote, ids, opts, url)
        delayed = run_in_process(
            stores=[FakeStoreConfig(STORE, records=1000)],
            latency=LATENCY,
            inbound_delay=INBOUND,
            rate_limits=limits,
        )
        with delayed:
            jitter = run_phase(
                f"RedisLimiter, {INBOUND_WORKERS} processes, stamped"
                f" {INBOUND[0] * 1000:g}-{INBOUND[1] * 1000:g} ms late",
                delayed,
                _customer_ids(delayed),
                opts,
                [url] * INBOUND_WORKERS,
            )
        cost = asyncio.run(acquire_cost(url, opts.acquires))
    out.table(
        ["limiter", "accepted", "x allowed rate", "429s", "most in 1 s", "requests failed"],
        [
            [p.name, p.accepted, p.ratio, p.server_429, p.peak, p.failed]
            for p in [*phases, *faults, jitter]
        ],
    )
    out.table(
        ["acquire cost, local Redis (us)", "median", "p99"],
        [
            ["one EVALSHA round trip (RedisPacing.reserve)", round(cost[0]), round(cost[1])],
            ["whole acquire: bind + slot(), idle pool", round(cost[2]), round(cost[3])],
        ],
    )
    shared = phases[0]
    if len(phases) > 1:
        out.say(f"  429s that sharing through Redis prevented: {phases[1].server_429}")
    checks = [
        out.check("Redis: throughput / allowed rate", shared.ratio, ">=", MIN_RATIO),
        out.check("Redis: 429 responses", shared.server_429, "<=", 0, "{:.0f}"),
    ]
    checks += [
        out.check(
            "inbound delay: throughput / allowed rate", jitter.ratio, ">=", INBOUND_MIN_RATIO
        ),
        out.check(
            "inbound delay: 429 responses", jitter.server_429, "<=", INBOUND_MAX_429, "{:.0f}"
        ),
    ]
    if faults:
        cut = faults[-1]
        checks += [
            out.check("partition: throughput / allowed rate", cut.ratio, ">=", PARTITION_MIN_RATIO),
            out.check(
                "partition: 429 responses", cut.server_429, "<=", PARTITION_MAX_429, "{:.0f}"
            ),
        ]
    return all(c.passed for c in checks)


#: For ``python -m benchmarks`` (name, then ``bench(report)``).
TITLE = "Redis limiter: 4 processes x 50 tasks share one store's 50 req/s"


def bench(report: _Out) -> None:
    run(Options(seconds=5.0 if report.quick else 20.0, quick=report.quick), report)


@attrs.define
class _Check:
    passed: bool


class _Print:
    quick = False

    def say(self, text: str = "") -> None:
        print(text, flush=True)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        cells = [[str(h) for h in headers]]
        cells += [[f"{c:.3f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
        for n, row in enumerate(cells):
            print(
                "  "
                + "  ".join(
                    c.rjust(w) if i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
            if n == 0:
                print("  " + "  ".join("-" * w for w in widths))

    def check(
        self, name: str, measured: float, op: str, target: float, fmt: str = "{:.3f}"
    ) -> _Check:
        passed = measured >= target if op == ">=" else measured <= target
        verdict = "PASS" if passed else "FAIL"
        got, want = fmt.format(measured), fmt.format(target)
        print(f"  {verdict}  {name}: {got} (target {op} {want})")
        return _Check(passed)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.bench_redis``: exit status 0 on PASS, 1 on FAIL."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_redis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="per load run (default 20)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=50, help="per process (default 50)")
    parser.add_argument("--acquires", type=int, default=5000, help="timed for the acquire cost")
    parser.add_argument("--redis-url", help="an existing Redis (default: start a redis-server)")
    parser.add_argument("--skip-local", action="store_true", help="no in-process comparison run")
    parser.add_argument("--no-faults", action="store_true", help="no single-worker, partition runs")
    parser.add_argument("--quick", action="store_true", help="a 4 s partition in 8 s")
    args = parser.parse_args(argv)
    print(f"== {TITLE}")
    ok = run(Options(**vars(args)), _Print())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def _customer_ids(remote: Any) -> list[int]:
    request = urllib.request.Request(
        f"{remote.api_url}customers?pageSize=250", headers={"X-Service-Token": remote.tokens[STORE]}
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # loopback only
        ids = [record["id"] for record in orjson.loads(response.read())["data"]]
    remote.reset_stats(STORE)
    return ids


if __name__ == "__main__":
    sys.exit(main())
