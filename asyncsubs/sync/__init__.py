"""Stores synced into a database: what ``asyncsubs sync`` runs, usable on its own.

::

    from asyncsubs.stores import load_config
    from asyncsubs.sync import SyncEngine, run_round, sink_for

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

from ._engine import SyncEngine
from ._listen import DEFAULT_RECONCILE_EVERY, REQUEUE_BELOW_ATTEMPTS, ListenSync, WebhookApplyError
from ._open import DEFAULT_DB_TIMEOUT, sink_for
from ._schedulers import run_round
from ._sink import (
    DEFAULT_LEASE,
    DatabaseConfigError,
    DatabaseError,
    DatabaseUnavailable,
    DeadLetters,
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
    "DEFAULT_DB_TIMEOUT",
    "DEFAULT_LEASE",
    "DEFAULT_RECONCILE_EVERY",
    "DatabaseConfigError",
    "DatabaseError",
    "DatabaseUnavailable",
    "DeadLetters",
    "LeaseLostError",
    "Leases",
    "ListenSync",
    "PageWrite",
    "REQUEUE_BELOW_ATTEMPTS",
    "Records",
    "Sink",
    "SyncEngine",
    "UnitState",
    "UnitStatus",
    "WebhookApplyError",
    "WebhookTables",
    "run_round",
    "sink_for",
]
