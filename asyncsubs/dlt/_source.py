"""``subscription_service``: the dlt source, one resource per list endpoint, every store at once.

Each resource is an async generator. dlt runs all of them on one event loop of its own (the
package's docstring says how), where they share one ``AdminClient`` per store
(``SourceClients``). A resource pulls every store that serves its endpoint concurrently, one
task each, and yields each page as it arrives: a whole page per item, records as sent plus
their ``store``.
"""

import asyncio
import datetime
import importlib.util
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final

import dlt
from dlt.common.typing import TSecretStrValue, TSecretValue
from dlt.extract import DltResource
from dlt.extract.incremental import Incremental

from .. import Page
from ..errors import AsyncSubsError, ConfigError, ProtocolError
from ..stores import Unit, check_redis_url
from ._deletes import DELETED_COLUMN, DeleteLog
from ._records import SEQ_COLUMN, STORE_COLUMN, Served
from ._session import DEFAULT_MAX_STORES, SourceClients, StoreSlots
from ._stores import RESOURCES, IncrementalFilter, Store, incremental_filters, stores_from_settings

__all__ = ["DEFAULT_LAG", "subscription_service"]

log = logging.getLogger("asyncsubs.dlt")

#: Seconds an incremental run reaches back before the high-water mark. A record changed while a
#: run pulls may carry a stamp below the newest one that run saw (its page was read before the
#: change), so the next run must reach back at least as far as a run lasts: an hour covers the
#: runs of a few million records at the heavy pools' usual rates, and a run that outlasts the
#: lag says so in a WARNING. The rows reached again are merged on their key: no duplicates.
DEFAULT_LAG: Final = 3600.0
_WRITE_DISPOSITIONS: Final = ("merge", "replace")
#: Load through parquet where the destination takes it: into DuckDB a load of 18,000 records
#: takes 0.8 s instead of 9.4 s and peaks at a fifth of the memory (benchmarks/README.md, dlt).
#: dlt writes parquet with pyarrow (in the ``dlt`` extra); a destination that takes no parquet
#: gets its default format, with dlt's warning; ``pipeline.run(loader_file_format=...)`` wins.
_PARQUET: Final = importlib.util.find_spec("pyarrow") is not None


def _columns(deletes: bool) -> dict[str, Any]:
    # The columns every row holds. The id is text: the one type every id fits exactly (ints
    # beyond 64 bits, strings), and stable across stores and runs. The serve order decides
    # which version of a record served twice in one load the merge keeps (``Served``).
    columns: dict[str, Any] = {
        STORE_COLUMN: {"data_type": "text", "nullable": False},
        "id": {"data_type": "text", "nullable": False},
        SEQ_COLUMN: {"data_type": "bigint", "nullable": False, "dedup_sort": "desc"},
    }
    if deletes:
        columns[DELETED_COLUMN] = {"data_type": "bool", "hard_delete": True}
    return columns


def _checked(store: str, path: str, records: list[Any]) -> list[Any]:
    for record in records:
        if not isinstance(record, dict) or record.get("id") is None:
            raise ProtocolError(
                f"GET {path}: store {store}: a record without an 'id' cannot be merged on "
                "(store, id)",
                method="GET",
                path=path,
            )
    return records


class _Pulls:
    """Every store's pull of one list endpoint, a task each, pages handed over as they arrive.

    Plain methods rather than an async generator: when dlt stops an extract it closes every
    async generator of its loop at once (``shutdown_asyncgens``), the ones in use by others
    included, and the resource's own generator is the one that must do the cleaning up."""

    def __init__(self, pages: Mapping[str, AsyncIterator[Page[Any]]], slots: StoreSlots) -> None:
        self._queue: asyncio.Queue[tuple[str, Page[Any] | None, BaseException | None]] = (
            asyncio.Queue(maxsize=max(1, len(pages)))
        )
        self._slots = slots
        self._tasks = [asyncio.create_task(self._pull(s, p)) for s, p in pages.items()]
        self._running = len(self._tasks)

    async def _pull(self, store: str, pages: AsyncIterator[Page[Any]]) -> None:
        try:
            async with self._slots.hold(store):
                async for page in pages:
                    await self._queue.put((store, page, None))
        except Exception as exc:
            await self._queue.put((store, None, exc))
        else:
            await self._queue.put((store, None, None))

    async def next(self) -> tuple[str, Page[Any]] | None:
        """The next page of any store, None when every store is done. A store's failure is
        raised, its message naming the store: dlt fails the run, and nothing is committed."""
        while self._running:
            store, page, error = await self._queue.get()
            if error is not None:
                if isinstance(error, AsyncSubsError):
                    error.args = (f"store {store}: {error}", *error.args[1:])
                raise error
            if page is not None:
                return store, page
            self._running -= 1
        return None

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _param(value: Any) -> Any:
    """A high-water value as a query parameter (a datetime given as ``initial_value``)."""
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    return value


def _resource(
    name: str,
    path: str,
    clients: SourceClients,
    stores: Sequence[Store],
    incremental: IncrementalFilter | None,
    lag: float,
    deletes: DeleteLog | None,
    write_disposition: str,
) -> DltResource:
    """The resource of one list endpoint: every store that serves it, pulled at once."""

    # One generator function for both kinds: dlt binds an incremental given as the default of
    # an argument annotated with it, and passes None where the default is None.
    # No boundary de-duplication (primary_key=()): dlt's drops a record pulled again at the
    # high-water mark as already seen even when it changed again within that instant; the merge
    # on (store, id) de-duplicates instead, keeping the newest.
    default: Incremental[Any] | None = (
        None
        if incremental is None
        else dlt.sources.incremental(
            incremental.field, lag=lag, primary_key=(), on_cursor_value_missing="include"
        )
    )

    async def pull(
        updated: Incremental[Any] | None = default,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        # Runs on dlt's extract loop: the state is read with the resource's name, as dlt asks of
        # async resources.
        state = dlt.current.resource_state(name)
        learned = dlt.current.source_state().setdefault("learned", {})
        started = time.monotonic()
        served = Served(None if incremental is None else incremental.field)
        drop: set[tuple[str, str]] = set()
        last_seq = seq = int(state.get("deletes_seq", 0))
        if deletes is not None:
            found = await asyncio.to_thread(deletes.since, seq, path)
            if found:
                gone = [{STORE_COLUMN: d.store, "id": d.id, DELETED_COLUMN: True} for d in found]
                served.number(gone)
                yield gone
                drop = {(d.store, str(d.id)) for d in found}
                last_seq = found[-1].seq
        start = None if updated is None else _param(updated.start_value)
        known = set(state.get("stores", ()))
        fresh = [s.name for s in stores if s.name not in known]
        if updated is not None and start is not None and fresh:
            # The high-water mark is the resource's; a store it has never pulled needs its whole
            # history, which the mark's filter would drop. This run passes pages unfiltered and
            # leaves the mark where it was.
            log.info("%s: stores %s pulled in full (new to this pipeline)", name, fresh)
            updated.advance(None)
        pulled: set[str] = set()
        async with clients.open(learned) as session:
            pages = {}
            for store in stores:
                params = {}
                if incremental is not None and start is not None and store.name in known:
                    params[incremental.param] = start
                unit = Unit(session.clients[store.name], store.name, path)
                pages[store.name] = unit.pages(page_size=store.page_size, params=params)
            pulls = _Pulls(pages, session.slots)
            try:
                while (item := await pulls.next()) is not None:
                    store_name, page = item
                    records = _checked(store_name, path, page.data)
                    if drop:
                        records = [r for r in records if (store_name, str(r["id"])) not in drop]
                    if records and (page_rows := served.rows(store_name, records)):
                        yield page_rows
                    if page.next_cursor is None:
                        pulled.add(store_name)
            finally:
                await pulls.aclose()
        # Written only now, and committed by dlt only with the load: a failed run changes none.
        if updated is not None:
            state["stores"] = sorted(known | pulled)
        if last_seq != seq:
            state["deletes_seq"] = last_seq
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

    hints: dict[str, Any] = {
        "name": name,
        "table_name": name,
        "primary_key": (STORE_COLUMN, "id"),
        "write_disposition": write_disposition,
        "columns": _columns(deletes is not None),
    }
    if _PARQUET:
        hints["file_format"] = "parquet"
    return dlt.resource(pull, **hints)


def _resource_name(path: str) -> str:
    return path.strip("/").replace("/", "_")


def _incremental_by_resource(
    paths: Sequence[str], stores: Sequence[Store], given: Mapping[str, IncrementalFilter]
) -> dict[str, IncrementalFilter]:
    """One filter per resource (dlt keeps one high-water mark per resource): the argument's,
    else the stores' own, which must then agree."""
    found: dict[str, IncrementalFilter] = {}
    for path in paths:
        if path in given:
            found[path] = given[path]
            continue
        filters = {s.incremental[path] for s in stores if path in s.incremental}
        if len(filters) > 1:
            raise ConfigError(
                f"incremental.{path}: the stores configure different filters "
                f"({sorted(map(str, filters))}); one resource has one high-water mark, so "
                "give one filter for all stores (the incremental argument)"
            )
        if filters:
            found[path] = filters.pop()
    return found


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
        stores: ``Store`` objects, or (from ``.dlt/secrets.toml``) a table of store tables,
            each with ``base_url`` and ``token``.
        base_url, token, store: one store (``token`` is a secret: ``sources.
            subscription_service.token``); ``store`` names it (default: a fingerprint).
        stores_file: the ``stores.toml`` of ``asyncsubs sync`` (tokens from the variables it
            names).
        resources: which of the interface's list endpoints to load.
        list_paths: other list endpoints with the same pagination (records as sent).
        incremental: ``{resource: {"param": ..., "field": ...}}``, the server's updated-since
            filter per resource (also read from a stores file's ``incremental.<resource>``).
        lag: seconds an incremental run reaches back before the high-water mark.
        redis_url: pace every store through ``RedisLimiter`` there (a store's ``redis`` wins).
        deletes: a ``DeleteLog`` file: its deletes become dlt hard deletes.
        write_disposition: ``"merge"`` on (``store``, ``id``), or ``"replace"`` (every run
            reloads the tables whole; deleted records go with the old rows).
        max_stores: stores pulling at once (each holds an HTTP session and its connections).
    """
    found = stores_from_settings(
        stores=stores, base_url=base_url, token=token, store=store, stores_file=stores_file
    )
    if write_disposition not in _WRITE_DISPOSITIONS:
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
    given = incremental_filters(incremental, "incremental")
    filters = _incremental_by_resource(wanted, found, given)
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
    # Settings each client will be made with, checked now (no I/O): a bad URL or token fails
    # here rather than inside the extract.
    for s in found:
        clients.check(s)
    return [
        _resource(
            _resource_name(path),
            path,
            clients,
            [s for s in found if s.pulls(path)],
            filters.get(path),
            float(lag),
            log_,
            write_disposition,
        )
        for path in wanted
    ]
