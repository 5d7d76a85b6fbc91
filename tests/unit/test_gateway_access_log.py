"""The gateway's access log: one JSON line per request, buffered in memory and written by one
background task, flushed whole on a clean stop, sampled exactly, and never blocking a request
(a full buffer drops lines and counts them)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from servepilot.core.config import AccessLogConfig, GatewayConfig
from servepilot.core.errors import ConfigError
from servepilot.gateway import Gateway
from servepilot.gateway.access_log import AccessLog, _utc
from tests.unit.fake_upstream import FakeUpstream, sse
from tests.unit.gateway_support import (
    STREAM_CHAT,
    call,
    chat,
    eventually,
    gateway_in_front_of,
    in_background,
    read_event,
    run,
    scrape,
    until,
)

# Nothing is written before the gateway stops, unless a test says otherwise.
HELD = {"flush_interval_ms": 3_600_000.0, "flush_lines": 100_000}


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(text) for text in path.read_text().splitlines()]


def test_every_request_gets_a_line_that_matches_its_answer(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    answers: list[tuple[int, str | None]] = []

    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        a.usage = b.usage = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
        settings = {"path": str(path), "flush_interval_ms": 20.0}
        async with (
            gateway_in_front_of([a, b], access_log=settings, retry_after_s=3) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            for index in range(6):
                reply = await call(client, url, STREAM_CHAT if index % 2 else chat("hello"))
                answers.append((reply.status, reply.headers.get("X-Servepilot-Replica")))
            unknown = await call(client, url, {**chat("x"), "model": "nope"})
            answers.append((unknown.status, None))
            assert gw.access_log is not None
            await eventually(until(lambda: len(path.read_text().splitlines()) == 7))
            # Counted once the writer's thread has returned to the loop. Then one scrape: a
            # scrape gets its own line, so polling /metrics could see 6 and then 8 (once, on a
            # loaded CI box, 2026-12-07).
            access = gw.access_log
            await eventually(until(lambda: access.written == 7))
            scraped = await scrape(client, url)
            assert scraped.value("servepilot_access_log_lines_total") == 7

    run(body())
    *lines, scraped = _lines(path)  # the scrape of /metrics got its line too
    assert [(line["status"], line["replica"]) for line in lines] == answers
    assert (scraped["method"], scraped["path"], scraped["status"]) == ("GET", "/metrics", 200)
    assert [r for _, r in answers[:6]] == ["a", "b", "a", "b", "a", "b"]  # round robin
    plain, streamed, refused = lines[0], lines[1], lines[6]
    assert plain["method"] == "POST" and plain["path"] == "/v1/chat/completions"
    assert (plain["class"], plain["model"], plain["stream"], plain["prompt_chars"]) == (
        1, "m", False, 5,
    )  # fmt: skip
    assert (plain["prompt_tokens"], plain["output_tokens"], plain["error"]) == (9, 4, None)
    assert plain["ttft_ms"] is None and 0 < plain["ttfb_ms"] <= plain["e2e_ms"]
    assert plain["bytes_out"] == len(json.dumps(_answer("a", a_usage=True)).encode())
    relayed = sse({"choices": [{"delta": {"content": "one"}}]}) + sse(
        {"choices": [{"delta": {"content": "two"}}]}
    )
    assert streamed["bytes_out"] == len(relayed) + len(b"data: [DONE]\n\n")
    assert streamed["stream"] is True and 0 < streamed["ttft_ms"] <= streamed["e2e_ms"]
    assert streamed["output_tokens"] is None  # a stream without include_usage says nothing
    assert (refused["status"], refused["error"], refused["replica"]) == (
        404, "model_not_found", None,
    )  # fmt: skip
    assert plain["time"].endswith("Z") and len(plain["time"]) == len("2026-12-01T14:50:00.123Z")


def _answer(name: str, a_usage: bool) -> dict[str, Any]:
    """The fake upstream's non-streamed answer, as aiohttp serialises it."""
    message = {"role": "assistant", "content": f"hello from {name}"}
    answer: dict[str, Any] = {"object": "chat.completion", "choices": [{"message": message}]}
    if a_usage:
        answer["usage"] = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
    return answer


def test_a_clean_stop_writes_every_buffered_line(tmp_path: Path) -> None:
    path = tmp_path / "access.log"

    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], access_log={"path": str(path), **HELD}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            for _ in range(5):
                assert (await call(client, url)).status == 200
            assert gw.access_log is not None and gw.access_log.buffered == 5
            assert (await scrape(client, url)).value("servepilot_access_log_buffered") == 5
            assert path.read_text() == ""  # nothing written yet: all held in memory

    run(body())
    lines = _lines(path)
    assert [line["path"] for line in lines] == ["/v1/chat/completions"] * 5 + ["/metrics"]


def test_the_buffer_empties_at_each_flush(tmp_path: Path) -> None:
    """The buffered gauge goes up with each request and back to 0 when `flush_lines` lines
    wait (the writer is woken, not left to its interval)."""
    path = tmp_path / "access.log"
    settings = {"path": str(path), "flush_interval_ms": 3_600_000.0, "flush_lines": 4}

    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], access_log=settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            access = gw.access_log
            assert access is not None
            for _ in range(3):
                await call(client, url)
            assert access.buffered == 3
            await call(client, url)
            await eventually(until(lambda: access.written == 4))
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_access_log_buffered") == 0
            assert metrics.value("servepilot_access_log_lines_total") == 4
            assert len(_lines(path)) == 4

    run(body())


def test_a_full_buffer_drops_and_counts_never_waits(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    settings = {"path": str(path), **HELD, "buffer_lines": 3}

    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], access_log=settings) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            for _ in range(5):
                assert (await call(client, url)).status == 200
            metrics = await scrape(client, url)
            assert (
                metrics.value("servepilot_access_log_dropped_total", {"reason": "buffer_full"}) == 2
            )
            assert metrics.value("servepilot_access_log_buffered") == 3

    run(body())
    assert len(_lines(path)) == 3


def test_sampling_logs_an_exact_evenly_spread_share() -> None:
    def taken(rate: float, requests: int) -> list[int]:
        access = AccessLog(AccessLogConfig(sample_rate=rate), Path("unused"))
        return [n for n in range(1, requests + 1) if access.sampled()]

    assert taken(0.1, 1000) == list(range(10, 1001, 10))
    assert len(taken(0.29, 100)) == 29  # 0.29 x 100 is 28.999... in floating point
    assert len(taken(1.0, 50)) == 50
    assert taken(0.0, 50) == []


def test_errors_are_logged_whatever_the_sample_rate(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    settings = {"path": str(path), "sample_rate": 0.25}

    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], access_log=settings) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            for _ in range(8):
                assert (await call(client, url)).status == 200
            for _ in range(2):
                assert (await call(client, url, {**chat("x"), "model": "nope"})).status == 404

    run(body())
    assert [line["status"] for line in _lines(path)] == [200, 200, 404, 404]


def test_a_client_that_leaves_gets_a_line(tmp_path: Path) -> None:
    path = tmp_path / "access.log"

    async def body() -> None:
        a = await FakeUpstream("a").start()
        a.hold_requests = True
        async with (
            gateway_in_front_of([a], access_log={"path": str(path)}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            waiting = in_background(client, url)
            await eventually(until(lambda: a.holding == 1))
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await eventually(until(lambda: gw.pool.total_in_flight() == 0))

    run(body())
    [line] = _lines(path)
    assert (line["status"], line["error"], line["class"]) == (499, "client_disconnected", 1)


def test_no_path_no_log() -> None:
    async def body() -> None:
        async with gateway_in_front_of([]) as (gw, _):
            assert gw.access_log is None

    run(body())


def test_an_access_log_that_cannot_be_written_fails_before_listening(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    config = GatewayConfig(port=0, access_log={"path": str(blocked / "access.log")})

    async def body() -> None:
        gateway = Gateway(config)
        with pytest.raises(ConfigError, match=r"access log .*file/access.log cannot be written"):
            await gateway.start("127.0.0.1", 0)
        assert not gateway._started  # nothing to stop: it never listened
        await gateway.stop(0)

    run(body())


def test_times_are_utc_to_the_millisecond() -> None:
    assert _utc(86_400.25) == "1970-01-02T00:00:00.250Z"
    assert _utc(86_399.999_9) == "1970-01-01T23:59:59.999Z"  # truncated, never rounded up


def test_requests_refused_before_routing_get_a_line(tmp_path: Path) -> None:
    """The server's own 413 and 431 (it answers them before any handler runs) are counted in
    /metrics; they are logged too, with the error code their body carries."""
    path = tmp_path / "access.log"

    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of([a], access_log={"path": str(path)}, max_body_bytes=2048) as (
                _,
                url,
            ),
            aiohttp.ClientSession() as client,
        ):
            large = await call(client, url, chat("x" * 4096))
            assert large.error(413)["code"] == "body_too_large"
            long_head = await call(client, url, method="GET", path="/health",
                                   headers={"X-Big": "v" * 70_000})  # fmt: skip
            assert long_head.error(431)["code"] == "headers_too_large"

    run(body())
    large, long_head = _lines(path)
    assert (large["method"], large["path"], large["status"], large["error"]) == (
        "POST", "/v1/chat/completions", 413, "body_too_large",
    )  # fmt: skip
    assert large["bytes_out"] > 0 and large["e2e_ms"] is None  # not timed: see AccessLog.record
    assert (long_head["method"], long_head["status"], long_head["error"]) == (
        "GET", 431, "headers_too_large",
    )  # fmt: skip


def test_a_client_that_leaves_mid_stream_gets_499_with_what_it_was_sent(tmp_path: Path) -> None:
    path = tmp_path / "access.log"
    first = sse({"choices": [{"delta": {"content": "one"}}]})

    async def body() -> None:
        a = await FakeUpstream("a").start()
        a.gate = asyncio.Event()  # the stream stops after its first event
        async with (
            gateway_in_front_of([a], access_log={"path": str(path)}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            resp = await client.post(f"{url}/v1/chat/completions", json=STREAM_CHAT)
            assert await read_event(resp) == first
            resp.close()  # drops the connection mid-stream
            await eventually(until(lambda: gw.pool.total_in_flight() == 0))

    run(body())
    [line] = _lines(path)
    assert (line["status"], line["error"], line["replica"], line["stream"]) == (
        499, "client_disconnected", "a", True,
    )  # fmt: skip
    assert 0 < line["ttfb_ms"] <= line["ttft_ms"] <= line["e2e_ms"]
    assert line["bytes_out"] == len(first)


def test_errors_from_a_replica_are_logged_with_their_code(tmp_path: Path) -> None:
    path = tmp_path / "access.log"

    async def body() -> None:
        a = await FakeUpstream("a").start()
        async with (
            gateway_in_front_of(
                [a], access_log={"path": str(path)}, continuation={"replica_wait_s": 0}
            ) as (_, url),  # fmt: skip
            aiohttp.ClientSession() as client,
        ):
            a.reply_status = 400  # vLLM's own error body
            assert (await call(client, url)).error(400)["code"] == "bad_request"
            a.reply_status, a.die_mid_stream = 200, True
            assert (await call(client, url, STREAM_CHAT)).status == 200

    run(body())
    refused, cut = _lines(path)
    assert (refused["status"], refused["error"], refused["replica"]) == (400, "bad_request", "a")
    assert refused["bytes_out"] > 0
    assert (cut["status"], cut["error"], cut["replica"]) == (200, "upstream_interrupted", "a")
