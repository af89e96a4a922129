"""``stores.toml`` (and dlt's store tables): the stores a door pulls, checked before any request.

The file's tables are attrs classes (``[defaults]`` a ``StoreOptions``, ``[stores.<id>]`` a
``StoreTable``, ``limits`` a ``LimitsTable``) that the package's cattrs converter structures,
each key through its field's check, every unknown key a problem, each problem's key path read
from cattrs' notes (``_problems``). A key with a problem is left out and the rest checked, so a
user fixes a file in one pass. Then each store as a whole (``_StoreReader``): base URL, version
and token by the client's own checks, limits by ``Limits``, secrets from the environment
variables named (never echoed) and, to listen, its ``WebhookConfig``. ``ConfigFileError`` says
each problem once, in the file's order, by its key as written (``stores.a.limits.heavy.orders``).
"""

from __future__ import annotations

import difflib
import json
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

import attrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)
from cattrs.gen import make_dict_structure_fn, override

from .. import Limits, Rate, RetryPolicy
from .._converter import converter
from ..errors import ConfigError
from ..settings import DEFAULT_VERSION, check_token, check_version
from ..webhooks import WebhookConfig, resolve_store_binding
from ._store import (
    LISTEN_INCREMENTAL,
    RESOURCES,
    Incremental,
    Store,
    check_base_url,
    check_nonblank,
    check_page_size,
    check_redis_url,
    parse_rate,
)

__all__ = ["ConfigFileError", "incremental_filters", "load_config", "stores_from_tables"]

T = TypeVar("T")

_ENV_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHOWN_ENV_RE: Final = re.compile(r"[A-Z_][A-Z0-9_]*")
_BARE_KEY_RE: Final = re.compile(r"^[A-Za-z0-9_-]+$")
_INCREMENTAL: Final = '{ param = "...", field = "..." }'
_REQUIRED: Final = ("base_url", "token_env")
#: Keys that belong to each store, never to ``[defaults]``.
_PER_STORE: Final = (*_REQUIRED, "webhook_store_id")
#: A secret every scheme reads (base64 after ``whsec_``), to check settings without the secret.
_PROBE_SECRET: Final = "whsec_AAAA"
#: Keys whose attribute has another name (``global`` is a Python keyword).
_RENAMED: Final = {"global_rate": "global"}


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
    """``problem`` (a message or an exception) of the key at ``path``."""
    text = problem.problem if isinstance(problem, ConfigError) else str(problem)
    key = _key_path(path) if isinstance(path, tuple | list) else str(path)
    return ConfigError(text, key=key)


def _key_path(path: Sequence[str]) -> str:
    """A key path as written in the file: ``stores."c d".limits``; a quoted key's escapes as
    TOML (and JSON) write them, so that no key breaks the one line it is said in."""
    return ".".join(key if _BARE_KEY_RE.match(key) else _quoted(key) for key in path)


def _quoted(key: str) -> str:
    text = json.dumps(key, ensure_ascii=False)  # C0 controls, quotes and backslashes escaped
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def _given(table: Any) -> dict[str, Any]:
    """A table's keys that are set."""
    fields = {} if table is None else attrs.asdict(table, recurse=False)
    return {k: v for k, v in fields.items() if v is not None}


# -- each key's check: the value it holds, or ValueError (ConfigError) saying what is wrong ---


def _test(test: Callable[[Any], bool], problem: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not test(value):
            raise ValueError(problem.format(value=value))
        return value

    return check


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_whole_number = _test(_whole, "must be a whole number >= 1, got {value!r}")
_seconds = _test(
    lambda v: _number(v) and 0 < v < float("inf"), "must be a number of seconds > 0, got {value!r}"
)
_fraction = _test(
    lambda v: _number(v) and 0 <= v < 1, "must be a fraction in [0, 1), e.g. 0.02, got {value!r}"
)
_share = _test(
    lambda v: _number(v) and 0 < v <= 1, "must be a fraction in (0, 1], e.g. 0.25, got {value!r}"
)
_boolean = _test(lambda v: isinstance(v, bool), "must be true or false, got {value!r}")
_url = _test(lambda v: isinstance(v, str) and bool(v.strip()), "must be a URL")
_server_limits = _test(
    lambda v: v in ("lower", "follow", "ignore"),
    "must be one of lower, follow, ignore, got {value!r}",
)
_env_name = _test(
    lambda v: isinstance(v, str) and bool(_ENV_RE.match(v)),
    "must be the NAME of an environment variable, like ACME_TOKEN (what it holds is not "
    "shown: it may be the secret itself)",
)


def _env_names(value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value  # one name, or a list of them
    if not isinstance(names, list) or not all(
        isinstance(n, str) and _ENV_RE.match(n) for n in names
    ):
        raise ValueError(
            'must be a list of NAMEs of environment variables, like ["ACME_WEBHOOK_SECRET_OLD"] '
            "(what it holds is not shown: it may be a secret itself)"
        )
    return tuple(names)


def _resources(value: Any) -> tuple[str, ...]:
    names = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
    if not names or not value:
        raise ConfigError(f"must be a non-empty list of names ({', '.join(RESOURCES)})")
    unknown = [v for v in value if v not in RESOURCES]
    if unknown:
        raise ConfigError(
            f"unknown resource {', '.join(map(repr, unknown))} (known: {', '.join(RESOURCES)})"
        )
    return tuple(dict.fromkeys(value))


def _incremental(value: Any, _: Any = None) -> Incremental:
    if isinstance(value, Incremental):
        return value
    if (
        not isinstance(value, Mapping)
        or set(value) != {"param", "field"}
        or not all(isinstance(v, str) and v for v in value.values())
    ):
        raise ConfigError(f"must be {_INCREMENTAL}")
    return Incremental(param=value["param"], field=value["field"])


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


def _webhook_setting(setting: str, **context: Any) -> Callable[[Any], Any]:
    """A ``webhook_<setting>`` key checked by ``WebhookConfig`` (``context``: what it needs)."""

    def check(value: Any) -> Any:
        WebhookConfig(_PROBE_SECRET, **context, **{setting: value})
        return value

    return check


def _key(check: Callable[[Any], Any]) -> Any:
    """An optional key of a table: None when absent, else ``check(value)``."""
    return attrs.field(default=None, metadata={"check": check})


# -- the file's shape ------------------------------------------------------------------------


def _table(what: str) -> Callable[[type[T]], type[T]]:
    """Structure the class, a table of ``what``, with the package's converter: keys named as
    its attributes, every other key a problem, each value through its key's check."""

    def hook(check: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
        return lambda value, _: check(value)

    def register(cls: type[T]) -> type[T]:
        overrides = {
            a.name: override(struct_hook=hook(a.metadata["check"]), rename=_RENAMED.get(a.name))
            for a in attrs.fields(cls)  # type: ignore[arg-type]
        }
        fields = make_dict_structure_fn(
            cls,
            converter,
            _cattrs_forbid_extra_keys=True,
            **overrides,  # type: ignore[arg-type]
        )

        def structure(value: Any, _: Any) -> T:
            if not isinstance(value, Mapping):
                raise ValueError(f"must be a table of {what}, got {value!r}")
            return fields(value, cls)

        converter.register_structure_hook(cls, structure)
        return cls

    return register


def _per_resource(check: Callable[[Any], Any], what: str) -> Callable[[Any], dict[str, Any]]:
    """A table of a value per resource, each by ``check``, as a dict."""
    fields = {resource: _key(check) for resource in RESOURCES}
    cls: type[Any] = attrs.make_class("ResourceTable", fields, frozen=True, kw_only=True)
    _table(what)(cls)
    return lambda value: _given(converter.structure(value, cls))


@_table("global, heavy, max_in_flight, max_margin, safety_margin, server_limits")
@attrs.frozen(kw_only=True)
class LimitsTable:
    """``limits``: the store's budget (``Limits``), pool by pool; ``global`` is ``global_rate``."""

    global_rate: Rate | None = _key(parse_rate)  # noqa: RUF009 - an attrs.field
    heavy: Mapping[str, Rate] | None = _key(_per_resource(parse_rate, "resource = rate"))
    max_in_flight: int | None = _key(_whole_number)
    safety_margin: float | None = _key(_fraction)
    max_margin: float | None = _key(_fraction)
    server_limits: str | None = _key(_server_limits)


@_table("keys shared by every store")
@attrs.frozen(kw_only=True)
class StoreOptions:
    """What ``[defaults]`` may set, and each store over it."""

    resources: tuple[str, ...] | None = _key(_resources)
    page_size: int | Literal["max"] | None = _key(check_page_size)
    max_attempts: int | None = _key(_whole_number)
    timeout: float | None = _key(_seconds)
    version: str | None = _key(check_version)
    allow_insecure: bool | None = _key(_boolean)
    limits: LimitsTable | None = _key(  # noqa: RUF009 - an attrs.field
        lambda v: converter.structure(v, LimitsTable)
    )
    incremental: Mapping[str, Incremental] | None = _key(
        _per_resource(_incremental, f"resource = {_INCREMENTAL}")
    )
    webhook_secret_env: str | None = _key(_env_name)
    webhook_previous_secrets_env: tuple[str, ...] | None = _key(_env_names)
    webhook_scheme: str | None = _key(_webhook_setting("scheme"))
    webhook_encoding: str | None = _key(_webhook_setting("encoding"))
    webhook_algorithm: str | None = _key(_webhook_setting("algorithm"))
    webhook_signature_header: str | None = _key(_webhook_setting("signature_header"))
    webhook_signature_prefix: str | None = _key(_webhook_setting("signature_prefix"))
    webhook_timestamp_header: str | None = _key(_webhook_setting("timestamp_header"))
    webhook_id_header: str | None = _key(_webhook_setting("id_header", scheme="standard-webhooks"))
    webhook_timestamp_tolerance: float | None = _key(_seconds)
    webhook_store_key: str | None = _key(check_nonblank)
    redis: str | None = _key(check_redis_url)
    redis_fallback: float | None = _key(_share)


@_table("keys of the store")
@attrs.frozen(kw_only=True)
class StoreTable(StoreOptions):
    """One ``[stores.<id>]`` table: the options, and the store's own address and token."""

    base_url: str | None = _key(_url)
    token_env: str | None = _key(_env_name)
    webhook_store_id: str | None = _key(_store_id)


@_table("keys of the store")
@attrs.frozen(kw_only=True)
class SecretStoreTable(StoreTable):
    """A store's table in dlt's config and secrets: the token itself, not its variable."""

    token: str | None = _key(check_token)


converter.register_structure_hook(Incremental, _incremental)
#: The ``WebhookConfig`` settings a ``webhook_<setting>`` key gives (the secrets are read from
#: the variables ``webhook_secret_env`` and ``webhook_previous_secrets_env`` name).
_WEBHOOK_SETTINGS: Final = [
    key.removeprefix("webhook_")
    for key in attrs.fields_dict(StoreTable)
    if key.startswith("webhook_") and not key.endswith("_env")
]
#: Keys that set the ``Store`` attribute of their name as they are.
_AS_IS: Final = {*attrs.fields_dict(StoreOptions)} & {*attrs.fields_dict(Store)} - {
    "limits",
    "incremental",
}


# -- problems --------------------------------------------------------------------------------


def _unknown(key: str, known: Iterable[str], where: Sequence[str]) -> str:
    if tuple(where) == ("defaults",) and key in _PER_STORE:
        return f"unknown key ({key} is set per store, in each [stores.<id>] table)"
    close = difflib.get_close_matches(key, list(known), n=1)
    return "unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")


def _problems(exc: BaseException, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every problem in what structuring raised, as (key path, problem): the walk of cattrs'
    ``transform_error``, the path kept as keys (each note names an attribute or a table's key)."""
    if isinstance(exc, ClassValidationError | IterableValidationError):
        with_notes, without = exc.group_exceptions()
        for inner, note in with_notes:
            if isinstance(note, AttributeValidationNote):
                key = _RENAMED.get(note.name, note.name)
            else:
                key = str(note.index)
            yield from _problems(inner, (*path, key))
        for inner in without:
            yield from _problems(inner, path)
    elif isinstance(exc, ForbiddenExtraKeysError):
        known = [_RENAMED.get(name, name) for name in attrs.fields_dict(exc.cl)]
        for key in exc.extra_fields:
            yield (*path, key), _unknown(key, known, path)
    else:
        yield path, exc.problem if isinstance(exc, ConfigError) else str(exc)


def _in_file_order(data: Any, path: tuple[str, ...]) -> tuple[int, ...]:
    """Where ``path`` is in the file (TOML tables keep their keys' order)."""
    position = []
    for key in path:
        keys = list(data) if isinstance(data, Mapping) else []
        position.append(keys.index(key) if key in keys else len(keys))
        data = data.get(key) if isinstance(data, Mapping) else None
    return tuple(position)


def _structure(
    cls: type[T], table: Mapping[str, Any], path: tuple[str, ...], problems: list[ConfigError]
) -> T:
    """``table`` as ``cls``, its problems reported, the keys that hold them left out."""
    try:
        return converter.structure(table, cls)
    except (ClassValidationError, ValueError) as exc:
        found = sorted(_problems(exc, path), key=lambda p: _in_file_order(table, p[0][len(path) :]))
    problems.extend(_at(where, problem) for where, problem in found)
    bad = {where[len(path)] for where, _ in found if len(where) > len(path)}
    try:
        return converter.structure({k: v for k, v in table.items() if k not in bad}, cls)
    except (ClassValidationError, ValueError, AttributeError):  # not a table at all
        return cls()


# -- each store ------------------------------------------------------------------------------


def _shown_env(name: str) -> str:
    """A variable's name as a message shows it: not at all unless it reads as one (it may be a
    token pasted where its variable's name goes)."""
    # As people write names: in upper case, with a "_" or short. A token or secret pasted
    # there is rarely either.
    if _SHOWN_ENV_RE.fullmatch(name) and ("_" in name or len(name) <= 8):
        return name
    return "(a name not like NAME_OF_VARIABLE, not shown: it may be a secret)"


def _from_env(name: str, env: Mapping[str, str], check: Callable[[str], object]) -> str:
    """The secret in variable ``name``, ``check``ed; ConfigError naming the variable, never
    the secret."""
    if not env.get(name):
        state = "is empty" if name in env else "is not set"
        raise ConfigError(f"environment variable {_shown_env(name)} {state}")
    try:
        check(env[name])
    except ConfigError as exc:
        raise ConfigError(f"{_shown_env(name)}: {exc}") from None
    return env[name]


class _StoreReader:
    """One ``[stores.<id>]`` table over ``[defaults]``, checked as a whole, each problem said
    of the key the user has to change: the store's own, or the default it took."""

    def __init__(
        self,
        store_id: str,
        table: Mapping[str, Any],
        defaults: StoreOptions,
        env: Mapping[str, str],
        problems: list[ConfigError],
        table_class: type[StoreTable] = StoreTable,
    ) -> None:
        self.where, self.table, self.env, self.problems = ("stores", store_id), table, env, problems
        self.before = len(problems)
        self.own = own = _structure(table_class, table, self.where, problems)
        self.values = {**_given(defaults), **_given(own)}
        # Limits merge key by key, their heavy pools path by path (those not given discover).
        limits = [_given(t) for t in (defaults.limits, own.limits) if t is not None]
        if limits:
            self.values["limits"] = {k: v for t in limits for k, v in t.items()}
            self.values["limits"]["heavy"] = {
                k: v for t in limits for k, v in t.get("heavy", {}).items()
            }

    def check(self, key: str, test: Callable[[], T]) -> T | None:
        """What ``test`` returns, or None, its problem said of ``key``."""
        try:
            return test()
        except ConfigError as exc:
            own = getattr(self.own, key, None) is not None
            self.problems.append(_at((*self.where, key) if own else ("defaults", key), exc))
            return None

    def store(self, listen: str | None) -> Store | None:
        """The store, or None. ``listen``: what the caller calls listening (None: not
        listening, and the webhook secrets are not read)."""
        own, values = self.own, self.values
        for key in ("base_url", "token") if isinstance(own, SecretStoreTable) else _REQUIRED:
            if key not in self.table:
                self.problems.append(_at(self.where, f"{key} is required"))
        version = values.get("version", DEFAULT_VERSION)
        insecure = values.get("allow_insecure", False)
        if own.base_url is not None:
            url, hint = own.base_url, "allow_insecure = true"
            self.check(
                "base_url", lambda: check_base_url(url, version, insecure, insecure_hint=hint)
            )
        token = getattr(own, "token", None) or ""
        if own.token_env is not None:
            name = own.token_env
            token = self.check("token_env", lambda: _from_env(name, self.env, check_token)) or ""
        webhook = self.webhook(listen) if listen else None
        limits = None  # none given: every pool the store's client has discovers its rate
        if "limits" in values:
            limits = self.check("limits", lambda: Limits(**values["limits"], discover=True))
        if len(self.problems) > self.before:
            return None
        incremental = values.get("incremental", {})
        if listen:  # reconciliation pulls are incremental: every resource needs a filter
            incremental = {r: incremental.get(r, LISTEN_INCREMENTAL) for r in RESOURCES}
        return Store(
            name=self.where[1],
            base_url=own.base_url or "",
            token=token,
            token_env=own.token_env or "",
            limits=limits,
            retry=RetryPolicy(max_attempts=values.get("max_attempts", 6)),
            webhook=webhook,
            **{key: values[key] for key in _AS_IS if key in values},
            incremental=incremental,
        )

    def webhook(self, listen: str) -> WebhookConfig | None:
        """The store's webhook receiver from its ``webhook_*`` keys, or None."""
        values = self.values
        scheme = values.get("webhook_scheme", "hmac")

        def secret(key: str, name: str) -> str | None:
            # Read as the scheme reads it: a Standard Webhooks secret must decode.
            read = lambda s: WebhookConfig(s, scheme=scheme)  # noqa: E731
            return self.check(key, lambda: _from_env(name, self.env, read))

        current = None
        if "webhook_secret_env" in values:
            current = secret("webhook_secret_env", values["webhook_secret_env"])
        elif "webhook_secret_env" not in self.table:  # else said to be invalid
            problem = (
                f"webhook_secret_env is required with {listen} (the name of the environment "
                "variable holding the store's webhook secret)"
            )
            self.problems.append(_at(self.where, problem))
        names = values.get("webhook_previous_secrets_env", ())
        previous = [secret("webhook_previous_secrets_env", name) for name in names]
        settings = {
            s: values[f"webhook_{s}"] for s in _WEBHOOK_SETTINGS if f"webhook_{s}" in values
        }
        try:
            if current is None or None in previous:  # the settings are still checked together
                WebhookConfig(_PROBE_SECRET, **settings)
                return None
            return WebhookConfig(current, previous_secrets=previous, **settings)
        except ConfigError as exc:  # settings that do not go together: said of the store's own
            own = any(f"webhook_{s}" in self.table for s in _WEBHOOK_SETTINGS)
            problem = exc.problem if exc.key is None else f"webhook_{exc.key} {exc.problem}"
            self.problems.append(_at(self.where if own else ("defaults",), problem))
            return None


def _bind(
    configs: list[Store], others: Mapping[str, WebhookConfig], problems: list[ConfigError]
) -> list[Store]:
    """``configs`` bound by ``resolve_store_binding`` over every store of the file (``others``:
    those ``only_stores`` left out): stores sharing a secret need distinct webhook_store_id."""
    webhooks = {c.store: c.webhook for c in configs if c.webhook is not None}
    keys = {key for webhook in webhooks.values() for key in webhook.keys}
    # Only those sharing a secret with a selected store: the others' problem is not this run's.
    webhooks.update({s: w for s, w in others.items() if keys & set(w.keys)})
    try:
        bound = resolve_store_binding(
            webhooks, name=lambda store, setting: _key_path(("stores", store, f"webhook_{setting}"))
        )
    except ConfigError as exc:
        problems.append(exc)
        return configs
    return [attrs.evolve(c, webhook=bound.get(c.store, c.webhook)) for c in configs]


# -- the entry points ------------------------------------------------------------------------


def load_config(
    path: Path,
    env: Mapping[str, str],
    *,
    resources: Iterable[str] | None = None,
    only_stores: Iterable[str] | None = None,
    listen: bool = False,
    names: Mapping[str, str] = {},
) -> list[Store]:
    """The stores of ``path``, or ConfigFileError listing every problem by its key.

    ``resources`` replaces each store's list; ``only_stores`` selects stores by id. ``listen``:
    each store's ``webhook`` is made from its ``webhook_*`` keys (its secret must be set), the
    binding resolved over every store of the file, and resources without ``incremental`` get
    ``LISTEN_INCREMENTAL``. ``names``: how the caller names these parameters in messages."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        problem = f"cannot read the config file ({exc.strerror})"
        raise ConfigFileError([_at(path, problem)]) from None
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
    try:
        if not isinstance(value, Mapping):
            raise ValueError(f"must be a table of resource = {_INCREMENTAL}, got {value!r}")
        return converter.structure(value, dict[str, Incremental])
    except (IterableValidationError, ValueError) as exc:
        raise ConfigFileError(
            [_at(at, problem) for at, problem in _problems(exc, (key,))]
        ) from None


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
            at = names.get("only_stores", "only_stores")
            problems.append(_at(at, f"no store {store_id!r} in {path}"))

    configs: list[Store] = []
    others: dict[str, WebhookConfig] = {}
    for store_id, table in stores.items():
        where = ("stores", store_id)
        if wanted is not None and store_id not in wanted:
            # For the binding only: a secret it shares with a selected store would let its
            # deliveries be replayed to that store's URL. Its problems are not this run's.
            if listen and isinstance(table, Mapping):
                scratch: list[ConfigError] = []
                other = _StoreReader(store_id, table, defaults, env, scratch).webhook("")
                if other is not None and not scratch:
                    others[store_id] = other
        elif not isinstance(table, Mapping):
            problems.append(_at(where, "must be a table"))
        elif not store_id.strip():
            problems.append(_at(where, "a store id must not be blank"))
        elif store_id in (".", ".."):  # a webhook URL's segment that clients resolve away
            problems.append(_at(where, "a store id must not be . or .."))
        elif not store_id.isprintable():  # a line break or an escape would forge log lines
            problems.append(_at(where, "a store id must be printable (no control characters)"))
        else:
            reader = _StoreReader(store_id, table, defaults, env, problems, table_class)
            config = reader.store(listen_as)
            if config is not None and override_resources is not None:
                config = attrs.evolve(config, resources=override_resources)
            if config is not None:
                configs.append(config)
    if listen:
        configs = _bind(configs, others, problems)
    if problems:
        raise ConfigFileError(problems)
    return configs
