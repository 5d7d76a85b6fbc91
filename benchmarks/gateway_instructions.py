"""Instructions per request of the gateway's own path, counted by valgrind: a figure that no
neighbour on a shared machine can move, to decide between two versions of the data path.

    python benchmarks/gateway_instructions.py              # instructions per request
    python benchmarks/gateway_instructions.py --keep DIR   # ...and callgrind's files in DIR
    python benchmarks/gateway_instructions.py --time       # CPU us per request, no valgrind

(with `PYTHONPATH` at the tree to measure; `valgrind` from the distribution's package). Where
`make gateway-fast` has built the tree's data path for its current sources, the compiled
gateway is what is measured (the first line printed says which: core/accel.py's status);
`SERVEPILOT_GATEWAY_PURE=1` measures the same tree in pure Python. One
process runs a real `Gateway` (round robin over two replicas, no access log) on uvloop, with
fake sockets on both sides: the client's side is fed one streamed chat completion request at
a time, as one read, and the upstream side answers each request the way
`benchmarks/gateway_everyday.py`'s stubs do, one read per piece, each in its own turn of the
event loop (18 reads: the head with the role event, 16 tokens written alone, the tail with the
finish and usage events, [DONE] and the chunked body's end). So every request goes through
parse, admission, routing, the handler task, the relay, metrics and the connection's reuse;
no system call or other process is involved. Two runs under `valgrind --tool=callgrind`
(`PYTHONHASHSEED=0`), of 100 and 600 requests: their difference over 500 is the count per
request, start-up and warm-up excluded. Each run checks that the client received every event
of its last 20 answers, in valid chunked framing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gateway_everyday
import httptools

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout

from servepilot.core import accel
from servepilot.core.config import GatewayConfig
from servepilot.gateway import Gateway
from servepilot.http1.client import ClientConnection
from servepilot.http1.connection import HttpConnection
from tests.support.stub_server import StubConfig, ThreadedStub, _Answer, answer_events

TOKENS = 16
_ANSWER = _Answer("chat", StubConfig(chunks=TOKENS))
PIECES = (_ANSWER.first, *[_ANSWER.token] * TOKENS, _ANSWER.tail)
"""The upstream reads of one answer, as a replica writing each token alone sends them."""
_EVENTS = answer_events("chat", StubConfig(chunks=TOKENS))
EXPECTED_BODY = b"".join((*_EVENTS.first, *[_EVENTS.token] * TOKENS, *_EVENTS.tail))
_BODY = json.dumps(gateway_everyday.BODY).encode()
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept: */*\r\n"
    b"Accept-Encoding: gzip, deflate\r\nUser-Agent: Python/3.11 aiohttp/3.11.18\r\n"
    b"Content-Length: %d\r\nContent-Type: application/json\r\n\r\n%b" % (len(_BODY), _BODY)
)
"""The everyday point's request, with the headers its aiohttp client sends."""
SHORT, LONG = 100, 600
CHECKED = 20
"""The last answers checked: every event, in valid chunked framing."""


class _Socket:
    """What both fake sides do alike: never closing, reading without flow control."""

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


class _UpstreamSocket(_Socket):
    """The replica's side: answers every request written to it with `PIECES`, one read per
    turn of the event loop."""

    dropped = 0
    """Connections the gateway dropped (none should be, before it stops)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: ClientConnection) -> None:
        self._loop = loop
        self._protocol = protocol

    def write(self, data: bytes) -> None:
        self._loop.call_soon(self._feed, 0)

    def _feed(self, index: int) -> None:
        self._protocol.data_received(PIECES[index])
        if index + 1 < len(PIECES):
            self._loop.call_soon(self._feed, index + 1)

    def abort(self) -> None:
        _UpstreamSocket.dropped += 1


class _ClientSocket(_Socket):
    """The client's side: keeps what the gateway writes."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def abort(self) -> None:
        raise AssertionError("the gateway dropped the client's connection")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class _Answers:
    """httptools' response parser over what the client received: each answer's body."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self._parts: list[bytes] = []
        self.status: list[int] = []
        self._parser = httptools.HttpResponseParser(self)

    def on_body(self, data: bytes) -> None:
        self._parts.append(data)

    def on_message_complete(self) -> None:
        self.status.append(self._parser.get_status_code())
        self.bodies.append(b"".join(self._parts))
        self._parts.clear()

    def feed(self, data: bytes) -> None:
        self._parser.feed_data(data)


def _fake_upstream(loop: asyncio.AbstractEventLoop) -> None:
    """Every connection the gateway opens from now on is to a fake replica answering
    `PIECES` (the gateway's own pooling and keep-alive reuse run as they are)."""

    async def create_connection(
        factory: Callable[[], asyncio.Protocol], *args: Any, **kwargs: Any
    ) -> tuple[asyncio.Transport, asyncio.Protocol]:
        protocol = factory()
        assert isinstance(protocol, ClientConnection)
        transport = _UpstreamSocket(loop, protocol)
        protocol.connection_made(transport)  # type: ignore[arg-type]
        return transport, protocol  # type: ignore[return-value]

    loop.create_connection = create_connection  # type: ignore[method-assign,assignment]


async def _requests(count: int) -> float:
    """Send `count` requests one after the other; CPU seconds they took."""
    loop = asyncio.get_running_loop()
    _UpstreamSocket.dropped = 0
    with ThreadedStub(StubConfig(chunks=TOKENS)) as stub:  # answers the replicas' checks
        gateway = Gateway(GatewayConfig(policy="round_robin", health_interval_s=3600.0))
        await gateway.pool.add("r0", stub.url)
        await gateway.pool.add("r1", stub.url)
        _fake_upstream(loop)
        conn = HttpConnection(gateway._server)
        client = _ClientSocket()
        conn.connection_made(client)  # type: ignore[arg-type]
        started = time.process_time()
        for sent in range(count):
            if sent == count - CHECKED:
                client.written.clear()  # a fixed cost, which the difference of two runs drops
            conn.data_received(REQUEST)
            task = conn.answering
            assert task is not None
            await task
            await asyncio.sleep(0)  # a turn for a done callback, where a tree has one
            assert conn.answering is None
        spent_s = time.process_time() - started
        assert not _UpstreamSocket.dropped, "the gateway dropped an upstream connection"
        await gateway.pool.close()
    _check(client.written, min(count, CHECKED))
    return spent_s


def _check(written: list[bytes], count: int) -> None:
    answers = _Answers()
    for data in written:
        answers.feed(data)
    wrong = [i for i, body in enumerate(answers.bodies) if body != EXPECTED_BODY]
    if len(answers.bodies) != count or wrong or set(answers.status) != {200}:
        sys.exit(f"the client got {len(answers.bodies)} answers of {count}, statuses "
                 f"{sorted(set(answers.status))}, {len(wrong)} bodies not as sent")  # fmt: skip


def _run(count: int, reps: int) -> None:
    import uvloop

    per_request_us = []
    for _ in range(reps):
        per_request_us.append(uvloop.run(_requests(count)) / count * 1e6)
    if reps > 1:
        print(f"{statistics.median(per_request_us):.1f} us/request of CPU "
              f"(median of {reps}; min {min(per_request_us):.1f})")  # fmt: skip


def _collected(count: int, keep: Path | None) -> int:
    """Instructions of a whole run of `count` requests under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = (keep or Path(tmp)) / f"callgrind.out.{count}"
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                sys.executable, __file__, "--run", str(count)]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or found is None:
        sys.exit(f"valgrind failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=int, metavar="N", help="(child) send N requests")
    parser.add_argument("--time", action="store_true",
                        help="CPU us per request (median of 7 runs), no valgrind")  # fmt: skip
    parser.add_argument("--keep", type=Path, help="keep callgrind's output files here")
    args = parser.parse_args()
    if args.run is not None:
        _run(args.run, 1)
    elif args.time:
        _run(2000, 7)
    else:
        print(f"gateway data path: {accel.status(accel.GATEWAY)}")
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
        short, long = _collected(SHORT, args.keep), _collected(LONG, args.keep)
        print(f"{(long - short) / (LONG - SHORT):,.0f} instructions per request "
              f"(callgrind, {LONG} - {SHORT} requests)")  # fmt: skip


if __name__ == "__main__":
    main()
