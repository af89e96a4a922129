"""Which failures are retried, and how long to wait between attempts (tenacity underneath).

A 429 is not waited out here: the client pauses the store's whole pool in the rate limiter for
the server's Retry-After, and the retried attempt queues behind that pause like every other
request of the pool. Everything else waits a capped exponential backoff with full jitter.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity

from ._config import RetryPolicy
from ._protocol import Request
from .errors import APIError, AsyncSubsError, ProtocolError, RateLimitError, TransportError

__all__ = ["backoff_seconds", "call_with_retries", "is_retryable", "set_waiting"]

T = TypeVar("T")
log = logging.getLogger("asyncsubs.retry")

# The testing switch (see asyncsubs.testing.no_waiting): when off, backoffs and 429 pauses are 0.
_waiting = True


def set_waiting(enabled: bool) -> bool:
    """Turn retry backoffs and 429 pauses on or off; returns the previous setting."""
    global _waiting
    previous, _waiting = _waiting, enabled
    return previous


def waiting_enabled() -> bool:
    return _waiting


def backoff_seconds(policy: RetryPolicy, attempt: int) -> float:
    """The ceiling of the backoff after failed attempt number ``attempt`` (1-based)."""
    return min(policy.backoff_max, policy.backoff_initial * 2.0 ** (attempt - 1))


def is_retryable(exc: BaseException, request: Request, policy: RetryPolicy) -> bool:
    # Only a request the server provably did not process is safe to resend when it is not
    # idempotent, unless the caller opted in.
    may_repeat = request.idempotent or policy.retry_non_idempotent
    if isinstance(exc, RateLimitError):
        if 429 not in policy.retry_statuses:
            return False
        return exc.retry_after is None or exc.retry_after <= policy.max_retry_after
    if isinstance(exc, APIError):
        return exc.status in policy.retry_statuses and may_repeat
    if isinstance(exc, TransportError):
        return exc.transient and (may_repeat or not exc.maybe_processed)
    if isinstance(exc, ProtocolError):
        return exc.transient and may_repeat
    return False


async def call_with_retries(
    policy: RetryPolicy, request: Request, attempt: Callable[[int], Awaitable[T]]
) -> T:
    """Run ``attempt(number)`` (numbered from 1) until it succeeds or the policy gives up; then
    re-raise the last error with ``attempts`` set on it.

    The first attempt runs bare: no closure, no cell, no tenacity object. tenacity builds a
    dozen objects per call that hold one another in reference cycles, and at thousands of
    requests per second in flight every object a request keeps alive is one more for the
    garbage collector to scan and promote (see benchmarks/README.md, GC); it is only needed
    once an attempt has failed.
    """
    started = time.monotonic()
    try:
        return await attempt(1)
    except Exception as exc:  # anything else (cancellation) is never retried
        failure = exc
    return await _retry_after(policy, request, attempt, failure, started)


async def _retry_after(
    policy: RetryPolicy,
    request: Request,
    attempt: Callable[[int], Awaitable[T]],
    failure: Exception,
    started: float,
) -> T:
    """The retries after a failed first attempt (which began at ``started``)."""
    first_failure: Exception | None = failure

    async def replay_then_attempt(number: int) -> T:
        # tenacity sees the failure as its own first attempt: it decides, numbers, waits,
        # logs and sets .attempts exactly as if it had run that attempt itself.
        nonlocal first_failure
        if first_failure is not None:
            replayed, first_failure = first_failure, None
            raise replayed
        return await attempt(number)

    def wait(state: tenacity.RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if not _waiting or isinstance(exc, RateLimitError):
            return 0.0
        return random.uniform(0.0, backoff_seconds(policy, state.attempt_number))

    def before_sleep(state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        assert exc is not None
        delay = state.next_action.sleep if state.next_action else 0.0
        log.debug(
            "%s %s: attempt %d failed (%s); retrying in %.3fs",
            request.method,
            request.path,
            state.attempt_number,
            type(exc).__name__,
            delay,
            extra={"error": exc},  # the whole error, for handlers that show why (the CLI)
        )

    retrying = tenacity.AsyncRetrying(
        stop=tenacity.stop_after_attempt(policy.max_attempts)
        # Its clock starts now: max_total less what the first attempt took.
        | tenacity.stop_after_delay(policy.max_total - (time.monotonic() - started)),
        wait=wait,
        retry=tenacity.retry_if_exception(lambda e: is_retryable(e, request, policy)),
        before_sleep=before_sleep,
        reraise=True,
    )
    number = 0
    try:
        async for try_ in retrying:
            number = try_.retry_state.attempt_number
            with try_:
                return await replay_then_attempt(number)
    except AsyncSubsError as exc:
        exc.attempts = number
        raise
    raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover
