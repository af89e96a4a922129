"""asyncsubs: asyncio client for the admin interface of a recurring-order subscription service.

Rate limits per store at the edge of the budget, cursor pagination as async generators,
retries, typed errors. See README.md. Beside this namespace: ``asyncsubs.errors`` (the error
tree, re-exported here), ``asyncsubs.limiting`` (the limiter's parts, for pacing backends and
statistics), ``asyncsubs.settings`` (the client's checks of its settings), ``asyncsubs.json``
(its JSON codec), ``asyncsubs.redis``, ``asyncsubs.webhooks``, ``asyncsubs.sync`` (stores
synced into a database, what the command line runs) and ``asyncsubs.testing``.
"""

from ._client import AdminClient
from ._config import Limits, Rate, RetryPolicy
from ._models import Customer, Order, Page, Subscription
from ._pagination import ListCall, ListEndpoint
from ._protocol import Response
from ._retry import RetryEvent
from ._version import __version__
from .errors import (
    APIError,
    AsyncSubsError,
    AuthenticationError,
    BadRequestError,
    ConfigError,
    LimiterUnavailableError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitError,
    ServerError,
    TransportError,
)

__all__ = [
    "APIError",
    "AdminClient",
    "AsyncSubsError",
    "AuthenticationError",
    "BadRequestError",
    "ConfigError",
    "Customer",
    "LimiterUnavailableError",
    "Limits",
    "ListCall",
    "ListEndpoint",
    "NotFoundError",
    "Order",
    "Page",
    "PermissionDeniedError",
    "ProtocolError",
    "Rate",
    "RateLimitError",
    "Response",
    "RetryEvent",
    "RetryPolicy",
    "ServerError",
    "Subscription",
    "TransportError",
    "__version__",
]
