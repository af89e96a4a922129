"""I. Discovery: bulk pulls at the server's capacity when nobody told the client what it is.

Each store's orders pool allows 2, 5 or 10 requests/s (a sliding window) and serves at most 100,
500 or 1,000 records a page, clamping a larger pageSize or refusing it with a 400 that does not
name the maximum; the client is told neither. Pulls are the command line's, with its defaults
(``asyncsubs pull orders -o FILE``: the pool discovered, the largest page learned, what was
learned kept in the cache directory), each in a process of its own as a user runs them, six at a
time. A row is a pull's records/s over its whole run, from its ``done`` JSON event (first request
to last page), as a share of the ceiling, the pool's rate x its largest page; 429s are the
pull's own.

1. First run: the 18 stores (rate x page x clamp/reject) of one server in its own process,
   each pull sized to last 60 s at its ceiling, with an arrival delay of 0 and then of 10-30 ms
   before the server stamps a request (pages leave 5-20 ms after it). Targets: every store
   >= 0.80 of its ceiling, at most 4 x 429 each.
2. Second run: the same pulls again, starting from what the first kept. Targets: every store
   >= 0.93, no 429.
3. Steady state: three pulls of 11 minutes (3 with ``--quick``), delay 10-30 ms, from their
   JSON progress events after the first minute. Targets: >= 0.93 of the ceiling, at most one
   429 per pool per ten minutes.
4. One ``asyncsubs sync`` of 20 stores into SQLite, each with its own pool's rate (2-6/s) and
   largest page (100-250, clamped or refused), all unknown, sized to last 60 s at each store's
   ceiling. Targets: every store >= 0.80 of its ceiling over its run, at most 4 x 429 each.
5. Three worker processes pull one store's pool at once through one ``RedisLimiter`` (5/s,
   500 records a page, refused above), 60 s, with the library's discovery. Targets: at most
   4 x 429 in all, the same learned rate in every worker; printed: the workers' records/s
   together as a share of the ceiling. Skipped without a ``redis-server`` on PATH.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from asyncsubs import AdminClient, Limits, Rate
from asyncsubs.testing import FakeStoreConfig, ServerRateLimits

from ._common import Report, all_stats, remote_server

NAME = "discovery"
TITLE = "I. Discovery: heavy pools' rates and page sizes found, remembered and shared"

RATES = (2, 5, 10)
PAGES = (100, 500, 1000)
RULES = ("clamp", "reject")
DELAYS: Sequence[tuple[str, Any]] = (("0", None), ("10-30 ms", (0.010, 0.030)))
LATENCY = (0.005, 0.020)
AT_ONCE = 6
STEADY = (("r2-p100-reject", 2, 100, "reject"), ("r5-p500-clamp", 5, 500, "clamp"))
STEADY += (("r10-p1000-reject", 10, 1000, "reject"),)


@attrs.frozen
class Pull:
    """What one pull did, from its JSON events: records and seconds of its whole run, 429s,
    what it learned last, and (time, records, 429s) at each progress event."""

    records: int
    seconds: float
    rate_limited: int
    rate: float | None
    page_size: int | None
    progress: tuple[tuple[float, int, int], ...] = attrs.field(default=(), repr=False)


def store_config(name: str, rate: int, page: int, rule: str, records: int) -> FakeStoreConfig:
    heavy = {"orders": Rate(rate), "subscriptions": Rate(2), "customers": Rate(2)}
    return FakeStoreConfig(
        name,
        records={"orders": records, "subscriptions": 0, "customers": 0},
        rate_limits=ServerRateLimits(heavy=heavy),
        max_page_size=page,
        over_max=rule,  # type: ignore[arg-type]
    )


def grid(seconds: float) -> list[tuple[str, int, int, str, int]]:
    return [
        (f"r{rate}-p{page}-{rule}", rate, page, rule, int(rate * page * seconds))
        for rate in RATES
        for page in PAGES
        for rule in RULES
    ]


def events(stderr: str) -> list[dict[str, Any]]:
    found = []
    for line in stderr.splitlines():
        try:
            found.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    return found


def pull_of(found: Sequence[Mapping[str, Any]], store: str | None = None) -> Pull:
    """A unit's ``Pull`` from its JSON events (one store's, when given)."""
    mine = [e for e in found if store is None or e.get("store") == store]
    done = [e for e in mine if e["event"] == "done"]
    if not done:
        failed = [e.get("error") or e.get("message") for e in mine if e["level"] == "error"]
        raise RuntimeError(f"the pull of {store} did not finish: {failed}")
    learned = [e for e in mine if e["event"] == "learned"]
    progress = tuple(
        (e["elapsed"], e["records"], e["rate_limited"]) for e in mine if e["event"] == "progress"
    )
    return Pull(
        records=done[-1]["records"],
        seconds=done[-1]["elapsed"],
        rate_limited=done[-1]["rate_limited"],
        rate=learned[-1]["rate"] if learned else None,
        page_size=learned[-1]["page_size"] if learned else None,
        progress=progress,
    )


def cli_pull(base_url: str, token: str, store: str, cache: Path, *extra: str) -> Pull:
    """``asyncsubs pull orders`` with the command line's defaults, in a process of its own."""
    output = cache / f"{store}.jsonl"
    command = [sys.executable, "-m", "asyncsubs", "pull", "orders", "--base-url", base_url]
    command += ["--store", store, "-o", str(output), "--restart", "--log-format", "json", *extra]
    env = {**os.environ, "ASYNCSUBS_TOKEN": token, "ASYNCSUBS_CACHE_DIR": str(cache)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    output.unlink(missing_ok=True)
    return pull_of(events(done.stderr))


def pull_all(base_url: str, tokens: Mapping[str, str], cache: Path, *extra: str) -> dict[str, Pull]:
    with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
        futures = {
            name: pool.submit(cli_pull, base_url, token, name, cache, *extra)
            for name, token in tokens.items()
        }
        return {name: future.result() for name, future in futures.items()}


def share(result: Pull, rate: float, page: int) -> float:
    return result.records / result.seconds / (rate * page)


def runs(report: Report, delay_name: str, delay: Any, seconds: float) -> None:
    stores = grid(seconds)
    configs = [store_config(*store) for store in stores]
    with (
        tempfile.TemporaryDirectory(prefix="asyncsubs-bench-") as tmp,
        remote_server(
            stores=configs,
            rate_limits=None,
            inbound_delay=delay,
            latency=LATENCY,
            make_records=True,
            start_timeout=120.0,  # 3.3 million records: 30-40 s in a slow hour
        ) as remote,
    ):
        first = pull_all(remote.base_url, remote.tokens, Path(tmp))
        time.sleep(2.0)  # the server's windows empty, as between two runs of a command
        second = pull_all(remote.base_url, remote.tokens, Path(tmp))
        server = all_stats(remote)
    rows, firsts, seconds_ = [], [], []
    for name, rate, page, _, _ in stores:
        a, b = first[name], second[name]
        firsts.append((share(a, rate, page), a.rate_limited, name))
        seconds_.append((share(b, rate, page), b.rate_limited, name))
        rows.append(
            [
                name,
                firsts[-1][0],
                a.rate_limited,
                seconds_[-1][0],
                b.rate_limited,
                b.rate or 0.0,
                b.page_size or 0,
                server[name].statuses.get(400, 0),
            ]
        )
    report.say(f"\n  arrival delay {delay_name}: records/s over each whole pull / ceiling")
    report.table(
        ["store", "first", "429s", "second", "429s", "rate learned", "page learned", "400s"], rows
    )
    worst, most = min(firsts), max(firsts, key=lambda s: s[1])
    report.say(f"  first run: slowest {worst[2]}; most 429s {most[2]}")
    report.check(f"I.1 delay {delay_name}: first run, slowest store", worst[0], ">=", 0.80)
    report.check(
        f"I.1 delay {delay_name}: first run, most 429s of a store", most[1], "<=", 4, "{:.0f}"
    )
    worst, most = min(seconds_), max(seconds_, key=lambda s: s[1])
    report.check(f"I.2 delay {delay_name}: second run, slowest store", worst[0], ">=", 0.93)
    report.check(
        f"I.2 delay {delay_name}: second run, most 429s of a store", most[1], "==", 0, "{:.0f}"
    )


def steady(report: Report, minutes: float) -> None:
    seconds = minutes * 60
    stores = [(*store, int(store[1] * store[2] * (seconds + 120))) for store in STEADY]
    configs = [store_config(*store) for store in stores]
    # Each stops at the records the pool serves in the run's length at its ceiling.
    with (
        tempfile.TemporaryDirectory(prefix="asyncsubs-bench-") as tmp,
        remote_server(
            stores=configs,
            rate_limits=None,
            inbound_delay=(0.010, 0.030),
            latency=LATENCY,
            make_records=True,
            start_timeout=300.0,  # millions of records to make first
        ) as remote,
        concurrent.futures.ThreadPoolExecutor(len(stores)) as pool,
    ):
        futures = {
            name: pool.submit(
                cli_pull,
                remote.base_url,
                remote.tokens[name],
                name,
                Path(tmp),
                "--limit",
                str(int(rate * page * seconds)),
                "--progress-interval",
                "5",
            )
            for name, rate, page, _, _ in stores
        }
        pulls = {name: future.result() for name, future in futures.items()}
    rows = []
    tens = max(1, math.ceil((minutes - 1) / 10))
    worst_share, worst_late = math.inf, 0
    for name, rate, page, _, _ in stores:
        result = pulls[name]
        mark = next((p for p in result.progress if p[0] >= 60.0), None)
        if mark is None:
            raise RuntimeError(f"{name}: no progress event after the first minute")
        after = result.records - mark[1]
        steady_share = after / (result.seconds - mark[0]) / (rate * page)
        late = result.rate_limited - mark[2]
        rows.append([name, steady_share, mark[2], late, result.rate or 0.0, result.page_size or 0])
        worst_share, worst_late = min(worst_share, steady_share), max(worst_late, late)
    report.say(f"\n  steady state, {minutes:g} minutes, delay 10-30 ms, after the first minute")
    report.table(["store", "share", "429s in minute 1", "429s after", "rate", "page"], rows)
    report.check("I.3 steady state after the first minute, slowest store", worst_share, ">=", 0.93)
    report.check(
        f"I.3 429s after the first minute, most of a pool ({minutes - 1:g} min)",
        worst_late,
        "<=",
        tens,
        "{:.0f}",
    )


def sync_stores(count: int, seconds: float) -> list[tuple[str, int, int, str, int]]:
    """``count`` stores, each its own rate, page maximum and rule."""
    stores = []
    for i in range(count):
        rate, page, rule = 2 + i % 5, (100, 150, 200, 250)[i % 4], RULES[(i // 2) % 2]
        stores.append((f"s{i:02d}-r{rate}-p{page}-{rule}", rate, page, rule, rate * page * 60))
    return [(n, r, p, rule, int(r * p * seconds)) for n, r, p, rule, _ in stores]


def many_stores(report: Report, count: int, seconds: float) -> None:
    stores = sync_stores(count, seconds)
    configs = [store_config(*store) for store in stores]
    with (
        tempfile.TemporaryDirectory(prefix="asyncsubs-bench-") as tmp,
        remote_server(
            stores=configs, rate_limits=None, latency=LATENCY, make_records=True
        ) as remote,
    ):
        toml = ['[defaults]\nresources = ["orders"]\n']
        env = {**os.environ, "ASYNCSUBS_CACHE_DIR": tmp}
        for i, (name, *_) in enumerate(stores):
            toml.append(f'[stores.{name}]\nbase_url = "{remote.base_url}"\ntoken_env = "T{i}"\n')
            env[f"T{i}"] = remote.tokens[name]
        config = Path(tmp) / "stores.toml"
        config.write_text("".join(toml), encoding="utf-8")
        command = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config)]
        command += ["--db", f"sqlite:///{tmp}/sync.db", "--log-format", "json"]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        found = events(done.stderr)
    rows, worst, most = [], (math.inf, ""), (0, "")
    for name, rate, page, _, _ in stores:
        result = pull_of(found, name)
        got = share(result, rate, page)
        rows.append([name, got, result.rate_limited, result.rate or 0.0, result.page_size or 0])
        worst, most = min(worst, (got, name)), max(most, (result.rate_limited, name))
    report.say(f"\n  one sync of {count} stores into SQLite, each pool and page size unknown")
    report.table(["store", "share", "429s", "rate learned", "page learned"], rows)
    report.check(f"I.4 {count} stores in one sync, slowest ({worst[1]})", worst[0], ">=", 0.80)
    report.check(f"I.4 {count} stores, most 429s ({most[1]})", most[0], "<=", 4, "{:.0f}")


async def _pull_until(base_url: str, token: str, limiter: Any, until: float) -> tuple[Any, ...]:
    loop = asyncio.get_running_loop()
    stop = loop.time() + max(0.0, until - time.time())
    async with AdminClient(
        token=token,
        base_url=base_url,
        store="shared",
        limits=Limits(discover=True),
        limiter=limiter,
        timeout=60.0,
    ) as client:
        t0, records = loop.time(), 0
        async for page in client.orders.list(page_size="max", model=dict).pages():
            records += len(page.data)
            if loop.time() >= stop:
                break
        pool = client.stats.pools["orders"]
        return records, loop.time() - t0, pool.rate_limited, pool.rate


def _worker(base_url: str, token: str, url: str, until: float, results: Any) -> None:
    from asyncsubs.redis import RedisLimiter

    async def main() -> tuple[Any, ...]:
        async with RedisLimiter(url) as limiter:
            return await _pull_until(base_url, token, limiter, until)

    results.put(asyncio.run(main()))


def workers(report: Report, seconds: float) -> None:
    if shutil.which("redis-server") is None:
        report.say("  SKIP  I.5: no redis-server on PATH")
        return
    from .bench_redis import redis_server

    rate, page = 5, 500
    config = store_config("shared", rate, page, "reject", int(rate * page * seconds * 2))
    with (
        redis_server() as url,
        remote_server(stores=[config], rate_limits=None, latency=LATENCY) as remote,
    ):
        ctx = multiprocessing.get_context("spawn")
        results = ctx.Queue()
        until = time.time() + 5.0 + seconds  # the workers' start-up included
        args = (remote.base_url, remote.tokens["shared"], url, until, results)
        procs = [ctx.Process(target=_worker, args=args) for _ in range(3)]
        for proc in procs:
            proc.start()
        outcomes = [results.get(timeout=seconds + 120) for _ in procs]
        for proc in procs:
            proc.join(timeout=30)
        server = all_stats(remote)["shared"].pool("orders")
    rows = [[i + 1, *outcome] for i, outcome in enumerate(outcomes)]
    report.say(f"\n  three workers, one store ({rate}/s, {page} a page, refused above), Redis")
    report.table(["worker", "records", "seconds", "429s", "rate learned"], rows)
    together = sum(o[0] for o in outcomes) / max(o[1] for o in outcomes) / (rate * page)
    report.say(f"  together {together:.3f} of the ceiling; the server refused {server.rejected}")
    report.check("I.5 three workers through Redis: 429s in all", server.rejected, "<=", 4, "{:.0f}")
    rates = [o[3] for o in outcomes]
    spread = (max(rates) - min(rates)) / max(rates)
    report.check("I.5 the learned rate, spread between workers", spread, "<=", 0.01)


def bench(report: Report) -> None:
    seconds = 20.0 if report.quick else 60.0
    for delay_name, delay in DELAYS:
        runs(report, delay_name, delay, seconds)
    many_stores(report, 20, seconds)
    steady(report, 3.0 if report.quick else 11.0)
    workers(report, 20.0 if report.quick else 60.0)
