"""The stores a source pulls, from its arguments: ``Store``s, dlt's config and secrets
(``stores_from_tables``), one ``base_url`` with its token, or the ``stores.toml`` that
``asyncsubs sync`` reads (``load_config``); ``asyncsubs.stores`` reads each."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._client import store_fingerprint
from ..errors import ConfigError
from ..settings import DEFAULT_VERSION, versioned_base
from ..stores import RESOURCES, Store, incremental_filters, load_config, stores_from_tables
from ..stores import Incremental as IncrementalFilter

__all__ = [
    "RESOURCES",
    "IncrementalFilter",
    "Store",
    "incremental_filters",
    "stores_from_file",
    "stores_from_settings",
]


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
        own = {name: table for name, table in stores.items() if not isinstance(table, Store)}
        tables = iter(stores_from_tables(own) if own else ())
        found = [t if isinstance(t, Store) else next(tables) for t in stores.values()]
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
    stores: list[Store] = load_config(Path(path), os.environ)
    return stores
