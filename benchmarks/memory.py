"""E. Memory: peak RSS of a client streaming 1,000,000 records vs 100,000.

The server (a FakeAdminServer with one store of each size, uvloop) runs in its own process;
each pull runs in a fresh Python process (``benchmarks._memory_child``) that streams every
record of ``client.subscriptions.list(page_size=1000)`` (default models, default prefetch),
keeping none, and reports its peak RSS (``VmHWM``; see that module for why not ``ru_maxrss``).
Streaming means the peak must not grow with the number of records: the difference is the
figure (target < 20 MB). The first pull of each store includes the server generating its
records (the ``dict`` pulls come second and are served from its cache), so the seconds are
for information only.
"""

from __future__ import annotations

import subprocess
import sys

import orjson

from asyncsubs.testing import FakeStoreConfig

from ._common import Report, remote_server

NAME = "memory"
TITLE = "E. Memory: peak RSS of the client streaming 1,000,000 vs 100,000 records"
PAGE_SIZE = 1000
TARGET_MB = 20.0


def child(base_url: str, token: str, store: str, records: int, model: str) -> dict[str, float]:
    argv = [sys.executable, "-m", "benchmarks._memory_child", base_url, token, store]
    argv += [str(records), str(PAGE_SIZE), model]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory child failed ({done.returncode}): {done.stderr[-2000:]}")
    result: dict[str, float] = orjson.loads(done.stdout.strip().splitlines()[-1])
    if result["records"] != records:
        raise RuntimeError(f"memory child pulled {result['records']} records, not {records}")
    return result


def bench(report: Report) -> None:
    small, large = (50_000, 250_000) if report.quick else (100_000, 1_000_000)
    stores = {
        "small": FakeStoreConfig("mem-small", records={"subscriptions": small}),
        "large": FakeStoreConfig("mem-large", records={"subscriptions": large}),
    }
    report.say(
        f"  {small:,} vs {large:,} subscriptions, page size {PAGE_SIZE}, each pull in a fresh"
        " process; server in its own process"
    )
    with remote_server(
        stores=list(stores.values()),
        records={"customers": 0, "orders": 0},
        rate_limits=None,
        max_page_size=PAGE_SIZE,
        use_uvloop=True,
    ) as remote:
        results = {}
        for model in ("models", "dict"):
            for size, config in stores.items():
                count = small if size == "small" else large
                results[model, size] = child(
                    remote.base_url, remote.tokens[config.name], config.name, count, model
                )
    rows = []
    diffs = {}
    for model in ("models", "dict"):
        s, lg = results[model, "small"], results[model, "large"]
        diffs[model] = (lg["peak_rss_kib"] - s["peak_rss_kib"]) / 1024
        for r in (s, lg):
            rows.append(
                [
                    "Subscription" if model == "models" else "dict",
                    int(r["records"]),
                    r["rss_before_kib"] / 1024,
                    r["peak_rss_kib"] / 1024,
                    r["ru_maxrss_kib"] / 1024,
                    r["seconds"],
                ]
            )
    report.table(
        [
            "model",
            "records",
            "RSS after imports MB",
            "peak RSS (VmHWM) MB",
            "ru_maxrss MB (inherited, not used)",
            "seconds",
        ],
        rows,
    )
    for model in ("models", "dict"):
        label = "Subscription models" if model == "models" else "model=dict"
        report.check(
            f"{label}: peak RSS {large:,} - {small:,} records (MB)",
            diffs[model],
            "<",
            TARGET_MB,
            "{:.1f}",
        )
