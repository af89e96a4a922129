"""Stores synced into a database: what ``asyncsubs sync`` runs, usable on its own.

::

    from asyncsubs.sync import SyncEngine, load_config, run_round, sink_for

    configs = load_config(Path("stores.toml"), os.environ)   # ConfigFileError: .problems
    sink = sink_for("sqlite:///subs.db")                     # or postgresql://...
    with sink.lock():                                        # SQLite: one writer at a time
        async with sink, SyncEngine(configs, sink, print) as engine:
            await run_round(engine)                          # every (store, resource) once

The parts, in the order one synced page passes them:

- ``asyncsubs.stores``: the stores (``load_config``), their clients, a unit's pull;
- ``_engine``: ``SyncEngine.pull`` runs one unit, a ``(store, resource)``, page by page, each
  page committed with its cursor; it tells an observer what happens;
- ``_schedulers``: ``run_round``, every unit once: in one process, or shared by workers
  through the sink's leases;
- ``_sink``: the roles a sink plays (``Records``, ``LearnedLimits``, ``WebhookTables``,
  ``Leases``; ``Sink``: all of them) and the statements both sinks run; ``sqlite`` and ``postgres``
  the two sinks, each with its webhook inbox and dead letters; ``_open``: ``sink_for(url)``,
  the one place that picks one;
- ``_listen``: ``ListenSync``, webhooks applied to the sink and reconciled by pulls.

The engine knows nothing of how progress is shown: the command line's live table, plain lines
and JSON lines are observers of its events.
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
