"""The client's byte-level decoders (chunked framing, SSE events) against plain references,
however the bytes are split across reads."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from servepilot.bench.framing import dechunk
from servepilot.bench.records import Endpoint
from servepilot.bench.sse import EventScanner
from servepilot.bench.wire import Connection, Pool
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


class _Sink:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass


def _feed(pieces: list[bytes]) -> tuple[str | None, int, bytes | None]:
    async def go() -> tuple[str | None, int, bytes | None]:
        pool = Pool("h", 1, None, lambda: EventScanner(Endpoint.CHAT), 0.0)
        conn = Connection(pool)
        conn.transport = _Sink()  # type: ignore[assignment]
        waiter = asyncio.get_running_loop().create_future()
        conn.start(b"", waiter, 1e18)
        for piece in pieces:
            conn.data_received(piece)
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


def _reference_dechunk(data: bytes) -> tuple[bytes, bool] | None:
    body, pos = b"", 0
    while pos < len(data):
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(data[pos:eol].split(b";")[0], 16)
        if size == 0:
            return (body, True) if data[eol:] == b"\r\n\r\n" else None
        if data[eol + 2 + size : eol + 4 + size] != b"\r\n":
            return None
        body, pos = body + data[eol + 2 : eol + 2 + size], eol + 4 + size
    return body, False


def test_dechunk_fast_path_is_exact_or_declines() -> None:
    assert dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n") == (b"abcde", True)
    assert dechunk(b"3\r\nabc\r\n") == (b"abc", False)
    assert dechunk(b"5\r\na\r\nbc\r\n") == (b"a\r\nbc", False)
    assert dechunk(b"3\r\nab") is None
    rng = random.Random(2)
    alphabet = [b"a", b"\r\n", b"0", b"\r", b"\n", b"5"]
    for _ in range(3000):
        pieces = [b"".join(rng.choices(alphabet, k=rng.randint(1, 4))) for _ in range(3)]
        data = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces[: rng.randint(1, 3)])
        data += rng.choice([b"", b"0\r\n\r\n"])
        fast = dechunk(data)
        assert fast is None or fast == _reference_dechunk(data), data
