"""Stores synced into a database: what ``asyncsubs sync`` runs, usable on its own.

::

    from asyncsubs.sync import SyncEngine, load_config, run_round, sink_for

    configs = load_config(Path("stores.toml"), os.environ)   # ConfigFileError: .problems
    sink = sink_for("sqlite:///subs.db")                     # or postgresql://...
    with sink.lock():                                        # SQLite: one writer at a time
        async with sink, SyncEngine(configs, sink, print) as engine:
            await run_round(engine)                          # every (store, resource) once

A synced page passes ``asyncsubs.stores`` (the stores, their clients, a unit's pull), then
``_engine`` (``SyncEngine.pull``: each page committed with its cursor, events told to an
observer), chosen by ``_schedulers`` (``run_round``: in one process, or shared by workers
through leases), into a sink: ``_sink`` (its roles, ``SQLSink``'s shared statements),
``sqlite`` or ``postgres``, picked by ``_open.sink_for``. ``_listen.ListenSync`` applies
webhooks and reconciles them by pulls. How progress is shown is the observer's business.
"""

from ..stores import (
    DEFAULT_MAX_STORES,
    DEFAULT_PAGE_SIZE,
    LISTEN_INCREMENTAL,
    ConfigFileError,
    Event,
    Incremental,
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
    check_base_url,
    check_redis_url,
    clamped_page_note,
    describe_error,
    load_config,
    parse_rate,
)
from ..stores import Store as StoreConfig
from ._engine import SyncEngine
from ._listen import DEFAULT_RECONCILE_EVERY, REQUEUE_BELOW_ATTEMPTS, ListenSync, WebhookApplyError
from ._open import DEFAULT_DB_TIMEOUT, sink_for
from ._schedulers import run_round
from ._sink import (
    DEFAULT_LEASE,
    RESOURCES,
    DatabaseConfigError,
    DatabaseError,
    DatabaseUnavailable,
    DeadLetters,
    LearnedLimits,
    LeaseLostError,
    Leases,
    PageWrite,
    Records,
    Sink,
    UnitState,
    UnitStatus,
    WebhookTables,
)

__all__ = [
    "ConfigFileError",
    "DEFAULT_DB_TIMEOUT",
    "DEFAULT_LEASE",
    "DEFAULT_MAX_STORES",
    "DEFAULT_PAGE_SIZE",
    "DEFAULT_RECONCILE_EVERY",
    "DatabaseConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "DeadLetters",
    "Event",
    "Incremental",
    "LISTEN_INCREMENTAL",
    "LearnedLimits",
    "LeaseLostError",
    "Leases",
    "ListenSync",
    "Message",
    "Observer",
    "PageCommitted",
    "PageWrite",
    "PoolLearned",
    "REQUEUE_BELOW_ATTEMPTS",
    "RESOURCES",
    "Records",
    "Retrying",
    "RunStarted",
    "Sink",
    "StoreConfig",
    "SyncEngine",
    "UnitDone",
    "UnitFailed",
    "UnitNote",
    "UnitStarted",
    "UnitState",
    "UnitStatus",
    "UnitStopped",
    "WebhookApplyError",
    "WebhookCounts",
    "WebhookRefused",
    "WebhookTables",
    "WorkerIdle",
    "check_base_url",
    "check_redis_url",
    "clamped_page_note",
    "describe_error",
    "load_config",
    "parse_rate",
    "run_round",
    "sink_for",
]
