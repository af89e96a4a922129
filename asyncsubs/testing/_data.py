"""Deterministic fake records for the fake admin server.

Records are a pure function of ``(seed, store, counts)``: the same configuration serves the same
bytes in every run and every process, so tests can compare against ``server.records()`` and a
restarted server accepts old cursors.

Speed matters (benchmarks page through 100k records at thousands of pages per second), so a record
is never built as a dict on the serving path. Each resource has a small pool of *variants*
(line items, addresses, names, ...) generated once from a seeded RNG and serialised once; a record
is its per-record *head* (id, references, status, timestamps: all derived from a cheap integer
hash of its index) spliced in front of one variant's pre-serialised bytes. The served bytes are
the canonical form; dicts are decoded from them on demand, so callers always get independent
copies. A changed or added record is kept as a dict override and re-serialised.
"""

from __future__ import annotations

import bisect
import hashlib
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal

import orjson

__all__ = [
    "RESOURCES",
    "SUBSCRIPTION_STATUSES",
    "RecordSet",
    "Resource",
    "StoreData",
    "interval_seconds",
    "iso",
]

Resource = Literal["subscriptions", "customers", "orders"]
RESOURCES: Final[tuple[Resource, ...]] = ("subscriptions", "customers", "orders")
SUBSCRIPTION_STATUSES: Final = ("ACTIVE", "PAUSED", "CANCELLED")

_MASK64: Final = (1 << 64) - 1
_ID_BASE: Final[Mapping[str, int]] = {
    "subscriptions": 200_000_000,
    "customers": 500_000_000,
    "orders": 800_000_000,
}
_EPOCH0: Final = 1_672_531_200  # 2023-01-01T00:00:00Z; fixed so data never depends on today
_SPAN: Final = 3 * 365 * 86_400
_DAY: Final = 86_400
_MAX_VARIANTS: Final = 512


def _mix(x: int) -> int:
    """splitmix64 finaliser: a fast, well-spread integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _salt(*parts: object) -> int:
    digest = hashlib.blake2b("|".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


# Formatting timestamps is the hot spot of record generation; tables make it ~5x cheaper.
_HHMM: Final = tuple(f"T{h:02d}:{m:02d}:" for h in range(24) for m in range(60))
_SSZ: Final = tuple(f"{s:02d}Z" for s in range(60))
_DATES: dict[int, str] = {}


def iso(ts: float) -> str:
    """ISO-8601 UTC with a Z suffix, second precision (the service's timestamp format)."""
    days, seconds = divmod(int(ts), _DAY)
    date = _DATES.get(days)
    if date is None:
        date = _DATES[days] = time.strftime("%Y-%m-%d", time.gmtime(days * _DAY))
    return date + _HHMM[seconds // 60] + _SSZ[seconds % 60]


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


# Pools of realistic values; non-ASCII names and notes make sure encodings are exercised.
_FIRST = (
    ("Ada", "ada"), ("José", "jose"), ("Zoë", "zoe"), ("Łukasz", "lukasz"), ("Mia", "mia"),
    ("Noah", "noah"), ("Amara", "amara"), ("Søren", "soren"), ("Hiro", "hiro"), ("Priya", "priya"),
    ("Liam", "liam"), ("Chloé", "chloe"), ("Omar", "omar"), ("Ines", "ines"), ("Kai", "kai"),
)  # fmt: skip
_LAST = (
    ("Lovelace", "lovelace"), ("García", "garcia"), ("Müller", "muller"), ("Nowak", "nowak"),
    ("Smith", "smith"), ("O'Brien", "obrien"), ("Okafor", "okafor"), ("Tanaka", "tanaka"),
    ("Johansson", "johansson"), ("Patel", "patel"), ("Dubois", "dubois"), ("Rossi", "rossi"),
)  # fmt: skip
_SLUGS: Final[Mapping[str, str]] = dict(_FIRST + _LAST)
_CITIES = (
    ("Portland", "OR", "US", "97201"), ("Austin", "TX", "US", "73301"),
    ("Toronto", "ON", "CA", "M5H 2N2"), ("München", "BY", "DE", "80331"),
    ("Lyon", None, "FR", "69001"), ("Kraków", None, "PL", "30-001"),
    ("Brighton", None, "GB", "BN1 1AA"), ("Melbourne", "VIC", "AU", "3000"),
)  # fmt: skip
_STREETS = ("Main St", "Oak Avenue", "Hauptstraße", "Rue de la Paix", "High Street", "Elm Rd")
_PRODUCTS = (
    (7_001_001, "Single-origin Coffee 1kg", 2_450), (7_001_002, "Decaf Coffee 500g", 1_390),
    (7_001_003, "Green Tea Sampler", 1_800), (7_001_004, "Oat Milk (6 pack)", 1_199),
    (7_001_005, "Dog Food — Grain Free 12kg", 5_999), (7_001_006, "Razor Blades x8", 1_500),
    (7_001_007, "Vitamin D3 90 caps", 999), (7_001_008, "Protein Bars (box of 12)", 2_799),
)  # fmt: skip
_CURRENCIES = ("USD", "USD", "USD", "USD", "EUR", "EUR", "GBP", "CAD")
_INTERVALS = (("WEEK", 1), ("WEEK", 2), ("MONTH", 1), ("MONTH", 1), ("MONTH", 2), ("DAY", 30))
_UNIT_SECONDS: Final[Mapping[str, int]] = {"DAY": _DAY, "WEEK": 7 * _DAY, "MONTH": 30 * _DAY}
_NOTES = ("Leave at the back door", "Gift — no invoice please ☺", "Ring twice", "")
_TAGS = ("vip", "wholesale", "newsletter", "churn-risk", "b2b", "früh-kunde")
_ORDER_STATUSES = ("PAID",) * 16 + ("PENDING",) * 2 + ("FAILED",) + ("REFUNDED",)


def interval_seconds(interval: object) -> int:
    """Length of a subscription's billing interval (``{"unit", "frequency"}``), in seconds."""
    if not isinstance(interval, Mapping):
        return 30 * _DAY
    unit = _UNIT_SECONDS.get(str(interval.get("unit")), 30 * _DAY)
    frequency = interval.get("frequency")
    return unit * (frequency if isinstance(frequency, int) and frequency > 0 else 1)


# --- variants: the bulky, per-record-independent part of a record ------------------------------


def _address(rng: random.Random, first: str, last: str) -> dict[str, Any]:
    r = rng.random
    city, province, country, zip_code = _CITIES[int(r() * len(_CITIES))]
    return {
        "firstName": first,
        "lastName": last,
        "address1": f"{1 + int(r() * 998)} {_STREETS[int(r() * len(_STREETS))]}",
        "address2": f"Apt {1 + int(r() * 40)}" if r() < 0.3 else None,
        "city": city,
        "provinceCode": province,
        "countryCode": country,
        "zip": zip_code,
        "phone": f"+1555{int(r() * 10_000_000):07d}" if r() < 0.5 else None,
    }


def _line_items(rng: random.Random, currency: str) -> tuple[list[dict[str, Any]], int]:
    r = rng.random
    items = []
    total = 0
    for _ in range(1 + int(r() * r() * 4)):
        product_id, title, cents = _PRODUCTS[int(r() * len(_PRODUCTS))]
        quantity = 1 + int(r() * r() * 4)
        total += cents * quantity
        items.append(
            {
                "productId": product_id,
                "variantId": product_id * 100 + int(r() * 4),
                "title": title,
                "quantity": quantity,
                "price": {"amount": _money(cents), "currencyCode": currency},
            }
        )
    return items, total


def _subscription_variant(rng: random.Random, v: int) -> dict[str, Any]:
    r = rng.random
    currency = _CURRENCIES[int(r() * len(_CURRENCIES))]
    unit, frequency = _INTERVALS[int(r() * len(_INTERVALS))]
    items, total = _line_items(rng, currency)
    first, _ = _FIRST[int(r() * len(_FIRST))]
    last, _ = _LAST[int(r() * len(_LAST))]
    metafields = [{"namespace": "erp", "key": "account", "value": f"A-{v:05d}", "type": "string"}]
    return {
        "interval": {"unit": unit, "frequency": frequency},
        "lineItems": items,
        "shippingAddress": _address(rng, first, last) if r() < 0.9 else None,
        "price": _money(total),
        "currencyCode": currency,
        "billingAttemptCount": int(r() * 30),
        "discountCodes": ["WELCOME10"] if r() < 0.1 else [],
        "metafields": metafields if r() < 0.2 else [],
        "note": _NOTES[int(r() * len(_NOTES))] if r() < 0.25 else None,
    }


def _customer_variant(rng: random.Random, v: int) -> dict[str, Any]:
    r = rng.random
    first, _ = _FIRST[v % len(_FIRST)]
    last, _ = _LAST[(v // len(_FIRST)) % len(_LAST)]
    return {
        "firstName": first,
        "lastName": last,
        "acceptsMarketing": r() < 0.4,
        "tags": sorted({_TAGS[int(r() * len(_TAGS))] for _ in range(int(r() * 3))}),
        "phone": f"+4420{int(r() * 100_000_000):08d}" if r() < 0.3 else None,
        "address": _address(rng, first, last) if r() < 0.8 else None,
    }


def _order_variant(rng: random.Random, v: int) -> dict[str, Any]:
    currency = _CURRENCIES[int(rng.random() * len(_CURRENCIES))]
    items, total = _line_items(rng, currency)
    return {"totalPrice": _money(total), "currencyCode": currency, "lineItems": items}


_VARIANT_MAKERS: Final[Mapping[str, Callable[[random.Random, int], dict[str, Any]]]] = {
    "subscriptions": _subscription_variant,
    "customers": _customer_variant,
    "orders": _order_variant,
}


class _Variants:
    def __init__(self, resource: str, seed: int, store: str, count: int) -> None:
        rng = random.Random(f"{seed}|{store}|{resource}|variants")
        make = _VARIANT_MAKERS[resource]
        self.dicts = [make(rng, v) for v in range(max(1, min(count, _MAX_VARIANTS)))]
        # Everything after the opening brace, so a head's bytes can be spliced in front.
        self.tails = [b"," + orjson.dumps(d)[1:] for d in self.dicts]


# --- layout: hash-derived per-record structure --------------------------------------------------


class _Layout:
    """Ids, creation times, cross references and statuses of one store, from integer hashes."""

    def __init__(self, seed: int, store: str, counts: Mapping[str, int]) -> None:
        self.seed = seed
        self.store = store
        self.counts = dict(counts)
        self._salts = {
            purpose: _salt(seed, store, purpose)
            for purpose in (*RESOURCES, "sub-customer", "sub-status", "order-sub", "record")
        }
        # Keep ids 9-digit for up to ~1M records while leaving gaps, as real ids have.
        self._strides = {r: max(2, min(1000, 100_000_000 // max(n, 1))) for r, n in counts.items()}
        self._steps = {r: max(1, min(3_600, _SPAN // max(n, 1))) for r, n in counts.items()}
        self._variants: dict[str, _Variants] = {}
        self._active: list[int] | None = None

    def ids(self, resource: str) -> list[int]:
        base, stride, salt = _ID_BASE[resource], self._strides[resource], self._salts[resource]
        return [base + i * stride + _mix(salt + i) % stride for i in range(self.counts[resource])]

    def id_of(self, resource: str, index: int) -> int:
        stride = self._strides[resource]
        return _ID_BASE[resource] + index * stride + _mix(self._salts[resource] + index) % stride

    def variants(self, resource: str) -> _Variants:
        variants = self._variants.get(resource)
        if variants is None:
            count = self.counts[resource]
            variants = self._variants[resource] = _Variants(resource, self.seed, self.store, count)
        return variants

    def record_hash(self, resource: str, index: int) -> int:
        return _mix(self._salts["record"] ^ self._salts[resource] ^ index)

    def created(self, resource: str, index: int, h: int) -> int:
        step = self._steps[resource]
        return _EPOCH0 + index * step + (h >> 40) % step

    def sub_customer_index(self, index: int) -> int:
        customers = self.counts["customers"]
        value = _mix(self._salts["sub-customer"] + index)
        return value % customers if customers else index

    def sub_status(self, index: int) -> str:
        roll = _mix(self._salts["sub-status"] + index) % 100
        return "ACTIVE" if roll < 70 else "PAUSED" if roll < 85 else "CANCELLED"

    def order_sub_index(self, index: int) -> int:
        subs = self.counts["subscriptions"]
        value = _mix(self._salts["order-sub"] + index)
        return value % subs if subs else index

    def active_counts(self) -> list[int]:
        """Initial ACTIVE subscriptions per customer index (computed once, O(subscriptions))."""
        if self._active is None:
            counts = [0] * self.counts["customers"]
            if counts:
                for i in range(self.counts["subscriptions"]):
                    if self.sub_status(i) == "ACTIVE":
                        counts[self.sub_customer_index(i)] += 1
            self._active = counts
        return self._active

    # Heads: the per-record fields, in the order they appear on the wire.

    def subscription_head(self, i: int, h: int, variant: Mapping[str, Any]) -> dict[str, Any]:
        created = self.created("subscriptions", i, h)
        updated = created + (h >> 8) % (120 * _DAY)
        status = self.sub_status(i)
        return {
            "id": self.id_of("subscriptions", i),
            "customerId": self.id_of("customers", self.sub_customer_index(i)),
            "status": status,
            "createdAt": iso(created),
            "updatedAt": iso(updated),
            "nextChargeDate": (
                iso(updated + interval_seconds(variant["interval"])) if status == "ACTIVE" else None
            ),
            "cancelledAt": iso(updated) if status == "CANCELLED" else None,
        }

    def customer_head(self, i: int, h: int, variant: Mapping[str, Any]) -> dict[str, Any]:
        created = self.created("customers", i, h)
        first = _SLUGS.get(variant["firstName"], "customer")
        last = _SLUGS.get(variant["lastName"], "x")
        return {
            "id": self.id_of("customers", i),
            "email": f"{first}.{last}{i}@example.com",
            "createdAt": iso(created),
            "updatedAt": iso(created + (h >> 8) % (200 * _DAY)),
            "activeSubscriptionCount": self.active_counts()[i],
        }

    def order_head(self, i: int, h: int, variant: Mapping[str, Any]) -> dict[str, Any]:
        created = self.created("orders", i, h)
        sub_index = self.order_sub_index(i)
        status = _ORDER_STATUSES[(h >> 20) % len(_ORDER_STATUSES)]
        processed = created + (h >> 8) % 3_600 if status in ("PAID", "REFUNDED") else None
        return {
            "id": self.id_of("orders", i),
            "subscriptionId": self.id_of("subscriptions", sub_index),
            "customerId": self.id_of("customers", self.sub_customer_index(sub_index)),
            "status": status,
            "createdAt": iso(created),
            "processedAt": None if processed is None else iso(processed),
            # Every resource has updatedAt, so one incremental filter serves all list endpoints.
            "updatedAt": iso(created if processed is None else processed),
        }


_HeadMaker = Callable[[_Layout, int, int, Mapping[str, Any]], dict[str, Any]]
_HEADS: Final[Mapping[str, _HeadMaker]] = {
    "subscriptions": _Layout.subscription_head,
    "customers": _Layout.customer_head,
    "orders": _Layout.order_head,
}


class RecordSet:
    """One resource of one store: records in server order (ascending id), generated lazily.

    Positions ``0 .. generated-1`` are the generated records (position == generation index);
    records added later are appended with larger ids, so the order stays sorted by id.
    """

    def __init__(self, resource: str, layout: _Layout) -> None:
        self.resource = resource
        self._layout = layout
        self._head = _HEADS[resource]
        self._generated = layout.counts[resource]
        self.ids: list[int] = layout.ids(resource)
        self._encoded: list[bytes | None] = [None] * self._generated
        # Changed or added records, by position; their bytes are re-serialised from these.
        self._overrides: dict[int, dict[str, Any]] = {}
        # Deleted positions: tombstones keep positions (and so cursors) stable.
        self._deleted: set[int] = set()
        # Live positions in change order, per field, until the next change (see ``by_change``).
        self._by_change: dict[str, tuple[list[tuple[float, int]], list[int]]] = {}

    def __len__(self) -> int:
        """Positions, deleted ones included (see ``is_deleted`` and ``live_count``)."""
        return len(self.ids)

    @property
    def live_count(self) -> int:
        return len(self.ids) - len(self._deleted)

    @property
    def has_deletions(self) -> bool:
        return bool(self._deleted)

    def is_deleted(self, position: int) -> bool:
        return position in self._deleted

    def _generate(self, position: int) -> bytes:
        layout = self._layout
        h = layout.record_hash(self.resource, position)
        variants = layout.variants(self.resource)
        v = h % len(variants.dicts)
        head = orjson.dumps(self._head(layout, position, h, variants.dicts[v]))
        return head[:-1] + variants.tails[v]

    def encoded_at(self, position: int) -> bytes:
        """The record's JSON bytes exactly as served."""
        encoded = self._encoded[position]
        if encoded is None:
            override = self._overrides.get(position)
            encoded = orjson.dumps(override) if override is not None else self._generate(position)
            self._encoded[position] = encoded
        return encoded

    def record_at(self, position: int) -> dict[str, Any]:
        """A fresh copy of the record at ``position`` (mutating it does not affect the server)."""
        record: dict[str, Any] = orjson.loads(self.encoded_at(position))
        return record

    def field_at(self, position: int, field: str) -> Any:
        """One top-level field, cheaply where the layout knows it (used by list filters)."""
        override = self._overrides.get(position)
        if override is not None:
            return override.get(field)
        if self.resource == "subscriptions" and field == "status":
            return self._layout.sub_status(position)
        return self.record_at(position).get(field)

    def by_change(
        self, field: str, key: Callable[[Any], float]
    ) -> tuple[list[tuple[float, int]], list[int]]:
        """Live records in change order: their ``(key(field), id)`` ascending, and their
        positions. Kept until a record is added, replaced or deleted."""
        cached = self._by_change.get(field)
        if cached is None:
            order = sorted(
                ((key(self.field_at(p, field)), self.ids[p]), p)
                for p in range(len(self.ids))
                if p not in self._deleted
            )
            cached = [k for k, _ in order], [p for _, p in order]
            self._by_change[field] = cached
        return cached

    def position_after(self, last_id: int) -> int:
        """Position of the first record with an id greater than ``last_id``."""
        return bisect.bisect_right(self.ids, last_id)

    def position_of(self, record_id: int) -> int | None:
        position = bisect.bisect_left(self.ids, record_id)
        if position < len(self.ids) and self.ids[position] == record_id:
            return position
        return None

    def live_position_of(self, record_id: int) -> int | None:
        position = self.position_of(record_id)
        return None if position is None or position in self._deleted else position

    def get(self, record_id: int) -> dict[str, Any] | None:
        position = self.live_position_of(record_id)
        return None if position is None else self.record_at(position)

    def get_encoded(self, record_id: int) -> bytes | None:
        position = self.live_position_of(record_id)
        return None if position is None else self.encoded_at(position)

    def replace(self, record_id: int, record: Mapping[str, Any]) -> dict[str, Any]:
        """Replace a record's content (its ``id`` is kept); returns the stored copy."""
        position = self.live_position_of(record_id)
        if position is None:
            raise KeyError(f"no {self.resource} record with id {record_id}")
        stored = {**record, "id": record_id}
        self._overrides[position] = stored
        self._encoded[position] = None
        self._by_change.clear()
        return stored

    def append(self, record: Mapping[str, Any]) -> dict[str, Any]:
        """Add a record after all others; assigns an ``id`` above the current maximum if absent."""
        stored = dict(record)
        last = self.ids[-1] if self.ids else _ID_BASE[self.resource]
        stored.setdefault("id", last + 1 + _mix(last) % 97)
        record_id = stored["id"]
        if isinstance(record_id, bool) or not isinstance(record_id, int) or record_id <= last:
            raise ValueError(f"a new {self.resource} id must be an int above {last}")
        self.ids.append(record_id)
        self._overrides[len(self._encoded)] = stored
        self._encoded.append(None)
        self._by_change.clear()
        return stored

    def delete(self, record_id: int) -> dict[str, Any]:
        """Delete a record (KeyError if absent); returns its last state. Its id is not reused."""
        position = self.live_position_of(record_id)
        if position is None:
            raise KeyError(f"no {self.resource} record with id {record_id}")
        last = self.record_at(position)
        self._deleted.add(position)
        self._by_change.clear()
        return last


class StoreData:
    """The records of one fake store, by resource."""

    def __init__(self, *, seed: int, store: str, counts: Mapping[str, int]) -> None:
        missing = set(RESOURCES) - set(counts)
        if missing:
            raise ValueError(f"record counts missing for {sorted(missing)}")
        self.layout = _Layout(seed, store, counts)
        self.resources: dict[str, RecordSet] = {r: RecordSet(r, self.layout) for r in RESOURCES}

    def __getitem__(self, resource: str) -> RecordSet:
        return self.resources[resource]
