"""Chat prompts sized so the server's count, chat template included, is --input-tokens.

Known answers from the embedded model's real tokenizer: SmolLM2's chat template adds 30 tokens
to one user message (a default system prompt, role markers and the generation prompt), so a
256-token chat request carries a 226-token text.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from aiohttp import web

from servepilot.bench.chat_template import ChatFrame, count_gap_note, measure_chat_frame
from servepilot.bench.records import Endpoint, RequestRecord, RequestSpec
from servepilot.bench.tokenizer import LocalTokenizer, ServerTokenizer
from servepilot.bench.workload import build_workload
from servepilot.core.config import ModelConfig
from servepilot.core.errors import ConfigError
from servepilot.engine.model_source import resolve_model
from servepilot.load.workload import WorkloadKind, WorkloadSpec
from tests.unit.http_thread import serving_app

SMOLLM2_TEMPLATE_TOKENS = 30


def _templated(tok: LocalTokenizer, request: RequestSpec) -> int:
    """What the chat endpoint counts for `request` (usage.prompt_tokens)."""
    messages = [{"role": role, "content": text} for role, text in request.history]
    count = tok.count_chat([*messages, {"role": "user", "content": request.prompt}])
    assert count is not None
    return count


def _chat_workload(
    tok: LocalTokenizer, count: int, spec: WorkloadSpec
) -> tuple[ChatFrame, list[RequestSpec]]:
    frame = measure_chat_frame(tok, Endpoint.CHAT)
    requests = build_workload(spec, tok, count, chat_template_tokens=frame.overhead_tokens)
    return frame, requests


def test_the_template_overhead_is_measured_once_by_the_tokenizer(tok: LocalTokenizer) -> None:
    assert measure_chat_frame(tok, Endpoint.CHAT) == ChatFrame(SMOLLM2_TEMPLATE_TOKENS)
    # Completions carry the text as it is: nothing to measure, nothing taken off.
    assert measure_chat_frame(tok, Endpoint.COMPLETIONS) == ChatFrame(0)


def test_random_chat_prompts_are_exact_by_the_servers_count(tok: LocalTokenizer) -> None:
    _, requests = _chat_workload(tok, 20, WorkloadSpec(input_tokens=256, output_tokens=8, seed=1))
    assert [_templated(tok, r) for r in requests] == [256] * 20
    assert [len(tok.encode(r.prompt)) for r in requests] == [256 - 30] * 20
    assert {r.input_tokens for r in requests} == {256}


def test_completions_prompts_stay_exact_texts(tok: LocalTokenizer) -> None:
    spec = WorkloadSpec(input_tokens=256, output_tokens=8, seed=1)
    requests = build_workload(spec, tok, 10)
    assert [len(tok.encode(r.prompt)) for r in requests] == [256] * 10


def test_mixed_chat_prompts_are_exact_short_and_long(tok: LocalTokenizer) -> None:
    _, requests = _chat_workload(
        tok,
        40,
        WorkloadSpec(
            kind=WorkloadKind.MIXED, input_tokens=64, long_input_tokens=300, output_tokens=4, seed=2
        ),
    )
    counts = [_templated(tok, r) for r in requests]
    assert counts == [r.input_tokens for r in requests]
    assert set(counts) == {64, 300}


def test_shared_prefix_keeps_its_prefix_and_the_suffix_gives_way(tok: LocalTokenizer) -> None:
    _, requests = _chat_workload(
        tok,
        12,
        WorkloadSpec(
            kind=WorkloadKind.SHARED_PREFIX,
            input_tokens=100,
            prefix_tokens=60,
            num_prefixes=2,
            output_tokens=4,
            seed=3,
        ),
    )
    assert [_templated(tok, r) for r in requests] == [100] * 12
    for group in (0, 1):
        prompts = [tok.encode(r.prompt) for r in requests if r.prefix_group == group]
        assert {len(ids) for ids in prompts} == {100 - 30}
        assert len({tuple(ids[:60]) for ids in prompts}) == 1  # the 60 prefix tokens, shared


def test_trace_lines_are_exact_and_share_their_prefix(tok: LocalTokenizer, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0.0, "input_tokens": 50, "output_tokens": 4, "prefix_group": 1},
        {"timestamp": 0.5, "input_tokens": 120, "output_tokens": 4, "prefix_group": 1},
        {"timestamp": 1.0, "input_tokens": 80, "output_tokens": 4},
    ]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    _, requests = _chat_workload(
        tok, 3, WorkloadSpec(kind=WorkloadKind.TRACE, trace_path=trace, prefix_tokens=64)
    )
    assert [_templated(tok, r) for r in requests] == [50, 120, 80]
    # The group's shortest line (50, a 20-token text) bounds the shared prefix: 20 tokens.
    first, second = (tok.encode(r.prompt) for r in requests[:2])
    assert len(first) == 20 and second[:20] == first


def test_multi_turn_first_turns_are_exact_later_ones_carry_the_history(
    tok: LocalTokenizer,
) -> None:
    _, requests = _chat_workload(
        tok,
        6,
        WorkloadSpec(
            kind=WorkloadKind.MULTI_TURN, input_tokens=80, output_tokens=16, turns=3, seed=4
        ),
    )
    first_turns = [r for r in requests if not r.history]
    assert first_turns and [_templated(tok, r) for r in first_turns] == [80] * len(first_turns)
    later = [r for r in requests if r.history]
    assert later and all(_templated(tok, r) > 80 + 16 for r in later)


def test_an_input_size_the_template_fills_is_refused_with_the_reason(
    tok: LocalTokenizer,
) -> None:
    with pytest.raises(ConfigError, match=r"--input-tokens \(30\) .* chat template \(30 tokens"):
        _chat_workload(tok, 2, WorkloadSpec(input_tokens=30, output_tokens=4))
    with pytest.raises(ConfigError, match=r"--prefix-tokens \(60\) and the chat template"):
        _chat_workload(
            tok,
            2,
            WorkloadSpec(
                kind=WorkloadKind.SHARED_PREFIX, input_tokens=80, prefix_tokens=60, output_tokens=4
            ),
        )
    # One token of text is enough.
    _, requests = _chat_workload(tok, 2, WorkloadSpec(input_tokens=31, output_tokens=4))
    assert [_templated(tok, r) for r in requests] == [31, 31]


class _NoTemplate:
    """A tokenizer (one token per character) whose model has no chat template."""

    name = "no-template"

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(map(chr, ids))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        return [self.decode(one) for one in ids]

    def count_chat(self, messages: Sequence[Mapping[str, str]]) -> int | None:
        return None


def test_without_a_template_the_counts_exclude_it_and_the_user_is_told() -> None:
    frame = measure_chat_frame(_NoTemplate(), Endpoint.CHAT)
    assert frame == ChatFrame(0, known=False)
    line = frame.describe(Endpoint.CHAT, "no-template")
    assert line is not None and "no-template cannot render the chat template" in line
    assert "Server prompt" in line
    assert frame.as_target(Endpoint.CHAT) == {"chat_template_tokens": None}


def test_the_measured_template_is_said_and_recorded() -> None:
    frame = ChatFrame(30)
    assert frame.describe(Endpoint.CHAT, "t") == (
        "the chat template adds 30 tokens to a message: its text is made that much shorter, "
        "so the server counts --input-tokens"
    )
    assert frame.as_target(Endpoint.CHAT) == {"chat_template_tokens": 30}
    assert frame.describe(Endpoint.COMPLETIONS, "t") is None
    assert frame.as_target(Endpoint.COMPLETIONS) == {}


def test_a_local_folder_without_a_chat_template_cannot_count_one(
    tok: LocalTokenizer, tmp_path: Path
) -> None:
    source = resolve_model(ModelConfig()).path
    shutil.copy(source / "tokenizer.json", tmp_path)
    config = json.loads((source / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    bare = LocalTokenizer(tmp_path)
    assert bare.count_chat([{"role": "user", "content": "hi"}]) is None
    assert measure_chat_frame(bare, Endpoint.CHAT) == ChatFrame(0, known=False)
    # With the template the same tokenizer counts it.
    assert tok.count_chat([{"role": "user", "content": "hi"}]) == 1 + SMOLLM2_TEMPLATE_TOKENS


def _tokenize_server(chat_status: int) -> web.Application:
    """vLLM's /tokenize shape, one token per word; `messages` answered with `chat_status`
    (and, when 200, 4 template tokens around the words)."""

    async def tokenize(request: web.Request) -> web.Response:
        body = await request.json()
        if "messages" not in body:
            words = body["prompt"].split()
        elif chat_status != 200:
            return web.json_response({"error": {"message": "`prompt` is required"}}, status=400)
        else:
            words = ["<s>", "user", *body["messages"][0]["content"].split(), "</s>", "bot"]
        return web.json_response({"tokens": list(range(len(words))), "count": len(words)})

    app = web.Application()
    app.router.add_post("/tokenize", tokenize)
    return app


def test_the_servers_tokenize_counts_the_template_or_says_it_cannot() -> None:
    with serving_app(_tokenize_server(200)) as url:
        server = ServerTokenizer(url, "m")
        assert measure_chat_frame(server, Endpoint.CHAT) == ChatFrame(4)
    # A server whose /tokenize refuses `messages` (400): the counts exclude the template.
    with serving_app(_tokenize_server(400)) as url:
        server = ServerTokenizer(url, "m")
        assert server.count_chat([{"role": "user", "content": "a b"}]) is None
        assert measure_chat_frame(server, Endpoint.CHAT) == ChatFrame(0, known=False)


def _sent_and_answered(
    asked: Sequence[int], counted: Sequence[int | None]
) -> tuple[list[RequestSpec], list[RequestRecord]]:
    sent = [RequestSpec(i, "p", 4, n) for i, n in enumerate(asked)]
    answered = [RequestRecord(i, 0.0, 0.0, input_tokens=c) for i, c in enumerate(counted)]
    return sent, answered


def test_the_servers_count_is_checked_against_the_asked_one() -> None:
    sent, answered = _sent_and_answered([256, 256, 300], [256, 256, 300])
    assert count_gap_note(ChatFrame(30), Endpoint.CHAT, sent, answered) is None
    # The template could not be counted: every request is 30 over, and the line says why.
    sent, answered = _sent_and_answered([256, 256], [286, 286])
    assert count_gap_note(ChatFrame(0, known=False), Endpoint.CHAT, sent, answered) == (
        "the server counted 286.0 prompt tokens per request where 256.0 were asked: +30.0 "
        "from the chat template, which bench could not count here"
    )
    note = count_gap_note(ChatFrame(30), Endpoint.CHAT, sent, answered)
    assert note is not None and note.endswith(
        "+30.0 from the chat template, which does not add the same 30 tokens (measured on "
        "one sample) to every text"
    )
    sent, answered = _sent_and_answered([100, 100], [101, 101])
    note = count_gap_note(ChatFrame(), Endpoint.COMPLETIONS, sent, answered)
    assert note is not None and note.endswith(
        "+1.0 from what the server adds to a text (a BOS token)"
    )


def test_the_check_skips_failures_missing_usage_and_conversations() -> None:
    sent, answered = _sent_and_answered([256, 256, 256], [256, None, 999])
    failed = RequestRecord(2, 0.0, 0.0, input_tokens=999, error="http_500")
    assert count_gap_note(ChatFrame(30), Endpoint.CHAT, sent, [*answered[:2], failed]) is None
    # A later turn carries its history: the server's count is larger by design.
    turn = RequestSpec(0, "p", 4, 256, history=(("user", "a"), ("assistant", "b")))
    record = RequestRecord(0, 0.0, 0.0, input_tokens=600)
    assert count_gap_note(ChatFrame(30), Endpoint.CHAT, [turn], [record]) is None
