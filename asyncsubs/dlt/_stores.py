"""The stores a source pulls: ``Store``, from arguments, from dlt's config and secrets, or from
the ``stores.toml`` that ``asyncsubs sync`` reads (``_stores_from_file``, through
``asyncsubs.sync.load_config``)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from .._client import store_fingerprint
from ..errors import ConfigError
from ..settings import DEFAULT_VERSION, versioned_base
from ..stores import RESOURCES, Store
from ..stores import Incremental as IncrementalFilter
from ..sync import load_config

__all__ = [
    "RESOURCES",
    "IncrementalFilter",
    "Store",
    "incremental_filters",
    "stores_from_file",
    "stores_from_settings",
]


def incremental_filters(value: object, where: str) -> dict[str, IncrementalFilter]:
    """``{resource: IncrementalFilter}`` from filters or ``{param, field}`` tables (``where``
    names the setting in messages)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f'{where}: expected resource = {{ param = "...", field = "..." }}')
    filters = {}
    for resource, spec in value.items():
        if isinstance(spec, IncrementalFilter):
            filters[resource] = spec
        elif isinstance(spec, Mapping) and set(spec) == {"param", "field"}:
            filters[resource] = IncrementalFilter(param=spec["param"], field=spec["field"])
        else:
            raise ConfigError(f'{where}.{resource}: expected {{ param = "...", field = "..." }}')
    return filters


_STORE_KEYS: Final = frozenset(
    {"base_url", "token", "page_size", "timeout", "version", "allow_insecure", "resources", "redis"}
)


def _store_from_table(name: str, table: object) -> Store:
    """A store of the ``stores`` table of dlt's config (``.dlt/secrets.toml``)."""
    where = f"stores.{name}"
    if isinstance(table, Store):
        return table
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table with base_url and token")
    unknown = sorted(set(table) - _STORE_KEYS - {"incremental"})
    if unknown:
        raise ConfigError(f"{where}: unknown keys {unknown} (known: {sorted(_STORE_KEYS)})")
    for key in ("base_url", "token"):
        if not table.get(key):
            raise ConfigError(f"{where}.{key} is required")
    kwargs = {key: table[key] for key in _STORE_KEYS if key in table}
    filters = incremental_filters(table.get("incremental"), where)
    return Store(name=name, incremental=filters, **kwargs)


def stores_from_settings(
    *,
    stores: object,
    base_url: str | None,
    token: str | None,
    store: str | None,
    stores_file: str | None,
) -> list[Store]:
    """The stores of one of the source's three forms: ``stores`` (``Store``s, or a table of
    tables from dlt's config), ``base_url`` + ``token`` (one store), or ``stores_file``."""
    given = [
        name
        for name, value in (
            ("stores", stores),
            ("base_url", base_url),
            ("stores_file", stores_file),
        )
        if value is not None
    ]
    if len(given) != 1:
        raise ConfigError(
            "subscription_service needs exactly one of: stores (Store objects, or a "
            "[sources.subscription_service.stores.<name>] table in .dlt/secrets.toml), "
            "base_url with token (one store), or stores_file (the stores.toml of asyncsubs "
            f"sync); got {', '.join(given) or 'none'}"
        )
    if stores_file is not None:
        return stores_from_file(stores_file)
    if base_url is not None:
        if not token:
            raise ConfigError(
                "token is required with base_url: sources.subscription_service.token in "
                ".dlt/secrets.toml, or SOURCES__SUBSCRIPTION_SERVICE__TOKEN"
            )
        # Unnamed, the store is called as a client calls it (a fingerprint of URL and token).
        name = store or store_fingerprint(versioned_base(base_url, DEFAULT_VERSION), token)
        return [Store(name=name, base_url=base_url, token=token)]
    if isinstance(stores, Store):
        return [stores]
    if isinstance(stores, Mapping):
        found = [_store_from_table(str(name), table) for name, table in stores.items()]
    elif isinstance(stores, Sequence) and not isinstance(stores, str | bytes):
        found = list(stores)
        if not all(isinstance(s, Store) for s in found):
            raise ConfigError("stores must be Store objects or a table of store tables")
    else:
        raise ConfigError(f"stores must be Store objects or a table of tables, got {stores!r}")
    if not found:
        raise ConfigError("stores is empty")
    names = [s.name for s in found]
    if len(set(names)) != len(names):
        raise ConfigError(f"store names must be unique, got {names}")
    return found


def stores_from_file(path: str | os.PathLike[str]) -> list[Store]:
    """The stores of a ``stores.toml`` as ``asyncsubs sync`` reads it (tokens from the
    environment variables it names); ConfigError listing every problem otherwise."""
    return load_config(Path(path), os.environ)
