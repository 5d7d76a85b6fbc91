"""Fuzzing the gateway's HTTP surface (its own HTTP/1.1 server on httptools) with hypothesis.

One gateway per module (two, in fact: one open, one with an API key and the session policy),
each on its own event loop in a thread, in front of an in-process streaming stub; the tests
talk to them with blocking sockets and parse every byte that comes back.

Properties: never a 500 nor a crash (nothing logged as an unexpected error); (a) arbitrary
bodies and (b) arbitrary headers get 200/400/401/404/405/413/429/503, every 4xx an OpenAI-shaped
JSON error, and a body valid by the documented rules a complete stream; (c) malformed HTTP
gets a 4xx or a closed connection, and the server keeps serving.
"""

from __future__ import annotations

import http.client
import io
import itertools
import json
import logging
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from benchmarks.stub_server import StubConfig, ThreadedStub
from servepilot.core.config import GatewayConfig, PolicyName
from servepilot.core.gateway_config import ApiKey, AuthConfig
from tests.integration.gatewayproc import ThreadedGateway, Upstream, openai_error

MODEL = "stub-model"
KEY = "sk-fuzz-key"
MAX_BODY = 64 * 1024
STUB_CHUNKS = 2
ALLOWED = {200, 400, 401, 404, 405, 413, 429, 503}
DONE_EVENT = b"data: [DONE]\n\n"
VALID_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)


# --- the servers ----------------------------------------------------------------------------------


@dataclass
class Servers:
    open: ThreadedGateway
    """No auth, hybrid policy (prefix hashing and length sharding read every body)."""
    keyed: ThreadedGateway
    """One API key, session policy (reads X-Session-Id)."""


class Crashes(logging.Handler):
    """Watches for crashes from the start of a test: anything the gateway logs at ERROR (an
    unexpected exception in a handler) and any 5xx it counts."""

    def __init__(self, servers: Servers) -> None:
        super().__init__(logging.ERROR)
        self.servers = servers
        self.records: list[logging.LogRecord] = []
        self.baseline = [self._fivexx(gw) for gw in (servers.open, servers.keyed)]

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    @staticmethod
    def _fivexx(gw: ThreadedGateway) -> int:
        counts = gw.inspect(lambda g: dict(g.metrics.requests))
        return sum(n for (_, code), n in counts.items() if code.startswith("5"))

    def check(self) -> None:
        """No crash so far; both gateways still answer /health, and a chat request."""
        logged = [
            f"{r.getMessage()} {r.exc_info[1]!r}" if r.exc_info else r.getMessage()
            for r in self.records
        ]
        assert not logged, logged
        now = [self._fivexx(gw) for gw in (self.servers.open, self.servers.keyed)]
        assert now == self.baseline, f"5xx answers counted: {now} (were {self.baseline})"
        for gw in (self.servers.open, self.servers.keyed):
            assert health(gw.port) == 200
        chat = one_request(
            self.servers.open.port,
            request_bytes("POST", "/v1/chat/completions", encode(VALID_CHAT)),
        )
        assert chat.status == 200 and chat.body.endswith(DONE_EVENT), chat


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    common: dict[str, Any] = {"port": 0, "health_interval_s": 0.5, "max_body_bytes": MAX_BODY}
    auth = AuthConfig(keys=(ApiKey(name="fuzz", key=KEY),))
    with (
        ThreadedStub(StubConfig(chunks=STUB_CHUNKS)) as stub,
        ThreadedGateway(GatewayConfig(**common), [Upstream("a", stub.url)]) as open_gw,
        ThreadedGateway(
            GatewayConfig(**common, policy=PolicyName.SESSION, auth=auth),
            [Upstream("a", stub.url)],
        ) as keyed_gw,
    ):
        yield Servers(open_gw, keyed_gw)
        for gw in (open_gw, keyed_gw):
            in_flight, queued = gw.inspect(
                lambda g: (g.pool.total_in_flight(), len(g.dispatcher.queue))
            )
            assert (in_flight, queued) == (0, 0)


@pytest.fixture
def crashes(servers: Servers) -> Iterator[Crashes]:
    handler = Crashes(servers)
    logger = logging.getLogger("servepilot.gateway")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# --- talking over a raw socket --------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes


class _Unclosable(io.BytesIO):
    def close(self) -> None:  # http.client closes its fp after a body; we read on
        pass


class _Sock:
    def __init__(self, fp: io.BytesIO) -> None:
        self._fp = fp

    def makefile(self, *args: Any, **kwargs: Any) -> io.BytesIO:
        return self._fp


def parse_responses(data: bytes) -> tuple[list[Response], bytes]:
    """Every complete response in `data` (interim 1xx skipped), and what is left over."""
    fp = _Unclosable(data)
    out: list[Response] = []
    while fp.tell() < len(data):
        start = fp.tell()
        resp = http.client.HTTPResponse(_Sock(fp))  # type: ignore[arg-type]
        try:
            resp.begin()
            body = resp.read()
        except (http.client.HTTPException, ValueError):
            return out, data[start:]
        out.append(Response(resp.status, resp.headers, body))
    return out, b""


def exchange(
    port: int, data: bytes | list[bytes], *, shut_write: bool = False, idle_s: float = 2.0
) -> tuple[bytes, bool]:
    """Send `data` (pieces sent one by one), read until the server closes or stays silent
    for `idle_s`; (bytes received, whether the server closed the connection)."""
    pieces = [data] if isinstance(data, bytes) else data
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for piece in pieces:
                sock.sendall(piece)
            if shut_write:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it closed on us mid-send: we still read what it said
        sock.settimeout(idle_s)
        received = b""
        while True:
            try:
                got = sock.recv(65536)
            except TimeoutError:
                return received, False
            except ConnectionResetError:
                return received, True
            if not got:
                return received, True
            received += got


def one_request(port: int, raw: bytes) -> Response:
    """Send one whole request (which says `Connection: close`) and parse its one answer."""
    received, closed = exchange(port, raw)
    assert closed, f"the connection stayed open after Connection: close: {received[:300]!r}"
    responses, rest = parse_responses(received)
    assert len(responses) == 1 and not rest, (received[:500], rest[:200])
    return responses[0]


def request_bytes(
    method: str,
    path: str,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
    close: bool = True,
    version: bytes = b"HTTP/1.1",
) -> bytes:
    head = [b"%s %s %s" % (method.encode(), path.encode(), version), b"Host: 127.0.0.1"]
    head += [name + b": " + value for name, value in headers or []]
    if method in ("POST", "PUT", "PATCH") or body:
        head.append(b"Content-Length: %d" % len(body))
    if close:
        head.append(b"Connection: close")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    finally:
        conn.close()


def check_answer(resp: Response) -> None:
    """The common property: an allowed status; 4xx in the OpenAI error shape; 200 a whole
    stream from the replica."""
    assert resp.status in ALLOWED, (resp.status, resp.body[:300])
    if 400 <= resp.status < 500:
        assert resp.headers.get_content_type() == "application/json", resp.headers
        openai_error(resp.body)
    elif resp.status in (429, 503):
        assert (resp.headers.get("Retry-After") or "").isdigit()
    if resp.status == 200:
        assert resp.headers.get("X-Servepilot-Replica") == "a"
        assert resp.body.endswith(DONE_EVENT) and resp.body.count(DONE_EVENT) == 1, resp.body


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


def encode(doc: Any) -> bytes:
    return json.dumps(doc).encode()


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
    if not isinstance(model, str) or not model:
        return 400
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
    return 200 if model == MODEL else 404


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


# --- (c) malformed HTTP over a plain socket -------------------------------------------------------

valid_requests = st.sampled_from(
    [
        request_bytes("GET", "/health", close=False),
        request_bytes("GET", "/v1/models", close=False),
        request_bytes("GET", "/metrics", close=False),
        request_bytes("POST", "/v1/chat/completions", encode(VALID_CHAT), close=False),
        request_bytes("POST", "/v1/completions", b"{not json", close=False),
        request_bytes("GET", "/nowhere", close=False),
    ]
)
garbage = st.binary(max_size=300).map(lambda b: b + b"\r\n\r\n")
request_lines = st.builds(
    lambda method, target, version, rest: b"%b %b %b\r\n%b\r\n" % (method, target, version, rest),
    st.sampled_from([b"GET", b"POST", b"get", b"PRI", b"CONNECT", b"TRACE", b"FOO", b"", b"G\x00T"])
    | st.binary(max_size=8),
    st.sampled_from(
        [
            b"/health",
            b"*",
            b"http://x/health",
            b"/v1/chat/completions",
            b"",
            b"/\xff",
            b"/a b",
            b"//",
            b"/" + b"x" * 70_000,
        ]
    )
    | st.binary(max_size=30),
    st.sampled_from(
        [
            b"HTTP/1.1",
            b"HTTP/1.0",
            b"HTTP/2.0",
            b"HTTP/9.9",
            b"HTTP/1",
            b"",
            b"http/1.1",
            b"HTTP/1.1 x",
            b"HTTP/0.9",
        ]
    ),
    st.sampled_from(
        [
            b"Host: x\r\n",
            b"",
            b"Host: x\r\nContent-Length: 5\r\n",
            b" folded\r\n",
            b"Host x\r\n",
            b": empty-name\r\n",
            b"Content-Length: -1\r\n",
            b"Content-Length: 1\r\nContent-Length: 2\r\n",
            b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
            b"Transfer-Encoding: gzip, chunked\r\n",
            b"Transfer-Encoding: identity\r\n",
            b"Content-Length: 99999999999999999999999\r\n",
        ]
    ),
)
chunk_lines = st.one_of(
    st.binary(min_size=0, max_size=20).map(lambda d: b"%x\r\n%b\r\n" % (len(d), d)),
    st.sampled_from(
        [
            b"zz\r\nab\r\n",
            b"-1\r\n",
            b"5\r\nab\r\n",
            b"3;ext=1\r\nabc\r\n",
            b"ffffffffffffffffffff\r\n",
            b"2\r\nabcd\r\n",
            b"\r\n",
            b"0\r\n",
            b"1\nx\n",
            b"0x2\r\nab\r\n",
        ]
    ),
)
bad_chunked = st.builds(
    lambda path, chunks, end: (
        b"POST %b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % path
        + b"".join(chunks)
        + end
    ),
    st.sampled_from([b"/v1/chat/completions", b"/v1/completions", b"/health"]),
    st.lists(chunk_lines, max_size=5),
    st.sampled_from([b"0\r\n\r\n", b"0\r\nTrailer: x\r\n\r\n", b"", b"0\r\n", b"garbage"]),
)
oversized_headers = st.builds(
    lambda count, size: (
        b"GET /health HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-Pad-%d: %b\r\n" % (i, b"v" * size) for i in range(count))
        + b"\r\n"
    ),
    st.integers(1, 40),
    st.sampled_from([10, 1000, 8000, 66_000]),
)
pipelined = st.builds(
    lambda reqs, tail: b"".join(reqs) + tail,
    st.lists(valid_requests, min_size=2, max_size=6),
    st.sampled_from([b"", b"GARBAGE\r\n\r\n", request_bytes("GET", "/health"), b"GET /he"]),
)
http10 = st.builds(
    lambda path, body, keep: (
        b"%b %b HTTP/1.0\r\n%bContent-Length: %d\r\n\r\n%b"
        % (
            b"POST" if body else b"GET",
            path,
            b"Connection: keep-alive\r\n" if keep else b"",
            len(body),
            body,
        )
    ),
    st.sampled_from([b"/health", b"/v1/models", b"/nowhere", b"/v1/chat/completions"]),
    st.sampled_from([b"", encode(VALID_CHAT), b"{}"]),
    st.booleans(),
)
malformed = st.one_of(garbage, request_lines, bad_chunked, oversized_headers, pipelined, http10)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


@settings(FUZZ, max_examples=150)
@given(data=malformed, cuts=st.lists(st.integers(0, 10**6), max_size=3))
def test_malformed_http_gets_a_4xx_or_a_close_and_the_server_lives_on(
    servers: Servers, crashes: Crashes, data: bytes, cuts: list[int]
) -> None:
    port = servers.open.port
    received, closed = exchange(port, split(data, cuts), idle_s=0.25)
    responses, rest = parse_responses(received)
    event(f"statuses {sorted({r.status for r in responses})}, closed={closed}")
    assert not rest, (data[:200], received[:500])
    for resp in responses:
        assert resp.status < 500, (resp.status, resp.body[:300], data[:300])
        if resp.status >= 400:
            openai_error(resp.body)
    # A request the HTTP parser refused is answered with a 4xx, then the connection closes.
    refused = ("bad_http", "body_too_large", "headers_too_large", "upgrade_not_supported")
    last = responses[-1] if responses else None
    if last is not None and last.status >= 400 and openai_error(last.body)["code"] in refused:
        assert closed, (data[:300], received[:300])
    crashes.check()


@FUZZ
@given(
    length=st.integers(1, 5000),
    sent=st.integers(0, 4999),
    path=st.sampled_from([b"/v1/chat/completions", b"/v1/completions"]),
)
def test_truncated_bodies_are_dropped_without_harm(
    servers: Servers, crashes: Crashes, length: int, sent: int, path: bytes
) -> None:
    sent = min(sent, length - 1)
    raw = b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path, length)
    received, closed = exchange(servers.open.port, raw + b"{" * sent, shut_write=True)
    # Half a request is no request: nothing to answer, and the connection ends.
    assert closed and received == b"", received[:300]
    crashes.check()


def test_pipelined_requests_are_answered_in_order(servers: Servers, crashes: Crashes) -> None:
    order = ["/health", "/v1/chat/completions", "/nowhere", "/v1/models", "/v1/completions"]
    raw = b"".join(
        request_bytes("POST", p, encode({**VALID_CHAT, "prompt": "x"}), close=False)
        if p.startswith("/v1/c")
        else request_bytes("GET", p, close=False)
        for p in order
    ) + request_bytes("GET", "/health", close=True)
    received, closed = exchange(servers.open.port, raw)
    responses, rest = parse_responses(received)
    assert closed and not rest
    assert [r.status for r in responses] == [200, 200, 404, 200, 200, 200]
    assert responses[1].body.endswith(DONE_EVENT) and b"chat.completion.chunk" in responses[1].body
    assert b"text_completion" in responses[4].body
    crashes.check()


def test_http10_without_keep_alive_is_answered_then_closed(
    servers: Servers, crashes: Crashes
) -> None:
    received, closed = exchange(servers.open.port, b"GET /health HTTP/1.0\r\n\r\n")
    responses, rest = parse_responses(received)
    assert closed and not rest and [r.status for r in responses] == [200]
    assert responses[0].headers.get("Connection", "").lower() == "close"
    crashes.check()


def test_oversized_headers_get_431_and_a_close(servers: Servers, crashes: Crashes) -> None:
    raw = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 70_000 + b"\r\n\r\n"
    received, closed = exchange(servers.open.port, raw)
    responses, _ = parse_responses(received)
    assert closed and [r.status for r in responses] == [431]
    assert openai_error(responses[0].body)["code"] == "headers_too_large"
    crashes.check()


# --- regressions: bugs this fuzzing found ---------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/admin/replicas"])
def test_deeply_nested_json_is_a_400_not_a_500(
    servers: Servers, crashes: Crashes, path: str
) -> None:
    body = b"[" * 50_000  # well under max_body_bytes (and the admin route's 64 KiB)
    resp = one_request(servers.open.port, request_bytes("POST", path, body))
    assert resp.status == 400, (resp.status, resp.body[:200])
    assert openai_error(resp.body)["code"] == "invalid_json"


def test_head_response_has_no_body(servers: Servers) -> None:
    raw = b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n" + request_bytes("GET", "/health")
    received, _ = exchange(servers.open.port, raw)
    # After the head of the HEAD answer, the next bytes must be the GET's status line.
    head_end = received.find(b"\r\n\r\n") + 4
    assert received[head_end:].startswith(b"HTTP/1.1 200"), received


def test_http10_stream_is_not_chunked(servers: Servers) -> None:
    body = encode(VALID_CHAT)
    raw = b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)
    received, closed = exchange(servers.open.port, raw)
    head, _, payload = received.partition(b"\r\n\r\n")
    assert closed and b" 200 " in head.split(b"\r\n")[0]
    assert b"transfer-encoding" not in head.lower(), head
    assert payload.startswith(b"data: "), payload[:40]


def test_expect_100_continue_does_not_cut_into_a_streaming_response(servers: Servers) -> None:
    stream_request = request_bytes("POST", "/v1/chat/completions", encode(VALID_CHAT), close=False)
    body = encode(VALID_CHAT)
    second_head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body)
    )
    # The stub answers in one write, so the first response is in flight only briefly; a slow
    # one is made by a stub with a chunk delay, in front of a gateway of its own.
    with (
        ThreadedStub(StubConfig(chunks=10, chunk_delay_s=0.02)) as slow,
        ThreadedGateway(GatewayConfig(port=0), [Upstream("slow", slow.url)]) as gw,
        socket.create_connection(("127.0.0.1", gw.port), timeout=5) as sock,
    ):
        sock.sendall(stream_request)
        time.sleep(0.08)  # the first answer is streaming now
        sock.sendall(second_head)
        time.sleep(0.05)
        sock.sendall(body)
        received = b""
        while got := sock.recv(65536):
            received += got
    responses, rest = parse_responses(received)
    assert not rest and [r.status for r in responses] == [200, 200], received[:2000]
    assert all(r.body.endswith(DONE_EVENT) for r in responses)
    assert b"100 Continue" not in responses[0].body
