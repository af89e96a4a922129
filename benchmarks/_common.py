"""Helpers shared by the benchmarks: reporting, event loops, servers in other processes, CPU.

Every benchmark prints its figures as ratios against a baseline measured in the same run, and
one PASS/FAIL line per target through :class:`Report`. Nothing here talks to anything but
127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from asyncsubs import Limits, Rate
from asyncsubs.testing import RemoteFakeServer, StoreStats, run_in_process
from asyncsubs.testing._data import RESOURCES, StoreData

T = TypeVar("T")

LOOPS = ("asyncio", "uvloop")

#: Client limits that are never the bottleneck (for benchmarks of everything but the limiter).
LOOSE_LIMITS = Limits(
    global_rate=Rate(1_000_000),
    heavy={resource: Rate(1_000_000) for resource in RESOURCES},
    max_in_flight=10_000,
)


# --------------------------------------------------------------------------------------------
# Event loops


def run(main: Callable[[], Awaitable[T]], loop: str = "asyncio") -> T:
    """Run ``main()`` in a fresh event loop: the default asyncio loop or uvloop."""
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main())  # type: ignore[arg-type]
    if loop != "asyncio":
        raise ValueError(f"unknown loop {loop!r}")
    return asyncio.run(main())  # type: ignore[arg-type]


def uvloop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def loops() -> tuple[str, ...]:
    return LOOPS if uvloop_available() else ("asyncio",)


# --------------------------------------------------------------------------------------------
# Fake servers in another process


@contextlib.contextmanager
def remote_server(**server_kwargs: Any) -> Iterator[RemoteFakeServer]:
    """A ``FakeAdminServer(**server_kwargs)`` in its own process, stopped on exit."""
    remote = run_in_process(**server_kwargs)
    try:
        yield remote
    finally:
        remote.stop()


@contextlib.contextmanager
def busy_cores() -> Iterator[None]:
    """A process spinning on every core for the block: a machine whose cores are shared with
    other work (another tenant's job, a host taking the VM's CPUs), as in its slow hours."""
    # Each spins until this process ends, however it ends (its parent changes then).
    loop = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    sum(range(10**6))"
    spin = [sys.executable, "-c", loop]
    spinners = [subprocess.Popen(spin) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def all_stats(remote: RemoteFakeServer) -> dict[str, StoreStats]:
    """Counters of every store of a remote server, in one request."""
    with urllib.request.urlopen(f"{remote.base_url}/_fake/stats", timeout=30) as response:
        data = orjson.loads(response.read())
    return {name: StoreStats.from_dict(stats) for name, stats in data.items()}


def subscription_ids(store: str, count: int, *, seed: int = 0) -> list[int]:
    """The ids a FakeAdminServer with this seed serves for ``store`` (records are a pure
    function of seed, store and counts, so no request is needed)."""
    counts: dict[str, int] = {resource: 0 for resource in RESOURCES}
    counts["subscriptions"] = count
    return list(StoreData(seed=seed, store=store, counts=counts)["subscriptions"].ids)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of another process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


@dataclass
class CpuMeter:
    """CPU seconds of this process (``time.process_time``) and optionally of another one."""

    other_pid: int | None = None
    wall: float = 0.0
    cpu: float = 0.0
    other_cpu: float = 0.0
    _t0: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __enter__(self) -> CpuMeter:
        self._t0 = (time.perf_counter(), time.process_time(), self._other())
        return self

    def __exit__(self, *exc: object) -> None:
        wall, cpu, other = self._t0
        self.wall = time.perf_counter() - wall
        self.cpu = time.process_time() - cpu
        self.other_cpu = self._other() - other

    def _other(self) -> float:
        return 0.0 if self.other_pid is None else process_cpu_seconds(self.other_pid)

    @property
    def utilisation(self) -> float:
        return self.cpu / self.wall if self.wall else 0.0

    @property
    def other_utilisation(self) -> float:
        return self.other_cpu / self.wall if self.wall else 0.0


def pages_of(listing: Any) -> AsyncGenerator[Any, None]:
    """``listing.pages()`` typed as the async generator it is (for ``contextlib.aclosing``)."""
    pages: AsyncGenerator[Any, None] = listing.pages()
    return pages


def achieved_rate(starts: Sequence[float], t0: float, seconds: float) -> tuple[int, float]:
    """(accepted starts in ``[t0, t0 + seconds)``, achieved rate per second).

    The rate is the count over ``seconds``, or the steady pace between the first and last of
    those starts if that is lower: for a slow pool the count alone over-counts by up to one
    interval (2.5% for 2/s over 20 s), so the lower of the two is reported.
    """
    inside = [t for t in starts if t0 <= t < t0 + seconds]
    if not inside:
        return 0, 0.0
    rate = len(inside) / seconds
    if len(inside) > 1 and inside[-1] > inside[0]:
        rate = min(rate, (len(inside) - 1) / (inside[-1] - inside[0]))
    return len(inside), rate


def load_average() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "n/a"
    return f"{one:.2f} / {five:.2f}"


# --------------------------------------------------------------------------------------------
# Reporting


@dataclass
class Check:
    bench: str
    name: str
    measured: float
    op: str
    target: float
    text: str

    @property
    def passed(self) -> bool:
        m, t = self.measured, self.target
        return {
            ">=": m >= t,
            ">": m > t,
            "<=": m <= t,
            "<": m < t,
            "==": m == t,
        }[self.op]


@dataclass
class Report:
    """Prints a benchmark's tables and PASS/FAIL lines; keeps them for the summary."""

    bench: str
    quick: bool
    checks: list[Check] = field(default_factory=list)
    markdown: list[str] = field(default_factory=list)

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.markdown.append(text)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        cells = [[str(h) for h in headers], *[[_cell(c) for c in row] for row in rows]]
        widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
        lines = []
        for n, row in enumerate(cells):
            lines.append(
                "  "
                + "  ".join(
                    c.rjust(w) if n and i else c.ljust(w)
                    for i, (c, w) in enumerate(zip(row, widths, strict=True))
                )
            )
            if n == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        print("\n".join(lines), flush=True)
        self.markdown.append("")
        self.markdown.append("| " + " | ".join(cells[0]) + " |")
        self.markdown.append("|" + "|".join("---" for _ in headers) + "|")
        for row in cells[1:]:
            self.markdown.append("| " + " | ".join(row) + " |")
        self.markdown.append("")

    def check(
        self, name: str, measured: float, op: str, target: float, fmt: str = "{:.3f}"
    ) -> Check:
        text = f"{name}: {fmt.format(measured)} (target {op} {fmt.format(target)})"
        check = Check(self.bench, name, measured, op, target, text)
        self.checks.append(check)
        self.say(f"  {'PASS' if check.passed else 'FAIL'}  {text}")
        return check


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pct(value: float) -> str:
    return f"{100 * value:.1f}%"


# --------------------------------------------------------------------------------------------
# Load generators


@dataclass
class Tally:
    """What one group of tasks got back."""

    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def failed(self) -> int:
        return sum(self.errors.values())


async def hammer(
    client: Any,
    ids: Sequence[int],
    tally: Tally,
    first: int,
    step: int,
    gate: asyncio.Event | None = None,
) -> None:
    """Light requests (one subscription each) through ``client`` until cancelled; each waits
    for ``gate``, when given, to be set."""
    from asyncsubs import AsyncSubsError

    n = first
    while True:
        if gate is not None:
            await gate.wait()
        try:
            await client.request("GET", f"subscriptions/{ids[n % len(ids)]}")
            tally.ok += 1
        except AsyncSubsError as exc:
            tally.error(type(exc).__name__)
        n += step


def naive_tasks(
    session: Any, remote: RemoteFakeServer, store: str, tally: Tally, *, tasks: int, records: int
) -> list[Awaitable[None]]:
    """The hand-written baseline: light requests through aiohttp behind an aiolimiter leaky
    bucket of 50/s (``AsyncLimiter(50, 1)``), ``tasks`` at a time, no retries, until cancelled."""
    import aiohttp
    from aiolimiter import AsyncLimiter

    ids = subscription_ids(store, records)
    limiter = AsyncLimiter(50, 1)
    headers = {"X-Service-Token": remote.tokens[store]}
    base = f"{remote.api_url}subscriptions/"

    async def task(first: int) -> None:
        n = first
        while True:
            async with limiter:
                try:
                    async with session.get(f"{base}{ids[n % len(ids)]}", headers=headers) as r:
                        await r.read()
                        if r.status == 200:
                            tally.ok += 1
                        else:
                            tally.error(f"HTTP {r.status}")
                except aiohttp.ClientError as exc:
                    tally.error(type(exc).__name__)
            n += tasks

    return [task(k) for k in range(tasks)]


async def run_tasks_for(seconds: float, coroutines: Sequence[Awaitable[Any]]) -> None:
    """Run ``coroutines`` as tasks for ``seconds``, then cancel them and wait until they end."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        done, _ = await asyncio.wait(tasks, timeout=seconds)
        for task in done:
            task.result()  # a load generator that ended by itself has crashed: raise it
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def warm_up(
    remote: RemoteFakeServer, stores: Sequence[str], session: Any = None, *, settle: float = 1.1
) -> None:
    """Before a measured phase: one request per store, up to 100 at a time.

    The fake server builds a store's data on its first request (~9 ms each); done inside the
    phase, that would block its loop for a second with 100 stores, overflow its listen backlog
    and stall connections for the kernel's 1 s SYN retry. Through ``session``, the requests also
    leave up to 100 keep-alive connections in its pool. Then wait ``settle`` seconds, so they
    have left the server's 1-second windows.
    """
    import aiohttp

    own = session is None
    if own:
        session = aiohttp.ClientSession()
    try:

        async def get(store: str) -> None:
            url = f"{remote.api_url}subscriptions/{subscription_ids(store, 1)[0]}"
            headers = {"X-Service-Token": remote.tokens[store]}
            async with session.get(url, headers=headers) as response:
                await response.read()

        for start in range(0, len(stores), 100):
            await asyncio.gather(*(get(s) for s in stores[start : start + 100]))
    finally:
        if own:
            await session.close()
    await asyncio.sleep(settle)


def raw_headers(remote: RemoteFakeServer, store: str) -> dict[str, str]:
    """What a raw aiohttp loop sends with each request: the token, and Accept as C's raw loop."""
    return {"X-Service-Token": remote.tokens[store], "Accept": "application/json"}


async def raw_light_baseline(
    remote: RemoteFakeServer, store: str, requests: int, concurrency: int = 20
) -> CpuMeter:
    """Raw aiohttp sending the same light requests as ``hammer``, ``concurrency`` at a time, no
    limiter (``store`` must have rate limits off): CPU per request on both sides. Each answer is
    decoded with ``json.loads``, as C's raw loop does and any caller would: the subscription is
    what a request is for."""
    import json

    import aiohttp

    ids = subscription_ids(store, 500)
    headers = raw_headers(remote, store)
    base = f"{remote.api_url}subscriptions/"
    async with aiohttp.ClientSession() as session:

        async def worker(first: int, total: int) -> None:
            for n in range(first, total, concurrency):
                async with session.get(f"{base}{ids[n % len(ids)]}", headers=headers) as r:
                    body = await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"baseline request failed: HTTP {r.status}")
                if not json.loads(body)["success"]:
                    raise RuntimeError("baseline request failed: success false")

        # Warm-up: the connections, and one request per worker.
        await asyncio.gather(*(worker(k, concurrency) for k in range(concurrency)))
        with CpuMeter(remote.process.pid) as meter:
            await asyncio.gather(*(worker(k, requests) for k in range(concurrency)))
    return meter
