"""The ``sync`` configuration file (TOML) and the ``--db`` URL, validated before any request.

Every problem found is collected, so a user fixes a config in one pass rather than one error
per run. Tokens are read from the environment variables the file names and never echoed.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs

from .. import AdminClient, Limits, Rate, RetryPolicy
from .._protocol import DEFAULT_VERSION
from ..errors import ConfigError

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "RESOURCES",
    "ConfigFileError",
    "LISTEN_INCREMENTAL",
    "Incremental",
    "StoreConfig",
    "check_client",
    "key_path",
    "load_config",
    "PostgresURL",
    "check_redis_url",
    "parse_db_url",
    "parse_rate",
    "parse_sqlite_url",
]

#: The list endpoints ``sync`` knows how to store (one table each).
RESOURCES: Final = ("subscriptions", "customers", "orders")
#: Records per request unless configured. The heavy list pools allow a request or two per
#: second, so records per request is what makes a pull fast: 250 is the fake server's largest
#: page, and a server with a smaller maximum clamps pageSize (the interface names none).
DEFAULT_PAGE_SIZE: Final = 250

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
        "redis",
    }
)
_DEFAULT_KEYS: Final = _STORE_KEYS - {"base_url", "token_env"}
_MARGIN_KEYS: Final = ("safety_margin", "max_margin")
_LIMIT_KEYS: Final = frozenset({"global", "heavy", "max_in_flight", *_MARGIN_KEYS, "server_limits"})
_SERVER_LIMITS: Final = ("lower", "follow", "ignore")
_RATE_RE: Final = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d*)?|\.\d+)?\s*s?\s*$")
_ENV_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHOWN_ENV_RE: Final = re.compile(r"[A-Z_][A-Z0-9_]*")
_BARE_KEY_RE: Final = re.compile(r"^[A-Za-z0-9_-]+$")


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
    page_size: int | None = DEFAULT_PAGE_SIZE
    limits: Limits = attrs.Factory(Limits)
    retry: RetryPolicy = attrs.Factory(RetryPolicy)
    timeout: float = 30.0
    #: The interface version in the path.
    version: str = DEFAULT_VERSION
    allow_insecure: bool = False
    incremental: Mapping[str, Incremental] = attrs.Factory(dict)
    #: The webhook signing secret (read only with ``--listen``) and the variable it came from.
    webhook_secret: str = attrs.field(default="", repr=False)
    webhook_secret_env: str = ""
    #: Pace through ``RedisLimiter`` on this Redis (``redis`` key or ``--redis``): the store's
    #: budget shared by every worker. May hold a password, hence no repr.
    redis: str | None = attrs.field(default=None, repr=False)


_RATE_HINT: Final = 'a rate looks like "50/s", "2/3s", 50 (per second) or { n = 2, per = 3.0 }'


def parse_rate(value: object) -> Rate:
    """``"50/s"``, ``"2/3s"``, ``50`` (per second) or ``{n = 2, per = 3.0}``; ConfigError
    (naming no internal field) otherwise."""
    if isinstance(value, Rate):
        return value
    n: object
    per: object = 1.0
    if isinstance(value, str):
        match = _RATE_RE.match(value)
        if match is None:
            raise ConfigError(f"{_RATE_HINT}, got {value!r}")
        n, per = int(match[1]), float(match[2] or 1.0)
    elif isinstance(value, Mapping):
        # Both keys, always: a table missing one is more likely a typo than a default.
        if set(value) != {"n", "per"}:
            raise ConfigError(f"a rate table has exactly the keys n and per, got {sorted(value)}")
        n, per = value["n"], value["per"]
    else:
        n = value
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ConfigError(f"a rate needs a whole number of requests >= 1, got {value!r}")
    if (
        isinstance(per, bool)
        or not isinstance(per, int | float)
        or not math.isfinite(per)
        or per <= 0
    ):
        raise ConfigError(f"a rate needs a period of seconds > 0, got {value!r}")
    return Rate(n, per=float(per))


@attrs.frozen
class PostgresURL:
    """A ``postgresql://`` ``--db``: libpq's URL, passed to psycopg as is (``where``: without
    the password, for messages)."""

    url: str = attrs.field(repr=False)

    @property
    def where(self) -> str:
        """``scheme://user@host:port/db``, read by hand: a password holding '/' or '#' makes
        urlsplit take part of it for a port or a path. Up to the last '@' is credentials (the
        user shown, not the password); the query (libpq takes ``password=`` there too) is not
        shown, nor a "port" that is no number (``postgresql://user:secret/db``, the host left
        out)."""
        scheme, _, rest = self.url.partition("://")
        credentials, at, rest = rest.rpartition("@")
        user = credentials.partition(":")[0]
        host, slash, path = re.split(r"[?#]", rest, maxsplit=1)[0].partition("/")
        name, colon, port = host.rpartition(":")
        if colon and not port.isdigit() and not name.endswith("]") and ":" not in name:
            host = name
        return f"{scheme}://{user + '@' if at and user else ''}{host}{slash}{path}"


def parse_db_url(url: str) -> Path | PostgresURL:
    """``postgresql://user@host:port/db`` (or ``postgres://``), ``sqlite:///relative.db``,
    ``sqlite:////absolute.db`` (SQLAlchemy style) or a path."""
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresURL(url)
    if "://" not in url:
        path = url
    elif url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
    elif url.startswith("sqlite://"):
        rest = url[len("sqlite://") :]
        raise ConfigError(
            f"--db: a SQLite URL has three slashes before a relative path "
            f"(sqlite:///{rest}) and four before an absolute one (sqlite:////abs/{rest})"
        )
    else:
        scheme = url.split("://", 1)[0]
        raise ConfigError(
            f"--db: SQLite (sqlite:///path.db) or PostgreSQL (postgresql://user@host/db), "
            f"got a {scheme}:// URL"
        )
    if not path or path == ":memory:":
        # An in-memory database would vanish with the process, defeating resume.
        raise ConfigError(f"--db must name a file, got {url!r}")
    if Path(path).is_dir():
        raise ConfigError(f"--db: {path} is a directory; name a database file in it")
    return Path(path)


def parse_sqlite_url(url: str, *, what: str) -> Path:
    """``parse_db_url`` for commands that work on SQLite only (``what`` names the command)."""
    db = parse_db_url(url)
    if isinstance(db, PostgresURL):
        raise ConfigError(f"--db: {what} works on a SQLite database only")
    return db


def check_redis_url(url: object, *, where: str) -> str:
    """A ``redis://``, ``rediss://`` or ``unix://`` URL, or ConfigError (never echoing it:
    it may hold a password)."""
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"{where}: expected a redis://, rediss:// or unix:// URL")
    return url


def check_client(settings: Mapping[str, Any], *, insecure_hint: str) -> AdminClient:
    """``AdminClient(**settings)``, which checks every setting (token, base URL, version...) and
    does no I/O: its HTTP session is opened by the first request.

    Raises the client's ConfigError, except for a plain ``http://`` base URL: when the same
    settings pass with ``allow_insecure=True``, that is the one problem, and the message names
    how this command allows it (``insecure_hint``: a flag or a config key)."""
    try:
        return AdminClient(**settings)
    except ConfigError as exc:
        problem = exc
    if not settings.get("allow_insecure", False):
        try:
            AdminClient(**{**settings, "allow_insecure": True})
        except ConfigError:
            pass
        else:
            raise ConfigError(
                f"plain http:// would send the token unencrypted; use https:// ({insecure_hint} "
                "on a trusted network)"
            ) from None
    raise problem


#: What ``_check_setting`` passes for the settings it does not check: a client needs a token
#: and a base URL, and is never used (construction sends nothing).
_STAND_INS: Final[Mapping[str, Any]] = {
    "token": "stand-in",
    "base_url": "https://stand-in.invalid",
    "telemetry": False,
}


def _check_setting(**setting: Any) -> None:
    """ConfigError if ``AdminClient`` refuses ``setting`` (one or a few keywords), the others
    being stand-ins: so each problem of a store is found and reported under the key that holds
    it, even while another key is wrong or the token variable unset."""
    check_client({**_STAND_INS, **setting}, insecure_hint="or allow_insecure = true")


def key_path(where: str, key: str) -> str:
    """``key`` under the TOML key path ``where``, as written in the file:
    ``key_path("stores.acme.limits.heavy", "orders")``; keys that are not bare are quoted."""
    part = key if _BARE_KEY_RE.match(key) else f'"{key}"'
    return f"{where}.{part}" if where else part


class _Problems:
    """Collects one line per problem, each naming the key it is about."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.lines.append(f"{where}: {message}")

    def unknown(self, where: str, key: str, known: Iterable[str]) -> None:
        close = difflib.get_close_matches(key, list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        self.add(key_path(where, key), f"unknown key{hint}")


def _positive_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"must be a whole number >= 1, got {value!r}")
    return value


def _positive_seconds(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def _safety_margin(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ConfigError(f"must be a fraction in [0, 1), e.g. 0.02, got {value!r}")
    return float(value)


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"must be true or false, got {value!r}")
    return value


def _version(value: object) -> str:
    _check_setting(version=value)
    assert isinstance(value, str)  # the client takes no other
    return value


def _env_name(value: object) -> str:
    if not isinstance(value, str) or not _ENV_RE.match(value):
        raise ConfigError(
            "must be the NAME of an environment variable, like ACME_TOKEN (what it holds is not "
            "shown: it may be the secret itself)"
        )
    return value


def _shown_env(name: str) -> str:
    """An environment variable's name as a message shows it: an upper-case name as it is, any
    other (a token pasted where its variable's name goes) not at all."""
    return name if _SHOWN_ENV_RE.fullmatch(name) else "(a name not in upper case, not shown)"


def _resource_names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"must be a non-empty list of names ({', '.join(RESOURCES)})")
    unknown = [v for v in value if v not in RESOURCES]
    if unknown:
        raise ConfigError(
            f"unknown resource {', '.join(map(repr, unknown))} (known: {', '.join(RESOURCES)})"
        )
    return tuple(dict.fromkeys(value))


def _table(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a table of {what}, got {value!r}")
    return value


def _limits(value: object, where: str, problems: _Problems) -> dict[str, Any] | None:
    """The ``Limits`` keyword arguments a limits table sets (heavy: only the paths it names),
    or None when something in it is wrong (each problem reported)."""
    try:
        table = _table(value, ", ".join(sorted(_LIMIT_KEYS)))
    except ConfigError as exc:
        problems.add(where, str(exc))
        return None
    before = len(problems.lines)
    kwargs: dict[str, Any] = {}
    for key, item in table.items():
        at = key_path(where, key)
        try:
            if key == "global":
                kwargs["global_rate"] = parse_rate(item)
            elif key == "heavy":
                heavy = {}
                for path, rate in _table(item, "resource = rate").items():
                    if path not in RESOURCES:
                        problems.unknown(at, path, RESOURCES)
                        continue
                    try:
                        heavy[path] = parse_rate(rate)
                    except ConfigError as exc:
                        problems.add(key_path(at, path), str(exc))
                kwargs["heavy"] = heavy
            elif key == "max_in_flight":
                kwargs["max_in_flight"] = _positive_int(item)
            elif key in _MARGIN_KEYS:
                kwargs[key] = _safety_margin(item)
            elif key == "server_limits":
                if item not in _SERVER_LIMITS:
                    raise ConfigError(f"must be one of {', '.join(_SERVER_LIMITS)}, got {item!r}")
                kwargs[key] = item
            else:
                problems.unknown(where, key, _LIMIT_KEYS)
        except ConfigError as exc:
            problems.add(at, str(exc))
    return kwargs if len(problems.lines) == before else None


def _incremental(value: object, where: str, problems: _Problems) -> dict[str, Incremental] | None:
    try:
        table = _table(value, 'resource = { param = "...", field = "..." }')
    except ConfigError as exc:
        problems.add(where, str(exc))
        return None
    before = len(problems.lines)
    result: dict[str, Incremental] = {}
    for resource, spec in table.items():
        if resource not in RESOURCES:
            problems.unknown(where, resource, RESOURCES)
            continue
        if (
            not isinstance(spec, Mapping)
            or set(spec) != {"param", "field"}
            or not all(isinstance(v, str) and v for v in spec.values())
        ):
            problems.add(key_path(where, resource), 'must be { param = "...", field = "..." }')
            continue
        result[resource] = Incremental(param=spec["param"], field=spec["field"])
    return result if len(problems.lines) == before else None


#: How each key's value is checked and converted (limits and incremental have tables).
_SCALARS: Final[Mapping[str, Any]] = {
    "base_url": lambda v: v if isinstance(v, str) and v.strip() else _fail("must be a URL"),
    "token_env": _env_name,
    "webhook_secret_env": _env_name,
    "resources": _resource_names,
    "page_size": _positive_int,
    "max_attempts": _positive_int,
    "timeout": _positive_seconds,
    "version": _version,
    "allow_insecure": _boolean,
    "redis": lambda v: check_redis_url(v, where="redis"),
}


def _fail(message: str) -> Any:
    raise ConfigError(message)


def _options(
    table: Mapping[str, Any], where: str, allowed: frozenset[str], problems: _Problems
) -> dict[str, Any]:
    """The checked values of the keys ``table`` sets; every problem reported under its key."""
    values: dict[str, Any] = {}
    for key, value in table.items():
        at = key_path(where, key)
        if key not in allowed:
            problems.unknown(where, key, allowed)
        elif key == "limits":
            limits = _limits(value, at, problems)
            if limits is not None:
                values[key] = limits
        elif key == "incremental":
            incremental = _incremental(value, at, problems)
            if incremental is not None:
                values[key] = incremental
        else:
            try:
                values[key] = _SCALARS[key](value)
            except ConfigError as exc:
                problems.add(at, str(exc))
    return values


def _merged_limits(defaults: Mapping[str, Any], store: Mapping[str, Any]) -> Limits:
    # A store's limits override the defaults key by key; heavy pools merge path by path.
    kwargs = {**defaults, **store}
    kwargs["heavy"] = {**Limits().heavy, **defaults.get("heavy", {}), **store.get("heavy", {})}
    return Limits(**kwargs)


def _store(
    store_id: str,
    table: Mapping[str, Any],
    defaults: Mapping[str, Any],
    env: Mapping[str, str],
    problems: _Problems,
    *,
    listen: bool = False,
) -> StoreConfig | None:
    """One store's config from its own checked keys over the checked ``defaults``; None when
    anything about it is wrong (each problem reported, once, under the key that holds it)."""
    where = key_path("stores", store_id)
    before = len(problems.lines)
    own = _options(table, where, _STORE_KEYS, problems)
    values = {**defaults, **own}

    def origin(key: str) -> str:
        # Where a value came from, so its problem names the key the user has to change.
        return key_path(where, key) if key in table or key not in defaults else f"defaults.{key}"

    for key in ("base_url", "token_env"):
        if key not in table:
            problems.add(where, f"{key} is required")
    version = values.get("version", DEFAULT_VERSION)  # (a wrong one is reported, and left out)
    allow_insecure = values.get("allow_insecure", False)
    base_url = values.get("base_url", "")
    if base_url:
        try:
            _check_setting(
                base_url=base_url,
                allow_insecure=allow_insecure,
                version=version,
            )
        except ConfigError as exc:
            problems.add(origin("base_url"), str(exc))

    token = ""
    token_env = values.get("token_env")
    if token_env is not None:
        if not env.get(token_env):
            state = "is empty" if token_env in env else "is not set"
            message = f"environment variable {_shown_env(token_env)} {state}"
            problems.add(origin("token_env"), message)
        else:
            try:
                _check_setting(token=env[token_env])
                token = env[token_env]
            except ConfigError as exc:
                problems.add(origin("token_env"), f"{_shown_env(token_env)}: {exc}")

    webhook_secret = ""
    secret_env = values.get("webhook_secret_env")
    # Read only with --listen: a plain sync of the same config must not need a secret.
    if listen and secret_env is None and "webhook_secret_env" not in table:
        problems.add(
            where,
            "webhook_secret_env is required with --listen (the name of the environment "
            "variable holding the store's webhook secret)",
        )
    elif listen and secret_env is not None:
        if not env.get(secret_env):
            state = "is empty" if secret_env in env else "is not set"
            message = f"environment variable {_shown_env(secret_env)} {state}"
            problems.add(origin("webhook_secret_env"), message)
        else:
            webhook_secret = env[secret_env]

    margins = {**attrs.asdict(Limits()), **defaults.get("limits", {}), **own.get("limits", {})}
    if margins["max_margin"] < margins["safety_margin"]:
        problems.add(key_path(where, "limits"), "max_margin must be >= safety_margin")

    if len(problems.lines) > before:
        return None
    incremental = dict(values.get("incremental", {}))
    if listen:
        # Reconciliation pulls are incremental: every resource needs a filter.
        incremental = {r: incremental.get(r, LISTEN_INCREMENTAL) for r in RESOURCES}
    return StoreConfig(
        store=store_id,
        base_url=base_url,
        token=token,
        token_env=token_env or "",
        resources=values.get("resources", RESOURCES),
        page_size=values.get("page_size", DEFAULT_PAGE_SIZE),
        limits=_merged_limits(defaults.get("limits", {}), own.get("limits", {})),
        retry=RetryPolicy(max_attempts=values.get("max_attempts", 6)),
        timeout=values.get("timeout", 30.0),
        version=version,
        allow_insecure=allow_insecure,
        incremental=incremental,
        webhook_secret=webhook_secret,
        webhook_secret_env=secret_env or "",
        redis=values.get("redis"),
    )


def load_config(
    path: Path,
    env: Mapping[str, str],
    *,
    resources: Iterable[str] | None = None,
    only_stores: Iterable[str] | None = None,
    listen: bool = False,
) -> list[StoreConfig]:
    """Read and validate ``path``; raise ConfigFileError listing every problem, one line each,
    naming the key it is about (``stores.acme.limits.heavy.orders``).

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

    problems = _Problems()
    for key in data:
        if key not in ("defaults", "stores"):
            problems.unknown("", key, ("defaults", "stores"))
    defaults: dict[str, Any] = {}
    if "defaults" in data:
        try:
            table = _table(data["defaults"], "keys shared by every store")
            defaults = _options(table, "defaults", _DEFAULT_KEYS, problems)
        except ConfigError as exc:
            problems.add("defaults", str(exc))
    stores = data.get("stores")
    if not isinstance(stores, Mapping) or not stores:
        problems.add(f"{path}", "no stores; add a [stores.<id>] table per store")
        stores = {}

    override: tuple[str, ...] | None = None
    if resources is not None:
        try:
            override = _resource_names(list(resources))
        except ConfigError as exc:
            problems.add("--resources", str(exc))
    wanted = None if only_stores is None else list(dict.fromkeys(only_stores))
    if wanted is not None:
        for store_id in wanted:
            if store_id not in stores:
                problems.add("--store", f"no store {store_id!r} in {path}")

    configs: list[StoreConfig] = []
    for store_id, table in stores.items():
        if wanted is not None and store_id not in wanted:
            continue
        if not isinstance(table, Mapping):
            problems.add(key_path("stores", store_id), "must be a table")
            continue
        if not store_id.strip():
            problems.add(key_path("stores", store_id), "a store id must not be blank")
            continue
        config = _store(store_id, table, defaults, env, problems, listen=listen)
        if config is not None:
            if override is not None:
                config = attrs.evolve(config, resources=override)
            configs.append(config)
    if problems.lines:
        raise ConfigFileError(problems.lines)
    return configs
