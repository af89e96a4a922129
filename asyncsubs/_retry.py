"""The retry policy's decisions, with no I/O: whether a failed attempt is tried again, and after
how long. The loop that applies them is ``AdminClient._call``.

A 429 is not waited out here: the client pauses the store's whole pool in the rate limiter for
the server's Retry-After (see ``pause_after_429``), and the retried attempt queues behind that
pause like every other request of the pool. Another error answer with a Retry-After (a 503) waits
what it says; everything else a capped exponential backoff with full jitter.
"""

from __future__ import annotations

import asyncio
import random
from typing import Final

import attrs

from ._config import RetryPolicy
from ._protocol import Request
from .errors import (
    APIError,
    AsyncSubsError,
    ProtocolError,
    RateLimitError,
    ServerError,
    TransportError,
)

__all__ = [
    "RetryEvent",
    "cancellations",
    "pause_after_429",
    "retry_delay",
    "set_waiting",
    "waiting_enabled",
]

#: The longest pause a Retry-After may put a pool in (seconds); requests fail fast meanwhile.
MAX_PAUSE: Final = 86_400.0

# The testing switch (see asyncsubs.testing.no_waiting): when off, backoffs and 429 pauses are 0.
# A module global, as stamina's, so that one switch reaches every client in every task and
# thread of a test process; read only once a request failed or a server said none are left.
_waiting = True


def cancellations() -> int:
    """The running task's pending cancellations (0 outside a task). A call counts them as it
    begins and again on a failure: more then, and the failure is a cancellation a library below
    reported as one (a timeout), never retried. Those it began with are not its own: a task
    handling its cancellation (``except CancelledError: <clean up>; raise``) may still send."""
    task = asyncio.current_task()
    return 0 if task is None else task.cancelling()


@attrs.frozen
class RetryEvent:
    """A failed attempt that the client is about to retry, as ``AdminClient(on_retry=...)``
    receives it: the request's ``method`` and ``path``, the ``attempt`` that failed (from 1),
    its ``error`` and the ``delay`` in seconds before the next attempt (a 429's wait is its
    pool's pause, in the limiter, not this delay), and the rate-limit ``pool`` it draws on."""

    method: str
    path: str
    attempt: int
    error: AsyncSubsError
    delay: float
    pool: str


def set_waiting(enabled: bool) -> bool:
    """Turn retry backoffs and 429 pauses on or off; returns the previous setting."""
    global _waiting
    previous, _waiting = _waiting, enabled
    return previous


def waiting_enabled() -> bool:
    return _waiting


def _backoff_ceiling(policy: RetryPolicy, attempt: int) -> float:
    """The ceiling of the backoff after failed attempt number ``attempt`` (1-based)."""
    return min(policy.backoff_max, policy.backoff_initial * 2.0 ** (attempt - 1))


def _is_retryable(exc: BaseException, request: Request, policy: RetryPolicy) -> bool:
    # Only a request the server provably did not process is safe to resend when it is not
    # idempotent, unless the caller opted in.
    may_repeat = request.idempotent or policy.retry_non_idempotent
    if isinstance(exc, APIError) and (exc.retry_after or 0.0) > policy.max_retry_after:
        return False  # the server asks for a longer wait than the policy allows: fail fast
    if isinstance(exc, RateLimitError):
        return 429 in policy.retry_statuses
    if isinstance(exc, APIError):  # a server error told in a 2xx envelope counts as a 500
        status = 500 if isinstance(exc, ServerError) and exc.status < 500 else exc.status
        return status in policy.retry_statuses and may_repeat
    if isinstance(exc, TransportError):
        return exc.transient and (may_repeat or not exc.maybe_processed)
    if isinstance(exc, ProtocolError):
        return exc.transient and may_repeat
    return False


def retry_delay(
    policy: RetryPolicy, request: Request, exc: BaseException, attempt: int, elapsed: float
) -> float | None:
    """Seconds to wait before another attempt after ``exc`` failed attempt number ``attempt``
    (from 1), ``elapsed`` seconds after the first began; None when the policy gives up."""
    if attempt >= policy.max_attempts or elapsed >= policy.max_total:
        return None
    if not _is_retryable(exc, request, policy):
        return None
    if not _waiting:
        return 0.0
    left = policy.max_total - elapsed
    if isinstance(exc, APIError) and exc.retry_after is not None:
        # The server says when it expects to be back (a 429's wait is its pool's pause, in the
        # limiter): an attempt sooner is wasted, one after the budget is not made.
        if exc.retry_after > left:
            return None
        return 0.0 if isinstance(exc, RateLimitError) else exc.retry_after
    if isinstance(exc, RateLimitError):  # its pool pauses for the backoff's ceiling
        return None if _backoff_ceiling(policy, attempt) > left else 0.0
    return min(left, random.uniform(0.0, _backoff_ceiling(policy, attempt)))


def pause_after_429(policy: RetryPolicy, retry_after: float | None, attempt: int) -> float | None:
    """How long a 429 (to attempt number ``attempt``) pauses its pool: the server's Retry-After,
    capped at ``MAX_PAUSE``, or the backoff ceiling when it sent none; None when waiting is off."""
    if not _waiting:
        return None
    if retry_after is None:
        return _backoff_ceiling(policy, attempt)
    return min(retry_after, MAX_PAUSE)
