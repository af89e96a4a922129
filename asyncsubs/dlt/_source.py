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
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any, Final

import dlt
from dlt.common.typing import TSecretStrValue, TSecretValue
from dlt.extract import DltResource

from .. import _json
from .._client import store_fingerprint
from .._versions import older, version
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
from ._records import SEQ_COLUMN, STORE_COLUMN, Served, exact
from ._session import Pulls, SourceClients

__all__ = ["DEFAULT_LAG", "stores_from_file", "subscription_service"]

log = logging.getLogger("asyncsubs.dlt")

#: Seconds an incremental run reaches back before the high-water mark: as long as a run lasts
#: (an hour: a few million records at the heavy pools' usual rates; docs/dlt.md, "The lag").
DEFAULT_LAG: Final = 3600.0
#: The longest lag: a mark less more than this may fall before the calendar's first year.
_MAX_LAG: Final = 100 * 365 * 86_400
#: Load through parquet (written by pyarrow, in the ``dlt`` extra) where the destination takes
#: it: into DuckDB, many times faster and at a fraction of the memory (docs/dlt.md, "Parquet").
_PARQUET: Final = importlib.util.find_spec("pyarrow") is not None


def _is_id(value: object) -> bool:
    """An id the key column takes as text: a string or a number (not an object, a list, a
    boolean or null, which dlt would load as columns of their own, or no id at all)."""
    return isinstance(value, str | int | float) and not isinstance(value, bool)


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
    field = None if incremental is None else incremental.field

    async def pull() -> AsyncIterator[list[dict[str, Any]]]:
        # On dlt's extract loop: an async resource names itself to read its state.
        state = dlt.current.resource_state(name)
        learned = dlt.current.source_state().setdefault("learned", {})
        started = time.monotonic()
        served = Served(field)
        seq = int(state.get("deletes_seq", 0))
        found = [] if deletes is None else await asyncio.to_thread(deletes.since, seq, path)
        if found:
            # An id beyond 64 bits as pulled records carry one (orjson refuses it as an int).
            gone = [{STORE_COLUMN: d.store, "id": exact(d.id), DELETED_COLUMN: True} for d in found]
            served.number(gone)
            yield gone
        drop = {(d.store, str(d.id)) for d in found}
        # The high-water mark where dlt's own incremental keeps it (so a pipeline that ran
        # with it goes on), kept by the one rule of newer (``_versions``): dlt's compares the
        # stamps as sent, so "09:00:00-05:00" would count as older than "11:00:00Z".
        mark = None if field is None else state.get("incremental", {}).get(field, {})
        mark = None if mark is None else mark.get("last_value")
        start = None if mark is None else _lagged(mark, lag)
        # A store the resource did not pull last run needs its history (all of it, or what
        # changed while it was left out), which the mark would leave out.
        known = set(state.get("stores", ()))
        fresh = [s.name for s in stores if s.name not in known]
        if start is not None and fresh:
            log.info("%s: stores %s pulled in full (not in its last run)", name, fresh)
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
                if not all(isinstance(r, dict) and _is_id(r.get("id")) for r in page.data):
                    raise ProtocolError(
                        f"GET {path}: store {store_name}: a record without an 'id' (a string "
                        "or a number) cannot be merged on (store, id)",
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
        if field is not None:
            if served.newest is not None and (mark is None or older(mark, served.newest)):
                marks = state.setdefault("incremental", {})
                marks[field] = {**marks.get(field, {}), "last_value": served.newest}
            # This run's stores only: one left out of a run missed its changes, which are older
            # than the mark by the time it comes back, and is pulled whole then.
            state["stores"] = sorted(s.name for s in stores)
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


#: The zone at the end of a timestamp's time (its date, ``-01``, is read before).
_ZONE: Final = re.compile(r"(Z|[+-][0-9]{2}(:?[0-9]{2})?)$")


def _lagged(mark: Any, lag: float) -> Any:
    """The filter's value for a run: ``mark`` less ``lag``, in seconds for a timestamp (in the
    mark's own form: a date, an offset, ``Z``), in the field's units for a number (a string of
    digits stays one); text, or a mark the lag would take before the calendar, as it is."""
    kind, value = version(mark) or ("text", mark)
    if not lag or kind == "text":
        return mark
    if kind == "number":
        if not isinstance(mark, str):
            return mark - lag if isinstance(mark, float) or lag % 1 else mark - int(lag)
        start = value - Decimal(repr(lag))
        return str(start.quantize(1)) if start == start.to_integral_value() else str(start)
    try:
        start = value[0] - datetime.timedelta(seconds=lag)  # to the microsecond: earlier still
    except OverflowError:
        return mark
    written = mark.upper()
    if "T" not in written and " " not in written:  # a date: the day the lagged instant falls in
        return start.date().isoformat()
    if not _ZONE.search(written):  # UTC, as it was written
        return start.replace(tzinfo=None).isoformat(sep="T" if "T" in written else " ")
    text = start.isoformat()
    return text.removesuffix("+00:00") + "Z" if written.endswith("Z") else text


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
    if isinstance(stores, str):  # a table as JSON, as dlt takes one from an environment variable
        try:
            stores = _json.loads(stores)
        except ValueError:
            raise ConfigError(
                "stores given as text must be a JSON object of store tables (not shown: it "
                "holds tokens)"
            ) from None
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
    else:  # never the value: it may hold tokens
        raise ConfigError(
            f"stores must be Store objects or a table of tables, got a {type(stores).__name__}"
        )
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
    if isinstance(lag, bool) or not isinstance(lag, int | float) or not 0 <= lag <= _MAX_LAG:
        raise ConfigError(
            f"lag must be a number of seconds from 0 to {_MAX_LAG:.0f} (a century), got {lag!r}"
        )
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
