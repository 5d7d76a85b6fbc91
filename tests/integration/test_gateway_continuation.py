"""A replica that dies mid-answer: the gateway continues the stream on another replica and the
official `openai` client reads one complete answer.

Real processes on 127.0.0.1: two simulated vLLM replicas (one cuts every stream's connection
after its 5th token: --drop-streams-after-tokens) behind `servepilot gateway` (round robin).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from servepilot.engine.simserver.tokens import filler_text
from tests.integration.gatewayproc import GatewayProcess, simulated_replica

MODEL = "smollm2"
DIES_AFTER = 5
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    folder = tmp_path_factory.mktemp("continuation")
    dying = ["--drop-streams-after-tokens", str(DIES_AFTER)]
    for name in ("healthy", "dying"):
        (folder / name).mkdir()
    with (
        simulated_replica(folder / "healthy", MODEL, 5.0) as healthy,
        simulated_replica(folder / "dying", MODEL, 5.0, dying) as dies,
        GatewayProcess(
            [healthy, dies],
            folder / "gw",
            # The dying replica's breaker never opens: it keeps getting its turn.
            gateway={
                "continuation": {"whole_answers": True},
                "protection": {"breaker_failures": 1000},
            },
            extra=["--access-log", str(folder / "access.log")],
        ) as gw,
    ):
        yield gw


def _folder(gw: GatewayProcess) -> Path:
    return gw.workdir.parent


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_stream_cut_after_five_tokens_reads_as_one_answer(
    gateway: GatewayProcess, chat: bool
) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    # Round robin over two replicas: two requests in a row, one of them on the dying one.
    for _ in range(2):
        ids, created, finishes, pieces, usage = set(), set(), [], [], None
        if chat:
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "tell me"}], stream=True,
                max_tokens=MAX_TOKENS, stream_options={"include_usage": True},
            )  # fmt: skip
        else:
            stream = client.completions.create(  # type: ignore[assignment]
                model=MODEL, prompt="once upon a time", stream=True, max_tokens=MAX_TOKENS,
                stream_options={"include_usage": True},
            )  # fmt: skip
        for chunk in stream:
            ids.add(chunk.id)
            created.add(chunk.created)
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text = choice.delta.content if chat else choice.text  # type: ignore[union-attr]
                if text:
                    pieces.append(text)
                if choice.finish_reason is not None:
                    finishes.append(choice.finish_reason)
        assert len(ids) == 1 and len(created) == 1
        assert finishes == ["length"]
        assert len(pieces) == MAX_TOKENS
        assert usage is not None and usage.completion_tokens == MAX_TOKENS
        assert usage.total_tokens == usage.prompt_tokens + MAX_TOKENS
        # The simulated replica writes the same filler from its first token on: a continued
        # answer is the dying replica's first 5 tokens, then the other's first 15.
        text = "".join(pieces)
        assert text in (
            filler_text(MAX_TOKENS),
            filler_text(DIES_AFTER) + filler_text(MAX_TOKENS - DIES_AFTER),
        )
    counted = gateway.metrics().value("servepilot_stream_continuations_total")
    assert counted >= 1


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_a_non_streamed_answer_cut_after_five_tokens_comes_whole(
    gateway: GatewayProcess, chat: bool
) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0)
    before = gateway.metrics().value("servepilot_stream_continuations_total")
    for _ in range(2):  # one of the two on the dying replica
        if chat:
            answer = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "tell me"}],
                max_tokens=MAX_TOKENS,
            )  # fmt: skip
            (choice,) = answer.choices
            text = choice.message.content
        else:
            whole = client.completions.create(model=MODEL, prompt="hi", max_tokens=MAX_TOKENS)
            (done,) = whole.choices
            text, answer = done.text, whole  # type: ignore[assignment]
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage is not None and answer.usage.completion_tokens == MAX_TOKENS
        assert answer.usage.total_tokens == answer.usage.prompt_tokens + MAX_TOKENS
        assert text in (
            filler_text(MAX_TOKENS),
            filler_text(DIES_AFTER) + filler_text(MAX_TOKENS - DIES_AFTER),
        )
    # A continuation takes a turn of the round robin too: one or both were on the dying one.
    assert gateway.metrics().value("servepilot_stream_continuations_total") >= before + 1


def test_a_request_that_opts_out_ends_with_the_error_event(gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "prompt": "hello", "stream": True, "max_tokens": MAX_TOKENS}
    headers = {"X-Servepilot-Continue": "0"}
    raws = []
    for _ in range(2):  # one of the two on the dying replica
        with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=headers,
                          timeout=30) as r:  # fmt: skip
            raws.append(b"".join(r.iter_bytes()))
    broken = [raw for raw in raws if b"upstream_interrupted" in raw]
    assert len(broken) == 1
    assert broken[0].count(b'"text"') == DIES_AFTER and b"[DONE]" not in broken[0]


def test_done_comes_once_and_the_access_log_names_both_replicas(
    gateway: GatewayProcess,
) -> None:
    body = {"model": MODEL, "prompt": "hello", "stream": True, "max_tokens": MAX_TOKENS}
    raws = []
    for _ in range(2):
        with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=30) as r:
            raws.append(b"".join(r.iter_bytes()))
    for raw in raws:
        events = [e for e in raw.split(b"\n\n") if e.strip()]
        assert events.count(b"data: [DONE]") == 1 and events[-1] == b"data: [DONE]"
        docs = [json.loads(e[len(b"data: ") :]) for e in events[:-1]]
        assert not any("error" in d for d in docs)
        assert sum(1 for d in docs for c in d["choices"] if c["text"]) == MAX_TOKENS
    gateway.stop()
    lines = [json.loads(x) for x in (_folder(gateway) / "access.log").read_text().splitlines()]
    continued = [x for x in lines if "replicas" in x]
    assert continued, lines
    assert all(x["replicas"] == ["r1", "r0"] for x in continued)
    assert all(x["error"] is None and x["status"] == 200 for x in continued)
