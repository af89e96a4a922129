"""One fake store: its token, records, rate-limit state and counters.

``FakeStore`` is deliberately a plain object the HTTP layer talks to, so later features (records
changing over time, webhooks) can hook in through ``add_record``/``update_record`` and the
``listeners`` called on every change.
"""

from __future__ import annotations

import bisect
import calendar
import gc
import hashlib
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final, Literal

import attrs
import orjson

from .._frozen import FrozenMap
from ._cursor import Position
from ._data import RESOURCES, StoreData, interval_seconds, iso
from ._limits import ServerRateLimits, StoreCounters, StoreStats, StoreWindows

__all__ = [
    "DEFAULT_RECORDS",
    "ChangeEvent",
    "OverMax",
    "ChangeKind",
    "ChangedSince",
    "FakeStore",
    "FakeStoreConfig",
    "ListOrder",
    "change_key",
    "parse_timestamp",
    "SubscriptionAction",
    "TransitionError",
]

#: Records per resource when neither the store nor the server says otherwise (not a multiple of
#: the default page size, so the last page is a short one).
DEFAULT_RECORDS: Final = 120

SubscriptionAction = Literal["pause", "resume", "cancel"]
#: What a pageSize above a store's largest page gets: a page of the largest, or a 400.
OverMax = Literal["clamp", "reject"]
#: The order lists are served in: by id, or by the change field (``updatedAt``), then id.
ListOrder = Literal["id", "changed"]
_TARGET: Final[Mapping[str, str]] = {"pause": "PAUSED", "resume": "ACTIVE", "cancel": "CANCELLED"}


def _counts(value: int | Mapping[str, int] | None) -> Mapping[str, int] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = dict.fromkeys(RESOURCES, value)
    if not isinstance(value, Mapping):
        raise TypeError("records must be an int or a mapping of resource -> int")
    unknown = set(value) - set(RESOURCES)
    if unknown:
        raise ValueError(f"unknown resources in records: {sorted(unknown)}; know {RESOURCES}")
    for resource, count in value.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"records[{resource!r}] must be an int >= 0, got {count!r}")
    return FrozenMap(value)


def _prefixes(value: str | Collection[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        value = (value,)
    return tuple(p.strip("/") for p in value)


@attrs.frozen
class FakeStoreConfig:
    """A store served by ``FakeAdminServer``.

    - ``token``: its ``X-Service-Token``; derived from the server seed and the name if None.
    - ``records``: records per resource, one int for all or ``{"orders": 0, ...}``; resources
      not named (or None) get the server's ``records`` default.
    - ``forbidden_paths``: path prefixes (relative to ``/admin/{version}/``) answered with 403.
    - ``rate_limits``: this store's limits; None means the server's ``rate_limits``.
    - ``max_page_size``/``over_max``: this store's largest page and what a larger pageSize
      gets (``"clamp"`` or ``"reject"``); None means the server's.
    """

    name: str
    token: str | None = attrs.field(default=None, kw_only=True, repr=False)
    records: Mapping[str, int] | None = attrs.field(default=None, converter=_counts, kw_only=True)
    forbidden_paths: tuple[str, ...] = attrs.field(default=(), converter=_prefixes, kw_only=True)
    rate_limits: ServerRateLimits | None = attrs.field(default=None, kw_only=True)
    max_page_size: int | None = attrs.field(default=None, kw_only=True)
    over_max: OverMax | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("store name must be a non-empty string")
        size = self.max_page_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"max_page_size must be an int >= 1 or None, got {size!r}")
        if self.over_max not in (None, "clamp", "reject"):
            raise ValueError(f"over_max must be 'clamp', 'reject' or None, got {self.over_max!r}")


def derive_token(seed: int, name: str) -> str:
    """A stable token per (seed, store), so restarted fake servers accept the same tokens."""
    digest = hashlib.blake2b(f"{seed}|{name}|token".encode(), digest_size=16).hexdigest()
    return f"fake_{digest}"


ChangeKind = Literal["created", "updated", "deleted"]


@attrs.frozen
class ChangeEvent:
    """A record of ``store`` was ``created``, ``updated`` or ``deleted``; ``record`` is a copy of
    it (for ``deleted``, its last state)."""

    store: str
    resource: str
    kind: ChangeKind
    record: Mapping[str, Any]


def parse_timestamp(value: object) -> float | None:
    """Seconds since the epoch of an ISO-8601 timestamp (``Z`` or an offset; naive means UTC),
    or None when ``value`` is not one."""
    if not isinstance(value, str) or not 10 <= len(value) <= 64:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return calendar.timegm(parsed.timetuple()) + parsed.microsecond / 1e6
    return parsed.timestamp()


def change_key(value: object) -> float:
    """A record's place in change order: its change field as seconds since the epoch (a
    number as it is; missing or unparseable as the epoch)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    stamp = parse_timestamp(value)
    return 0.0 if stamp is None else stamp


def _is_canonical(value: str) -> bool:
    # The fake's own stamps ("2026-01-02T03:04:05Z") order correctly as strings.
    return len(value) == 20 and value[10] == "T" and value[-1] == "Z"


class ChangedSince:
    """The incremental filter: a record matches when its change field is at or after ``since``.

    A record whose field is missing or unparseable always matches: sending too much is harmless
    to an incremental pull, leaving a change out is not.
    """

    def __init__(self, since: float) -> None:
        self.since = since
        # Whole seconds: a fractional `since` rounds down, so the same second still matches.
        self.key = iso(since)

    def __call__(self, value: object) -> bool:
        if isinstance(value, str) and _is_canonical(value):
            return value >= self.key
        stamp = parse_timestamp(value)
        return stamp is None or stamp >= int(self.since)


class TransitionError(ValueError):
    """A subscription action is not allowed from the record's current status."""


def _decode_all(parts: list[bytes]) -> list[dict[str, Any]]:
    # Building many nested dicts triggers the cyclic GC over and over (5x slower for 100k);
    # decoding one joined array is slower still than record by record.
    paused = gc.isenabled()
    gc.disable()
    try:
        return [orjson.loads(part) for part in parts]
    finally:
        if paused:
            gc.enable()


class FakeStore:
    """Mutable state of one fake store (see ``FakeStoreConfig`` for what is configurable)."""

    def __init__(
        self,
        config: FakeStoreConfig,
        *,
        seed: int,
        default_records: Mapping[str, int],
        rate_limits: ServerRateLimits,
        keep_starts: int = 10_000,
    ) -> None:
        self.config = config
        self.name = config.name
        self.token = config.token or derive_token(seed, config.name)
        counts = {**default_records, **(config.records or {})}
        self.data = StoreData(seed=seed, store=config.name, counts=counts)
        self.counters = StoreCounters(keep_starts=keep_starts)
        self.windows = StoreWindows(rate_limits)
        self.counters.ensure_pools(rate_limits.pools)
        #: Called with a ``ChangeEvent`` after every change (hook for webhooks and the like).
        self.listeners: list[Callable[[ChangeEvent], None]] = []

    def __repr__(self) -> str:
        sizes = ", ".join(f"{r}={self.data[r].live_count}" for r in RESOURCES)
        return f"<FakeStore {self.name!r} {sizes}>"

    # --- configuration ------------------------------------------------------------------------

    @property
    def rate_limits(self) -> ServerRateLimits:
        return self.windows.limits

    def set_rate_limits(self, limits: ServerRateLimits) -> None:
        """Replace the limits; windows restart empty, counters are kept."""
        self.windows = StoreWindows(limits)
        self.counters.ensure_pools(limits.pools)

    def is_forbidden(self, path: str) -> bool:
        prefixes = self.config.forbidden_paths
        return any(not p or path == p or path.startswith(p + "/") for p in prefixes)

    # --- reading ------------------------------------------------------------------------------

    def records(self, resource: str, *, status: str | None = None) -> list[dict[str, Any]]:
        """Copies of all (not deleted) records of ``resource`` in server order (optionally one
        status)."""
        records = self.data[resource]
        positions: Iterable[int] = range(len(records))
        if records.has_deletions:
            positions = [p for p in positions if not records.is_deleted(p)]
        if status is not None:
            positions = [p for p in positions if records.field_at(p, "status") == status]
        return _decode_all([records.encoded_at(p) for p in positions])

    def get(self, resource: str, record_id: int) -> dict[str, Any] | None:
        return self.data[resource].get(record_id)

    def page(
        self,
        resource: str,
        *,
        after: Position | None,
        size: int,
        statuses: Collection[str] | None = None,
        changed_since: Callable[[object], bool] | None = None,
        change_field: str = "updatedAt",
        order: ListOrder = "id",
    ) -> tuple[list[bytes], Position | None, bool]:
        """(encoded records, the position of the last of them, whether more match after them).

        ``order="id"``: records in id order whatever the filters, so a cursor (the last id
        returned) stays valid. ``order="changed"``: in order of ``change_field`` (as a
        timestamp), then id, as a server that lists by modification time does: a record changed
        during a pull moves to the end and is served again. ``changed_since`` (e.g.
        ``ChangedSince``) is called with each record's ``change_field`` value and keeps the
        records it returns True for.
        """
        records = self.data[resource]
        # The list in its order: each entry's position among the records, and its cursor.
        positions: Sequence[int]
        cursors: Sequence[Position]
        if order == "changed":
            cursors, positions = records.by_change(change_field, change_key)
            start = 0 if after is None else bisect.bisect_right(cursors, after)
        else:
            cursors, positions = records.ids, range(len(records))
            start = 0 if after is None else records.position_after(after)  # type: ignore[arg-type]
        total = len(positions)
        if statuses is None and changed_since is None and not records.has_deletions:
            end = min(start + size, total)
            parts = [records.encoded_at(positions[i]) for i in range(start, end)]
            return parts, (cursors[end - 1] if end > start else None), end < total

        def matches(position: int) -> bool:
            if records.is_deleted(position):
                return False
            if statuses is not None and records.field_at(position, "status") not in statuses:
                return False
            return changed_since is None or changed_since(records.field_at(position, change_field))

        parts = []
        last = None
        index = start
        while index < total and len(parts) < size:
            if matches(positions[index]):
                parts.append(records.encoded_at(positions[index]))
                last = cursors[index]
            index += 1
        has_next = any(matches(positions[i]) for i in range(index, total))
        return parts, last, has_next

    # --- changing -----------------------------------------------------------------------------

    def _emit(self, resource: str, kind: ChangeKind, record: dict[str, Any]) -> None:
        for listener in list(self.listeners):
            listener(ChangeEvent(self.name, resource, kind, dict(record)))

    def add_record(self, resource: str, record: Mapping[str, Any]) -> dict[str, Any]:
        """Append a record (``id`` above all others is assigned when missing); returns a copy."""
        stored = self.data[resource].append(record)
        self._emit(resource, "created", stored)
        return dict(stored)

    def update_record(
        self, resource: str, record_id: int, changes: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge top-level ``changes`` into a record (KeyError if absent); returns a copy."""
        records = self.data[resource]
        current = records.get(record_id)
        if current is None:
            raise KeyError(f"no {resource} record with id {record_id}")
        stored = records.replace(record_id, {**current, **changes})
        self._emit(resource, "updated", stored)
        return dict(stored)

    def delete_record(self, resource: str, record_id: int) -> dict[str, Any]:
        """Delete a record (KeyError if absent); returns its last state. Later reads, lists and
        actions no longer see it, and its id is never reused."""
        last = self.data[resource].delete(record_id)
        self._emit(resource, "deleted", last)
        return last

    def apply_action(
        self,
        subscription_id: int,
        action: SubscriptionAction,
        body: Mapping[str, Any] | None = None,
        *,
        now: float | None = None,
    ) -> dict[str, Any] | None:
        """Pause, resume or cancel a subscription; None if absent, TransitionError if not allowed.

        Repeating the action a record is already in is a no-op (idempotent, as retries need);
        nothing leaves CANCELLED.
        """
        record = self.data["subscriptions"].get(subscription_id)
        if record is None:
            return None
        old, new = record.get("status"), _TARGET[action]
        if old == new:
            return record
        if old == "CANCELLED":
            raise TransitionError(f"cannot {action} a cancelled subscription")
        stamp = iso(time.time() if now is None else now)
        changes: dict[str, Any] = {"status": new, "updatedAt": stamp}
        if new == "ACTIVE":
            base = time.time() if now is None else now
            changes["nextChargeDate"] = iso(base + interval_seconds(record.get("interval")))
        else:
            changes["nextChargeDate"] = None
        if new == "CANCELLED":
            changes["cancelledAt"] = stamp
            reason = (body or {}).get("reason")
            if isinstance(reason, str):
                changes["cancellationReason"] = reason
        updated = self.update_record("subscriptions", subscription_id, changes)
        if "ACTIVE" in (old, new):
            delta = 1 if new == "ACTIVE" else -1
            self.adjust_active_count(record.get("customerId"), delta, stamp=stamp)
        return updated

    def adjust_active_count(self, customer_id: object, delta: int, *, stamp: str) -> None:
        """Keep a customer's activeSubscriptionCount true after a subscription changes state.

        ``updatedAt`` moves too, so incremental pulls see the change."""
        if not isinstance(customer_id, int):
            return
        customer = self.data["customers"].get(customer_id)
        count = None if customer is None else customer.get("activeSubscriptionCount")
        if isinstance(count, int):
            changes = {"activeSubscriptionCount": max(0, count + delta), "updatedAt": stamp}
            self.update_record("customers", customer_id, changes)

    # --- counters -----------------------------------------------------------------------------

    def stats(self) -> StoreStats:
        return self.counters.snapshot()

    def reset_stats(self) -> None:
        self.counters.reset()
        self.counters.ensure_pools(self.windows.limits.pools)
