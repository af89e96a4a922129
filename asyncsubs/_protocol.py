"""The admin interface's protocol, with no I/O: build requests, parse responses.

Nothing here imports aiohttp. The transport turns a ``Request`` into a ``RawResponse``
``(status, headers, body)``; this module turns that into a ``Response``, a ``PageEnvelope`` or a
typed error from ``asyncsubs.errors``. Error classes are chosen from status and ``code`` in one
place (``error_class``).
"""

from __future__ import annotations

import datetime
import email.utils
import ipaddress
import math
import re
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import quote, urlencode, urlsplit

import attrs

from . import _json
from ._version import __version__
from .errors import (
    APIError,
    AuthenticationError,
    BadRequestError,
    ConfigError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitError,
    ServerError,
    excerpt,
)

__all__ = [
    "DEFAULT_VERSION",
    "PageEnvelope",
    "RawResponse",
    "Request",
    "Response",
    "build_request",
    "check_token",
    "check_version",
    "error_class",
    "is_loopback",
    "parse_page",
    "parse_response",
    "parse_retry_after",
    "redacted",
    "versioned_base",
    "without_secret",
]

#: The interface version this client implements (the path's ``/admin/{version}/``).
DEFAULT_VERSION: Final = "2026-04"
TOKEN_HEADER: Final = "X-Service-Token"
USER_AGENT: Final = f"asyncsubs/{__version__}"
_VERSION_RE: Final = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._-]*$")
_SCHEME_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,15}")
_DELAY_SECONDS: Final = re.compile(r"\d+(?:\.\d+)?", re.ASCII)  # not "-1", "1e3" or "١٢٠"


@attrs.frozen
class Request:
    """One HTTP request, ready for a transport. ``path`` is relative to the versioned base."""

    method: str
    url: str
    path: str
    headers: Mapping[str, str] = attrs.field(repr=False)
    body: bytes | None = attrs.field(default=None, repr=False)

    @property
    def idempotent(self) -> bool:
        return self.method in ("GET", "HEAD", "OPTIONS", "PUT")


@attrs.frozen
class RawResponse:
    """What the transport got back. Header names are lower-cased; a field sent in several lines
    is one value, its lines joined by ", " (RFC 9110, 5.3)."""

    status: int
    headers: Mapping[str, str] = attrs.field(repr=False)
    body: bytes = attrs.field(repr=False)


#: The shortest piece of the token that a text must not show: a parser's excerpt of a line may
#: cut the token anywhere, and a server may echo its start.
_TOKEN_PIECE: Final = 8
#: Pieces of the token past which a text (a hostile body echoing it throughout) is not shown
#: at all: masking each would cost more than the text is worth.
_MOST_PIECES: Final = 1_000
#: A JSON escape of a printable ASCII character (a quote or a backslash as JSON writes it
#: otherwise, so the text stays JSON), or an escaped slash; or an escaped backslash, kept.
_ESCAPE: Final = re.compile(r"\\(?:u00([2-7][0-9A-Fa-f])|/)|\\\\")


def _shown_forms(secret: str) -> list[str]:
    """How a text may show ``secret``: as it is, escaped in JSON (``/`` as ``\\/`` too, as PHP
    writes it) and in a Python repr (aiohttp quotes what it could not parse); longest first."""
    in_json = _json.dumps(secret).decode()[1:-1]
    forms = {secret, in_json, in_json.replace("/", "\\/"), repr(secret)[1:-1]}
    forms.add(repr(secret.encode())[2:-1])
    return sorted(forms, key=len, reverse=True)


def _unescaped(match: re.Match[str]) -> str:
    code = match[1]
    if code is None:
        return "/" if match[0] == "\\/" else match[0]
    character = chr(int(code, 16))
    return "\\" + character if character in '"\\' else character  # as JSON writes those


def redacted(text: str, secret: str) -> str:
    """``text`` with every form of ``secret`` in it put as ``***``, and every piece of it as long
    as ``_TOKEN_PIECE`` or longer (an excerpt that cut it, a server echoing its start)."""
    forms = _shown_forms(secret)
    for form in forms:
        text = text.replace(form, "***")
    n = min(_TOKEN_PIECE, len(secret))
    pieces = {form[i : i + n] for form in forms for i in range(len(form) - n + 1)}
    spans = []
    for piece in pieces:
        at = text.find(piece)
        while at != -1:
            spans.append((at, at + n))
            if len(spans) > _MOST_PIECES:
                return "(a text holding the client's token throughout, not shown)"
            at = text.find(piece, at + 1)
    runs: list[list[int]] = []  # the spans merged where they touch
    for begin, end in sorted(spans):
        if runs and begin <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([begin, end])
    shown, kept = 0, []
    for begin, end in runs:
        kept += [text[shown:begin], "***"]
        shown = end
    return "".join([*kept, text[shown:]])


def without_secret(raw: RawResponse, secret: str) -> RawResponse | None:
    """``raw`` with ``secret`` (the token, echoed by a server or a proxy) put as ``***`` in its
    body and headers, to build an error from; None when it holds no ``secret``.

    A JSON body may escape its characters (``\\u0074``, ``\\/``): they are read as the error
    will read them. Bytes that are not UTF-8 are kept, through the surrogates that stand for
    them."""
    text = _ESCAPE.sub(_unescaped, raw.body.decode("utf-8", "surrogateescape"))
    clean = redacted(text, secret)
    headers = {name: redacted(value, secret) for name, value in raw.headers.items()}
    if clean == text and headers == raw.headers:
        return None
    return RawResponse(raw.status, headers, clean.encode("utf-8", "surrogateescape"))


@attrs.frozen
class Response:
    """A successful answer from ``AdminClient.request``. ``headers`` are the response's (names
    lower-cased, a field's lines joined), ``request_id`` the server's id for the request when it
    sent one."""

    status: int
    data: Any
    message: str | None
    code: str | None
    headers: Mapping[str, str] = attrs.field(repr=False, factory=dict)
    request_id: str | None = None


@attrs.frozen
class PageEnvelope:
    """A successful list-endpoint answer, records still as received (dicts)."""

    data: list[Any]
    has_next_page: bool
    next_cursor: str | None


#: Response headers that carry the server's id for a request, most specific first.
REQUEST_ID_HEADERS: Final = ("x-request-id", "request-id", "x-correlation-id", "x-trace-id")


def request_id_in(headers: Mapping[str, str]) -> str | None:
    """The server's id for the request (what its support asks for), if a header carries one."""
    for name in REQUEST_ID_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1); not a name that merely begins
    like one (``127.0.0.1.example`` resolves wherever its owner wants)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shown_url(url: str) -> str:
    """``url`` as a message may show it: scheme and host only, anything before an ``@`` masked;
    nothing of a value that does not look like a URL (a token pasted as base_url)."""
    scheme, sep, rest = url.partition("://")
    if not sep or not _SCHEME_RE.fullmatch(scheme):
        return "a value that is not a URL (not shown)"
    _, at, rest = rest.rpartition("@")
    host = re.split(r"[/?#]", rest, maxsplit=1)[0]
    return repr(f"{scheme}://{'***@' if at else ''}{host}")


def versioned_base(
    base_url: str,
    version: str,
    *,
    allow_insecure: bool = False,
    insecure_hint: str = "allow_insecure=True for a trusted network",
) -> str:
    """``{base_url}/admin/{version}/``, validated. Raises ConfigError, which never shows the
    URL's credentials, query or path; a plain http:// one names ``insecure_hint``, how the
    caller allows it."""
    if not isinstance(base_url, str) or not base_url.strip():
        raise ConfigError("base_url is required (or set ASYNCSUBS_BASE_URL)")
    check_version(version)
    url = base_url.strip()
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port that is not 0-65535
    except ValueError:
        port = 0
    if port == 0:
        raise ConfigError(
            "base_url is not a valid URL (check the port, 1-65535, and any [IPv6] brackets): "
            f"got {shown_url(url)}"
        )
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        raise ConfigError(
            f"base_url must be an http(s) URL with a host, like https://subs.example: "
            f"got {shown_url(url)}"
        )
    if not host.isprintable() or " " in host:
        raise ConfigError(f"base_url's host has spaces or control characters: {shown_url(url)}")
    try:
        # As the resolver will: a label empty ("a..b") or over 63 characters does not encode.
        ipaddress.ip_address(host)
    except ValueError:
        try:
            host.encode("idna")
        except UnicodeError:
            raise ConfigError(
                "base_url's host is not a host name (an empty label, as in a..b, or one over "
                f"63 characters?): got {shown_url(url)}"
            ) from None
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError("base_url must not carry a query, fragment or credentials")
    if re.search(r"/admin(/[^/]*)?/?$", parts.path):
        raise ConfigError(
            "base_url is the service's address without /admin/{version}/ (the client adds it; "
            "pass version= for another): got one that ends in /admin"
        )
    if parts.scheme == "http" and not allow_insecure and not is_loopback(host):
        raise ConfigError(
            f"plain http:// would send the token unencrypted; use https:// (or {insecure_hint})"
        )
    return f"{url.rstrip('/')}/admin/{version}/"


def check_version(version: object) -> str:
    """The interface version of the path, validated (``2026-04``: letters, digits, ``._-``)."""
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise ConfigError(f"version must look like '2026-04', got {version!r}")
    return version


def check_token(token: object) -> str:
    """The token, validated: a non-empty string without whitespace at its ends or control chars.

    Messages never echo the token.
    """
    if token is None or token == "":
        raise ConfigError("token is required (or set ASYNCSUBS_TOKEN)")
    if not isinstance(token, str):
        raise ConfigError(f"token must be a string, got a {type(token).__name__} (not shown)")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in token):
        raise ConfigError("token contains control characters (CR/LF?); check how it was loaded")
    if token != token.strip():
        raise ConfigError("token has leading or trailing whitespace; check how it was loaded")
    if not token.isascii():
        raise ConfigError("token must be ASCII")
    return token


#: A path that clean_path returns unchanged: segments of unreserved and sub-delim characters
#: (what quote() below leaves alone) with no dots, joined by single slashes.
_PLAIN_PATH: Final = re.compile(r"[0-9A-Za-z_~:@!$&'()*+,;=-]+(?:/[0-9A-Za-z_~:@!$&'()*+,;=-]+)*")


#: A query of plain ``key=value`` pairs, which ``urlencode`` would leave as they are.
_PLAIN_QUERY: Final = re.compile(
    r"[0-9A-Za-z_.~-]+=[0-9A-Za-z_.~-]*(?:&[0-9A-Za-z_.~-]+=[0-9A-Za-z_.~-]*)*"
)


def clean_path(path: str) -> str:
    if type(path) is str and _PLAIN_PATH.fullmatch(path):
        return path  # the common case, e.g. "subscriptions/123": already clean
    if not isinstance(path, str) or not path.strip("/"):
        raise ConfigError(f"path must be a non-empty string, got {path!r}")
    if "://" in path or path.startswith("//") or "?" in path or "#" in path:
        raise ConfigError(f"path must be relative to the versioned base URL, got {path!r}")
    segments = path.strip("/").split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        raise ConfigError(f"path has empty or dot segments: {path!r}")
    return "/".join(quote(seg, safe="-._~:@!$&'()*+,;=") for seg in segments)


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int) or (isinstance(value, float) and math.isfinite(value)):
        return str(value)
    raise ConfigError(
        f"query parameter values must be str, int, finite float or bool, got {value!r}"
    )


def encode_json(value: Any) -> bytes:
    """A request's JSON body; ConfigError for a value JSON cannot carry."""
    try:
        encoded = _json.dumps(value)
    except TypeError as exc:
        raise ConfigError(
            f"json= cannot be sent as JSON ({exc}); pass dicts with str keys, lists, str, "
            "int, float, bool or None"
        ) from None
    if b"null" in encoded and _holds_non_finite(value):  # orjson writes them as null
        raise ConfigError("json= holds a NaN or an infinity, which JSON cannot carry")
    return encoded


def _holds_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict | list | tuple):
        return any(map(_holds_non_finite, value.values() if isinstance(value, dict) else value))
    return False


def request_headers(token: str, user_agent: str = USER_AGENT) -> Mapping[str, str]:
    """The headers of every request of a client (read-only: transports copy them)."""
    return MappingProxyType(
        {
            TOKEN_HEADER: token,
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": user_agent,
        }
    )


def build_request(
    base: str,
    token: str,
    method: str,
    path: str,
    *,
    params: Mapping[str, Any] | None = None,
    json: Any = None,
    user_agent: str = USER_AGENT,
    headers: Mapping[str, str] | None = None,
) -> Request:
    """Build a request. ``path`` must already be clean (see ``clean_path``). ``headers``, when
    given, is what ``request_headers(token, user_agent)`` returned (shared, never mutated)."""
    method = method.upper()
    url = base + path
    if params:
        query = [(str(k), _query_value(v)) for k, v in params.items() if v is not None]
        if query:
            joined = "&".join(f"{k}={v}" for k, v in query)  # plain keys and values, as a rule
            # One "=" a pair: a value such as "k1&sig=ab12" (an opaque cursor) is not two pairs.
            plain = joined.count("=") == len(query) and _PLAIN_QUERY.fullmatch(joined)
            url = f"{url}?{joined if plain else urlencode(query)}"
    body = None if json is None else encode_json(json)
    if headers is None:
        headers = request_headers(token, user_agent)
    return Request(method=method, url=url, path=path, headers=headers, body=body)


# ---------------------------------------------------------------------------------------------
# Responses

_STATUS_ERRORS: Final[Mapping[int, type[APIError]]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    422: BadRequestError,
    429: RateLimitError,
}
# Used when the status does not decide (2xx with success=false, or an unlisted 4xx). The
# interface does not list its codes; these are the common spellings.
_CODE_ERRORS: Final[Mapping[str, type[APIError]]] = {
    "BAD_REQUEST": BadRequestError,
    "INVALID_REQUEST": BadRequestError,
    "INVALID_CURSOR": BadRequestError,
    "VALIDATION_ERROR": BadRequestError,
    "UNAUTHORIZED": AuthenticationError,
    "UNAUTHENTICATED": AuthenticationError,
    "INVALID_TOKEN": AuthenticationError,
    "FORBIDDEN": PermissionDeniedError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "NOT_FOUND": NotFoundError,
    "RATE_LIMITED": RateLimitError,
    "TOO_MANY_REQUESTS": RateLimitError,
    "INTERNAL_ERROR": ServerError,
    "SERVER_ERROR": ServerError,
}

_HINTS: Final[Mapping[type[APIError], str]] = {
    AuthenticationError: "check the token (admin portal: Settings > API Tokens)",
    PermissionDeniedError: (
        "the token lacks the scope or entitlement for this capability; "
        "some capabilities must be enabled by the account's success manager"
    ),
    NotFoundError: "check the path and the API version",
}


def error_class(status: int, code: str | None) -> type[APIError]:
    """The one place that maps an error answer to its class."""
    if status >= 500:
        return ServerError
    if status in _STATUS_ERRORS:
        return _STATUS_ERRORS[status]
    if code is not None:
        return _CODE_ERRORS.get(code.upper(), APIError)
    return APIError


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header, or None: delay-seconds (a fraction tolerated;
    one too large for a float is 2**31, as RFC 9111 1.2.2 has it) or an HTTP date in any of its
    three forms (asctime's, with no zone, is GMT too). The field sent twice (joined ``30, 60``):
    the longest delay."""
    value = (value or "").strip()
    delays = [v.strip() for v in value.split(",")]
    if all(_DELAY_SECONDS.fullmatch(delay) for delay in delays):
        return min(max(map(float, delays)), 2.0**31)
    try:
        when = email.utils.parsedate_to_datetime(value)
        seconds = when.replace(tzinfo=when.tzinfo or datetime.UTC).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    seconds -= time.time() if now is None else now
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _decode(method: str, path: str, raw: RawResponse) -> Any:
    try:
        return _json.loads(raw.body)
    except ValueError:
        kind = "an empty body" if not raw.body else "a body that is not valid JSON"
        raise ProtocolError(
            f"{method} {path}: HTTP {raw.status} with {kind}: {excerpt(raw.body)!r}",
            method=method,
            path=path,
            status=raw.status,
            body_excerpt=excerpt(raw.body),
            transient=True,
        ) from None


def _str_or_none(value: Any) -> str | None:
    """A ``code`` or ``message`` as text: a structured value as compact JSON, or None when it
    nests too deeply to encode (``str()`` of a value nested a thousand deep overflows)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        try:
            return _json.dumps(value).decode()
        except TypeError:
            return None
    return str(value)


def _api_error(method: str, path: str, raw: RawResponse, decoded: Any) -> APIError:
    code = message = None
    if isinstance(decoded, dict):
        code = _str_or_none(decoded.get("code"))
        message = _str_or_none(decoded.get("message") or decoded.get("error"))
    body = decoded if decoded is not None else excerpt(raw.body)
    cls = error_class(raw.status, code)
    text = f"{method} {path}: HTTP {raw.status}"
    if code:
        text += f" {code}"
    if message:
        text += f": {excerpt(message)}"
    elif decoded is None and raw.body:
        text += f": {excerpt(raw.body)!r}"
    hint = _HINTS.get(cls)
    if hint and (message is None or "API Tokens" not in message):
        text += f" ({hint})"
    rid = request_id_in(raw.headers)
    if rid:
        text += f" [request id {excerpt(rid, 100)}]"
    kwargs: dict[str, Any] = {
        "status": raw.status,
        "code": code,
        "server_message": message,
        "body": body,
        "method": method,
        "path": path,
        "headers": MappingProxyType(raw.headers),
        "request_id": rid,
    }
    return cls(text, retry_after=parse_retry_after(raw.headers.get("retry-after")), **kwargs)


def _envelope_error(method: str, path: str, raw: RawResponse, why: str) -> ProtocolError:
    return ProtocolError(
        f"{method} {path}: HTTP {raw.status}: {why}: {excerpt(raw.body)!r}",
        method=method,
        path=path,
        status=raw.status,
        body_excerpt=excerpt(raw.body),
    )


def _check_answer(method: str, path: str, raw: RawResponse) -> Any:
    """The decoded body of a successful answer; raise the typed error for anything else."""
    if 300 <= raw.status < 400:
        location = excerpt(raw.headers.get("location", "?"), 120)
        raise ProtocolError(
            f"{method} {path}: HTTP {raw.status} redirect to {location!r} not followed, so the "
            "token is never sent elsewhere; set base_url to the final address",
            method=method,
            path=path,
            status=raw.status,
        )
    if not 200 <= raw.status < 300:
        try:
            decoded = _json.loads(raw.body) if raw.body else None
        except ValueError:
            decoded = None
        raise _api_error(method, path, raw, decoded)
    if raw.status == 204 or (not raw.body and method != "GET"):
        return None
    decoded = _decode(method, path, raw)
    if isinstance(decoded, dict) and decoded.get("success") is False:
        raise _api_error(method, path, raw, decoded)
    return decoded


def parse_response(method: str, path: str, raw: RawResponse) -> Response:
    """Parse the answer to a non-list request.

    Non-list payload shapes are not specified, so this is tolerant: an envelope (a JSON object
    with ``success``) is unwrapped; any other JSON is returned whole as ``data``.
    """
    decoded = _check_answer(method, path, raw)
    if isinstance(decoded, dict) and "success" in decoded:
        if decoded["success"] is not True:
            raise _envelope_error(method, path, raw, "'success' is not a boolean")
        return Response(
            status=raw.status,
            data=decoded.get("data"),
            message=_str_or_none(decoded.get("message")),
            code=_str_or_none(decoded.get("code")),
            headers=raw.headers,
            request_id=request_id_in(raw.headers),
        )
    return Response(
        status=raw.status,
        data=decoded,
        message=None,
        code=None,
        headers=raw.headers,
        request_id=request_id_in(raw.headers),
    )


def parse_page(method: str, path: str, raw: RawResponse) -> PageEnvelope:
    """Parse the answer to a list request, strictly: the pagination contract must hold."""
    decoded = _check_answer(method, path, raw)
    if not isinstance(decoded, dict):
        raise _envelope_error(method, path, raw, "expected the response envelope (a JSON object)")
    if decoded.get("success") is not True:
        raise _envelope_error(method, path, raw, "'success' missing or not a boolean")
    data = decoded.get("data")
    if not isinstance(data, list):
        raise _envelope_error(method, path, raw, "'data' missing or not a list")
    page_info = decoded.get("pageInfo")
    if not isinstance(page_info, dict):
        raise _envelope_error(method, path, raw, "'pageInfo' missing or not an object")
    has_next = page_info.get("hasNextPage")
    if not isinstance(has_next, bool):
        raise _envelope_error(method, path, raw, "'pageInfo.hasNextPage' missing or not a boolean")
    next_cursor = page_info.get("nextCursor")
    if next_cursor is not None and not isinstance(next_cursor, str):
        raise _envelope_error(method, path, raw, "'pageInfo.nextCursor' is not a string")
    if has_next and not next_cursor:
        raise _envelope_error(method, path, raw, "'hasNextPage' is true but there is no nextCursor")
    return PageEnvelope(data=data, has_next_page=has_next, next_cursor=next_cursor or None)
