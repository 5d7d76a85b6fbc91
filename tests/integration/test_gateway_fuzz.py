"""Fuzzing the gateway's HTTP surface (its own HTTP/1.1 server on httptools) with hypothesis:
request bodies and headers (fuzz_support.py has the servers; test_gateway_fuzz_http.py the
malformed HTTP).

Properties: never a 500 nor a crash (nothing logged as an unexpected error); (a) arbitrary
bodies and (b) arbitrary headers get 200/400/401/404/405/413/429/503, every 4xx an OpenAI-shaped
JSON error, and a body valid by the documented rules a complete stream.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

# pytest finds fixtures by name in the module: the servers and the crash watch.
from tests.integration.fuzz_support import (
    ALLOWED,
    FUZZ,
    KEY,
    MAX_BODY,
    MODEL,
    VALID_CHAT,
    Crashes,
    Servers,
    check_answer,
    encode,
    one_request,
    request_bytes,
)
from tests.integration.gatewayproc import openai_error

# --- (a) bodies -----------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5)
    ),
    max_leaves=25,
)
messages = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "role": st.sampled_from(["user", "system", "assistant", "tool"]) | json_values,
            "content": st.text(max_size=300) | json_values,
            "tool_calls": json_values,
        },
    )
    | json_values,
    max_size=4,
)
huge_numbers = st.sampled_from([10**400, -(10**400), 2**63, -1, 0]).map(int) | st.floats()
request_doc = st.fixed_dictionaries(
    {},
    optional={
        "model": st.just(MODEL) | st.sampled_from(["", "gpt-4", MODEL.upper()]) | json_values,
        "messages": messages | json_values,
        "prompt": st.text(max_size=300)
        | st.lists(st.text(max_size=20) | st.integers(0, 50_000), max_size=8)
        | json_values,
        "stream": st.booleans() | json_values,
        "max_tokens": huge_numbers | json_values,
        "stream_options": json_values,
        "temperature": huge_numbers | json_values,
    },
).flatmap(
    lambda doc: st.dictionaries(st.text(max_size=12), json_values, max_size=3).map(
        lambda extra: {**extra, **doc}
    )
)


def mangled(body: bytes) -> st.SearchStrategy[bytes]:
    """`body` truncated, or with bytes replaced by arbitrary ones (invalid UTF-8 included)."""
    return st.one_of(
        st.integers(0, len(body)).map(lambda n: body[:n]),
        st.tuples(st.integers(0, max(0, len(body) - 1)), st.binary(min_size=1, max_size=4)).map(
            lambda t: body[: t[0]] + t[1] + body[t[0] + len(t[1]) :]
        ),
    )


prompts = st.text(max_size=300) | st.lists(st.text(max_size=20), max_size=4) | st.just("x" * 40_000)
valid_messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant"]),
            "content": st.text(max_size=300),
        },
        optional={"name": json_values, "tool_calls": json_values},
    ),
    min_size=1,
    max_size=4,
)
# A request valid in every way the gateway checks, then perhaps one field broken or dropped.
near_valid = st.tuples(
    st.fixed_dictionaries(
        {"model": st.just(MODEL), "messages": valid_messages, "prompt": prompts},
        optional={
            "stream": st.booleans(),
            "max_tokens": huge_numbers | json_values,
            "stream_options": json_values,
            "temperature": huge_numbers,
            "n": json_values,
        },
    ),
    st.sampled_from([None, None, None, "model", "messages", "prompt", "stream"]),
    st.booleans(),
    json_values,
).map(lambda t: mutate(*t))


def mutate(doc: dict[str, Any], key: str | None, drop: bool, junk: Any) -> dict[str, Any]:
    if key is None:
        return doc
    if drop:
        return {k: v for k, v in doc.items() if k != key}
    return {**doc, key: junk}


bodies = st.one_of(
    near_valid.map(encode),
    near_valid.map(encode).flatmap(mangled),
    request_doc.map(encode),
    request_doc.map(encode).flatmap(mangled),
    json_values.map(encode),
    st.binary(max_size=200),
    st.just(b""),
    st.sampled_from(
        [
            b"\xff\xfe{}",
            b'{"model": "\xc3\x28"}',
            b"\xef\xbb\xbf{}",
            b"null",
            b"[]",
            b"1e99999",
            b"9" * 5000,
            b'{"model": "stub-model"' * 20,
        ]
    ),
)


def expected_status(body: bytes, field: str) -> int:
    """What the documented validation rules say: 200 (valid), 400, or 404 (unknown model)."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return 400
    if not isinstance(doc, dict):
        return 400
    model, stream, prompt = doc.get("model"), doc.get("stream"), doc.get(field)
    if model is not None and (not isinstance(model, str) or not model):
        return 400  # absent is fine: the fleet's only model serves it
    if stream is not None and not isinstance(stream, bool):
        return 400
    if field == "messages":
        if (
            not isinstance(prompt, list)
            or not prompt
            or not all(isinstance(m, dict) for m in prompt)
        ):
            return 400
    elif not isinstance(prompt, str | list):
        return 400
    return 200 if model in (None, MODEL) else 404


@FUZZ
@given(body=bodies, path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
def test_arbitrary_bodies_get_a_clean_answer(
    servers: Servers, crashes: Crashes, body: bytes, path: str
) -> None:
    resp = one_request(servers.open.port, request_bytes("POST", path, body))
    event(f"status {resp.status}")
    check_answer(resp)
    field = "messages" if path == "/v1/chat/completions" else "prompt"
    expected = expected_status(body, field)
    assert resp.status == expected, (resp.status, expected, body[:200], resp.body[:200])
    crashes.check()


@FUZZ
@given(size=st.integers(MAX_BODY - 16, MAX_BODY + 64), chunked=st.booleans())
def test_bodies_around_the_size_limit(
    servers: Servers, crashes: Crashes, size: int, chunked: bool
) -> None:
    body = b"{" + b" " * (size - 1)  # not JSON: a 400 when it gets through
    if chunked:
        raw = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            + b"".join(
                b"%x\r\n%b\r\n" % (len(body[i : i + 4096]), body[i : i + 4096])
                for i in range(0, len(body), 4096)
            )
            + b"0\r\n\r\n"
        )
    else:
        raw = request_bytes("POST", "/v1/completions", body)
    resp = one_request(servers.open.port, raw)
    check_answer(resp)
    assert resp.status == (413 if len(body) > MAX_BODY else 400), (resp.status, len(body))
    crashes.check()


# --- (b) headers ----------------------------------------------------------------------------------

token_chars = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
header_names = st.sampled_from(
    [
        b"X-Priority",
        b"x-priority",
        b"X-Session-Id",
        b"Authorization",
        b"Content-Type",
        b"Accept",
        b"X-Request-Id",
        b"traceparent",
        b"Expect",
        b"Cookie",
        b"Host",
        b"Upgrade",
    ]
) | st.text(token_chars, min_size=1, max_size=20).map(str.encode).filter(
    lambda name: name.lower() not in (b"content-length", b"transfer-encoding", b"connection")
)  # message framing is (c)'s business
# Anything but CR and LF (which would end the header): controls and obs-text included.
header_values = st.binary(max_size=80).map(lambda v: v.replace(b"\r", b"").replace(b"\n", b""))
priority_values = st.sampled_from(
    [
        b"0",
        b"1",
        b"2",
        b" 2 ",
        b"3",
        b"-1",
        b"",
        b"01",
        b"0x1",
        b"2.0",
        b"high",
        b"\xef\xbc\x91",
        b"1" * 200,
        b"NaN",
        b"+1",
    ]
)
headers_lists = st.lists(
    st.tuples(header_names, header_values)
    | st.tuples(st.just(b"X-Priority"), priority_values)
    | st.tuples(
        st.just(b"Authorization"),
        st.sampled_from(
            [
                b"Bearer " + KEY.encode(),
                b"bearer " + KEY.encode() + b"  ",
                b"Bearer",
                b"Basic Zm9vOmJhcg==",
                b"Bearer x",
                b"Bearer " + KEY.encode() + b"x",
            ]
        )
        | header_values,
    ),
    max_size=8,
)


def _safe(value: bytes) -> bool:
    return all(b == 0x09 or 0x20 <= b <= 0x7E for b in value)


def expected_by_headers(headers: list[tuple[bytes, bytes]], keyed: bool) -> int | None:
    """200, 400 or 401 by the documented header rules, or None if a value is not plain
    printable ASCII (the HTTP parser may refuse it: a 400 either way, checked elsewhere)."""
    if not all(_safe(v) and _safe(n) for n, v in headers):
        return None
    last = {n.lower(): v.decode().strip(" \t") for n, v in headers}  # the parser strips OWS
    if any(n in last for n in (b"expect", b"upgrade", b"host")):
        return None
    if keyed:
        auth = last.get(b"authorization")
        if auth is None or not auth.lower().startswith("bearer "):
            return 401
        if auth[len("bearer ") :].strip() != KEY:
            return 401
    priority = last.get(b"x-priority")
    if priority is not None and priority.strip() not in ("0", "1", "2"):
        return 400
    return 200


@FUZZ
@given(headers=headers_lists, keyed=st.booleans())
def test_arbitrary_headers_get_a_clean_answer(
    servers: Servers, crashes: Crashes, headers: list[tuple[bytes, bytes]], keyed: bool
) -> None:
    gw = servers.keyed if keyed else servers.open
    raw = request_bytes("POST", "/v1/chat/completions", encode(VALID_CHAT), headers)
    resp = one_request(gw.port, raw)
    event(f"status {resp.status}")
    check_answer(resp)
    expected = expected_by_headers(headers, keyed)
    if expected is not None:
        assert resp.status == expected, (resp.status, expected, headers, resp.body[:200])
    if resp.status == 401:
        assert resp.headers.get("WWW-Authenticate") == "Bearer"
    crashes.check()


@FUZZ
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    path=st.sampled_from(
        [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/models",
            "/health",
            "/ready",
            "/metrics",
            "/tokenize",
            "/admin/replicas",
            "/admin/replicas/a",
            "/",
            "/v1",
            "/v1/chat/completions?x=1",
            "/%00",
            "/" + "a" * 2000,
        ]
    )
    | st.text(token_chars + "/?=&%", max_size=60).map(lambda p: "/" + p),
)
def test_any_route_and_method_get_a_clean_answer(
    servers: Servers, crashes: Crashes, method: str, path: str
) -> None:
    # The keyed gateway: admin routes are closed there (403), the rest needs the key.
    for gw, headers in (
        (servers.open, []),
        (servers.keyed, [(b"Authorization", b"Bearer " + KEY.encode())]),
    ):
        body = encode(VALID_CHAT) if method == "POST" else b""
        # Never DELETE the one replica (that is an admin feature, not a fuzz target).
        if method == "DELETE" and path.startswith("/admin/replicas/a"):
            path = "/admin/replicas/ghost"
        resp = one_request(gw.port, request_bytes(method, path, body, headers))
        assert resp.status < 500 and resp.status in ALLOWED | {201, 403, 409}, (
            resp.status,
            resp.body[:300],
        )
        if resp.status >= 400:
            openai_error(resp.body)
    crashes.check()
