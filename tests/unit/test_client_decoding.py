"""The client's decoding of a streamed answer (the client core's chunked framing, then the SSE
events) against plain references, however the bytes are split across reads."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from servepilot.bench.records import Endpoint
from servepilot.bench.sse import EventScanner
from servepilot.bench.wire import Connection, Pool
from servepilot.http1.client import ClientConnection
from tests.unit.test_client import ROLE, USAGE, chat


def _stream(rng: random.Random, compact: bool) -> tuple[bytes, int]:
    """A random valid chunked SSE answer and its number of content events."""
    events, content = [ROLE], 0
    for _ in range(rng.randint(0, 12)):
        text = rng.choice(["", "a", '"', "\\", "é", "data: x", "\n", " ", '"content":""'])
        if compact or rng.random() < 0.8:
            events.append(chat(text))
        else:
            delta = {"choices": [{"delta": {"content": text}}]}
            events.append(json.dumps(delta, indent=rng.choice([None, 1])).encode())
        content += text != ""
    events += [USAGE, b"[DONE]"]
    body = b""
    for event in events:
        lines = b"data: " + event.replace(b"\n", b"\ndata: ") + b"\n\n"
        body += b"%x\r\n%s\r\n" % (len(lines), lines)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
    return head + b"\r\n" + body + b"0\r\n\r\n", content


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def _feed(pieces: list[bytes]) -> tuple[str | None, int, bytes | None]:
    async def go() -> tuple[str | None, int, bytes | None]:
        pool = Pool("h", 1, None, lambda: EventScanner(Endpoint.CHAT), 0.0)
        conn = Connection(pool)
        conn.wire = ClientConnection(conn)
        conn.wire.connection_made(_Transport())  # type: ignore[arg-type]
        waiter = asyncio.get_running_loop().create_future()
        conn.start(b"", waiter, 1e18)
        for piece in pieces:
            conn.wire.data_received(piece)
        answer = waiter.result()
        return answer.error, len(answer.chunks), answer.usage

    result: tuple[str | None, int, bytes | None] = asyncio.run(go())
    return result


@pytest.mark.parametrize("compact", [True, False])
def test_decoding_does_not_depend_on_how_reads_split(
    compact: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    bulk = EventScanner._bulk
    took: list[bool] = []

    def counting(self: EventScanner, data: bytes, end: int, now: float) -> bool:
        took.append(bulk(self, data, end, now))
        return took[-1]

    monkeypatch.setattr(EventScanner, "_bulk", counting)
    rng = random.Random(5)
    for _ in range(300):
        raw, content = _stream(rng, compact)
        cuts = sorted(rng.sample(range(1, len(raw)), rng.randint(0, min(6, len(raw) - 1))))
        pieces = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=False)]
        error, chunks, usage = _feed(pieces)
        assert error == (None if content else "no_content") and usage is not None
        # Every content event in one read shares its timestamp, but the count is exact.
        assert chunks == content
    assert not compact or sum(took) > 50  # the counting shortcut was taken (and agreed)
