"""The HTTP/1.1 server core (servepilot/http1), as the simulated replica serves with it, over
real loopback sockets: what the replica gained by sharing the gateway's server. A head over
the limit gets a 431, `Expect: 100-continue` is answered before the body is sent, and a
client that does not read costs a bounded buffer, whatever the length of its stream. (The
gateway's side of each is in tests/integration/test_gateway_fuzz_http.py.)"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from servepilot.engine.metrics import parse_metrics
from servepilot.http1 import HttpRequest, HttpServer, Limits
from tests.integration.fuzz_support import exchange, parse_responses
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, ThreadedSim

HIGH_WATER_BYTES = 64 * 1024  # asyncio's and uvloop's default for a transport's write buffer


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSim]:
    with ThreadedSim([*BASE_ARGS, *COST_FLAGS]) as server:
        yield server


def _chat(max_tokens: int, *, stream: bool) -> bytes:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": max_tokens, "stream": stream}  # fmt: skip
    return json.dumps(body).encode()


def _head(body: bytes, *extra: bytes) -> bytes:
    lines = [b"POST /v1/chat/completions HTTP/1.1", b"Host: x", b"Content-Type: application/json",
             b"Content-Length: %d" % len(body), *extra]  # fmt: skip
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _read_to_close(sock: socket.socket) -> bytes:
    received = b""
    while got := sock.recv(65536):
        received += got
    return received


def test_a_head_over_the_limit_gets_431_and_a_close(sim: ThreadedSim) -> None:
    raw = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 70_000 + b"\r\n\r\n"
    received, closed = exchange(sim.port, raw)
    responses, _ = parse_responses(received)
    assert closed and [r.status for r in responses] == [431], received[:300]
    error = json.loads(responses[0].body)["error"]  # vLLM's error shape
    assert (error["code"], error["type"]) == (431, "BadRequestError"), error
    assert httpx.get(f"{sim.url}/health").status_code == 200


def test_expect_100_continue_is_answered_before_the_body_is_sent(sim: ThreadedSim) -> None:
    body = _chat(3, stream=False)
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(_head(body, b"Expect: 100-continue", b"Connection: close"))
        sock.settimeout(2.0)
        try:
            interim = sock.recv(65536)
        except TimeoutError:
            interim = b""  # curl and others would wait a second, then send the body anyway
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        responses, rest = parse_responses(_read_to_close(sock))
    assert [r.status for r in responses] == [200] and not rest
    assert json.loads(responses[0].body)["usage"]["completion_tokens"] == 3


def _shrink_send_buffers(server: HttpServer) -> int:
    """Give the server's sockets a small kernel send buffer, as on a busy host: on loopback
    Linux lets one grow to 4 MB, which would hide what the server itself holds."""
    for conn in server.connections:
        assert conn.transport is not None
        conn.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024
        )
    return len(server.connections)


def _buffered_bytes(server: HttpServer) -> int:
    return sum(c.transport.get_write_buffer_size() for c in server.connections if c.transport)


def test_a_client_that_does_not_read_costs_a_bounded_buffer() -> None:
    """A 4,000-token stream (about 900 kB) to a client that reads nothing until all of it has
    been generated: the server's buffer for it stays near the high-water mark (without
    backpressure it holds the whole stream), the request counts as in flight until its last
    event is written, and every event arrives once the client reads."""
    tokens = 4000
    argv = [*BASE_ARGS, "--max-model-len", "4096", "--step-ms", "0.2"]
    with ThreadedSim(argv) as fast, socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: small window
        sock.connect(("127.0.0.1", fast.port))
        deadline = time.monotonic() + 30
        while fast.inspect(_shrink_send_buffers) != 1:
            assert time.monotonic() < deadline, "the server did not accept the connection"
        body = _chat(tokens, stream=True)
        sock.sendall(_head(body, b"Connection: close") + body)
        while parse_metrics(httpx.get(f"{fast.url}/metrics").text).generation_tokens_total < tokens:
            assert time.monotonic() < deadline, "the stream was not generated in 30 s"
            time.sleep(0.05)
        buffered = fast.inspect(_buffered_bytes)
        assert not fast.idle_within(0.3)  # held back, so still in flight: a drain waits
        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(_read_to_close, sock)
            assert fast.idle_within(10)
            received = reading.result(10)
    assert len(received) > 10 * HIGH_WATER_BYTES
    assert buffered < HIGH_WATER_BYTES + 16 * 1024, buffered
    responses, rest = parse_responses(received)
    assert [r.status for r in responses] == [200] and not rest
    events = responses[0].body.split(b"\n\n")
    contents = [json.loads(e[6:])["choices"][0]["delta"] for e in events[:-2]]
    assert len([d for d in contents if d.get("content")]) == tokens
    assert events[-2:] == [b"data: [DONE]", b""]


def test_a_400_before_the_body_reaches_a_client_still_sending_it(sim: ThreadedSim) -> None:
    """A head llhttp refuses (Content-Length beside chunked coding) with 4 MiB behind it, all
    written before a byte is read: the 400 arrives whole, then the close (a lingering close;
    a plain close with the body unread sends a reset that can destroy the 400)."""
    raw = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n") + b"x" * (4 * 1024 * 1024)  # fmt: skip
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        responses, _ = parse_responses(_read_to_close(sock))
    assert [r.status for r in responses] == [400]
    assert json.loads(responses[0].body)["error"]["code"] == 400  # vLLM's error shape


def test_a_lingering_close_ends_within_its_bound_when_the_client_never_closes(
    sim: ThreadedSim,
) -> None:
    """A client that gets its 431, then neither sends nor closes: the server stops waiting for
    it after Limits.linger_s (2 s) and counts it as lingering only until then."""
    raw = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 70_000 + b"\r\n\r\n"
    # The server is shared: an earlier test's refusal may still linger (up to 2 s).
    quiet_by = time.monotonic() + 5
    while sim.inspect(lambda s: s.lingering):
        assert time.monotonic() < quiet_by, "an earlier lingering connection never closed"
        time.sleep(0.05)
    with socket.create_connection(("127.0.0.1", sim.port), timeout=5) as sock:
        sock.sendall(raw)
        started = time.monotonic()
        sock.settimeout(5)
        received = b""
        while not received.endswith(b"}"):
            received += sock.recv(65536)
        assert sim.inspect(lambda s: s.lingering) == 1
        assert sock.recv(65536) == b""  # the server's half-close, right after the answer
        assert time.monotonic() - started < 1.0
        deadline = started + 5
        while sim.inspect(lambda s: s.lingering):
            assert time.monotonic() < deadline, "the lingering connection was never closed"
            time.sleep(0.05)
        closed_after_s = time.monotonic() - started
    assert 1.9 < closed_after_s < 3.0, closed_after_s
    assert parse_responses(received)[0][0].status == 431
    assert not sim.inspect(lambda s: s.connections)


def test_a_refusal_behind_pipelined_requests_lingers_too(sim: ThreadedSim) -> None:
    """Two pipelined requests, then a head over the limit and 8 MiB more: the first is
    answered (the refusal drops what waited behind it), then the connection lingers, reading
    again (it had stopped while the second waited its turn), so the client's send completes
    and it reads the answer; a server that did not read would leave it blocked in its send
    until the close resets it."""
    body = _chat(2, stream=False)
    raw = (
        _head(body) + body
        + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"v" * 70_000 + b"\r\n\r\n"
        + b"x" * (8 * 1024 * 1024)
    )  # fmt: skip
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)  # before connect
        sock.settimeout(10)
        sock.connect(("127.0.0.1", sim.port))
        sock.sendall(raw)
        responses, _ = parse_responses(_read_to_close(sock))
    # The first answer is the chat's. If it is done before the oversized head is parsed,
    # the /health waiting behind it is answered too, then the head refused (a fresh clone's
    # run saw this order); else the refusal drops it. Either way the client read to the close.
    assert [r.status for r in responses] in ([200], [200, 200, 431])


def test_a_server_on_uvloop_answers_on_the_port_it_reports() -> None:
    """uvloop's `Server.sockets` is a list where typeshed says a tuple: the server reads it
    untyped, as the compiled one (`make gateway-fast`) must, which checks declared types."""
    import uvloop

    async def handler(request: HttpRequest) -> None:
        request.respond(200, b'{"ok":true}')

    async def body() -> bytes:
        server = HttpServer(handler, Limits(1024), lambda status, message, code: b"{}")
        port = await server.start("127.0.0.1", 0)
        try:
            async with httpx.AsyncClient() as client:
                answer = await client.get(f"http://127.0.0.1:{port}/")
            return answer.content
        finally:
            await server.close()

    assert uvloop.run(body()) == b'{"ok":true}'
