"""H. Many workers into PostgreSQL: ``python -m benchmarks.workers [--stores 100] [--records 250]``.

A FakeAdminServer in its own process serves ``stores`` stores, each with ``records`` records
of every resource (the server's default limits: 2 requests/s per heavy pool per store, 50/s
global; 10-30 ms latency). A PostgreSQL cluster is started in a temporary directory
(``asyncsubs.testing._postgres``, with ``pg_stat_statements``), a fresh database per phase. Each
phase runs N worker processes of ``asyncsubs sync --db postgresql://...`` with the same config
(limits configured as the server's exact ones, pages of ``page_size`` records) and waits for
all of them. With two cores or more the server and PostgreSQL are pinned to the last core and
the workers to the others, so that what the workers cost is theirs (``--no-pin``: unpinned).

- N = 1, 2, 4: records per second (records / wall time of the slowest worker) against the
  ceiling the heavy pools allow (stores x 3 pools x 2 pages/s x page size, or the total over
  the time one unit needs at 2 pages/s, whichever is lower), and the server's 429s; what a
  fleet planner needs: the workers' CPU seconds (their own, from ``wait4``) per 1,000 records
  and per request (the server's count, 429s included), their share of the cores they had, and
  PostgreSQL statements per page (``pg_stat_statements`` calls in the phase's database over
  the heavy pools' accepted requests);
- with ``--against DIR`` (or ``ASYNCSUBS_AGAINST``; a checkout of another commit, e.g. a
  ``git worktree``): the 1-worker phase again with that checkout's asyncsubs, in the same run,
  its CPU per 1,000 records beside today's;
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

import attrs

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


def _workers(
    n: int, cmd: list[str], env: dict[str, str], cores: set[int] | None, cwd: str
) -> list[subprocess.Popen[bytes]]:
    procs = [
        subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for _ in range(n)
    ]
    for proc in procs:
        if cores is not None:
            os.sched_setaffinity(proc.pid, cores)
    return procs


def _wait(procs: list[subprocess.Popen[bytes]]) -> list[float]:
    """Wait for each worker; its CPU seconds (user + system, all its threads)."""
    spent = []
    for proc in procs:
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        spent.append(usage.ru_utime + usage.ru_stime)
    return spent


def _enable_statement_counts(pg: PostgresServer) -> None:
    """``pg_stat_statements`` in the cluster: loaded at start, so the cluster restarts once."""
    _query(pg.url(), "ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    pg._run("pg_ctl", "-D", str(pg.data), "-l", str(pg.root / "log"), "-w", "restart")
    _query(pg.url(), "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


def _statements(pg: PostgresServer, url: str) -> int:
    """Statements executed in the database of ``url`` so far."""
    name = url.rsplit("/", 1)[1]
    rows = _query(
        pg.url(),
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
        " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s)",
        (name,),
    )
    return int(rows[0][0])


def _pin_services(pg: PostgresServer, server_pid: int) -> tuple[set[int], set[int]] | None:
    """With two cores or more: the fake server and PostgreSQL (its postmaster, whose backends
    inherit the affinity, and its processes now) on the last core; the workers' cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    service, workers = {cores[-1]}, set(cores[:-1])
    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
    pids = {server_pid, postmaster}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    for pid in pids:
        os.sched_setaffinity(pid, service)
    return service, workers


@attrs.frozen
class Phase:
    """What one phase measured."""

    workers: int
    checkout: str
    wall: float
    rows: int
    rejected: int
    requests: int
    pages: int
    statements: int
    cpu: tuple[float, ...]  # each worker's CPU seconds

    def row(self, ceiling: float, cores: int) -> str:
        cpu, rate = sum(self.cpu), self.rows / self.wall
        share = cpu / (self.wall * cores)
        return (
            f"{self.workers:>7}  {self.checkout:>8}  {self.wall:6.1f}  {rate:9,.0f}"
            f"  {rate / ceiling:9.0%}  {self.rejected:4}  {cpu:6.1f}  {share:9.0%}"
            f"  {cpu / self.rows * 1000:9.3f}  {cpu / self.requests * 1000:9.2f}"
            f"  {self.statements / self.pages:9.2f}  {self.rows:,}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--stores", type=int, default=100)
    parser.add_argument("--records", type=int, default=250)
    parser.add_argument("--page-size", type=int, default=25)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--against",
        metavar="DIR",
        default=os.environ.get("ASYNCSUBS_AGAINST"),
        help="a checkout of another commit: its 1-worker phase beside today's",
    )
    parser.add_argument("--no-pin", action="store_true", help="leave every process unpinned")
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
    _enable_statement_counts(pg)
    remote = run_in_process(
        stores=[FakeStoreConfig(s, records=counts) for s in stores],
        latency=(0.01, 0.03),
        request_log_size=0,
        make_records=True,  # made inside the first phase's requests, they stamp it late
    )
    pinned = None if args.no_pin else _pin_services(pg, remote.process.pid)
    worker_cores = None if pinned is None else pinned[1]
    cores = len(worker_cores or os.sched_getaffinity(0))
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
            where = (
                f"server and PostgreSQL on core {sorted(pinned[0])}, workers on {sorted(pinned[1])}"
                if pinned
                else "unpinned"
            )
            print(f"{where}; CPU: the workers' own (wait4), share of the {cores} core(s) they had")
            print(
                "workers    asyncsubs  wall s  records/s  of ceiling  429s  CPU s  CPU share"
                "  CPU s/1k rec  CPU ms/req  stmts/page  rows"
            )
            phases = [(n, None) for n in args.workers]
            if args.against:
                phases.insert(
                    args.workers.index(1) + 1 if 1 in args.workers else 0, (1, args.against)
                )
            measured: list[Phase] = []
            for n, checkout in phases:
                url = pg.create_database()
                cmd = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config),
                       "--db", url, "--quiet"]  # fmt: skip
                # From a directory of its own: ``-m asyncsubs`` imports the installed package,
                # or the checkout's first on PYTHONPATH.
                phase_env = {**env, "PYTHONPATH": checkout} if checkout else env
                remote.reset_stats()
                started = time.monotonic()
                procs = _workers(n, cmd, phase_env, worker_cores, tmp)
                cpu = _wait(procs)
                wall = time.monotonic() - started
                if any(p.returncode for p in procs):
                    err = b"".join(p.stderr.read() for p in procs if p.stderr).decode()
                    codes = [p.returncode for p in procs]
                    raise SystemExit(f"workers exited {codes}: {err[-2000:]}")
                statements = _statements(pg, url)
                rows = _check_rows(url, stores, args.records)
                stats = all_stats(remote).values()
                phase = Phase(
                    workers=n,
                    checkout="against" if checkout else "today",
                    wall=wall,
                    rows=rows,
                    rejected=sum(s.rejected for s in stats),
                    requests=sum(s.requests for s in stats),
                    pages=sum(s.pool(r).accepted for s in stats for r in RESOURCES),
                    statements=statements,
                    cpu=tuple(cpu),
                )
                measured.append(phase)
                print(phase.row(ceiling, cores))
            single = [p for p in measured if p.workers == 1]
            if len(single) == 2:
                today, before = (sum(p.cpu) / p.rows * 1000 for p in single)
                verdict = "PASS" if today < before else "FAIL"
                print(
                    f"  {verdict}  1 worker, CPU s per 1,000 records: {today:.3f} today,"
                    f" {before:.3f} at {args.against}: {today / before:.2f} of it (target < 1)"
                )
            for phase in single:
                verdict = "PASS" if phase.rejected == 0 else "FAIL"
                print(f"  {verdict}  1 worker ({phase.checkout}): {phase.rejected} 429s (target 0)")

            # One of two workers SIGKILLed a third of the way.
            url = pg.create_database()
            cmd = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config),
                   "--db", url, "--quiet", "--lease", "5"]  # fmt: skip
            remote.reset_stats()
            started = time.monotonic()
            victim, survivor = _workers(2, cmd, env, worker_cores, tmp)
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
