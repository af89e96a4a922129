"""Testing helpers: ``FakeAdminServer``, a real aiohttp server implementing the admin interface.

It serves deterministic records with cursor pagination, checks ``X-Service-Token``, enforces
per-store rate limits (429 + Retry-After) and injects faults, for the project's tests and
benchmarks and for users' own tests. With pytest-asyncio installed, the ``fake_admin_server``
fixture is available by name (registered through a ``pytest11`` entry point).

Records change over time with a seeded ``Mutator`` (``server.mutator(store)``), and every change
can be sent as a signed webhook by a ``WebhookSender`` (``server.deliver_webhooks(url, secret)``),
so webhook receivers and incremental pulls can be tested end to end on one machine.
"""

from ._faults import Faults, ScriptedResponse
from ._limits import ServerPoolStats, ServerRateLimits, StoreStats
from ._mutations import Mutation, Mutator, Reviser
from ._process import RemoteFakeServer, run_in_process, serve, serve_forever, serve_in_thread
from ._server import FakeAdminServer, Latency, RequestRecord
from ._store import ChangeEvent, FakeStore, FakeStoreConfig, TransitionError
from ._switch import no_waiting, set_waiting
from ._webhook_sender import WebhookDelivery, WebhookSender, WebhookSenderStats

__all__ = [
    "ChangeEvent",
    "FakeAdminServer",
    "FakeStore",
    "FakeStoreConfig",
    "Faults",
    "Latency",
    "Mutation",
    "Mutator",
    "RemoteFakeServer",
    "RequestRecord",
    "Reviser",
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
