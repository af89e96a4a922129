"""B. Soak: 100,000 records through a hostile server, every record exactly once, no error.

Two FakeAdminServers in their own processes serve the same store (same seed, same records):
one clean, one injecting faults on every path: 5% 500s, 3% HTML 502s, 3% connection resets
mid-body, 3% truncated bodies and 2% slow answers (5 s, beyond the client's 1 s timeout). The
client pulls ``subscriptions`` with a large page size (500) and loose limits (not the
bottleneck), default models and prefetch, and the default RetryPolicy. The clean run is the
baseline for the time; both runs are in this process, one after the other.
"""

from __future__ import annotations

import time
from typing import Any

from asyncsubs import AdminClient, AsyncSubsError
from asyncsubs.testing import FakeStoreConfig, Faults

from ._common import LOOSE_LIMITS, Report, remote_server, run, subscription_ids

NAME = "soak"
TITLE = "B. Soak: 100,000 records with 16% injected faults vs a fault-free run"

STORE = "soak"
PAGE_SIZE = 500
TIMEOUT = 1.0
FAULTS = Faults(
    seed=7,
    error_500=0.05,
    html_502=0.03,
    reset=0.03,
    truncate=0.03,
    slow=0.02,
    slow_seconds=5.0,
)


async def pull(base_url: str, token: str) -> dict[str, Any]:
    ids: list[int] = []
    error = None
    t0 = time.perf_counter()
    async with AdminClient(
        token=token, base_url=base_url, store=STORE, limits=LOOSE_LIMITS, timeout=TIMEOUT
    ) as client:
        try:
            async for sub in client.subscriptions.list(page_size=PAGE_SIZE):
                ids.append(sub.id)
        except AsyncSubsError as exc:
            error = f"{type(exc).__name__}: {exc}"
        stats = client.stats
    return {
        "seconds": time.perf_counter() - t0,
        "ids": ids,
        "error": error,
        "retries": stats.retries,
        "requests": stats.requests,
    }


def soak_run(records: int, faults: Faults | None) -> dict[str, Any]:
    with remote_server(
        stores=[FakeStoreConfig(STORE)],
        records={"subscriptions": records, "customers": 0, "orders": 0},
        rate_limits=None,
        faults=faults,
        max_page_size=PAGE_SIZE,
        use_uvloop=True,
    ) as remote:
        result = run(lambda: pull(remote.base_url, remote.tokens[STORE]))
        stats = remote.stats(STORE)
    result["faults"] = {k: v for k, v in stats.faults.items() if v}
    result["statuses"] = dict(sorted(stats.statuses.items()))
    return result


def bench(report: Report) -> None:
    records = 20_000 if report.quick else 100_000
    expected = subscription_ids(STORE, records)
    report.say(
        f"  {records:,} subscriptions, page size {PAGE_SIZE}, client timeout {TIMEOUT:g} s,"
        f" faults: {', '.join(f'{k} {v:.0%}' for k, v in FAULTS.fractions.items() if v)}"
        f" (slow = {FAULTS.slow_seconds:g} s)"
    )
    clean = soak_run(records, None)
    faulty = soak_run(records, FAULTS)
    rows = []
    for label, r in (("fault-free (baseline)", clean), ("with faults", faulty)):
        rows.append(
            [
                label,
                len(r["ids"]),
                len(set(r["ids"])),
                r["requests"],
                r["retries"],
                sum(r["faults"].values()),
                r["seconds"],
                r["seconds"] / clean["seconds"],
                r["error"] or "none",
            ]
        )
    report.table(
        [
            "run",
            "records",
            "unique",
            "requests",
            "retries",
            "faults injected",
            "seconds",
            "x baseline",
            "error surfaced",
        ],
        rows,
    )
    report.say(f"  faults injected by kind: {faulty['faults']}")
    report.say(f"  server statuses (faulty run): {faulty['statuses']}")
    for label, r in (("fault-free", clean), ("with faults", faulty)):
        exact = r["ids"] == expected
        report.check(
            f"{label}: records exactly as served, each once (1 = yes)",
            float(exact),
            "==",
            1,
            "{:.0f}",
        )
    report.check("with faults: records yielded", len(faulty["ids"]), "==", records, "{:,.0f}")
    report.check(
        "with faults: errors surfaced", 0 if faulty["error"] is None else 1, "==", 0, "{:.0f}"
    )
