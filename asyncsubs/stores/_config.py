"""``stores.toml`` (and dlt's store tables), the stores a door pulls, read and checked before
any request.

The file's shape is a few attrs classes: ``[defaults]`` and each ``[stores.<id>]`` are a
``StoreOptions`` (a store adds ``base_url`` and ``token_env``), ``limits`` a ``LimitsTable``.
The package's cattrs converter structures them, every unknown key a problem, each key's value
checked by its attribute's validator; a key with a problem is left out and the rest checked, so
a user fixes a file in one pass. Then each store is checked as a whole: its base URL, version
and token by ``asyncsubs.settings`` (the client's own checks), its limits by ``Limits``, its
secrets by the environment variables it names (never echoed). To listen, each store's
``webhook_*`` keys make its ``WebhookConfig``, and ``resolve_store_binding`` refuses stores that
share a webhook secret without a way to tell their deliveries apart.

``load_config(path, env)`` returns one ``Store`` per store or raises ``ConfigFileError``,
whose ``errors`` say each problem once, in the file's order, with the key as written in the
file (``stores.acme.limits.heavy.orders``); ``stores_from_tables`` reads dlt's tables alike.
The walk over cattrs' errors (``_walk``) keeps each key path as keys, not as the string
``transform_error`` makes of it: problems are sorted by where their keys are in the file, and
the keys that hold one are left out to check the rest.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal

import attrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, override

from .. import Limits, Rate, RetryPolicy
from .._converter import converter
from ..errors import ConfigError
from ..settings import DEFAULT_VERSION, check_token, check_version
from ..webhooks import WebhookConfig, resolve_store_binding
from ._store import (
    DEFAULT_PAGE_SIZE,
    LISTEN_INCREMENTAL,
    RESOURCES,
    Incremental,
    Store,
    check_base_url,
    check_redis_url,
    parse_rate,
)

__all__ = ["ConfigFileError", "incremental_filters", "load_config", "stores_from_tables"]

_ENV_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHOWN_ENV_RE: Final = re.compile(r"[A-Z_][A-Z0-9_]*")
_BARE_KEY_RE: Final = re.compile(r"^[A-Za-z0-9_-]+$")
_INCREMENTAL: Final = '{ param = "...", field = "..." }'
_REQUIRED: Final = ("base_url", "token_env")
#: Keys that belong to each store, never to ``[defaults]``.
_PER_STORE: Final = (*_REQUIRED, "webhook_store_id")
#: The ``WebhookConfig`` settings a ``webhook_<setting>`` key gives (the secrets are read from
#: the variables ``webhook_secret_env`` and ``webhook_previous_secrets_env`` name).
_WEBHOOK_SETTINGS: Final = (
    "scheme",
    "encoding",
    "algorithm",
    "signature_header",
    "signature_prefix",
    "timestamp_header",
    "id_header",
    "timestamp_tolerance",
    "store_key",
    "store_id",
)
#: A secret every scheme reads (base64 after ``whsec_``), to check one setting on its own.
_PROBE_SECRET: Final = "whsec_AAAA"


class ConfigFileError(ConfigError):
    """One or more problems in the configuration: ``errors``, each a ``ConfigError`` whose
    ``key`` names where (``stores.acme.limits``: a key path, a parameter, or the file), and
    ``problems``, each on one line."""

    def __init__(self, errors: Sequence[ConfigError]) -> None:
        unique = {str(error): error for error in errors}  # each problem once, in order
        super().__init__("; ".join(unique))
        self.errors = tuple(unique.values())
        self.problems = tuple(unique)


def _at(path: Sequence[str] | Path | str, problem: object) -> ConfigError:
    """``problem`` (a message, or a ConfigError: its problem) of the key at ``path``."""
    text = problem.problem if isinstance(problem, ConfigError) else str(problem)
    key = _key_path(path) if isinstance(path, tuple | list) else str(path)
    return ConfigError(text, key=key)


def _resources(value: object) -> tuple[str, ...]:
    if (
        not isinstance(value, list | tuple)
        or not value
        or not all(isinstance(v, str) for v in value)
    ):
        raise ConfigError(f"must be a non-empty list of names ({', '.join(RESOURCES)})")
    unknown = [v for v in value if v not in RESOURCES]
    if unknown:
        raise ConfigError(
            f"unknown resource {', '.join(map(repr, unknown))} (known: {', '.join(RESOURCES)})"
        )
    return tuple(dict.fromkeys(value))


def _problem(test: Callable[[Any], bool], message: str) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: ValueError(``message``, ``{value!r}`` filled in) unless ``test``."""

    def validate(_: Any, __: Any, value: Any) -> None:
        if not test(value):
            raise ValueError(message.format(value=value))

    return validate


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_whole_number = _problem(
    lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0,
    "must be a whole number >= 1, got {value!r}",
)
_page_size = _problem(
    lambda v: v == "max" or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
    'must be a whole number >= 1 or "max" (the largest page, learned), got {value!r}',
)
_seconds = _problem(
    lambda v: _number(v) and 0 < v < float("inf"), "must be a number of seconds > 0, got {value!r}"
)
_fraction = _problem(
    lambda v: _number(v) and 0 <= v < 1, "must be a fraction in [0, 1), e.g. 0.02, got {value!r}"
)
_boolean = _problem(lambda v: isinstance(v, bool), "must be true or false, got {value!r}")
_share = _problem(
    lambda v: _number(v) and 0 < v <= 1, "must be a fraction in (0, 1], e.g. 0.25, got {value!r}"
)
_url = _problem(lambda v: isinstance(v, str) and bool(v.strip()), "must be a URL")
_env_name = _problem(
    lambda v: isinstance(v, str) and bool(_ENV_RE.match(v)),
    "must be the NAME of an environment variable, like ACME_TOKEN (what it holds is not "
    "shown: it may be the secret itself)",
)
_env_names = _problem(
    lambda v: isinstance(v, tuple) and all(isinstance(n, str) and _ENV_RE.match(n) for n in v),
    'must be a list of NAMEs of environment variables, like ["ACME_WEBHOOK_SECRET_OLD"] (what '
    "it holds is not shown: it may be a secret itself)",
)
_nonblank = _problem(
    lambda v: isinstance(v, str) and bool(v.strip()), "must be a non-empty string, got {value!r}"
)
_server_limits = _problem(
    lambda v: v in ("lower", "follow", "ignore"),
    "must be one of lower, follow, ignore, got {value!r}",
)


def _checked(check: Callable[[Any], Any]) -> Callable[[Any, Any, Any], None]:
    """A check that raises ConfigError (a ValueError), as an attrs validator."""
    return lambda _, __, value: check(value)


def _webhook_setting(setting: str, **context: Any) -> Callable[[Any, Any, Any], None]:
    """A ``webhook_<setting>`` key checked by ``WebhookConfig`` itself (with ``context``, the
    other settings it needs), its message said of the key."""

    def check(value: Any) -> None:
        try:
            WebhookConfig(_PROBE_SECRET, **context, **{setting: value})
        except ConfigError as exc:
            raise ConfigError(exc.problem) from None

    return _checked(check)


def _list_of_names(value: Any) -> Any:
    # One name or a list of them; what is neither is left to the validator.
    if isinstance(value, str):
        return (value,)
    return tuple(value) if isinstance(value, list) else value


def _store_id(value: Any) -> str:
    # A service may name a store by a number: the body's integer is compared as its digits.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            "must be the value the service sends for this store (a string or an integer), "
            f"got {value!r}"
        )
    return value


def _key(
    validator: Callable[[Any, Any, Any], None] | None = None,
    *,
    parse: Callable[[Any], Any] | None = None,
) -> Any:
    """An optional key of a table: None when absent; ``parse`` makes the value, ``validator``
    checks it (each raising ValueError, or ConfigError, with the problem)."""
    return attrs.field(
        default=None,
        validator=attrs.validators.optional(validator) if validator else None,
        metadata={"parse": parse},
    )


# -- the file's shape ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LimitsTable:
    """``limits``: the store's budget (``Limits``), pool by pool; ``global`` is ``global_rate``."""

    global_rate: Rate | None = _key(parse=parse_rate)  # noqa: RUF009 - an attrs.field
    heavy: Mapping[str, Rate] | None = _key(parse=lambda v: _table_of(v, _heavy, "resource = rate"))
    max_in_flight: int | None = _key(_whole_number)
    safety_margin: float | None = _key(_fraction)
    max_margin: float | None = _key(_fraction)
    server_limits: str | None = _key(_server_limits)


def _heavy(resource: str, value: Any) -> Rate:
    return parse_rate(value)


def _incremental(resource: str, value: Any) -> Incremental:
    if isinstance(value, Incremental):
        return value
    if (
        not isinstance(value, Mapping)
        or set(value) != {"param", "field"}
        or not all(isinstance(v, str) and v for v in value.values())
    ):
        raise ConfigError(f"must be {_INCREMENTAL}")
    return Incremental(param=value["param"], field=value["field"])


@attrs.frozen(kw_only=True)
class StoreOptions:
    """What ``[defaults]`` may set, and each store over it."""

    resources: tuple[str, ...] | None = _key(parse=_resources)
    page_size: int | Literal["max"] | None = _key(_page_size)
    max_attempts: int | None = _key(_whole_number)
    timeout: float | None = _key(_seconds)
    version: str | None = _key(_checked(check_version))
    allow_insecure: bool | None = _key(_boolean)
    limits: LimitsTable | None = _key(parse=lambda v: converter.structure(v, LimitsTable))  # noqa: RUF009
    incremental: Mapping[str, Incremental] | None = _key(
        parse=lambda v: _table_of(v, _incremental, f"resource = {_INCREMENTAL}")
    )
    webhook_secret_env: str | None = _key(_env_name)
    webhook_previous_secrets_env: tuple[str, ...] | None = _key(_env_names, parse=_list_of_names)
    webhook_scheme: str | None = _key(_webhook_setting("scheme"))
    webhook_encoding: str | None = _key(_webhook_setting("encoding"))
    webhook_algorithm: str | None = _key(_webhook_setting("algorithm"))
    webhook_signature_header: str | None = _key(_webhook_setting("signature_header"))
    webhook_signature_prefix: str | None = _key(_webhook_setting("signature_prefix"))
    webhook_timestamp_header: str | None = _key(_webhook_setting("timestamp_header"))
    webhook_id_header: str | None = _key(_webhook_setting("id_header", scheme="standard-webhooks"))
    webhook_timestamp_tolerance: float | None = _key(_seconds)
    webhook_store_key: str | None = _key(_nonblank)
    redis: str | None = _key(_checked(lambda v: check_redis_url(v, where="redis")))
    redis_fallback: float | None = _key(_share)


@attrs.frozen(kw_only=True)
class StoreTable(StoreOptions):
    """One ``[stores.<id>]`` table: the options, and the store's own address and token."""

    base_url: str | None = _key(_url)
    token_env: str | None = _key(_env_name)
    webhook_store_id: str | None = _key(parse=_store_id)


@attrs.frozen(kw_only=True)
class SecretStoreTable(StoreTable):
    """A store's table in dlt's config and secrets: the token itself, not its variable."""

    token: str | None = _key(_checked(check_token))


class _TableProblems(Exception):
    """Problems of a table's keys, ``(key, problem)``, each walked in turn (``_walk``)."""

    def __init__(self, problems: Sequence[tuple[str, BaseException]]) -> None:
        super().__init__(problems)
        self.problems = problems


def _table_of(
    value: Any, item: Callable[[str, Any], Any], what: str, *, any_path: bool = False
) -> dict[str, Any]:
    """A table of resource = ``item(resource, value)``; every problem by its key. The keys are
    the interface's resources, or (``any_path``) any list path."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"must be a table of {what}, got {value!r}")
    result, problems = {}, []
    for resource, spec in value.items():
        try:
            if resource not in RESOURCES and not any_path:
                raise ForbiddenExtraKeysError(None, dict, {resource})
            result[resource] = item(resource, spec)
        except (ConfigError, ForbiddenExtraKeysError) as exc:
            problems.append((resource, exc))
    if problems:
        raise _TableProblems(problems)
    return result


_TABLES: Final = {
    LimitsTable: "global, heavy, max_in_flight, max_margin, safety_margin, server_limits",
    StoreOptions: "keys shared by every store",
    StoreTable: "keys of the store",
    SecretStoreTable: "keys of the store",
}
#: Keys whose attribute has another name.
_RENAMED: Final = {"global_rate": "global"}


def _register(cls: type[Any], what: str) -> None:
    """Structure ``cls`` with the package's converter: keys named as its attributes, every
    other key a problem, each value through its attribute's ``parse`` and validator."""

    def hook(a: attrs.Attribute[Any]) -> Callable[[Any, Any], Any]:
        parse = a.metadata.get("parse")

        def structure(value: Any, _: Any) -> Any:
            if parse is not None:
                value = parse(value)
            if a.validator is not None:
                a.validator(None, a, value)
            return value

        return structure

    overrides = {
        a.name: override(struct_hook=hook(a), rename=_RENAMED.get(a.name))
        for a in attrs.fields(cls)
    }
    fields = make_dict_structure_fn(
        cls,
        converter,
        _cattrs_forbid_extra_keys=True,
        **overrides,  # type: ignore[arg-type]
    )

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(f"must be a table of {what}, got {value!r}")
        return fields(value, cls)

    converter.register_structure_hook(cls, structure)


_register(LimitsTable, _TABLES[LimitsTable])
_register(StoreOptions, _TABLES[StoreOptions])
_register(StoreTable, _TABLES[StoreTable])
_register(SecretStoreTable, _TABLES[SecretStoreTable])


# -- problems --------------------------------------------------------------------------------


def _key_path(path: Sequence[str]) -> str:
    """A key path as written in the file: ``stores."c d".limits``."""
    return ".".join(key if _BARE_KEY_RE.match(key) else f'"{key}"' for key in path)


def _unknown(key: str, known: Iterable[str], where: Sequence[str]) -> str:
    if tuple(where) == ("defaults",) and key in _PER_STORE:
        return f"unknown key ({key} is set per store, in each [stores.<id>] table)"
    close = difflib.get_close_matches(key, list(known), n=1)
    return "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")


def _walk(exc: BaseException, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every problem in ``exc`` (what structuring raised) as (key path, message)."""
    if isinstance(exc, _TableProblems):
        for key, inner in exc.problems:  # an unknown key names itself
            yield from _walk(
                inner, path if isinstance(inner, ForbiddenExtraKeysError) else (*path, key)
            )
    elif isinstance(exc, ClassValidationError):
        with_key, without = exc.group_exceptions()
        for inner, note in with_key:
            yield from _walk(inner, (*path, _RENAMED.get(note.name, note.name)))
        for inner in without:
            yield from _walk(inner, path)
    elif isinstance(exc, ForbiddenExtraKeysError):
        known = (
            RESOURCES if exc.cl is dict else [_RENAMED.get(n, n) for n in attrs.fields_dict(exc.cl)]
        )
        for key in exc.extra_fields:
            yield (*path, key), _unknown(key, known, path)
    else:
        yield path, str(exc)


def _in_file_order(data: Any, path: tuple[str, ...]) -> tuple[int, ...]:
    """Where ``path`` is in the file (TOML tables keep their keys' order)."""
    position = []
    for key in path:
        keys = list(data) if isinstance(data, Mapping) else []
        position.append(keys.index(key) if key in keys else len(keys))
        data = data.get(key) if isinstance(data, Mapping) else None
    return tuple(position)


def _structure(
    cls: type[Any], table: Mapping[str, Any], path: tuple[str, ...], problems: list[ConfigError]
) -> Any:
    """``table`` as ``cls``, its problems reported, the keys that hold them left out."""
    try:
        return converter.structure(table, cls)
    except (ClassValidationError, ValueError) as exc:
        found = sorted(_walk(exc, path), key=lambda p: _in_file_order(table, p[0][len(path) :]))
    problems.extend(_at(where, message) for where, message in found)
    bad = {where[len(path)] for where, _ in found if len(where) > len(path)}
    try:
        return converter.structure({k: v for k, v in table.items() if k not in bad}, cls)
    except (ClassValidationError, ValueError, AttributeError):  # not a table at all
        return cls()


# -- each store ------------------------------------------------------------------------------


def _shown_env(name: str) -> str:
    """An environment variable's name as a message shows it: an upper-case name as it is, any
    other (a token pasted where its variable's name goes) not at all."""
    return name if _SHOWN_ENV_RE.fullmatch(name) else "(a name not in upper case, not shown)"


def _from_env(name: str, env: Mapping[str, str]) -> str:
    if not env.get(name):
        state = "is empty" if name in env else "is not set"
        raise ConfigError(f"environment variable {_shown_env(name)} {state}")
    return env[name]


def _merged(defaults: StoreOptions, own: StoreTable) -> dict[str, Any]:
    """The store's options: its own keys over ``[defaults]``; limits key by key."""
    values = {k: v for k, v in attrs.asdict(defaults, recurse=False).items() if v is not None}
    values.update({k: v for k, v in attrs.asdict(own, recurse=False).items() if v is not None})
    tables = [t for t in (defaults.limits, own.limits) if t is not None]
    limits = {
        k: v for t in tables for k, v in attrs.asdict(t, recurse=False).items() if v is not None
    }
    # Heavy pools merge path by path; the default ones not given a rate discover theirs.
    limits["heavy"] = {k: v for t in tables for k, v in (t.heavy or {}).items()}
    values["limits"] = limits
    return values


def _reporter(
    where: tuple[str, ...], own: StoreTable, problems: list[ConfigError]
) -> Callable[[str, Callable[[], Any]], Any]:
    """``check(key, test)``: what ``test`` returns, or None with its ConfigError reported under
    ``key`` where its value came from: the store's own key, or the default's."""

    def check(key: str, test: Callable[[], Any]) -> Any:
        try:
            return test()
        except ConfigError as exc:
            at = (*where, key) if getattr(own, key, None) is not None else ("defaults", key)
            problems.append(_at(at, exc))
            return None

    return check


def _store(
    store_id: str,
    table: Mapping[str, Any],
    own: StoreTable,
    defaults: StoreOptions,
    env: Mapping[str, str],
    problems: list[ConfigError],
    *,
    listen: str | None,
) -> Store | None:
    """One store's config from its own keys over ``defaults``; None when anything about it is
    wrong (each problem reported under the key the user has to change)."""
    where = ("stores", store_id)
    before = len(problems)
    values = _merged(defaults, own)
    check = _reporter(where, own, problems)

    secret = isinstance(own, SecretStoreTable)
    for key in ("base_url", "token") if secret else _REQUIRED:
        if key not in table:
            problems.append(_at(where, f"{key} is required"))
    version = values.get("version", DEFAULT_VERSION)
    allow_insecure = values.get("allow_insecure", False)
    if own.base_url is not None:
        url = own.base_url
        hint = "allow_insecure = true"
        check("base_url", lambda: check_base_url(url, version, allow_insecure, insecure_hint=hint))
    token = own.token or "" if isinstance(own, SecretStoreTable) else ""
    if own.token_env is not None:
        name = own.token_env
        token = check("token_env", lambda: _token(_from_env(name, env), name)) or ""
    # Read only to listen: a plain sync of the same config must not need a secret.
    webhook = _webhook(where, table, values, env, problems, check, listen) if listen else None
    limits = None  # none given: every pool the store's client has discovers its rate
    try:
        if own.limits is not None or defaults.limits is not None:
            limits = Limits(**values["limits"], discover=True)
    except ConfigError as exc:
        problems.append(_at((*where, "limits"), exc))
    if len(problems) > before:
        return None
    incremental = dict(values.get("incremental", {}))
    if listen:  # reconciliation pulls are incremental: every resource needs a filter
        incremental = {r: incremental.get(r, LISTEN_INCREMENTAL) for r in RESOURCES}
    return Store(
        name=store_id,
        base_url=own.base_url or "",
        token=token,
        token_env=own.token_env or "",
        resources=values.get("resources", RESOURCES),
        page_size=values.get("page_size", DEFAULT_PAGE_SIZE),
        limits=limits,
        retry=RetryPolicy(max_attempts=values.get("max_attempts", 6)),
        timeout=float(values.get("timeout", 30.0)),
        version=version,
        allow_insecure=allow_insecure,
        incremental=incremental,
        webhook=webhook,
        webhook_secret_env=values.get("webhook_secret_env", ""),
        redis=values.get("redis"),
        redis_fallback=values.get("redis_fallback"),
    )


def _webhook(
    where: tuple[str, ...],
    table: Mapping[str, Any],
    values: Mapping[str, Any],
    env: Mapping[str, str],
    problems: list[ConfigError],
    check: Callable[[str, Callable[[], Any]], Any],
    listen: str,
) -> WebhookConfig | None:
    """The store's webhook receiver from its ``webhook_*`` keys over ``[defaults]``, its secrets
    read from the variables they name; None when anything about it is wrong (reported).
    ``listen``: what the caller calls listening, for the message of a missing secret."""
    scheme = values.get("webhook_scheme", "hmac")

    def secret(key: str, name: str) -> str | None:
        value: str | None = check(key, lambda: _webhook_secret(name, env, scheme))
        return value

    secret_env = values.get("webhook_secret_env")
    if secret_env is None and "webhook_secret_env" not in table:  # else reported as invalid
        problems.append(
            _at(
                where,
                f"webhook_secret_env is required with {listen} (the name of the environment "
                "variable holding the store's webhook secret)",
            )
        )
    secrets = [None if secret_env is None else secret("webhook_secret_env", secret_env)]
    for name in values.get("webhook_previous_secrets_env", ()):
        secrets.append(secret("webhook_previous_secrets_env", name))
    current, *previous = secrets
    read = current is not None and None not in previous
    settings = {
        name: values[f"webhook_{name}"] for name in _WEBHOOK_SETTINGS if f"webhook_{name}" in values
    }
    try:
        # Without its secrets, the settings are still checked together.
        config = WebhookConfig(current if read else _PROBE_SECRET, **settings)
    except ConfigError as exc:  # settings that do not go together
        own = any(f"webhook_{name}" in table for name in _WEBHOOK_SETTINGS)
        problems.append(_at(where if own else ("defaults",), _in_keys(str(exc))))
        return None
    return attrs.evolve(config, previous_secrets=previous) if read else None


def _webhook_secret(name: str, env: Mapping[str, str], scheme: Any) -> str:
    """The secret in variable ``name``, as ``scheme`` reads it (a Standard Webhooks secret must
    decode), or ConfigError naming the variable, never the secret."""
    secret = _from_env(name, env)
    try:
        WebhookConfig(secret, scheme=scheme)
    except ConfigError as exc:
        raise ConfigError(f"{_shown_env(name)}: {exc}") from None
    return secret


def _webhook_key(setting: str) -> str:
    """The stores.toml key of a ``WebhookConfig`` setting."""
    return "webhook_previous_secrets_env" if setting == "previous_secrets" else f"webhook_{setting}"


_SETTING_RE: Final = re.compile(
    r"\b(previous_secrets|" + "|".join(name for name in _WEBHOOK_SETTINGS if "_" in name) + r")\b"
)


def _in_keys(message: str) -> str:
    """A ``WebhookConfig`` message with its settings named as stores.toml keys."""
    return _SETTING_RE.sub(lambda m: _webhook_key(m[1]), message)


def _unselected_webhook(
    store_id: str, table: Mapping[str, Any], defaults: StoreOptions, env: Mapping[str, str]
) -> WebhookConfig | None:
    """The webhook receiver of a store ``only_stores`` left out, for the binding only: a secret it
    shares with a selected store would let its deliveries be replayed to that store's URL. Its
    problems are not this run's: None when it has any."""
    scratch: list[ConfigError] = []
    where = ("stores", store_id)
    own = _structure(StoreTable, table, where, scratch)
    check = _reporter(where, own, scratch)
    webhook = _webhook(where, table, _merged(defaults, own), env, scratch, check, "")
    return None if scratch else webhook


def _bind(
    configs: list[Store], others: Mapping[str, WebhookConfig], problems: list[ConfigError]
) -> list[Store]:
    """``configs`` with their webhook binding said by ``resolve_store_binding``, from the secrets
    of every store of the file (``others``: those ``only_stores`` left out); stores that share a
    secret without distinct ``webhook_store_id`` values are one problem naming the keys."""
    webhooks = {c.store: c.webhook for c in configs if c.webhook is not None}
    keys = {key for webhook in webhooks.values() for key in webhook.keys}
    # Only those sharing a secret with a selected store: the others' problem is not this run's.
    webhooks.update({s: w for s, w in others.items() if keys & set(w.keys)})

    def key(store: str, setting: str) -> str:
        return _key_path(("stores", store, _webhook_key(setting)))

    try:
        bound = resolve_store_binding(webhooks, name=key)
    except ConfigError as exc:
        problems.append(exc)
        return configs
    return [attrs.evolve(c, webhook=bound.get(c.store, c.webhook)) for c in configs]


def _token(token: str, name: str) -> str:
    try:
        return check_token(token)
    except ConfigError as exc:
        raise ConfigError(f"{_shown_env(name)}: {exc}") from None


def load_config(
    path: Path,
    env: Mapping[str, str],
    *,
    resources: Iterable[str] | None = None,
    only_stores: Iterable[str] | None = None,
    listen: bool = False,
    names: Mapping[str, str] = {},
) -> list[Store]:
    """Read and check ``path``; ConfigFileError listing every problem, one line each, named
    by its key (``stores.acme.limits.heavy.orders``).

    ``resources`` replaces each store's list; ``only_stores`` selects stores by id.
    ``listen``: each store's webhook secret must be set, its ``webhook`` is made from its
    ``webhook_*`` keys with the store binding resolved over every store of the file, and
    resources without ``incremental`` get ``LISTEN_INCREMENTAL``. ``names``: how the caller
    names these parameters in messages (the command line: by its flags), by parameter name.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigFileError(
            [_at(path, f"cannot read the config file ({exc.strerror})")]
        ) from None
    except UnicodeDecodeError:
        raise ConfigFileError([_at(path, "the config file is not UTF-8")]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError([_at(path, f"invalid TOML: {exc}")]) from None
    return _load(
        data, env, path, resources=resources, only_stores=only_stores, listen=listen, names=names
    )


def incremental_filters(value: object, key: str) -> dict[str, Incremental]:
    """``{path: Incremental}`` from ``Incremental`` values or ``{param, field}`` tables by list
    path (``key`` names the setting); ConfigFileError listing every problem otherwise."""
    if value is None:
        return {}
    what = f"resource = {_INCREMENTAL}"
    try:
        return _table_of(value, _incremental, what, any_path=True)
    except (ConfigError, _TableProblems) as exc:
        raise ConfigFileError([_at(at, problem) for at, problem in _walk(exc, (key,))]) from None


def stores_from_tables(tables: object) -> list[Store]:
    """Stores from tables that hold their tokens, by store name (dlt's config and secrets:
    ``stores.<name>``), each with the keys of a ``stores.toml`` store; ConfigFileError listing
    every problem, named by its key."""
    return _load({"stores": tables}, {}, "stores", table_class=SecretStoreTable)


def _load(
    data: Mapping[str, Any],
    env: Mapping[str, str],
    path: Path | str,
    *,
    resources: Iterable[str] | None = None,
    only_stores: Iterable[str] | None = None,
    listen: bool = False,
    names: Mapping[str, str] = {},
    table_class: type[StoreTable] = StoreTable,
) -> list[Store]:

    listen_as = names.get("listen", "listen=True") if listen else None
    problems: list[ConfigError] = []
    for key in data:
        if key not in ("defaults", "stores"):
            problems.append(_at((key,), _unknown(key, ("defaults", "stores"), ())))
    defaults = _structure(StoreOptions, data.get("defaults", {}), ("defaults",), problems)
    stores = data.get("stores")
    if not isinstance(stores, Mapping) or not stores:
        problems.append(_at(path, "no stores; add a [stores.<id>] table per store"))
        stores = {}
    override_resources = None
    if resources is not None:
        try:
            override_resources = _resources(list(resources))
        except ConfigError as exc:
            problems.append(_at(names.get("resources", "resources"), exc))
    wanted = None if only_stores is None else list(dict.fromkeys(only_stores))
    for store_id in wanted or ():
        if store_id not in stores:
            problems.append(
                _at(names.get("only_stores", "only_stores"), f"no store {store_id!r} in {path}")
            )

    configs = []
    others: dict[str, WebhookConfig] = {}
    for store_id, table in stores.items():
        if wanted is not None and store_id not in wanted:
            if listen and isinstance(table, Mapping):
                other = _unselected_webhook(store_id, table, defaults, env)
                if other is not None:
                    others[store_id] = other
            continue
        where = ("stores", store_id)
        if not isinstance(table, Mapping):
            problems.append(_at(where, "must be a table"))
        elif not store_id.strip():
            problems.append(_at(where, "a store id must not be blank"))
        else:
            before = len(problems)
            own = _structure(table_class, table, where, problems)
            config = _store(store_id, table, own, defaults, env, problems, listen=listen_as)
            if config is not None and len(problems) == before:
                if override_resources is not None:
                    config = attrs.evolve(config, resources=override_resources)
                configs.append(config)
    if listen:
        configs = _bind(configs, others, problems)
    if problems:
        raise ConfigFileError(problems)
    return configs
