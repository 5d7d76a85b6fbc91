"""The API timeline plugin's records and the report that reads them (no vLLM, no GPU)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.gpu_api_timeline_report import (
    batches,
    engine_steps,
    idle_cost,
    read_timeline,
    slowdown_table,
    step_table,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "gpu_api_timeline"))
import servepilot_api_timeline as plugin


def test_the_report_joins_a_requests_stamps_and_finds_the_tokenizers_batches() -> None:
    lines = [
        {"wall": 1.0, "mono": 0.0, "pid": 1},
        {"rid": "a", "create": 1.000, "render": 1.010, "add_in": 1.011, "add_out": 1.0112},
        {"rid": "b", "create": 1.002, "render": 1.0105, "add_in": 1.012, "add_out": 1.0122},
        {"rid": "c", "create": 1.020, "render": 1.030, "add_in": 1.031, "add_out": 1.0312},
        {"rid": "a-1f2e3d4c", "queued": 1.015, "scheduled": 1.016},
        {"rid": "a-1f2e3d4c", "first_engine": 1.040, "first_proc": 1.041},
        {"rid": "a", "first_chunk": 1.042, "second_chunk": 1.043},
        {"rid": "b", "first_chunk": 1.044, "second_chunk": 1.045},
        {"rid": "c", "first_chunk": 1.050, "second_chunk": 1.051},
        {"po": 1.005, "dur": 0.001, "n": 100, "ts": 1.004},
        {"po": 1.025, "dur": 0.001, "n": 40, "ts": 1.024},
        {"lag": 1.0, "ms": 3.0},
    ]
    requests, calls = read_timeline(json.dumps(line) for line in lines)
    assert [r["create"] for r in requests] == [1.000, 1.002, 1.020]
    # The engine core's id carries vLLM's suffix: its stamps join the API server's.
    assert requests[0]["scheduled"] == 1.016 and requests[0]["first_engine"] == 1.040
    found = batches(requests, calls)
    # a and b rendered 0.5 ms apart: one batch of two, from a's arrival to b's render, beside
    # the 100 tokens streamed then; c alone, from its arrival (after that batch), beside 40.
    assert found == [(2, pytest.approx(0.0105), pytest.approx(100 / 0.0105)),
                     (1, pytest.approx(0.010), pytest.approx(40 / 0.010))]  # fmt: skip


def test_the_engines_steps_are_read_on_its_clock_with_their_first_tokens() -> None:
    """Three output batches at 10.00, 10.02 and 10.05 s of the engine's clock: the second
    carried a's first token (a prefill) and 2 outputs in two chunks, the third 3 outputs."""
    rows = [{"create": 9.9, "client": 10.2, "first_engine": 10.02}]
    calls = [{"po": 10.001, "n": 1, "ts": 10.00}, {"po": 10.021, "n": 1, "ts": 10.02},
             {"po": 10.022, "n": 1, "ts": 10.02}, {"po": 10.051, "n": 3, "ts": 10.05},
             {"po": 11.0, "n": 9, "ts": 10.9}]  # fmt: skip
    steps = engine_steps(rows, calls)
    assert steps == [(1, 2, pytest.approx(0.02)), (0, 3, pytest.approx(0.03))]
    rows = [line.split() for line in step_table(steps * 8).splitlines()[1:]]
    assert rows == [["0", "0-49", "8", "30.0"], ["1", "0-49", "8", "20.0"]]
    assert step_table(steps * 7).splitlines()[1:] == []  # under 8 steps: not shown


def test_a_batchs_idle_cost_and_its_slowing_beside_the_streaming() -> None:
    """Idle batches of 1, 2 and 3 prompts in 6, 8 and 10 ms: 6 ms for one (the median of the
    one-prompt batches) and 2 ms a further one. Beside 10,000 streamed tokens a second at
    30 us a token (a share of 0.3), a one-prompt batch of 12 ms is slowed 2 times."""
    idle_rows = [(1, 0.005, 0.0), (1, 0.006, 0.0), (1, 0.007, 0.0), (2, 0.008, 0.0),
                 (3, 0.010, 0.0)]  # fmt: skip
    one, more = idle_cost(idle_rows)
    assert one == pytest.approx(0.006) and more == pytest.approx(0.002)
    table = slowdown_table([(1, 0.012, 10_000.0), (2, 0.008, 100.0)], (one, more), 30e-6)
    assert [line.split() for line in table.splitlines()[1:]] == [
        ["0.3", "1", "2.00", "1.43", "2.04"]
    ]  # the second batch, at a share of 0.003, is too idle to count


class _Processor:
    def process_outputs(self, outputs: list[Any], timestamp: float | None = None) -> str:
        return f"processed {len(outputs)}"


def test_the_plugin_stamps_first_tokens_and_engine_events_and_keeps_the_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plugin._lines.clear()
    plugin._seen_first.clear()
    monkeypatch.setattr(_Processor, "process_outputs", plugin._process(_Processor.process_outputs))
    event = SimpleNamespace(type=1, timestamp=5.0)
    first = SimpleNamespace(request_id="r-1", events=[event], new_token_ids=[7])
    again = SimpleNamespace(request_id="r-1", events=None, new_token_ids=[8])
    assert _Processor().process_outputs([first], 4.5) == "processed 1"
    assert _Processor().process_outputs([again], engine_core_timestamp=4.6) == "processed 1"
    records = [json.loads(line) for line in plugin._lines]
    assert {"rid": "r-1", "queued": 5.0, "scheduled": None} in records
    firsts = [r for r in records if "first_engine" in r]
    assert len(firsts) == 1 and firsts[0]["first_engine"] == 4.5
    assert [r["ts"] for r in records if "po" in r] == [4.5, 4.6]


def test_the_plugin_hands_the_routes_stamps_to_the_stream_that_adds_the_request() -> None:
    """vLLM runs the route in a task of its own: the stamps set there reach add_request, which
    the stream's task calls, through the request id."""
    plugin._lines.clear()

    class Engine:
        async def add_request(self, request_id: str) -> str:
            return request_id

    class Chat:
        async def create_chat_completion(self, request: Any) -> Any:
            return self.chat_completion_stream_generator(request, None, "chatcmpl-1")

        def chat_completion_stream_generator(self, request: Any, results: Any, rid: str) -> Any:
            async def chunks() -> Any:
                await Engine().add_request(rid)
                yield "role"
                yield "token"

            return chunks()

    Chat.create_chat_completion = plugin._chat(Chat.create_chat_completion)  # type: ignore[method-assign]
    Chat.chat_completion_stream_generator = plugin._stream(  # type: ignore[method-assign]
        Chat.chat_completion_stream_generator
    )
    Engine.add_request = plugin._add(Engine.add_request)  # type: ignore[method-assign]

    async def serve() -> list[str]:
        stream = await asyncio.get_running_loop().create_task(Chat().create_chat_completion(None))
        out = [chunk async for chunk in stream]  # another task than the route's
        for task in plugin._lag_task:
            task.cancel()
        plugin._lag_task.clear()
        return out

    assert asyncio.run(serve()) == ["role", "token"]
    records = [json.loads(line) for line in plugin._lines]
    added = next(r for r in records if "add_in" in r)
    assert added["rid"] == "chatcmpl-1" and added["create"] <= added["add_in"]
    assert any(r.get("first_chunk") for r in records)
