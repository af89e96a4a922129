"""H. Many workers into PostgreSQL: ``python -m benchmarks.workers [--stores 100] [--records 250]``.

A FakeAdminServer in its own process serves ``stores`` stores, each with ``records`` records
of every resource (the server's default limits: 2 requests/s per heavy pool per store, 50/s
global; 10-30 ms latency). A PostgreSQL cluster is started in a temporary directory
(``asyncsubs.testing._postgres``), a fresh database per phase. Each phase runs N worker
processes of ``asyncsubs sync --db postgresql://...`` with the same config (heavy limits
configured as the server's, pages of ``page_size`` records) and waits for all of them:

- N = 1, 2, 4: records per second (records / wall time of the slowest worker) against the
  ceiling the heavy pools allow (stores x 3 pools x 2 pages/s x page size, or the total over
  the time one unit needs at 2 pages/s, whichever is lower), and the server's 429s;
- N = 2 with one worker SIGKILLed once a third of the records are in (``--lease`` 5 s): the
  rows at the end (exactly the server's, once each), and the takeover time: from the kill
  until the survivor holds every unit the victim held.

Every phase checks the row count of every (store, resource) against the server's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncsubs.testing import FakeStoreConfig, run_in_process
from asyncsubs.testing._postgres import PostgresServer, postgres_bindir

from ._common import all_stats

RESOURCES = ("subscriptions", "customers", "orders")
HEAVY_RATE = 2.0  # the fake server's default per heavy pool and store


def _config(path: Path, base_url: str, stores: list[str], page_size: int) -> None:
    lines = [
        "[defaults]",
        f"page_size = {page_size}",
        "[defaults.limits]",
        'global = "50/s"',
        'heavy = { subscriptions = "2/s", customers = "2/s", orders = "2/s" }',
    ]
    for i, store in enumerate(stores):
        lines += [f'[stores."{store}"]', f'base_url = "{base_url}"', f'token_env = "T{i}"']
    path.write_text("\n".join(lines) + "\n")


def _query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _check_rows(url: str, stores: list[str], records: int) -> int:
    total = 0
    for resource in RESOURCES:
        counts = dict(_query(url, f"SELECT store, count(*) FROM {resource} GROUP BY store"))
        wrong = [s for s in stores if counts.get(s, 0) != records]
        if wrong:
            raise SystemExit(f"{resource}: wrong row counts for {len(wrong)} stores")
        total += sum(counts.values())
    return total


def _workers(n: int, cmd: list[str], env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--stores", type=int, default=100)
    parser.add_argument("--records", type=int, default=250)
    parser.add_argument("--page-size", type=int, default=25)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    args = parser.parse_args()

    bindir = postgres_bindir()
    if bindir is None:
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql)")
    stores = [f"store-{i:03d}" for i in range(args.stores)]
    counts = dict.fromkeys(RESOURCES, args.records)
    total = args.stores * 3 * args.records
    pages_per_unit = -(-args.records // args.page_size)
    pool_ceiling = args.stores * 3 * HEAVY_RATE * args.page_size
    # A unit cannot finish faster than its pages at 2/s (the first one at once).
    unit_floor = (pages_per_unit - 1) / HEAVY_RATE
    ceiling = min(pool_ceiling, total / unit_floor) if unit_floor else pool_ceiling

    pg = PostgresServer(bindir)
    pg.start()
    remote = run_in_process(
        stores=[FakeStoreConfig(s, records=counts) for s in stores],
        latency=(0.01, 0.03),
        request_log_size=0,
    )
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "stores.toml"
            _config(config, remote.api_url.rsplit("/admin/", 1)[0], stores, args.page_size)
            env = {**os.environ, **{f"T{i}": remote.tokens[s] for i, s in enumerate(stores)}}
            print(
                f"{args.stores} stores x 3 resources x {args.records} records = {total:,};"
                f" pages of {args.page_size}; ceiling {ceiling:,.0f} records/s"
                f" (heavy pools: {pool_ceiling:,.0f}/s; one unit needs >= {unit_floor:.1f}s)"
            )
            print("workers  wall s  records/s  of ceiling  429s  rows")
            for n in args.workers:
                url = pg.create_database()
                cmd = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config),
                       "--db", url, "--quiet"]  # fmt: skip
                remote.reset_stats()
                started = time.monotonic()
                procs = _workers(n, cmd, env)
                codes = [p.wait() for p in procs]
                wall = time.monotonic() - started
                if any(codes):
                    err = b"".join(p.stderr.read() for p in procs if p.stderr).decode()
                    raise SystemExit(f"workers exited {codes}: {err[-2000:]}")
                rows = _check_rows(url, stores, args.records)
                rejected = sum(s.rejected for s in all_stats(remote).values())
                rate = rows / wall
                print(
                    f"{n:>7}  {wall:6.1f}  {rate:9,.0f}  {rate / ceiling:9.0%}"
                    f"  {rejected:4}  {rows:,}"
                )

            # One of two workers SIGKILLed a third of the way.
            url = pg.create_database()
            cmd = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config),
                   "--db", url, "--quiet", "--lease", "5"]  # fmt: skip
            remote.reset_stats()
            started = time.monotonic()
            victim, survivor = _workers(2, cmd, env)
            while True:
                done = _query(url, "SELECT coalesce(sum(run_records), 0) FROM"
                              " asyncsubs_sync_state") if _has_state(url) else [(0,)]  # fmt: skip
                if done[0][0] >= total / 3:
                    break
                time.sleep(0.05)
            held_rows = _query(
                url,
                "SELECT DISTINCT holder FROM asyncsubs_sync_units WHERE holder IS NOT NULL",
            )
            holders = sorted(r[0] for r in held_rows)
            victim_holder = next(h for h in holders if h.split(":")[1] == str(victim.pid))
            units = _query(
                url,
                "SELECT store, resource FROM asyncsubs_sync_units WHERE holder = %s",
                (victim_holder,),
            )
            victim.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            victim.wait()
            takeover = None
            while survivor.poll() is None or takeover is None:
                held = _query(
                    url,
                    "SELECT count(*) FROM asyncsubs_sync_units WHERE (store, resource) IN"
                    " (SELECT * FROM unnest(%s::text[], %s::text[]))"
                    " AND (holder IS DISTINCT FROM %s)",
                    ([u[0] for u in units], [u[1] for u in units], victim_holder),
                )
                if takeover is None and held[0][0] == len(units):
                    takeover = time.monotonic() - killed
                if survivor.poll() is not None:
                    break
                time.sleep(0.05)
            code = survivor.wait()
            wall = time.monotonic() - started
            if code:
                raise SystemExit(f"survivor exited {code}")
            rows = _check_rows(url, stores, args.records)
            rejected = sum(s.rejected for s in all_stats(remote).values())
            print(
                f"2 workers, one SIGKILLed at 1/3 (lease 5 s): {len(units)} units taken over"
                f" {takeover:.1f}s after the kill; {rows:,} rows, exactly the server's;"
                f" {wall:.1f}s in all; {rejected} 429s"
            )
    finally:
        remote.stop()
        pg.stop()


def _has_state(url: str) -> bool:
    rows = _query(url, "SELECT to_regclass('asyncsubs_sync_state') IS NOT NULL")
    return bool(rows[0][0])


if __name__ == "__main__":
    main()
