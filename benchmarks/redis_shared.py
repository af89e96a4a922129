"""Runs ``benchmarks.bench_redis`` (owned with benchmarks/README-redis.md by the Redis limiter's
author) as part of ``python -m benchmarks``: several processes sharing one store's budget
through a RedisLimiter. Its own output and PASS/FAIL line are printed as they are; its exit
status becomes one target here. Skipped when no ``redis-server`` is on PATH.
"""

from __future__ import annotations

import shutil

from ._common import Report

NAME = "redis"
TITLE = "Redis limiter: 4 processes share one store through Redis (benchmarks/bench_redis.py)"


def bench(report: Report) -> None:
    if shutil.which("redis-server") is None:
        report.say("  SKIP  no redis-server on PATH (see benchmarks/README-redis.md)")
        return
    from . import bench_redis

    argv = ["--seconds", "5", "--acquires", "1000", "--quick"] if report.quick else []
    status = bench_redis.main(argv)
    report.check("bench_redis exit status (0 = its targets met)", status, "==", 0, "{:.0f}")
