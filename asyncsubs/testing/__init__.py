"""Testing helpers: ``FakeAdminServer``, a real aiohttp server implementing the admin interface.

It serves deterministic records with cursor pagination, checks ``X-Service-Token``, enforces
per-store rate limits (429 + Retry-After) and injects faults, for the project's tests and
benchmarks and for users' own tests. With pytest-asyncio installed, the ``fake_admin_server``
fixture is available by name (registered through a ``pytest11`` entry point).
"""

from ._data import RESOURCES, SUBSCRIPTION_STATUSES
from ._faults import FAULT_KINDS, Faults, ScriptedResponse
from ._limits import DEFAULT_SERVER_HEAVY, ServerPoolStats, ServerRateLimits, StoreStats
from ._process import RemoteFakeServer, run_in_process, serve, serve_forever
from ._server import DEFAULT_VERSION, FakeAdminServer, Latency, RequestRecord
from ._store import DEFAULT_RECORDS, ChangeEvent, FakeStore, FakeStoreConfig, TransitionError
from ._switch import no_waiting, set_waiting

__all__ = [
    "ChangeEvent",
    "DEFAULT_RECORDS",
    "DEFAULT_SERVER_HEAVY",
    "DEFAULT_VERSION",
    "FAULT_KINDS",
    "FakeAdminServer",
    "FakeStore",
    "FakeStoreConfig",
    "Faults",
    "Latency",
    "RESOURCES",
    "RemoteFakeServer",
    "RequestRecord",
    "SUBSCRIPTION_STATUSES",
    "ScriptedResponse",
    "ServerPoolStats",
    "ServerRateLimits",
    "StoreStats",
    "TransitionError",
    "no_waiting",
    "run_in_process",
    "serve",
    "serve_forever",
    "set_waiting",
]
