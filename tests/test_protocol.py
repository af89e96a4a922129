"""The pure protocol layer: requests, envelopes, error mapping. No network."""

from __future__ import annotations

import email.utils
import json
import pickle
import string
from urllib.parse import quote, urlencode

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from asyncsubs import _json, errors
from asyncsubs._protocol import (
    RawResponse,
    build_request,
    check_token,
    clean_path,
    error_class,
    parse_page,
    parse_response,
    parse_retry_after,
    redacted,
    versioned_base,
    without_secret,
)

TOKEN = "tok-SECRET-123"


def raw(status: int, body: object, headers: dict[str, str] | None = None) -> RawResponse:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return RawResponse(status=status, headers=headers or {}, body=data)


def envelope(data: object, has_next: bool = False, cursor: str | None = None) -> dict[str, object]:
    return {
        "success": True,
        "message": "OK",
        "code": "SUCCESS",
        "data": data,
        "pageInfo": {"hasNextPage": has_next, "nextCursor": cursor},
    }


def test_versioned_base_appends_admin_version() -> None:
    assert versioned_base("https://x.test/", "2026-04") == "https://x.test/admin/2026-04/"
    assert versioned_base("http://127.0.0.1:8080", "2026-04").startswith("http://127.0.0.1")


@pytest.mark.parametrize(
    "url",
    ["", "ftp://x.test", "https://", "x.test", "https://x.test/?a=1", "https://u:p@x.test"],
)
def test_bad_base_urls(url: str) -> None:
    with pytest.raises(errors.ConfigError):
        versioned_base(url, "2026-04")


@pytest.mark.parametrize("host", ["acme..subs.example", "a" * 64 + ".example", ".example"])
def test_a_host_the_resolver_cannot_encode_is_a_config_error(host: str) -> None:
    """Else the resolver's UnicodeError escapes the transport at the first request."""
    with pytest.raises(errors.ConfigError, match="not a host name"):
        versioned_base(f"https://{host}", "2026-04")
    assert versioned_base("https://bücher.example", "2026-04")  # IDNA encodes it


def test_a_server_echoing_part_of_the_token_shows_none_of_it() -> None:
    """A server echoing the token's first characters, cut off: each piece of eight or more."""
    token = "fake_35b7a2103748bab7be506dd28cf5ef11"
    body = b'{"message": "invalid token fake_35b7a2103748bab...", "at": "\xff"}'
    clean = without_secret(raw(401, body), token)
    assert clean is not None
    assert b"35b7a210" not in clean.body
    assert b"invalid token ***..." in clean.body
    assert redacted(f"{token[:5]} and {token[20:]}", token) == "fake_ and ***"


def test_plain_http_refused_unless_loopback_or_opted_in() -> None:
    with pytest.raises(errors.ConfigError, match="unencrypted"):
        versioned_base("http://shop.example.com", "2026-04")
    assert versioned_base("http://localhost:1", "2026-04")
    assert versioned_base("http://[::1]:1", "2026-04")
    assert versioned_base("http://shop.example.com", "2026-04", allow_insecure=True)


@pytest.mark.parametrize("version", ["", "2026/04", "../x", None])
def test_bad_version(version: object) -> None:
    with pytest.raises(errors.ConfigError):
        versioned_base("https://x.test", version)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "token", ["", None, "Sec\r\nRet9", "SecRet9\x00", " SecRet9", "SecRet9\n", "SecRët9"]
)
def test_bad_tokens_rejected_without_echo(token: object) -> None:
    with pytest.raises(errors.ConfigError) as info:
        check_token(token)
    if isinstance(token, str) and token:
        assert token.strip() not in str(info.value)


@pytest.mark.parametrize("token", [12345678901234567890, ["SecRet9"], {"SecRet9": 1}])
def test_a_token_of_another_type_is_said_so_not_missing(token: object) -> None:
    with pytest.raises(errors.ConfigError, match="token must be a string, got a") as info:
        check_token(token)
    assert "SecRet9" not in str(info.value)
    assert "1234567890" not in str(info.value)


_PATH_CHARS = string.ascii_letters + string.digits + "-._~:@!$&'()*+,;=%/ é?#"


def _clean_path_by_quoting(path: str) -> str | None:
    """clean_path without its fast path (None where it raises)."""
    if not path.strip("/") or "://" in path or path.startswith("//") or "?" in path:
        return None
    segments = path.strip("/").split("/")
    if "#" in path or any(seg in ("", ".", "..") for seg in segments):
        return None
    return "/".join(quote(seg, safe="-._~:@!$&'()*+,;=") for seg in segments)


@given(st.lists(st.text(alphabet=_PATH_CHARS, max_size=12), min_size=1, max_size=4))
def test_clean_path_fast_path_agrees_with_quoting(parts: list[str]) -> None:
    """Paths that need no quoting skip it; every path gets the same result as by quoting."""
    path = "/".join(parts)
    expected = _clean_path_by_quoting(path)
    if expected is None:
        with pytest.raises(errors.ConfigError):
            clean_path(path)
    else:
        assert clean_path(path) == expected


def test_clean_path() -> None:
    assert clean_path("/subscriptions/") == "subscriptions"
    assert clean_path("subscriptions/12 3/pause") == "subscriptions/12%203/pause"
    for bad in ["", "/", "a/../b", "https://evil.test/x", "//evil.test", "a?b=1", "a//b"]:
        with pytest.raises(errors.ConfigError):
            clean_path(bad)


def test_build_request_headers_and_query() -> None:
    req = build_request(
        "https://x.test/admin/2026-04/",
        TOKEN,
        "get",
        "subscriptions",
        params={"pageSize": 100, "afterCursor": "a b+c", "flag": True, "skip": None},
    )
    assert req.method == "GET"
    assert req.url == (
        "https://x.test/admin/2026-04/subscriptions?pageSize=100&afterCursor=a+b%2Bc&flag=true"
    )
    assert req.headers["X-Service-Token"] == TOKEN
    assert req.headers["Content-Type"] == "application/json"
    assert req.headers["User-Agent"].startswith("asyncsubs/")
    assert TOKEN not in repr(req)
    post = build_request("https://x.test/admin/2026-04/", TOKEN, "POST", "a", json={"k": 1})
    assert post.body == b'{"k":1}'
    assert not post.idempotent


@given(
    st.dictionaries(
        st.text(string.printable + "éß", min_size=1, max_size=6),
        st.text(string.printable + "éß", max_size=8) | st.integers(),
        max_size=3,
    )
)
@example({"afterCursor": "k1&sig=ab12"})  # an opaque cursor that looks like two pairs
def test_a_query_is_what_urlencode_makes_of_it(params: dict[str, object]) -> None:
    """Plain pairs are joined as they are (the common case, cheaper); any other is encoded."""
    req = build_request("https://x.test/admin/2026-04/", TOKEN, "GET", "s", params=params)
    query = urlencode([(k, str(v)) for k, v in params.items()])
    assert req.url == "https://x.test/admin/2026-04/s" + (f"?{query}" if query else "")


def test_parse_page_ok() -> None:
    page = parse_page("GET", "subscriptions", raw(200, envelope([{"id": 1}], True, "c1")))
    assert page.data == [{"id": 1}]
    assert page.has_next_page
    assert page.next_cursor == "c1"
    last = parse_page("GET", "subscriptions", raw(200, envelope([], False, None)))
    assert not last.has_next_page
    assert last.next_cursor is None


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"<html>502</html>", "not valid JSON"),
        (b'{"success": true, "data": [', "not valid JSON"),
        (b"", "empty body"),
        ([1, 2], "envelope"),
        ("scalar", "envelope"),
        ({"data": [], "pageInfo": {"hasNextPage": False}}, "'success'"),
        ({"success": "yes", "data": [], "pageInfo": {"hasNextPage": False}}, "'success'"),
        ({"success": True, "pageInfo": {"hasNextPage": False}}, "'data'"),
        ({"success": True, "data": {}, "pageInfo": {"hasNextPage": False}}, "'data'"),
        ({"success": True, "data": []}, "'pageInfo'"),
        ({"success": True, "data": [], "pageInfo": []}, "'pageInfo'"),
        ({"success": True, "data": [], "pageInfo": {"hasNextPage": "true"}}, "hasNextPage"),
        (
            {"success": True, "data": [1], "pageInfo": {"hasNextPage": True, "nextCursor": 5}},
            "nextCursor",
        ),
        (envelope([{"id": 1}], True, None), "no nextCursor"),
        (envelope([{"id": 1}], True, ""), "no nextCursor"),
    ],
)
def test_parse_page_contract_violations(body: object, fragment: str) -> None:
    with pytest.raises(errors.ProtocolError, match=fragment) as info:
        parse_page("GET", "subscriptions", raw(200, body))
    assert "GET subscriptions" in str(info.value)
    assert info.value.path == "subscriptions"


def test_truncated_json_is_transient_but_bad_envelope_is_not() -> None:
    with pytest.raises(errors.ProtocolError) as info:
        parse_page("GET", "s", raw(200, b'{"success": tr'))
    assert info.value.transient
    with pytest.raises(errors.ProtocolError) as info:
        parse_page("GET", "s", raw(200, [1]))
    assert not info.value.transient


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "BAD_REQUEST", errors.BadRequestError),
        (422, None, errors.BadRequestError),
        (401, "UNAUTHORIZED", errors.AuthenticationError),
        (403, "FORBIDDEN", errors.PermissionDeniedError),
        (404, "NOT_FOUND", errors.NotFoundError),
        (429, "RATE_LIMITED", errors.RateLimitError),
        (500, "INTERNAL_ERROR", errors.ServerError),
        (503, None, errors.ServerError),
        (409, "CONFLICT", errors.APIError),
        (200, "UNAUTHORIZED", errors.AuthenticationError),
        (200, "RATE_LIMITED", errors.RateLimitError),
        (200, "WEIRD", errors.APIError),
    ],
)
def test_error_mapping(status: int, code: str | None, cls: type[errors.APIError]) -> None:
    assert error_class(status, code) is cls
    body = {"success": False, "code": code, "message": "nope", "data": None}
    with pytest.raises(errors.APIError) as info:
        parse_response("GET", "subscriptions/7", raw(status, body, {"retry-after": "3"}))
    exc = info.value
    assert type(exc) is cls
    assert exc.status == status
    assert exc.code == code
    assert exc.message == "nope"
    assert exc.body == body
    assert "GET subscriptions/7" in str(exc)
    assert f"HTTP {status}" in str(exc)
    if cls is errors.RateLimitError:
        assert isinstance(exc, errors.RateLimitError)
        assert exc.retry_after == 3.0


def test_auth_error_points_to_admin_portal() -> None:
    with pytest.raises(errors.AuthenticationError, match=r"Settings > API Tokens"):
        parse_response("GET", "x", raw(401, {"success": False, "code": "UNAUTHORIZED"}))


def test_html_error_page_is_server_error_with_excerpt() -> None:
    html = b"<html><body><h1>502 Bad Gateway</h1>" + b"x" * 5000 + b"</body></html>"
    with pytest.raises(errors.ServerError) as info:
        parse_response("GET", "x", raw(502, html))
    assert "502 Bad Gateway" in str(info.value)
    assert len(str(info.value)) < 400


def test_redirect_is_not_followed() -> None:
    with pytest.raises(errors.ProtocolError, match="not followed"):
        parse_response("GET", "x", raw(307, b"", {"location": "https://other.test/"}))


def test_parse_response_tolerates_non_envelope_and_empty() -> None:
    resp = parse_response("POST", "x", raw(200, envelope({"id": 1})))
    assert (resp.data, resp.code, resp.message, resp.status) == ({"id": 1}, "SUCCESS", "OK", 200)
    assert parse_response("POST", "x", raw(200, {"id": 2})).data == {"id": 2}
    assert parse_response("DELETE", "x", RawResponse(204, {}, b"")).data is None


def test_retry_after_forms() -> None:
    assert parse_retry_after(None) is None
    assert parse_retry_after("2") == 2.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after(" 7 ") == 7.0
    assert parse_retry_after("soon") is None
    # delay-seconds is digits (RFC 9110 10.2.3): no sign, exponent, NaN or other scripts' digits.
    for bad in ("-3", "-0", "+5", "nan", "inf", "1e3", "1_0", "\u0661\u0662\u0660", "", " "):
        assert parse_retry_after(bad) is None, bad
    # Too large for a float: 2**31 s, as RFC 9111 1.2.2 has it (then capped by the caller).
    assert parse_retry_after("9" * 400) == 2.0**31
    # The field sent twice arrives joined (RFC 9110 5.3): the longer delay, not none.
    assert parse_retry_after("30, 30") == 30.0
    assert parse_retry_after("30,60") == 60.0
    for bad in ("30,", ",", "30, soon", "30, -1"):
        assert parse_retry_after(bad) is None, bad
    date = email.utils.formatdate(1_000_030, usegmt=True)
    assert parse_retry_after(date, now=1_000_000) == pytest.approx(30.0)
    # The obsolete forms a recipient must accept too (RFC 9110 5.6.7); asctime's is GMT.
    assert parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now=784111747) == 30.0
    assert parse_retry_after("Sun Nov  6 08:49:37 1994", now=784111747) == 30.0
    # A date no calendar holds is no date, however large its numbers.
    for bad in ("Mon, 01 Jan 2030 99999999999999999999:00:00 GMT", "Mon, 99 Jan 2030 00:00 GMT"):
        assert parse_retry_after(bad) is None


def test_a_lone_surrogate_is_not_json_on_either_decoder() -> None:
    """orjson refuses one; the exact-integer path (a number beyond 64 bits) must too, or the
    string reaches a cursor that cannot be encoded into the next request."""
    for body in (b'{"c": "\\ud800"}', b'{"n": 18446744073709551617, "c": "\\ud800"}'):
        with pytest.raises(ValueError, match="surrogate"):
            _json.loads(body)
    pair = b'{"n": 18446744073709551617, "c": "\\ud83d\\ude00"}'
    assert _json.loads(pair)["c"] == "\U0001f600"
    # Refused wherever it is, also where a later duplicate key replaces it.
    with pytest.raises(ValueError, match="surrogate"):
        _json.loads(b'{"c": "\\ud800", "c": 1, "n": 18446744073709551617}')


def test_json_is_read_to_1024_levels_however_deep_the_caller_is() -> None:
    def called_at(depth: int, body: bytes) -> object:
        return called_at(depth - 1, body) if depth else _json.loads(body)

    deep = b"[" * 1_020 + b"1" + b"]" * 1_020
    level = called_at(400, deep)
    for _ in range(1_020):
        assert isinstance(level, list)
        level = level[0]
    assert level == 1
    with pytest.raises(ValueError, match="depth"):
        called_at(400, b"[" * 1_025 + b"]" * 1_025)
    # Too deep for msgspec and holding what orjson would round: refused, never rounded.
    with pytest.raises(ValueError, match="nested too deeply"):
        called_at(400, deep.replace(b"1", b"18446744073709551617"))


def test_integers_beyond_64_bits_stay_exact() -> None:
    body = b'{"success": true, "data": [{"id": 18446744073709551617}, {"id": 18446744073709551618},'
    body += b' {"id": -9223372036854775809, "f": 1.5}], "pageInfo": {"hasNextPage": false}}'
    page = parse_page("GET", "subscriptions", raw(200, body))
    assert [r["id"] for r in page.data] == [2**64 + 1, 2**64 + 2, -(2**63) - 1]
    assert page.data[2]["f"] == 1.5
    resp = parse_response("GET", "x", raw(200, b'{"id": 123456789012345678901234567890}'))
    assert resp.data == {"id": 123456789012345678901234567890}


@pytest.mark.parametrize(
    "value", [2**64 + 1, -(2**63) - 1, 10**40, [1, {"id": 2**70, "s": "é", "f": 0.1}]]
)
def test_json_round_trips_every_integer_exactly(value: object) -> None:
    assert _json.loads(_json.dumps(value)) == value
    post = build_request("https://x.test/admin/2026-04/", TOKEN, "POST", "a", json=value)
    assert post.body is not None
    assert _json.loads(post.body) == value


@pytest.mark.parametrize(
    "body",
    [b"[1e999]", b"[NaN]", b"[1111111111111111111111e999]", b"[Infinity, 11111111111111111111]"],
)
def test_json_refuses_what_is_not_json_on_both_paths(body: bytes) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 -- the contract is ValueError, nothing else
        _json.loads(body)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("ftp://user:PW-secret@host.test", "'ftp://***@host.test'"),
        ("https://u:PW-secret@[::1", "'https://***@[::1'"),
        ("https://u:PW-secret@x.test:99999", "'https://***@x.test:99999'"),
        ("https://x.test:0", "'https://x.test:0'"),
        ("ftp://PW-secret@x/y@host.test/p?q", "'ftp://***@host.test'"),
        ("PW-secret-token-pasted-as-base-url", "not a URL (not shown)"),
        ("https://exa mple.test", "'https://exa mple.test'"),
    ],
)
def test_bad_base_url_messages_never_show_secrets(url: str, shown: str) -> None:
    with pytest.raises(errors.ConfigError) as info:
        versioned_base(url, "2026-04")
    assert shown in str(info.value)
    assert "PW-secret" not in str(info.value)
    assert info.value.__context__ is None or info.value.__suppress_context__


@pytest.mark.parametrize("field", ["code", "message"])
def test_error_body_nested_beyond_the_recursion_limit_is_an_api_error(field: str) -> None:
    deep = b"[" * 1_020 + b"]" * 1_020
    body = b'{"success": false, "%s": %s}' % (field.encode(), deep)
    with pytest.raises(errors.BadRequestError) as info:
        parse_response("GET", "x", raw(400, body))
    assert str(info.value).startswith("GET x: HTTP 400")
    shallow = parse_response("GET", "x", raw(200, {"success": True, "code": {"a": [1]}}))
    assert shallow.code == '{"a":[1]}'


def test_an_error_keeps_32_levels_of_a_deep_body_and_marks_the_cut() -> None:
    deep = b"[" * 1_000 + b"]" * 1_000
    body = b'{"success": false, "code": "X", "data": %s, "kept": [[1]]}' % deep
    with pytest.raises(errors.BadRequestError) as info:
        parse_response("GET", "x", raw(400, body, {"x-request-id": "r-1"}))
    kept = info.value.body
    assert (kept["code"], kept["kept"]) == ("X", [[1]])
    level, depth = kept, 1
    while isinstance(level, dict | list):
        level = level["data"] if isinstance(level, dict) else level[0]
        depth += 1
    assert (level, depth) == (errors.CUT_MARKER, errors.BODY_MAX_DEPTH + 1)
    assert "32" in errors.CUT_MARKER
    copy = pickle.loads(pickle.dumps(info.value))
    assert (type(copy), copy.args, vars(copy)) == (
        type(info.value),
        info.value.args,
        vars(info.value),
    )
    assert (
        json.loads(json.dumps(vars(info.value), default=str))["headers"]
        == "{'x-request-id': 'r-1'}"
    )
    shallow = {"errors": [{"field": {"path": ["a", {"b": [1]}]}}]}
    assert errors.APIError("m", status=400, body=shallow).body == shallow


def test_errors_and_responses_carry_response_headers_and_request_id() -> None:
    headers = {"x-request-id": "req-42", "retry-after": "3", "content-type": "text/html"}
    with pytest.raises(errors.ServerError) as info:
        parse_response("GET", "x", raw(503, b"<html>down</html>", headers))
    assert info.value.request_id == "req-42"
    assert "[request id req-42]" in str(info.value)
    assert dict(info.value.headers) == headers
    with pytest.raises(errors.RateLimitError) as limited:
        parse_response("GET", "x", raw(429, {}, {"request-id": "r-7"}))
    assert (limited.value.request_id, limited.value.retry_after) == ("r-7", None)
    ok = parse_response("GET", "x", raw(200, envelope({"id": 1}), {"x-correlation-id": "c-1"}))
    assert (ok.request_id, ok.headers["x-correlation-id"]) == ("c-1", "c-1")
    plain = parse_response("GET", "x", raw(200, {"id": 1}))
    assert plain.request_id is None
    with pytest.raises(errors.NotFoundError) as missing:
        parse_response("GET", "x", raw(404, {}))
    assert (missing.value.request_id, dict(missing.value.headers)) == (None, {})


ESCAPABLE = 'tok/SE"CR\\ET-123'


@pytest.mark.parametrize(
    "shown",
    [
        ESCAPABLE,
        json.dumps(ESCAPABLE)[1:-1],  # in a JSON string
        json.dumps(ESCAPABLE)[1:-1].replace("/", "\\/"),  # as PHP writes it
        repr(ESCAPABLE.encode())[2:-1],  # as aiohttp quotes a line it could not parse
        ESCAPABLE[3:12],  # a parser's excerpt that cut it
    ],
)
def test_no_form_of_the_token_survives_redaction(shown: str) -> None:
    text = redacted(f"Invalid HTTP header: b'X-A: {shown}'", ESCAPABLE)
    assert all(piece not in text for piece in ("SE", "CR", "ET-123"))
    assert redacted("nothing of it here", ESCAPABLE) == "nothing of it here"


def test_an_echo_escaped_in_json_is_found_and_left_out() -> None:
    escaped = "".join(f"\\u{ord(ch):04x}" for ch in ESCAPABLE)  # every character escaped
    body = b'{"success": false, "message": "bad token ' + escaped.encode() + b'"}'
    clean = without_secret(raw(401, body), ESCAPABLE)
    assert clean is not None
    assert json.loads(clean.body) == {"success": False, "message": "bad token ***"}
    assert without_secret(raw(401, b'{"message": "bad token"}'), ESCAPABLE) is None


@pytest.mark.parametrize(
    "body",
    [
        # Its first characters, each escaped: never the whole token, so never found whole.
        b'{"message": "token starting '
        + "".join(f"\\u{ord(c):04x}" for c in TOKEN[:10]).encode()
        + b'... is revoked"}',
        # Escaped, beside an array nested deeper than any encoder writes back.
        b'{"message": "bad token '
        + "".join(f"\\u{ord(c):04x}" for c in TOKEN).encode()
        + b'", "deep": '
        + b"[" * 3000
        + b"]" * 3000
        + b"}",
    ],
)
def test_an_escaped_echo_is_found_in_part_and_at_any_depth(body: bytes) -> None:
    clean = without_secret(raw(401, body), TOKEN)
    assert clean is not None
    with pytest.raises(errors.AuthenticationError) as info:
        parse_response("GET", "x", clean)
    assert "SECRET" not in str(info.value)
    assert "SECRET" not in repr(info.value.body)[:2000]
