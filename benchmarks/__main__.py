"""Run the benchmarks: ``python -m benchmarks [--quick] [NAME ...]`` (see benchmarks/README.md).

Exit status 1 if any target FAILs (or a benchmark crashes), else 0.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import os
import platform
import sys
import time
import traceback
from types import ModuleType

from ._common import Check, Report, load_average, uvloop_available

#: Benchmarks in the order ``python -m benchmarks`` runs them: name -> module.
BENCHMARKS = {
    "rate": "rate",
    "soak": "soak",
    "overhead": "overhead",
    "structuring": "structuring",
    "memory": "memory",
    "prefetch": "prefetch",
    "stores": "stores",
    "pacer": "pacer",
    "redis": "redis_shared",
    "discovery": "discovery",
    "dlt": "dlt_source",
}


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"benchmarks.{BENCHMARKS[name]}")


def _environment() -> str:
    import aiohttp

    uv = importlib.metadata.version("uvloop") if uvloop_available() else "not installed"
    return (
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; Python"
        f" {platform.python_version()}; aiohttp {aiohttp.__version__}; uvloop {uv};"
        f" {os.cpu_count()} cores; load average (1/5 min) {load_average()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="asyncsubs benchmarks; each prints ratios against a baseline measured in "
        "the same run and PASS/FAIL per target.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"benchmarks to run (default: all): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument("--quick", action="store_true", help="short durations (smoke run)")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also print where a page's microseconds go (overhead)",
    )
    parser.add_argument("--markdown", metavar="PATH", help="also write the output as Markdown")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}"
        )
    names = args.names or list(BENCHMARKS)

    header = f"asyncsubs benchmarks{' (--quick)' if args.quick else ''}: {_environment()}"
    print(header, flush=True)
    markdown = [f"_{header}_", ""]
    checks: list[Check] = []
    crashed: list[str] = []
    started = time.perf_counter()
    for name in names:
        module = _module(name)
        report = Report(name, args.quick)
        print(f"\n== {module.TITLE}", flush=True)
        t0 = time.perf_counter()
        try:
            module.bench(report)
            if args.profile and hasattr(module, "profile"):
                module.profile(report)
        except Exception:
            traceback.print_exc()
            crashed.append(name)
            report.say(f"  FAIL  {name} crashed (traceback above)")
        elapsed = time.perf_counter() - t0
        report.say(f"  ({elapsed:.0f} s)")
        checks += report.checks
        markdown += [f"### {module.TITLE}", "", *report.markdown, ""]

    failed = [c for c in checks if not c.passed]
    total = time.perf_counter() - started
    print(f"\n== Summary ({total:.0f} s, load average now {load_average()})")
    for c in checks:
        print(f"  {'PASS' if c.passed else 'FAIL'}  [{c.bench}] {c.text}")
    for name in crashed:
        print(f"  FAIL  [{name}] crashed")
    ok = not failed and not crashed
    print(f"{'PASS' if ok else 'FAIL'}: {len(checks) - len(failed)}/{len(checks)} targets met")
    if args.markdown:
        markdown += ["### Summary", "", "| benchmark | target | result |", "|---|---|---|"]
        markdown += [f"| {c.bench} | {c.text} | {'PASS' if c.passed else 'FAIL'} |" for c in checks]
        markdown += [f"| {n} | crashed | FAIL |" for n in crashed]
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write("\n".join(markdown) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
