"""The stores a source pulls: ``Store``, from arguments, from dlt's config and secrets, or from
the ``stores.toml`` that ``asyncsubs sync`` reads (``_stores_from_file``, through
``asyncsubs.sync.load_config``)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs

from .. import AdminClient, Limits, Rate, RetryPolicy
from ..errors import ConfigError
from ..sync import RESOURCES, check_redis_url, load_config

__all__ = [
    "RESOURCES",
    "IncrementalFilter",
    "Store",
    "client_settings",
    "incremental_filters",
    "stores_from_file",
    "stores_from_settings",
]


@attrs.frozen
class IncrementalFilter:
    """A list endpoint's updated-since filter: pass query parameter ``param`` = a high-water
    value of record field ``field`` (the interface names none; the fake server's is
    ``updatedAtMin`` on ``updatedAt``): the command line's ``incremental.<resource>``."""

    param: str
    field: str

    def __attrs_post_init__(self) -> None:
        for name in ("param", "field"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"incremental {name} must be a non-empty string, got {value!r}")


def _names(value: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen
class Store:
    """One store the source pulls, with its own budget (one ``AdminClient`` for all of its
    resources).

    ``limits=None`` discovers the heavy pools' rates (``Limits(discover=True)``) and
    ``page_size="max"`` the largest page (README, "Discovery"); give a ``Limits`` or an int to
    pin them. ``resources``: the list endpoints this store serves (None: all the source pulls).
    ``redis``: a ``redis://`` URL to pace through ``RedisLimiter`` there, the store's budget
    shared with every other process pacing through it (an ``asyncsubs sync``, another pipeline).
    """

    name: str
    base_url: str
    token: str = attrs.field(repr=False)
    limits: Limits | None = None
    page_size: int | Literal["max"] = "max"
    retry: RetryPolicy | None = None
    timeout: float = 30.0
    version: str | None = None
    allow_insecure: bool = False
    resources: tuple[str, ...] | None = attrs.field(default=None, converter=_names)
    incremental: Mapping[str, IncrementalFilter] = attrs.field(factory=dict)
    redis: str | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"a store needs a non-empty name, got {self.name!r}")
        size = self.page_size
        if size != "max" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigError(f"store {self.name}: page_size must be an int >= 1 or 'max'")
        if self.redis is not None:
            check_redis_url(str(self.redis), where=f"store {self.name}: redis")

    def pulls(self, resource: str) -> bool:
        return self.resources is None or resource in self.resources


def client_settings(store: Store, list_paths: Sequence[str]) -> dict[str, Any]:
    """``AdminClient`` keywords for ``store``; ``list_paths``: every path the source pulls, each
    a heavy pool (discovered unless the store's ``limits`` pins it)."""
    limits = store.limits
    if limits is None:
        heavy = {path: Rate.discover() for path in list_paths}
        limits = Limits(discover=True, heavy=heavy)
    else:
        missing = [path for path in list_paths if path not in limits.heavy]
        if missing:  # a list path the limits do not know would draw on the global pool
            extra = dict.fromkeys(missing, Rate(1, per=1.0))
            limits = attrs.evolve(limits, heavy={**limits.heavy, **extra})
    settings: dict[str, Any] = {
        "token": store.token,
        "base_url": store.base_url,
        "store": store.name,
        "limits": limits,
        "retry": store.retry,
        "timeout": store.timeout,
        "allow_insecure": store.allow_insecure,
        "user_agent": "asyncsubs-dlt",
    }
    if store.version is not None:
        settings["version"] = store.version
    return settings


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
        name = store or AdminClient(token=token, base_url=base_url, telemetry=False).store
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
    return _stores_from_file(Path(path))


def _stores_from_file(path: Path) -> list[Store]:
    """The one adapter between the command line's config loader (``asyncsubs.sync``) and the
    source: a store's limits and page size come as the loader has them, the heavy pools and
    the page size the file does not set already discovered."""
    return [
        Store(
            name=config.store,
            base_url=config.base_url,
            token=config.token,
            limits=config.limits,
            page_size=config.page_size,
            retry=config.retry,
            timeout=config.timeout,
            version=config.version,
            allow_insecure=config.allow_insecure,
            resources=config.resources,
            incremental={
                r: IncrementalFilter(param=i.param, field=i.field)
                for r, i in config.incremental.items()
            },
            redis=config.redis,
        )
        for config in load_config(path, os.environ)
    ]
