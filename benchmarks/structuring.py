"""D. Structuring: records per second from JSON bytes to ``Subscription`` models vs to dicts.

No network: 1,000 realistic subscription records from the fake server's data (~760 bytes each,
nested line items and address), as 10 pages of 100. Each figure is CPU time of this one thread
(``time.process_time``), median of several repeats, each page's result dropped before the next
as in a streaming pull (so the garbage collector runs as it would there).

- decode: ``orjson.loads`` of a page (what the client does; ``model=dict`` stops here);
- structure: ``structure_records(records, structurer_for(Subscription))`` on decoded pages,
  the target (>= 300,000 models/s);
- decode + structure: both, i.e. bytes to models;
- for comparison, a caller's own attrs class through cattrs (``list(model=MyClass)``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import orjson

from asyncsubs import Subscription
from asyncsubs._converter import structure_records, structurer_for
from asyncsubs.testing._data import StoreData

from ._common import Report, median

NAME = "structuring"
TITLE = "D. Structuring: JSON bytes -> Subscription models vs -> dicts (one core, no I/O)"
TARGET = 300_000
PAGES = 10
PAGE_SIZE = 100


@attrs.frozen
class CallerSubscription:
    """What a caller might pass as ``model=``: typed fields, structured by cattrs."""

    id: int
    customer_id: int
    status: str
    created_at: str
    updated_at: str
    price: str
    currency_code: str
    raw: dict[str, Any] = attrs.field(repr=False, eq=False)


def pages() -> list[bytes]:
    counts = {"subscriptions": PAGES * PAGE_SIZE, "customers": 0, "orders": 0}
    data = StoreData(seed=0, store="structuring", counts=counts)["subscriptions"]
    return [
        b"[" + b",".join(data.encoded_at(p * PAGE_SIZE + i) for i in range(PAGE_SIZE)) + b"]"
        for p in range(PAGES)
    ]


def rate(step: Callable[[int], int], seconds: float, repeats: int = 5) -> float:
    """Median over ``repeats`` of records per CPU second, each repeat running ~``seconds``."""
    results = []
    step(0)  # warm-up
    for _ in range(repeats):
        done = 0
        c0 = time.process_time()
        n = 0
        while True:
            done += step(n)
            n += 1
            if n % PAGES == 0 and time.process_time() - c0 >= seconds:
                break
        results.append(done / (time.process_time() - c0))
    return median(results)


def bench(report: Report) -> None:
    seconds = 0.15 if report.quick else 0.6
    raw_pages = pages()
    decoded = [orjson.loads(p) for p in raw_pages]
    models = structurer_for(Subscription)
    caller = structurer_for(CallerSubscription)

    def decode(n: int) -> int:
        return len(orjson.loads(raw_pages[n % PAGES]))

    def structure(n: int) -> int:
        out = structure_records(decoded[n % PAGES], models, method="GET", path="subscriptions")
        return len(out)

    def decode_structure(n: int) -> int:
        records = orjson.loads(raw_pages[n % PAGES])
        return len(structure_records(records, models, method="GET", path="subscriptions"))

    def caller_structure(n: int) -> int:
        out = structure_records(decoded[n % PAGES], caller, method="GET", path="subscriptions")
        return len(out)

    size = sum(len(p) for p in raw_pages) / (PAGES * PAGE_SIZE)
    report.say(f"  {PAGES} pages x {PAGE_SIZE} records, {size:.0f} bytes per record on average")
    decode_rate = rate(decode, seconds)
    structure_rate = rate(structure, seconds)
    both_rate = rate(decode_structure, seconds)
    caller_rate = rate(caller_structure, seconds)
    report.table(
        ["step", "records/s (one core)", "us/record", "x bytes->dicts"],
        [
            ["bytes -> dicts (orjson; model=dict)", decode_rate, 1e6 / decode_rate, 1.0],
            [
                "dicts -> Subscription (structuring alone)",
                structure_rate,
                1e6 / structure_rate,
                structure_rate / decode_rate,
            ],
            [
                "bytes -> Subscription (decode + structure)",
                both_rate,
                1e6 / both_rate,
                both_rate / decode_rate,
            ],
            [
                "dicts -> caller's attrs class (cattrs)",
                caller_rate,
                1e6 / caller_rate,
                caller_rate / decode_rate,
            ],
        ],
    )
    report.check(
        "Subscription models/s, structuring alone", structure_rate, ">=", TARGET, "{:,.0f}"
    )
