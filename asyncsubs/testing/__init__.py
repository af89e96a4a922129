"""Testing helpers: ``FakeAdminServer``, a real aiohttp server implementing the admin interface.

It serves deterministic records with cursor pagination, checks ``X-Service-Token``, enforces
per-store rate limits (429 + Retry-After) and injects faults, for the project's tests and
benchmarks and for users' own tests. With pytest-asyncio installed, the ``fake_admin_server``
fixture is available by name (registered through a ``pytest11`` entry point).

Records change over time with a seeded ``Mutator`` (``server.mutator(store)``), and every change
can be sent as a signed webhook by a ``WebhookSender`` (``server.deliver_webhooks(url, secret)``),
so webhook receivers and incremental pulls can be tested end to end on one machine.
"""

from ._data import RESOURCES, SUBSCRIPTION_STATUSES
from ._faults import FAULT_KINDS, Faults, ScriptedResponse
from ._limits import DEFAULT_SERVER_HEAVY, ServerPoolStats, ServerRateLimits, StoreStats
from ._mutations import DEFAULT_MUTATION_WEIGHTS, MUTATION_KINDS, Mutation, Mutator
from ._process import RemoteFakeServer, run_in_process, serve, serve_forever, serve_in_thread
from ._server import (
    DEFAULT_INCREMENTAL_PARAM,
    DEFAULT_VERSION,
    FakeAdminServer,
    Latency,
    RequestRecord,
)
from ._store import DEFAULT_RECORDS, ChangeEvent, FakeStore, FakeStoreConfig, TransitionError
from ._switch import no_waiting, set_waiting
from ._webhook_sender import WebhookDelivery, WebhookSender, WebhookSenderStats

__all__ = [
    "ChangeEvent",
    "DEFAULT_INCREMENTAL_PARAM",
    "DEFAULT_RECORDS",
    "DEFAULT_SERVER_HEAVY",
    "DEFAULT_VERSION",
    "DEFAULT_MUTATION_WEIGHTS",
    "FAULT_KINDS",
    "FakeAdminServer",
    "FakeStore",
    "FakeStoreConfig",
    "Faults",
    "Latency",
    "MUTATION_KINDS",
    "Mutation",
    "Mutator",
    "RESOURCES",
    "RemoteFakeServer",
    "RequestRecord",
    "SUBSCRIPTION_STATUSES",
    "ScriptedResponse",
    "ServerPoolStats",
    "ServerRateLimits",
    "StoreStats",
    "TransitionError",
    "WebhookDelivery",
    "WebhookSender",
    "WebhookSenderStats",
    "no_waiting",
    "run_in_process",
    "serve",
    "serve_forever",
    "serve_in_thread",
    "set_waiting",
]
