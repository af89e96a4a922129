"""dlt. The dlt source is not the bottleneck: 20 stores through ``asyncsubs.dlt`` into DuckDB
against the same client pulling alone and ``asyncsubs sync`` writing SQLite.

One FakeAdminServer in its own process serves 20 stores whose heavy pools it limits (2/s each,
sliding windows, pages of up to 250); every client is given exactly those limits, so each pull
runs at the rate the server allows. Three pulls of everything, one after the other:

- **client alone**: the same ``AdminClient`` per store, pages read and dropped (the baseline);
- **dlt source**: ``pipeline.extract`` of ``subscription_service`` (the source's part), then
  normalize and load into DuckDB, timed apart;
- **asyncsubs sync**: the command line in a subprocess, into SQLite.

Target: the source's extract runs at >= 0.9 of the client alone's records/s. The end-to-end
figures (into DuckDB, into SQLite) are printed against the server's allowed rate.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncsubs import AdminClient, Limits, Rate
from asyncsubs.testing import FakeStoreConfig, ServerRateLimits

from ._common import Report, all_stats, remote_server

NAME = "dlt"
TITLE = "dlt. The dlt source against the same pull alone and asyncsubs sync, 20 stores"
RESOURCES = ("subscriptions", "customers", "orders")
HEAVY = dict.fromkeys(RESOURCES, Rate(2))
PAGE = 250
TARGET = 0.9


def _limits() -> Limits:
    return Limits(heavy=HEAVY)


async def _pull_alone(base_url: str, tokens: dict[str, str]) -> int:
    clients = [
        AdminClient(token=token, base_url=base_url, store=name, limits=_limits())
        for name, token in tokens.items()
    ]

    async def one(client: AdminClient, resource: str) -> int:
        count = 0
        async for page in client.list_endpoint(resource).list(page_size=PAGE).pages():
            count += len(page.data)
        return count

    try:
        counts = await asyncio.gather(*(one(c, r) for c in clients for r in RESOURCES))
    finally:
        for client in clients:
            await client.aclose()
    return sum(counts)


def _stores_toml(path: Path, base_url: str, names: list[str]) -> None:
    heavy = ", ".join(f'{r} = "{rate}"' for r, rate in HEAVY.items())
    lines = [f"[defaults]\npage_size = {PAGE}\n[defaults.limits]\nheavy = {{ {heavy} }}\n"]
    for i, name in enumerate(names):
        lines.append(f'[stores.{name}]\nbase_url = "{base_url}"\ntoken_env = "BENCH_TOKEN_{i}"\n')
    path.write_text("\n".join(lines))


def bench(report: Report) -> None:
    import dlt

    from asyncsubs.dlt import Store, subscription_service

    os.environ.setdefault("RUNTIME__DLTHUB_TELEMETRY", "false")
    os.environ.setdefault("RUNTIME__LOG_LEVEL", "ERROR")
    stores = 4 if report.quick else 20
    pages = 6 if report.quick else 14  # per pool: 2.5 or 6.5 s at 2/s
    records = pages * PAGE
    names = [f"dlt-{i}" for i in range(stores)]
    allowed = stores * len(RESOURCES) * HEAVY["orders"].per_second * PAGE  # records/s
    total = stores * len(RESOURCES) * records
    limits = ServerRateLimits(heavy=HEAVY, window="sliding")
    configs = [FakeStoreConfig(n, records=records, rate_limits=limits) for n in names]
    report.say(
        f"  {stores} stores x 3 resources x {records:,} records, heavy pools 2/s each, pages of "
        f"{PAGE}: the server allows {allowed:,.0f} records/s"
    )
    rows: list[tuple[Any, ...]] = []
    with (
        remote_server(stores=configs, make_records=True, max_page_size=PAGE) as remote,
        tempfile.TemporaryDirectory(prefix="asyncsubs-bench-dlt-") as tmp,
    ):
        tokens = dict(remote.tokens)

        def rejected() -> int:
            return sum(s.rejected for s in all_stats(remote).values())

        t0 = time.perf_counter()
        pulled = asyncio.run(_pull_alone(remote.base_url, tokens))
        alone = time.perf_counter() - t0
        assert pulled == total, (pulled, total)
        rows.append(("client alone (baseline)", pulled, alone, pulled / alone, rejected()))
        remote.reset_stats()
        time.sleep(1.0)  # the pools' windows empty before the next pull

        pipeline = dlt.pipeline(
            pipeline_name="bench_dlt",
            destination=dlt.destinations.duckdb(str(Path(tmp) / "bench.duckdb")),
            pipelines_dir=str(Path(tmp) / "pipelines"),
            dataset_name="subs",
        )
        source = subscription_service(
            stores=[
                Store(name=n, base_url=remote.base_url, token=t, limits=_limits(), page_size=PAGE)
                for n, t in tokens.items()
            ]
        )
        t0 = time.perf_counter()
        pipeline.extract(source)
        extract = time.perf_counter() - t0
        t1 = time.perf_counter()
        pipeline.normalize()
        normalize = time.perf_counter() - t1
        pipeline.load()
        rest = time.perf_counter() - t1
        report.say(f"  dlt normalize {normalize:.1f} s, load {rest - normalize:.1f} s")
        with pipeline.sql_client() as sql:
            loaded = sum(sql.execute_sql(f"SELECT count(*) FROM {r}")[0][0] for r in RESOURCES)
        assert loaded == total, (loaded, total)
        rows.append(("dlt source: extract", loaded, extract, loaded / extract, rejected()))
        rows.append(
            ("dlt source: + normalize, load", loaded, extract + rest, loaded / (extract + rest), 0)
        )
        remote.reset_stats()
        time.sleep(1.0)

        config = Path(tmp) / "stores.toml"
        _stores_toml(config, remote.base_url, names)
        env = {**os.environ, **{f"BENCH_TOKEN_{i}": tokens[n] for i, n in enumerate(names)}}
        command = [sys.executable, "-m", "asyncsubs", "sync", "--config", str(config)]
        command += ["--db", f"sqlite:///{Path(tmp) / 'sync.db'}", "-q"]
        t0 = time.perf_counter()
        subprocess.run(command, env=env, check=True)
        synced = time.perf_counter() - t0
        rows.append(("asyncsubs sync into SQLite", total, synced, total / synced, rejected()))

    report.table(
        ["pull", "records", "seconds", "records/s", "429s"],
        [(name, f"{n:,}", f"{s:.1f}", f"{n / s:,.0f}", r) for name, n, s, _, r in rows],
    )
    report.say(
        "  of the allowed rate: "
        + "; ".join(f"{name} {rate / allowed:.1%}" for name, _, _, rate, _ in rows)
    )
    report.check("dlt extract / client alone, records/s", rows[1][3] / rows[0][3], ">=", TARGET)
    report.check("429s in the dlt source's pull", rows[1][4], "==", 0, fmt="{:.0f}")
