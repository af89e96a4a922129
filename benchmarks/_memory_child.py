"""One pull in a fresh process, for the memory benchmark: prints its peak RSS as JSON.

``python -m benchmarks._memory_child BASE_URL TOKEN STORE RECORDS PAGE_SIZE [MODEL]``

The peak is ``VmHWM`` from /proc/self/status: the high-water mark of this process's own memory.
``getrusage(RUSAGE_SELF).ru_maxrss`` is not usable here: Linux carries the parent's peak over
into it through fork/vfork + exec, so every child would report at least the benchmark runner's
own size. It is printed too, for comparison.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time

import orjson

from asyncsubs import AdminClient

from ._common import LOOSE_LIMITS


def status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (VmRSS, VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def ru_maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


async def pull(base_url: str, token: str, store: str, page_size: int, model: str) -> int:
    count = 0
    async with AdminClient(
        token=token, base_url=base_url, store=store, limits=LOOSE_LIMITS
    ) as client:
        listing = client.subscriptions.list(
            page_size=page_size, model=dict if model == "dict" else None
        )
        async for _ in listing:
            count += 1
    return count


def main() -> None:
    base_url, token, store, records, page_size = sys.argv[1:6]
    model = sys.argv[6] if len(sys.argv) > 6 else "models"
    before = status_kib("VmRSS")
    t0 = time.perf_counter()
    count = asyncio.run(pull(base_url, token, store, int(page_size), model))
    result = {
        "records": count,
        "expected": int(records),
        "seconds": time.perf_counter() - t0,
        "rss_before_kib": before,
        "peak_rss_kib": status_kib("VmHWM"),
        "ru_maxrss_kib": ru_maxrss_kib(),
    }
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
