"""asyncsubs: asyncio client for the admin interface of a recurring-order subscription service.

Rate limits per store at the edge of the budget, cursor pagination as async generators,
retries, typed errors. See README.md.
"""

from ._client import AdminClient
from ._config import Limits, Rate, RetryPolicy
from ._limiter import Limiter, LocalLimiter, PacingBackend
from ._models import Customer, Order, Page, Subscription
from ._pagination import ListCall, ListEndpoint
from ._protocol import Response
from ._stats import LimiterStats, PoolStats
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
    "Limiter",
    "LimiterStats",
    "LimiterUnavailableError",
    "Limits",
    "ListCall",
    "ListEndpoint",
    "LocalLimiter",
    "NotFoundError",
    "Order",
    "PacingBackend",
    "Page",
    "PermissionDeniedError",
    "PoolStats",
    "ProtocolError",
    "Rate",
    "RateLimitError",
    "Response",
    "RetryPolicy",
    "ServerError",
    "Subscription",
    "TransportError",
    "__version__",
]
