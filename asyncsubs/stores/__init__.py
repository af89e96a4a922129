"""The store runtime: what every door (``pull``, ``sync``, the dlt source) stands on.

- ``_store``: ``Store``, what a store is (one frozen class), and ``Incremental``;
- ``_config``: a ``stores.toml`` (or dlt's tables) read and checked into ``Store``s;
- ``_learned``: ``LearnedStore``, where what a store's pools learned is kept between runs;
- ``_clients``: ``StoreClients``, the one place that makes a store's ``AdminClient``;
- ``_units``: ``Unit``, one ``(store, resource)`` pulled page by page; ``_events``, what it tells.

A door adds only what is its own: ``pull`` its file and checkpoint, ``sync`` its sinks,
scheduler, leases and listener, the dlt source its rows, hints and state.
"""

from ._clients import StoreClients
from ._config import ConfigFileError, incremental_filters, load_config, stores_from_tables
from ._events import (
    Event,
    Message,
    Observer,
    PageCommitted,
    PoolLearned,
    Retrying,
    RunStarted,
    UnitDone,
    UnitFailed,
    UnitNote,
    UnitStarted,
    UnitStopped,
    WebhookCounts,
    WebhookRefused,
    WorkerIdle,
)
from ._learned import FILE_FORMAT, LearnedFile, LearnedState, LearnedStore
from ._store import (
    DEFAULT_MAX_STORES,
    DEFAULT_PAGE_SIZE,
    LISTEN_INCREMENTAL,
    RESOURCES,
    Incremental,
    Store,
    check_base_url,
    check_redis_url,
    parse_rate,
)
from ._units import Unit, clamped_page_note, describe_error

__all__ = [
    "ConfigFileError",
    "DEFAULT_MAX_STORES",
    "DEFAULT_PAGE_SIZE",
    "Event",
    "FILE_FORMAT",
    "Incremental",
    "LISTEN_INCREMENTAL",
    "LearnedFile",
    "LearnedState",
    "LearnedStore",
    "Message",
    "Observer",
    "PageCommitted",
    "PoolLearned",
    "RESOURCES",
    "Retrying",
    "RunStarted",
    "Store",
    "StoreClients",
    "Unit",
    "UnitDone",
    "UnitFailed",
    "UnitNote",
    "UnitStarted",
    "UnitStopped",
    "WebhookCounts",
    "WebhookRefused",
    "WorkerIdle",
    "check_base_url",
    "check_redis_url",
    "clamped_page_note",
    "incremental_filters",
    "load_config",
    "describe_error",
    "parse_rate",
    "stores_from_tables",
]
