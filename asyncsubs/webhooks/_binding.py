"""Which store a delivery is for: bind only where binding protects something.

With a secret of its own, a store's URL and the signature identify the store, and the body need
not name it. With one secret for several stores, a genuine delivery for one store could be
replayed to another's URL, so each store's receiver checks a signed field (``store_key``)
against the value the service sends for that store (``store_id``): it may be a shop domain or a
numeric id rather than the name the user gave the store.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from ..errors import ConfigError
from ._config import WebhookConfig
from ._refusals import DeliveryRefused, Refusal

__all__ = ["check_store", "resolve_store_binding"]


def check_store(config: WebhookConfig, store: str | None, named: str | None) -> None:
    """Raise ``DeliveryRefused`` (wrong store) when a verified delivery whose signed body names
    ``named`` (in ``store_key``; None when it names none) is not for the receiver of ``store``."""
    field = config.store_key
    if config.store_id is not None:
        if named != config.store_id:
            said = "names no store" if named is None else f"names store {named!r}"
            raise DeliveryRefused(
                Refusal.WRONG_STORE,
                f"its signed body {said} in {field!r}, not this store's {config.store_id!r} "
                "(store_id)",
            )
        return
    if config.shared_secret is None and store is not None and named not in (None, store):
        raise DeliveryRefused(
            Refusal.WRONG_STORE,
            f"its signed body names store {named!r} in {field!r}, not {store!r}; if that is "
            "how the service names this store, set store_id to it, and if this secret is the "
            "store's own, shared_secret=False",
        )


def _library_name(store: str, key: str) -> str:
    return f"{key} of store {store}"


def resolve_store_binding(
    configs: Mapping[str, WebhookConfig],
    *,
    name: Callable[[str, str], str] = _library_name,
) -> dict[str, WebhookConfig]:
    """The stores' configs (store -> config) with ``shared_secret`` said from the secrets
    themselves: True for a store whose secrets (current or previous) another store's config
    also holds, False for the others (unless already True). Stores sharing a secret must each
    have a ``store_id``, and different ones; else one ConfigError names every setting to add,
    each as ``name(store, key)`` with key ``"store_id"`` or ``"store_key"`` (e.g. a CLI's
    ``stores.<store>.webhook_store_id``), so that a service cannot be started with a secret
    that lets one store's deliveries be replayed to another."""
    holders: dict[bytes, list[str]] = {}
    for store, config in configs.items():
        for key in set(config.keys):
            holders.setdefault(key, []).append(store)
    sharing: dict[str, set[str]] = {store: set() for store in configs}
    for stores in holders.values():
        for store in stores:
            sharing[store].update(other for other in stores if other != store)

    problems: list[str] = []
    reported: set[frozenset[str]] = set()
    for store, others in sharing.items():
        if not others:
            continue
        group = frozenset({store, *others})
        if group in reported:
            continue
        reported.add(group)
        members = sorted(group)
        unbound = [s for s in members if configs[s].store_id is None]
        if unbound:
            missing = [name(s, "store_id") for s in unbound]
            missing += [name(s, "store_key") for s in members if configs[s].store_key is None]
            fields = " / ".join(sorted({repr(configs[s].store_key) for s in members} - {"None"}))
            problems.append(
                f"stores {', '.join(members)} share a webhook secret, so a delivery for one "
                f"could be replayed to another's URL: set {', '.join(missing)} (the value the "
                f"service sends for each store in the signed field {fields or 'that names it'}), "
                "or give each store a secret of its own"
            )
            continue
        seen: dict[str, str] = {}
        for member in members:
            value = str(configs[member].store_id)
            if value in seen:
                problems.append(
                    f"stores {seen[value]} and {member} share a webhook secret and the same "
                    f"store id {value!r}: set {name(seen[value], 'store_id')} and "
                    f"{name(member, 'store_id')} to the value the service sends for each"
                )
            seen.setdefault(value, member)
    if problems:
        raise ConfigError("; ".join(problems))
    return {
        store: config
        if config.shared_secret is True
        else attrs.evolve(config, shared_secret=bool(sharing[store]))
        for store, config in configs.items()
    }
