"""A read-only mapping that, unlike ``MappingProxyType``, pickles (configs cross processes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["FrozenMap"]

_V = TypeVar("_V")


class FrozenMap(Mapping[str, _V], Generic[_V]):
    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, _V] | None = None) -> None:
        self._data: dict[str, _V] = dict(data or {})

    def __getitem__(self, key: str) -> _V:
        return self._data[key]

    def __contains__(self, key: object) -> bool:  # Mapping's would raise and catch a KeyError
        return key in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return repr(self._data)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._data,))
