"""The ``sync`` configuration file (TOML) and the ``--db`` URL, validated before any request.

Every problem found is collected, so a user fixes a config in one pass rather than one error
per run. Tokens are read from the environment variables the file names and never echoed.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from .._config import DEFAULT_HEAVY, Limits, Rate, RetryPolicy
from .._protocol import check_token, versioned_base
from ..errors import ConfigError

__all__ = [
    "RESOURCES",
    "ConfigFileError",
    "LISTEN_INCREMENTAL",
    "Incremental",
    "StoreConfig",
    "load_config",
    "parse_db_url",
    "parse_rate",
]

#: The list endpoints ``sync`` knows how to store (one table each).
RESOURCES: Final = ("subscriptions", "customers", "orders")
DEFAULT_VERSION: Final = "2026-04"

_STORE_KEYS: Final = frozenset(
    {
        "base_url",
        "token_env",
        "resources",
        "page_size",
        "limits",
        "max_attempts",
        "timeout",
        "version",
        "allow_insecure",
        "incremental",
        "webhook_secret_env",
    }
)
_DEFAULT_KEYS: Final = _STORE_KEYS - {"base_url", "token_env"}
_LIMIT_KEYS: Final = frozenset({"global", "heavy", "max_in_flight", "safety_margin"})
_RATE_RE: Final = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d*)?|\.\d+)?\s*s?\s*$")
_ENV_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ConfigFileError(ConfigError):
    """One or more problems in the configuration; ``problems`` lists each on one line."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = tuple(problems)


@attrs.frozen
class Incremental:
    """Incremental pulls: pass ``param`` = a high-water value of record field ``field``."""

    param: str
    field: str


#: The filter ``sync --listen`` reconciles with where a resource configures none: the fake
#: server's name (the interface does not name one; configure ``incremental.<resource>``).
LISTEN_INCREMENTAL: Final = Incremental(param="updatedAtMin", field="updatedAt")


@attrs.frozen
class StoreConfig:
    """Everything needed to sync one store."""

    store: str
    base_url: str
    token: str = attrs.field(repr=False)
    token_env: str = ""
    resources: tuple[str, ...] = RESOURCES
    page_size: int | None = None
    limits: Limits = attrs.Factory(Limits)
    retry: RetryPolicy = attrs.Factory(RetryPolicy)
    timeout: float = 30.0
    version: str = DEFAULT_VERSION
    allow_insecure: bool = False
    incremental: Mapping[str, Incremental] = attrs.Factory(dict)
    #: The webhook signing secret (read only with ``--listen``) and the variable it came from.
    webhook_secret: str = attrs.field(default="", repr=False)
    webhook_secret_env: str = ""


def parse_rate(value: object) -> Rate:
    """``"50/s"``, ``"2/3s"``, ``50`` (per second) or ``{n = 2, per = 3.0}``."""
    if isinstance(value, Rate):
        return value
    if isinstance(value, bool):
        raise ConfigError(f"a rate looks like '50/s' or '2/3s', got {value!r}")
    if isinstance(value, int):
        return Rate(value, per=1.0)
    if isinstance(value, str):
        match = _RATE_RE.match(value)
        if match is None:
            raise ConfigError(f"a rate looks like '50/s' or '2/3s', got {value!r}")
        return Rate(int(match[1]), per=float(match[2] or 1.0))
    if isinstance(value, Mapping):
        extra = set(value) - {"n", "per"}
        if extra or "n" not in value:
            raise ConfigError(f"a rate table has keys n and per, got {sorted(value)}")
        return Rate(value["n"], per=value.get("per", 1.0))
    raise ConfigError(f"a rate looks like '50/s' or '2/3s', got {value!r}")


def parse_db_url(url: str) -> Path:
    """``sqlite:///relative.db``, ``sqlite:////absolute.db`` (SQLAlchemy style) or a path."""
    if "://" not in url:
        path = url
    elif url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
    else:
        scheme = url.split("://", 1)[0]
        raise ConfigError(
            f"--db: only SQLite is supported (sqlite:///path.db), got a {scheme}:// URL"
        )
    if not path or path == ":memory:":
        # An in-memory database would vanish with the process, defeating resume.
        raise ConfigError(f"--db must name a file, got {url!r}")
    return Path(path)


def _limits(table: Mapping[str, Any], where: str, problems: list[str]) -> Limits:
    kwargs: dict[str, Any] = {}
    for key in sorted(set(table) - _LIMIT_KEYS):
        problems.append(f"{where}: unknown key {key!r} in limits")
    try:
        if "global" in table:
            kwargs["global_rate"] = parse_rate(table["global"])
        heavy = table.get("heavy")
        if heavy is not None:
            if not isinstance(heavy, Mapping):
                raise ConfigError("limits.heavy must be a table of path = rate")
            kwargs["heavy"] = {path: parse_rate(rate) for path, rate in heavy.items()}
        if "max_in_flight" in table:
            kwargs["max_in_flight"] = table["max_in_flight"]
        if "safety_margin" in table:
            kwargs["safety_margin"] = table["safety_margin"]
        return Limits(**kwargs)
    except ConfigError as exc:
        problems.append(f"{where}: {exc}")
        return Limits()


def _merge_limits(defaults: Mapping[str, Any], store: Mapping[str, Any]) -> dict[str, Any]:
    # A store's limits override the defaults key by key; heavy pools merge path by path.
    merged = {**defaults, **store}
    heavy: dict[str, Any] = {**DEFAULT_HEAVY}
    for source in (defaults, store):
        if isinstance(source.get("heavy"), Mapping):
            heavy.update(source["heavy"])
    merged["heavy"] = heavy
    return merged


def _resources(value: object, where: str, problems: list[str]) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        problems.append(f"{where}: resources must be a non-empty list of names")
        return RESOURCES
    unknown = [v for v in value if v not in RESOURCES]
    if unknown:
        problems.append(
            f"{where}: unknown resource {', '.join(map(repr, unknown))} "
            f"(known: {', '.join(RESOURCES)})"
        )
    return tuple(dict.fromkeys(v for v in value if v in RESOURCES))


def _incremental(value: object, where: str, problems: list[str]) -> dict[str, Incremental]:
    if not isinstance(value, Mapping):
        problems.append(f"{where}: incremental must be a table of resource = {{param, field}}")
        return {}
    result: dict[str, Incremental] = {}
    for resource, spec in value.items():
        if resource not in RESOURCES:
            problems.append(f"{where}: incremental: unknown resource {resource!r}")
            continue
        if (
            not isinstance(spec, Mapping)
            or set(spec) != {"param", "field"}
            or not all(isinstance(v, str) and v for v in spec.values())
        ):
            problems.append(
                f"{where}: incremental.{resource} must be {{param = '...', field = '...'}}"
            )
            continue
        result[resource] = Incremental(param=spec["param"], field=spec["field"])
    return result


def _webhook_secret(
    values: Mapping[str, Any],
    where: str,
    env: Mapping[str, str],
    problems: list[str],
    *,
    listen: bool,
) -> tuple[str, str]:
    """(secret, variable name). The variable is read only with ``--listen``: a plain sync of the
    same config must not need a secret it never uses."""
    name = values.get("webhook_secret_env")
    if name is None:
        if listen:
            problems.append(
                f"{where}: webhook_secret_env is required with --listen (the name of the "
                "environment variable holding the store's webhook secret)"
            )
        return "", ""
    if not isinstance(name, str) or not _ENV_RE.match(name):
        problems.append(f"{where}: webhook_secret_env must name an environment variable")
        return "", ""
    if not listen:
        return "", name
    if name not in env:
        problems.append(f"{where}: environment variable {name} (its webhook secret) is not set")
        return "", name
    if not env[name]:
        problems.append(f"{where}: environment variable {name} (its webhook secret) is empty")
        return "", name
    return env[name], name


def _store(
    store_id: str,
    table: Mapping[str, Any],
    defaults: Mapping[str, Any],
    env: Mapping[str, str],
    problems: list[str],
    *,
    listen: bool = False,
) -> StoreConfig | None:
    where = f"store {store_id!r}"
    before = len(problems)
    for key in sorted(set(table) - _STORE_KEYS):
        problems.append(f"{where}: unknown key {key!r}")
    values = {**defaults, **table}

    version = values.get("version", DEFAULT_VERSION)
    allow_insecure = values.get("allow_insecure", False)
    if not isinstance(allow_insecure, bool):
        problems.append(f"{where}: allow_insecure must be true or false")
        allow_insecure = False
    base_url = table.get("base_url")
    if not isinstance(base_url, str) or not base_url:
        problems.append(f"{where}: base_url is required")
        base_url = ""
    else:
        try:
            versioned_base(base_url, version, allow_insecure=allow_insecure)
        except ConfigError as exc:
            problems.append(f"{where}: {exc}")

    token = ""
    token_env = table.get("token_env")
    if not isinstance(token_env, str) or not _ENV_RE.match(token_env):
        problems.append(f"{where}: token_env must name the environment variable with its token")
        token_env = ""
    elif token_env not in env:
        problems.append(f"{where}: environment variable {token_env} (its token) is not set")
    else:
        try:
            token = check_token(env[token_env])
        except ConfigError as exc:
            problems.append(f"{where}: {token_env}: {exc}")

    resources = _resources(values.get("resources", list(RESOURCES)), where, problems)
    page_size = values.get("page_size")
    if page_size is not None and (
        isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0
    ):
        problems.append(f"{where}: page_size must be a positive integer")
        page_size = None

    limits_tables = [source.get("limits", {}) for source in (defaults, table)]
    if not all(isinstance(t, Mapping) for t in limits_tables):
        problems.append(f"{where}: limits must be a table")
        limits = Limits()
    else:
        limits = _limits(_merge_limits(*limits_tables), where, problems)

    retry = RetryPolicy()
    if "max_attempts" in values:
        try:
            retry = RetryPolicy(max_attempts=values["max_attempts"])
        except ConfigError as exc:
            problems.append(f"{where}: {exc}")
    timeout = values.get("timeout", 30.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
        problems.append(f"{where}: timeout must be a positive number of seconds")
        timeout = 30.0
    incremental = _incremental(values.get("incremental", {}), where, problems)
    webhook_secret, webhook_secret_env = _webhook_secret(
        values, where, env, problems, listen=listen
    )
    if listen:
        # Reconciliation pulls are incremental: every resource needs a filter.
        incremental = {r: incremental.get(r, LISTEN_INCREMENTAL) for r in RESOURCES}

    if len(problems) > before:
        return None
    return StoreConfig(
        store=store_id,
        base_url=base_url,
        token=token,
        token_env=token_env,
        resources=resources,
        page_size=page_size,
        limits=limits,
        retry=retry,
        timeout=float(timeout),
        version=version,
        allow_insecure=allow_insecure,
        incremental=incremental,
        webhook_secret=webhook_secret,
        webhook_secret_env=webhook_secret_env,
    )


def load_config(
    path: Path,
    env: Mapping[str, str],
    *,
    resources: Iterable[str] | None = None,
    only_stores: Iterable[str] | None = None,
    listen: bool = False,
) -> list[StoreConfig]:
    """Read and validate ``path``; raise ConfigFileError listing every problem.

    ``resources`` (from ``--resources``) replaces each store's list; ``only_stores`` (from
    ``--store``) selects stores by id. ``listen`` (``--listen``): each store's webhook secret
    must be set, and resources without ``incremental`` get ``LISTEN_INCREMENTAL``.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError([f"{path}: cannot read the config file ({exc.strerror})"]) from None
    except UnicodeDecodeError:
        raise ConfigFileError([f"{path}: the config file is not UTF-8"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError([f"{path}: invalid TOML: {exc}"]) from None

    problems: list[str] = []
    for key in sorted(set(data) - {"defaults", "stores"}):
        problems.append(f"{path}: unknown top-level key {key!r} (expected defaults, stores)")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, Mapping):
        problems.append(f"{path}: [defaults] must be a table")
        defaults = {}
    for key in sorted(set(defaults) - _DEFAULT_KEYS):
        problems.append(f"{path}: unknown key {key!r} in [defaults]")
    stores = data.get("stores")
    if not isinstance(stores, Mapping) or not stores:
        problems.append(f"{path}: no stores; add a [stores.<id>] table per store")
        stores = {}

    override: tuple[str, ...] | None = None
    if resources is not None:
        override = _resources(list(resources), "--resources", problems)
    wanted = None if only_stores is None else list(dict.fromkeys(only_stores))
    if wanted is not None:
        for store_id in wanted:
            if store_id not in stores:
                problems.append(f"--store: no store {store_id!r} in {path}")

    configs: list[StoreConfig] = []
    for store_id, table in stores.items():
        if wanted is not None and store_id not in wanted:
            continue
        if not isinstance(table, Mapping):
            problems.append(f"{path}: stores.{store_id} must be a table")
            continue
        if not store_id.strip():
            problems.append(f"{path}: a store id must not be blank")
            continue
        config = _store(store_id, table, defaults, env, problems, listen=listen)
        if config is not None:
            if override is not None:
                config = attrs.evolve(config, resources=override)
            configs.append(config)
    if problems:
        raise ConfigFileError(problems)
    return configs
