"""What a store is: ``Store``, one frozen class for every door, and the values it is made of.

A store is named (``name``: its identity for pacing, learned limits, logs and rows), reached at
``base_url`` with ``token``, paced by ``limits``, its ``resources`` each with an optional
``Incremental`` filter. Its checks are its attributes' validators; ``_config`` makes one from a
``stores.toml`` or dlt's config as keyword arguments do.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Literal

import attrs

from .. import Limits, Rate, RetryPolicy
from .._config import MAX_PER, MAX_STARTS, check_redis_url
from ..errors import ConfigError
from ..settings import DEFAULT_VERSION, versioned_base
from ..webhooks import WebhookConfig

__all__ = [
    "DEFAULT_MAX_STORES",
    "DEFAULT_PAGE_SIZE",
    "RESOURCES",
    "Incremental",
    "LISTEN_INCREMENTAL",
    "Store",
    "check_base_url",
    "check_nonblank",
    "check_page_size",
    "check_redis_url",
    "parse_rate",
]

#: The interface's list endpoints.
RESOURCES: Final = ("subscriptions", "customers", "orders")
#: Records per request unless configured: the largest page the server serves, learned while
#: pulling. The heavy list pools allow a few requests a second: page size makes a pull fast.
DEFAULT_PAGE_SIZE: Final = "max"
#: Stores pulled at once by one process: each holds a few connections (file descriptors).
DEFAULT_MAX_STORES: Final = 32

_RATE_RE: Final = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d*)?|\.\d+)?\s*s?\s*$")
_RATE_HINT: Final = 'a rate looks like "50/s", "2/3s", 50 (per second) or { n = 2, per = 3.0 }'


def parse_rate(value: object) -> Rate:
    """``"50/s"``, ``"2/3s"``, ``50`` (per second) or ``{n = 2, per = 3.0}``; ConfigError
    (naming no internal field) otherwise."""
    if isinstance(value, Rate):
        return value
    n, per = value, 1.0
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
    try:
        return Rate(n, per=per)  # type: ignore[arg-type]
    except ConfigError:  # Rate's own checks, said in the file's terms
        whole = isinstance(n, int) and not isinstance(n, bool) and n > 0  # Rate checks n first
        what = "a whole number of requests >= 1"
        if whole:
            too_many = n > MAX_STARTS  # type: ignore[operator]
            what = f"at most {MAX_STARTS:,} requests" if too_many else "a period of seconds"
            what += "" if too_many else f" > 0 and at most {MAX_PER:,.0f} (a day)"
        raise ConfigError(f"a rate needs {what}, got {value!r}") from None


def check_base_url(url: object, version: str, allow_insecure: bool, *, insecure_hint: str) -> str:
    """``url`` checked as the client checks it (ConfigError), a plain-http one naming how the
    caller allows it (``insecure_hint``: a parameter or a config key)."""
    hint = f"{insecure_hint} on a trusted network"
    versioned_base(url, version, allow_insecure=allow_insecure, insecure_hint=hint)  # type: ignore[arg-type]
    assert isinstance(url, str)
    return url


def check_nonblank(value: Any, what: str = "value") -> str:
    """``value``, a non-empty string, or ConfigError (``what``: what it is)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"must be a non-empty string, got {value!r}", key=what, sep=" ")
    return value


def check_page_size(size: Any) -> int | Literal["max"]:
    """``size``, records per request: ``"max"`` (the largest page, learned) or an int >= 1."""
    if size != "max" and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        problem = f'must be a whole number >= 1 or "max" (the largest page, learned), got {size!r}'
        raise ConfigError(problem, key="page_size", sep=" ")
    return size  # type: ignore[no-any-return]


def _validates(check: Callable[..., object], *what: str) -> Any:
    """``check`` as an attrs validator."""
    return lambda _, __, value: check(value, *what)


@attrs.frozen
class Incremental:
    """A list endpoint's updated-since filter: pass query parameter ``param`` = a high-water
    value of record field ``field`` (the interface names none; the fake server's is
    ``updatedAtMin`` on ``updatedAt``): a store's ``incremental.<resource>``."""

    param: str = attrs.field(validator=_validates(check_nonblank, "incremental param"))
    field: str = attrs.field(validator=_validates(check_nonblank, "incremental field"))


#: The filter a sync that listens to webhooks reconciles with where a resource configures
#: none: the fake server's name (the interface does not name one; configure
#: ``incremental.<resource>``).
LISTEN_INCREMENTAL: Final = Incremental(param="updatedAtMin", field="updatedAt")


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen
class Store:
    """One store, as every door pulls it (one ``AdminClient`` for all of its resources).

    ``limits=None`` discovers the heavy pools' rates (``Limits(discover=True)``) and
    ``page_size="max"`` the largest page (README, "Discovery"); give a ``Limits`` or an int to
    pin them. ``resources``: the list endpoints this store serves (a store that serves all of
    the interface's also serves any other list path a door pulls). ``redis``: a ``redis://``
    URL to pace through ``RedisLimiter`` there, the store's budget shared with every other
    process pacing through it. ``webhook``: its webhook receiver, when a sync listens.
    """

    name: str = attrs.field(validator=_validates(check_nonblank, "a store's name"))
    base_url: str
    token: str = attrs.field(repr=False)
    limits: Limits | None = None
    page_size: int | Literal["max"] = attrs.field(
        default=DEFAULT_PAGE_SIZE, validator=_validates(check_page_size)
    )
    retry: RetryPolicy | None = None
    timeout: float = 30.0
    version: str = DEFAULT_VERSION
    allow_insecure: bool = False
    resources: tuple[str, ...] = attrs.field(default=RESOURCES, converter=_names)
    incremental: Mapping[str, Incremental] = attrs.field(factory=dict)
    redis: str | None = attrs.field(
        default=None, repr=False, validator=attrs.validators.optional(_validates(check_redis_url))
    )
    #: While that Redis fails, pace in this process alone at this fraction of each rate
    #: (``RedisLimiter``'s ``fallback_fraction``); None: requests fail.
    redis_fallback: float | None = None
    #: The environment variables the token and the webhook secret were read from, if any.
    token_env: str = ""
    webhook: WebhookConfig | None = None
    webhook_secret_env: str = ""

    @property
    def store(self) -> str:
        """The store's identity (its ``name``), as events and rows call it."""
        return self.name

    def pulls(self, resource: str) -> bool:
        """Whether this store serves ``resource`` (another list path: if it serves all)."""
        if resource in RESOURCES:
            return resource in self.resources
        return set(RESOURCES) <= set(self.resources)
