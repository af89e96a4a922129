"""Records changing over time: a seeded ``Mutator`` applying random, realistic changes to a store.

Every change goes through ``FakeStore.add_record``/``update_record``/``apply_action``/
``delete_record``, so it moves ``updatedAt`` (incremental pulls see it) and reaches the store's
listeners as a ``ChangeEvent`` (webhook senders see it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from .._frozen import FrozenMap
from ._data import interval_seconds, iso
from ._store import FakeStore, SubscriptionAction, change_key

__all__ = ["DEFAULT_MUTATION_WEIGHTS", "MUTATION_KINDS", "Mutation", "Mutator", "Reviser"]

_DAY: Final = 86_400
MUTATION_KINDS: Final = (
    "subscription_action",
    "subscription_reschedule",
    "subscription_create",
    "subscription_delete",
    "order_create",
    "order_update",
    "customer_create",
    "customer_update",
)
#: Relative frequency of each kind. Deletes are off by default: an incremental pull cannot see
#: a record that is gone, so a delete whose webhook is lost is only caught by a full pull.
DEFAULT_MUTATION_WEIGHTS: Mapping[str, float] = FrozenMap(
    {
        "subscription_action": 4.0,
        "subscription_reschedule": 2.0,
        "subscription_create": 1.0,
        "subscription_delete": 0.0,
        "order_create": 3.0,
        "order_update": 1.0,
        "customer_create": 1.0,
        "customer_update": 2.0,
    }
)
# Order statuses and where a change moves them.
_ORDER_NEXT: Final[Mapping[str, str]] = {"PENDING": "PAID", "FAILED": "PAID", "PAID": "REFUNDED"}


def _weights(value: Mapping[str, float] | None) -> Mapping[str, float]:
    if value is None:
        return DEFAULT_MUTATION_WEIGHTS
    unknown = set(value) - set(MUTATION_KINDS)
    if unknown:
        raise ValueError(f"unknown mutation kinds {sorted(unknown)}; know {MUTATION_KINDS}")
    merged = {**DEFAULT_MUTATION_WEIGHTS, **value}
    for kind, weight in merged.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
            raise ValueError(f"weight of {kind} must be a number >= 0, got {weight!r}")
    if not any(merged.values()):
        raise ValueError("at least one mutation kind needs a positive weight")
    return FrozenMap({k: float(v) for k, v in merged.items()})


@attrs.frozen
class Mutation:
    """One change a ``Mutator`` made: its kind, and the record it created/changed/deleted."""

    kind: str
    resource: str
    record_id: int


def _check_run(steps: int | None, interval: float) -> None:
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
        raise ValueError(f"steps must be an int >= 0 or None, got {steps!r}")
    number = isinstance(interval, int | float) and not isinstance(interval, bool)
    if not (number and interval >= 0 and math.isfinite(interval)):
        raise ValueError(f"interval must be a number of seconds >= 0, got {interval!r}")


class Mutator:
    """Applies seeded random changes to one ``FakeStore``.

    ::

        mutator = Mutator(server.store("acme"), seed=1)
        await mutator.run(steps=200)               # as fast as possible, yielding between steps
        mutator.start(interval=0.5)                # or in the background until stop()

    - ``weights``: relative frequency per kind (``MUTATION_KINDS``), merged over
      ``DEFAULT_MUTATION_WEIGHTS``; e.g. ``{"subscription_delete": 1}`` turns deletes on.
    - ``clock``: epoch seconds for ``updatedAt``/``createdAt`` stamps (default ``time.time``).

    The same seed, weights and starting data give the same changes in the same order.
    """

    def __init__(
        self,
        store: FakeStore,
        *,
        seed: int = 0,
        weights: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.time,
        history_size: int = 10_000,
    ) -> None:
        self.store = store
        self.weights = _weights(weights)
        self._rng = random.Random(f"{seed}|{store.name}|mutations")
        self._clock = clock
        self._kinds = [k for k in MUTATION_KINDS if self.weights[k] > 0]
        self._kind_weights = [self.weights[k] for k in self._kinds]
        #: Mutations made, per kind.
        self.counts: collections.Counter[str] = collections.Counter()
        #: The most recent mutations, oldest first.
        self.history: collections.deque[Mutation] = collections.deque(maxlen=history_size)
        self._task: asyncio.Task[int] | None = None
        self._created = 0

    def __repr__(self) -> str:
        return f"<Mutator {self.store.name!r} steps={self.counts.total()}>"

    # --- driving ------------------------------------------------------------------------------

    def step(self) -> Mutation:
        """Make one random change now."""
        for _ in range(20):
            kind = self._rng.choices(self._kinds, weights=self._kind_weights)[0]
            make: Callable[[], Mutation | None] = getattr(self, f"_{kind}")
            mutation = make()
            if mutation is not None:
                break
        else:
            # Nothing else applies (say, every subscription cancelled): a new customer always does.
            mutation = self._customer_create()
        self.counts[mutation.kind] += 1
        self.history.append(mutation)
        return mutation

    async def run(self, steps: int | None = None, *, interval: float = 0.0) -> int:
        """Make ``steps`` changes (None: until cancelled or ``stop()``), sleeping ``interval``
        seconds after each (0: just yield, so webhook deliveries interleave); returns the count."""
        _check_run(steps, interval)
        done = 0
        while steps is None or done < steps:
            self.step()
            done += 1
            await asyncio.sleep(interval)
        return done

    def start(self, steps: int | None = None, *, interval: float = 1.0) -> asyncio.Task[int]:
        """``run`` in a background task (one at a time); ``stop()`` ends it."""
        if self._task is not None and not self._task.done():
            raise RuntimeError("this mutator is already running")
        _check_run(steps, interval)  # here, not in a task that would say it at the server's close
        self._task = asyncio.create_task(self.run(steps, interval=interval))
        return self._task

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Stop a background ``start()``; safe when not running."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- picking records ----------------------------------------------------------------------

    def _now(self) -> float:
        return self._clock()

    def _pick(self, resource: str, accept: Callable[[dict[str, Any]], bool] | None = None) -> Any:
        records = self.store.data[resource]
        if not len(records):
            return None
        for _ in range(20):
            position = self._rng.randrange(len(records))
            if records.is_deleted(position):
                continue
            record = records.record_at(position)
            if accept is None or accept(record):
                return record
        return None

    # --- the kinds ----------------------------------------------------------------------------

    def _subscription_action(self) -> Mutation | None:
        sub = self._pick("subscriptions", lambda r: r.get("status") in ("ACTIVE", "PAUSED"))
        if sub is None:
            return None
        action: SubscriptionAction
        if sub["status"] == "ACTIVE":
            action = "pause" if self._rng.random() < 0.8 else "cancel"
        else:
            action = "resume" if self._rng.random() < 0.8 else "cancel"
        self.store.apply_action(
            sub["id"], action, {"reason": "changed by the fake"}, now=self._now()
        )
        return Mutation("subscription_action", "subscriptions", sub["id"])

    def _subscription_reschedule(self) -> Mutation | None:
        sub = self._pick("subscriptions", lambda r: r.get("status") == "ACTIVE")
        if sub is None:
            return None
        now = self._now()
        changes = {
            "nextChargeDate": iso(now + self._rng.randint(1, 60) * _DAY),
            "updatedAt": iso(now),
        }
        self.store.update_record("subscriptions", sub["id"], changes)
        return Mutation("subscription_reschedule", "subscriptions", sub["id"])

    def _subscription_create(self) -> Mutation | None:
        customer = self._pick("customers")
        if customer is None:
            return None
        template = self._pick("subscriptions") or {
            "interval": {"unit": "MONTH", "frequency": 1},
            "lineItems": [],
        }
        now = self._now()
        stamp = iso(now)
        record = {
            key: value for key, value in template.items() if key not in ("id", "cancellationReason")
        }
        record.update(
            customerId=customer["id"],
            status="ACTIVE",
            createdAt=stamp,
            updatedAt=stamp,
            nextChargeDate=iso(now + interval_seconds(record.get("interval"))),
            cancelledAt=None,
        )
        stored = self.store.add_record("subscriptions", record)
        self.store.adjust_active_count(customer["id"], 1, stamp=stamp)
        return Mutation("subscription_create", "subscriptions", stored["id"])

    def _subscription_delete(self) -> Mutation | None:
        sub = self._pick("subscriptions")
        if sub is None:
            return None
        self.store.delete_record("subscriptions", sub["id"])
        if sub.get("status") == "ACTIVE":
            self.store.adjust_active_count(sub.get("customerId"), -1, stamp=iso(self._now()))
        return Mutation("subscription_delete", "subscriptions", sub["id"])

    def _order_create(self) -> Mutation | None:
        sub = self._pick("subscriptions", lambda r: r.get("status") == "ACTIVE")
        if sub is None:
            return None
        stamp = iso(self._now())
        status = "PAID" if self._rng.random() < 0.9 else "PENDING"
        record = {
            "subscriptionId": sub["id"],
            "customerId": sub.get("customerId"),
            "status": status,
            "createdAt": stamp,
            "processedAt": stamp if status == "PAID" else None,
            "updatedAt": stamp,
            "totalPrice": sub.get("price"),
            "currencyCode": sub.get("currencyCode"),
            "lineItems": sub.get("lineItems", []),
        }
        stored = self.store.add_record("orders", record)
        return Mutation("order_create", "orders", stored["id"])

    def _order_update(self) -> Mutation | None:
        order = self._pick("orders", lambda r: r.get("status") in _ORDER_NEXT)
        if order is None:
            return None
        stamp = iso(self._now())
        new = _ORDER_NEXT[order["status"]]
        changes: dict[str, Any] = {"status": new, "updatedAt": stamp}
        if new == "PAID":
            changes["processedAt"] = stamp
        self.store.update_record("orders", order["id"], changes)
        return Mutation("order_update", "orders", order["id"])

    def _customer_create(self) -> Mutation:
        self._created += 1
        stamp = iso(self._now())
        number = self._rng.randrange(1_000_000)
        record = {
            "email": f"new.customer{number}.{self._created}@example.com",
            "createdAt": stamp,
            "updatedAt": stamp,
            "activeSubscriptionCount": 0,
            "firstName": "New",
            "lastName": f"Customer {self._created}",
            "acceptsMarketing": self._rng.random() < 0.5,
            "tags": [],
            "phone": None,
            "address": None,
        }
        stored = self.store.add_record("customers", record)
        return Mutation("customer_create", "customers", stored["id"])

    def _customer_update(self) -> Mutation | None:
        customer = self._pick("customers")
        if customer is None:
            return None
        changes = {
            "acceptsMarketing": not customer.get("acceptsMarketing", False),
            "updatedAt": iso(self._now()),
        }
        self.store.update_record("customers", customer["id"], changes)
        return Mutation("customer_update", "customers", customer["id"])


class Reviser:
    """A ``FakeAdminServer(before_page=...)`` hook that changes records while a pull reads them.

    Before each list page it gives the ``per_page`` records that come first in change order (in
    a list served by change, ``list_order="changed"``, those served longest ago) a new revision:
    ``revision`` counts up, ``revisions`` lists them (``[{"revision": 1}, ...]``, a nested
    array, so a loader's child rows change with it) and ``field`` (the server's
    ``incremental_field``, ``updatedAt``) moves one second past every stamp before, so the
    change is never a tie and the record is served again later in the same pull, its old
    version first, as a real server that lists by modification time does. ``revised`` counts the
    changes per ``(store, resource, id)``; ``enabled = False`` stops them.
    """

    def __init__(
        self, *, per_page: int = 2, field: str = "updatedAt", start: float | None = None
    ) -> None:
        if isinstance(per_page, bool) or not isinstance(per_page, int) or per_page < 1:
            raise ValueError(f"per_page must be an int >= 1, got {per_page!r}")
        self.per_page = per_page
        self.field = field
        self.enabled = True
        self.revised: collections.Counter[tuple[str, str, int]] = collections.Counter()
        self._stamp = int(time.time() if start is None else start)

    def __repr__(self) -> str:
        return f"<Reviser per_page={self.per_page} changes={self.revised.total()}>"

    def __call__(self, store: FakeStore, resource: str) -> None:
        if not self.enabled:
            return
        records = store.data[resource]
        _, positions = records.by_change(self.field, change_key)
        for position in positions[: self.per_page]:
            record = records.record_at(position)
            self._stamp = max(self._stamp + 1, int(change_key(record.get(self.field))) + 1)
            revision = record.get("revision", 0) + 1
            changes = {
                "revision": revision,
                "revisions": [{"revision": n} for n in range(1, revision + 1)],
                self.field: iso(self._stamp),
            }
            store.update_record(resource, record["id"], changes)
            self.revised[store.name, resource, record["id"]] += 1
