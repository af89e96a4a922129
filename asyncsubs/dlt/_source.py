"""``subscription_service``: the dlt source, one resource per list endpoint, every store at once.

Each resource is an async generator sharing one ``AdminClient`` per store (``SourceClients``)
with the others; it pulls every store that serves its endpoint at once and yields each page as
it arrives, a whole page per item: records as sent plus their ``store``.
"""

import asyncio
import datetime
import importlib.util
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import dlt
from dlt.common.typing import TSecretStrValue, TSecretValue
from dlt.extract import DltResource
from dlt.extract.incremental import Incremental

from .._client import store_fingerprint
from ..errors import ConfigError, ProtocolError
from ..settings import DEFAULT_VERSION, versioned_base
from ..stores import (
    DEFAULT_MAX_STORES,
    RESOURCES,
    Store,
    Unit,
    check_redis_url,
    incremental_filters,
    load_config,
    stores_from_tables,
)
from ..stores import Incremental as IncrementalFilter
from ._deletes import DELETED_COLUMN, DeleteLog
from ._records import SEQ_COLUMN, STORE_COLUMN, Served
from ._session import Pulls, SourceClients

__all__ = ["DEFAULT_LAG", "stores_from_file", "subscription_service"]

log = logging.getLogger("asyncsubs.dlt")

#: Seconds an incremental run reaches back before the high-water mark: as long as a run lasts
#: (an hour: a few million records at the heavy pools' usual rates; docs/dlt.md, "The lag").
DEFAULT_LAG: Final = 3600.0
#: Load through parquet (written by pyarrow, in the ``dlt`` extra) where the destination takes
#: it: into DuckDB, many times faster and at a fraction of the memory (docs/dlt.md, "Parquet").
_PARQUET: Final = importlib.util.find_spec("pyarrow") is not None


def _resource(
    path: str,
    clients: SourceClients,
    incremental: IncrementalFilter | None,
    lag: float,
    deletes: DeleteLog | None,
    write_disposition: str,
) -> DltResource:
    """The resource of one list endpoint: every store that serves it, pulled at once."""
    name = path.strip("/").replace("/", "_")
    stores = [s for s in clients.stores if s.pulls(path)]
    # dlt binds an incremental given as an argument's default (None: none). No boundary
    # de-duplication (primary_key=()): it would drop a record changed again within the mark's
    # instant as already seen; the merge on (store, id) keeps the newest instead.
    default: Incremental[Any] | None = None
    if incremental is not None:
        default = dlt.sources.incremental(
            incremental.field, lag=lag, primary_key=(), on_cursor_value_missing="include"
        )

    async def pull(
        updated: Incremental[Any] | None = default,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        # On dlt's extract loop: an async resource names itself to read its state.
        state = dlt.current.resource_state(name)
        learned = dlt.current.source_state().setdefault("learned", {})
        started = time.monotonic()
        served = Served(None if incremental is None else incremental.field)
        seq = int(state.get("deletes_seq", 0))
        found = [] if deletes is None else await asyncio.to_thread(deletes.since, seq, path)
        if found:
            gone = [{STORE_COLUMN: d.store, "id": d.id, DELETED_COLUMN: True} for d in found]
            served.number(gone)
            yield gone
        drop = {(d.store, str(d.id)) for d in found}
        start = None if updated is None else updated.start_value
        if isinstance(start, datetime.datetime | datetime.date):  # a datetime initial_value
            start = start.isoformat()
        known = set(state.get("stores", ()))
        fresh = [s.name for s in stores if s.name not in known]
        if updated is not None and start is not None and fresh:
            # A store the resource never pulled needs its whole history, which the mark would
            # filter out: this run passes pages unfiltered and leaves the mark where it was.
            log.info("%s: stores %s pulled in full (new to this pipeline)", name, fresh)
            updated.advance(None)
        since = {} if incremental is None or start is None else {incremental.param: start}
        run = await clients.enter(learned)
        pages = {}
        for store in stores:
            unit = Unit(run.clients[store.name], store.name, path)
            params = since if store.name in known else None
            pages[store.name] = unit.pages(page_size=store.page_size, params=params)
        pulls = Pulls(run, pages)
        try:
            async for store_name, page in pulls:
                if any(not isinstance(r, dict) or r.get("id") is None for r in page.data):
                    raise ProtocolError(
                        f"GET {path}: store {store_name}: a record without an 'id' cannot be "
                        "merged on (store, id)",
                        method="GET",
                        path=path,
                    )
                records = page.data
                if drop:
                    records = [r for r in records if (store_name, str(r["id"])) not in drop]
                if page_rows := served.rows(store_name, records):
                    yield page_rows
        except GeneratorExit:  # closed at a page (``add_limit``): what was learned is kept
            pulls.stop()
            await clients.leave(run)
            raise
        except BaseException:
            # Failed, or stopped by dlt ending the extract (Ctrl-C, another resource failed),
            # which does not wait: the run's own loop winds the pulls down.
            pulls.stop()
            clients.abandon(run)
            raise
        await clients.leave(run)
        # Every store pulled to its last page. Written only now, and committed by dlt only with
        # the load: a failed run changes none.
        if updated is not None:
            state["stores"] = sorted(known | {s.name for s in stores})
        if found:
            state["deletes_seq"] = found[-1].seq
        if served.dropped:
            log.info(
                "%s: %d records were served again in an older version; the newer one is kept",
                name,
                served.dropped,
            )
        took = time.monotonic() - started
        if incremental is not None and took > lag:
            log.warning(
                "%s: this run took %.0f s, longer than the incremental lag (%.0f s): records "
                "changed early in it may be missed next run; pass lag=%d or more",
                name,
                took,
                lag,
                math.ceil(2 * took),
            )

    # The id is text: every id fits it exactly (ints beyond 64 bits, strings), in every store.
    columns: dict[str, Any] = {
        STORE_COLUMN: {"data_type": "text", "nullable": False},
        "id": {"data_type": "text", "nullable": False},
        SEQ_COLUMN: {"data_type": "bigint", "nullable": False, "dedup_sort": "desc"},
    }
    if deletes is not None:
        columns[DELETED_COLUMN] = {"data_type": "bool", "hard_delete": True}
    hints: dict[str, Any] = {
        "name": name,
        "table_name": name,
        "primary_key": (STORE_COLUMN, "id"),
        "write_disposition": write_disposition,
        "columns": columns,
        "file_format": "parquet" if _PARQUET else None,
    }
    return dlt.resource(pull, **hints)


def _stores(
    stores: object, base_url: str | None, token: str | None, store: str | None, path: str | None
) -> list[Store]:
    """The stores of one of the source's three forms: ``stores`` (``Store``s, or a table of
    tables from dlt's config), ``base_url`` + ``token`` (one store), or a stores file."""
    forms = {"stores": stores, "base_url": base_url, "stores_file": path}
    given = [form for form, value in forms.items() if value is not None]
    if len(given) != 1:
        raise ConfigError(
            "subscription_service needs exactly one of: stores (Store objects, or a "
            "[sources.subscription_service.stores.<name>] table in .dlt/secrets.toml), "
            "base_url with token (one store), or stores_file (the stores.toml of asyncsubs "
            f"sync); got {', '.join(given) or 'none'}"
        )
    if path is not None:
        return stores_from_file(path)
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
        stores = [stores]
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
    if len({s.name for s in found}) != len(found):
        raise ConfigError(f"store names must be unique, got {[s.name for s in found]}")
    return found


def stores_from_file(path: str | os.PathLike[str]) -> list[Store]:
    """The stores of a ``stores.toml`` as ``asyncsubs sync`` reads it (tokens from the
    environment variables it names); ConfigError listing every problem otherwise."""
    return load_config(Path(path), os.environ)


@dlt.source(name="subscription_service")
def subscription_service(
    # A secret as a whole: tables from .dlt/secrets.toml hold tokens, and dlt's trace shows the
    # value of every resolved argument that is not one.
    stores: TSecretValue | None = None,
    base_url: str | None = None,
    token: TSecretStrValue | None = None,
    store: str | None = None,
    stores_file: str | None = None,
    resources: Sequence[str] = RESOURCES,
    list_paths: Sequence[str] = (),
    incremental: dict[str, Any] | None = None,
    lag: float = DEFAULT_LAG,
    redis_url: TSecretStrValue | None = None,
    deletes: str | None = None,
    write_disposition: str = "merge",
    max_stores: int = DEFAULT_MAX_STORES,
) -> list[DltResource]:
    """Subscriptions, customers and orders (and any other list endpoint) of one store or many.

    Args:
        stores: ``Store`` objects, or (from ``.dlt/secrets.toml``) a table of store tables.
        base_url, token, store: one store (``token`` a secret); ``store`` names it (default:
            a fingerprint).
        stores_file: the ``stores.toml`` of ``asyncsubs sync`` (tokens from its variables).
        resources: which of the interface's list endpoints to load.
        list_paths: other list endpoints with the same pagination (records as sent).
        incremental: ``{resource: {"param": ..., "field": ...}}``, the server's updated-since
            filter per resource (also read from a stores file's ``incremental.<resource>``).
        lag: seconds an incremental run reaches back before the high-water mark.
        redis_url: pace every store through ``RedisLimiter`` there (a store's ``redis`` wins).
        deletes: a ``DeleteLog`` file: its deletes become dlt hard deletes.
        write_disposition: ``"merge"`` on (``store``, ``id``), or ``"replace"`` (each run
            reloads the tables whole).
        max_stores: stores pulling at once (each holds an HTTP session and its connections).
    """
    found = _stores(stores, base_url, token, store, stores_file)
    if write_disposition not in ("merge", "replace"):
        raise ConfigError(
            f"write_disposition must be 'merge' or 'replace', got {write_disposition!r}"
        )
    wanted = list(dict.fromkeys([*resources, *list_paths]))
    unknown = [r for r in resources if r not in RESOURCES]
    if unknown:
        raise ConfigError(
            f"unknown resources {unknown} (known: {', '.join(RESOURCES)}; name other list "
            "endpoints in list_paths)"
        )
    if isinstance(lag, bool) or not isinstance(lag, int | float) or lag < 0:
        raise ConfigError(f"lag must be a number of seconds >= 0, got {lag!r}")
    # One filter per resource (dlt keeps one high-water mark per resource): the argument's,
    # else the stores' own, which must then agree.
    given = incremental_filters(incremental, "incremental")
    filters = {}
    for path in wanted:
        own = {s.incremental[path] for s in found if path in s.incremental}
        if path not in given and len(own) > 1:
            raise ConfigError(
                f"incremental.{path}: the stores configure different filters "
                f"({sorted(map(str, own))}); one resource has one high-water mark, so "
                "give one filter for all stores (the incremental argument)"
            )
        if path in given or own:
            filters[path] = given.get(path) or own.pop()
    if filters and write_disposition == "replace":
        raise ConfigError(
            "write_disposition='replace' with incremental: each run would replace the tables "
            "with the records changed since the last one; use one or the other"
        )
    log_ = None if deletes is None else DeleteLog(deletes)
    if log_ is not None and write_disposition != "merge":
        raise ConfigError("deletes are applied by merging: write_disposition must be 'merge'")
    if isinstance(max_stores, bool) or not isinstance(max_stores, int) or max_stores < 1:
        raise ConfigError(f"max_stores must be a whole number >= 1, got {max_stores!r}")
    redis = None if redis_url is None else check_redis_url(str(redis_url), where="redis_url")
    clients = SourceClients(found, wanted, redis, max_stores)
    return [
        _resource(path, clients, filters.get(path), float(lag), log_, write_disposition)
        for path in wanted
    ]
