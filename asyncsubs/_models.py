"""Record models: Subscription, Customer, Order, and the Page that carries them.

The interface does not list record fields, so every field but ``raw`` is optional and holds the
value exactly as the server sent it (never converted, never rejected). ``raw`` is the record as
received, so every field the server sent stays reachable.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import attrs

__all__ = ["Customer", "Order", "Page", "Subscription"]

T = TypeVar("T")


@attrs.frozen
class Subscription:
    id: Any
    raw: dict[str, Any] = attrs.field(repr=False, eq=False)
    customer_id: Any = None
    status: Any = None
    created_at: Any = None
    updated_at: Any = None


@attrs.frozen
class Customer:
    id: Any
    raw: dict[str, Any] = attrs.field(repr=False, eq=False)
    email: Any = None
    first_name: Any = None
    last_name: Any = None
    created_at: Any = None
    updated_at: Any = None


@attrs.frozen
class Order:
    id: Any
    raw: dict[str, Any] = attrs.field(repr=False, eq=False)
    subscription_id: Any = None
    customer_id: Any = None
    status: Any = None
    created_at: Any = None
    updated_at: Any = None


@attrs.frozen
class Page(Generic[T]):
    """One page of a list endpoint.

    ``cursor`` is the afterCursor that fetched this page (None for the first page);
    ``next_cursor`` is where to resume once this page is processed (None on the last page).
    """

    data: list[T]
    cursor: str | None
    next_cursor: str | None
    has_next_page: bool

    def __len__(self) -> int:
        return len(self.data)
