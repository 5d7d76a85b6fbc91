"""Fuzzing the gateway's HTTP server below the request: (c) malformed HTTP over a plain socket
gets a 4xx or a closed connection, and the server keeps serving; then the regressions this
fuzzing found. The servers are fuzz_support.py's.
"""

from __future__ import annotations

import itertools
import socket
import time

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from servepilot.core.config import GatewayConfig

# pytest finds fixtures by name in the module: the servers and the crash watch.
from tests.integration.fuzz_support import (
    DONE_EVENT,
    FUZZ,
    VALID_CHAT,
    Crashes,
    Servers,
    encode,
    exchange,
    one_request,
    parse_responses,
    request_bytes,
)
from tests.integration.gatewayproc import openai_error
from tests.integration.threaded_gateway import ThreadedGateway, Upstream
from tests.support.stub_server import StubConfig, ThreadedStub

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
