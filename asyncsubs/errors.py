"""Every exception asyncsubs raises, in one tree.

::

    AsyncSubsError
    ├── ConfigError                bad token/base_url/limits/arguments, a closed client, a client
    │                              used from another event loop (also a ValueError)
    ├── LimiterUnavailableError    the shared (Redis) rate limiter cannot be reached
    ├── TransportError             connection/timeout failures once retries are spent; at once
    │                              when retrying cannot help (TLS, certificate, invalid URL)
    ├── ProtocolError              a response that breaks the contract: bad JSON, no envelope,
    │                              cursor loop, body too large
    └── APIError                   the server answered with an error: .status .code .message
        │                          .body .headers .request_id .retry_after
        ├── BadRequestError            400/422
        ├── AuthenticationError        401
        │   └── PermissionDeniedError  403
        ├── NotFoundError              404
        ├── RateLimitError             429 once retries are spent
        └── ServerError                5xx once retries are spent

No other exception type escapes the client for a bad response. Messages name the HTTP method and
the request path (relative to the versioned base URL) and never contain the token: the token is
never passed to any of these constructors, and no exception of the HTTP library is chained to them
(aiohttp's carry the request, headers and all, in their arguments), only a description of it. An
answer that echoes the token (a server's message, a proxy's error page, a Location) gives an error
built from the answer with the token as ``***``.

Every attribute of every error prints and serialises (``repr``, ``str``, ``json.dumps(...,
default=str)``, ``repr(vars(error))``) and every error pickles, whatever the server sent: what an
error keeps of a response's JSON body is cut at ``BODY_MAX_DEPTH`` levels of nesting (see
``APIError``), so a logger or an error tracker never fails while reporting the failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ._frozen import FrozenMap

__all__ = [
    "APIError",
    "AsyncSubsError",
    "AuthenticationError",
    "BadRequestError",
    "ConfigError",
    "LimiterUnavailableError",
    "NotFoundError",
    "PermissionDeniedError",
    "ProtocolError",
    "RateLimitError",
    "ServerError",
    "TransportError",
]

#: How much of a response body an error keeps for its message (characters).
BODY_EXCERPT_CHARS = 200
#: Levels of nesting an error keeps of a JSON body (the body itself is the first). Printing,
#: encoding or pickling a value recurses once per level, and Python's recursion limit (1000
#: frames, some already taken by whoever reports the error) is hit by bodies a server can send.
BODY_MAX_DEPTH: Final = 32
#: What stands for each list or object nested deeper than ``BODY_MAX_DEPTH``.
CUT_MARKER: Final = f"<nested deeper than {BODY_MAX_DEPTH} levels: not kept>"


def excerpt(body: bytes | str | None, limit: int = BODY_EXCERPT_CHARS) -> str:
    """A short, single-line, printable excerpt of a response body for error messages."""
    if body is None:
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else body
    text = " ".join(text[: limit * 2].split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def capped(value: Any, levels: int = BODY_MAX_DEPTH) -> Any:
    """``value`` (decoded JSON) with every list or dict nested deeper than ``levels`` replaced
    by ``CUT_MARKER``; lists and dicts are copied, everything else kept as it is."""
    if isinstance(value, dict):
        if levels <= 0:
            return CUT_MARKER
        return {key: capped(item, levels - 1) for key, item in value.items()}
    if isinstance(value, list):
        if levels <= 0:
            return CUT_MARKER
        return [capped(item, levels - 1) for item in value]
    return value


def _rebuild(cls: type[AsyncSubsError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class AsyncSubsError(Exception):
    """Base class of every asyncsubs error.

    ``attempts`` is how many attempts were made before the error was raised (1 when the request
    was not retried). The message describes the underlying failure; an HTTP library's exception
    is never chained (see the module docstring).
    """

    attempts: int = 1

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as its arguments and attributes: BaseException's way, calling the class with
        # the arguments alone, cannot pass the keyword-only ones most subclasses require.
        return (_rebuild, (type(self), self.args, self.__dict__))


class ConfigError(AsyncSubsError, ValueError):
    """Bad configuration or arguments, detected before any request is sent.

    ``key`` names the setting at fault where one does (a parameter, or a config key by its
    path: ``stores.acme.limits``), ``problem`` says what is wrong with it; the message is both,
    joined by ``sep`` (``"scheme must be one of ..."``: a sentence about the key).
    A front door may name the key its own way (the command line: by its flag)."""

    def __init__(self, problem: str = "", *, key: str | None = None, sep: str = ": ") -> None:
        super().__init__(problem if key is None else f"{key}{sep}{problem}")
        self.key = key
        self.problem = problem


class LimiterUnavailableError(AsyncSubsError):
    """The shared rate limiter backend (e.g. Redis) failed; no request was sent."""


class TransportError(AsyncSubsError):
    """The request did not get a (whole) response: connection refused/reset, DNS, timeout, TLS.

    ``maybe_processed`` is False only when the request provably never reached the server
    (connection refused, DNS failure), which makes even a POST safe to retry. ``transient`` is
    False when another attempt cannot help (a TLS handshake with a plain-http port, a
    certificate that fails verification, a URL aiohttp refuses, a closed shared session): such
    errors are raised at the first attempt, their message naming the likely cause.
    """

    def __init__(
        self,
        message: str,
        *,
        method: str = "",
        path: str = "",
        maybe_processed: bool = True,
        transient: bool = True,
    ) -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.maybe_processed = maybe_processed
        self.transient = transient


class ProtocolError(AsyncSubsError):
    """The server answered, but the answer breaks the interface's contract."""

    def __init__(
        self,
        message: str,
        *,
        method: str = "",
        path: str = "",
        status: int | None = None,
        body_excerpt: str = "",
        transient: bool = False,
    ) -> None:
        super().__init__(message)
        self.method = method
        self.path = path
        self.status = status
        self.body_excerpt = body_excerpt
        #: True when another attempt may well succeed (e.g. a truncated body).
        self.transient = transient


class APIError(AsyncSubsError):
    """The server answered with an error (non-2xx status, or ``success`` false).

    ``body`` is the decoded JSON body when it was JSON, else a short excerpt of the text. Of
    JSON, ``BODY_MAX_DEPTH`` (32) levels of nesting are kept: each list or object deeper than
    that is replaced by the string ``CUT_MARKER`` (``"<nested deeper than 32 levels: not
    kept>"``), so the error prints, serialises and pickles whatever the server sent.
    ``headers`` are the response's headers (names lower-cased; nothing of the request's), and
    ``request_id`` the server's id for the request (``X-Request-Id`` or a similar header) when it
    sent one: what the service's support asks for. ``retry_after`` is the wait in seconds its
    Retry-After asked for (a 429's, a 503's), None without one.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int,
        code: str | None = None,
        server_message: str | None = None,
        body: Any = None,
        method: str = "",
        path: str = "",
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = server_message
        self.body = capped(body)
        self.method = method
        self.path = path
        self.headers: Mapping[str, str] = FrozenMap(headers)
        self.request_id = request_id
        self.retry_after = retry_after


class BadRequestError(APIError):
    """400 or 422: the request was malformed or failed validation."""


class AuthenticationError(APIError):
    """401: the token was missing, malformed or revoked."""


class PermissionDeniedError(AuthenticationError):
    """403: the token is valid but lacks the scope or entitlement for this capability."""


class NotFoundError(APIError):
    """404: no such resource or path (check ``version`` and the path)."""


class RateLimitError(APIError):
    """429 once retries are spent, or a wait (Retry-After, a pool's pause) longer than the policy
    allows; ``retry_after`` says how long, or is None when the server did not."""


class ServerError(APIError):
    """5xx once retries are spent."""
