"""bench's side of the agentic workload (bench/agentic.py): texts sized as the workload asks,
each turn carrying the whole conversation with the answers as they came, and the stream
scanner that keeps an answer's text. Known answers from the embedded model's tokenizer
(SmolLM2's chat template adds 30 tokens to a lone user message, a default system prompt
included; inside a conversation with its own system prompt, less)."""

from __future__ import annotations

import dataclasses

import pytest

from servepilot.bench.agentic import POOL, AgenticTexts, _Conversation, make_texts
from servepilot.bench.records import Endpoint
from servepilot.bench.sse import EventScanner
from servepilot.bench.tokenizer import LocalTokenizer
from servepilot.core.errors import ConfigError
from servepilot.load.agentic import AgenticSpec
from servepilot.load.sessions import session_script
from servepilot.load.workload import WorkloadKind, WorkloadSpec

TEMPLATE = 30
SPEC = WorkloadSpec(
    kind=WorkloadKind.AGENTIC, input_tokens=80, output_tokens=16, turns=4, seed=2,
    agentic=AgenticSpec(system_prompts=3, system_prompt_tokens=200, tool_tokens=50,
                        tool_fraction=0.5),
)  # fmt: skip


@pytest.fixture(scope="module")
def texts(tok: LocalTokenizer) -> AgenticTexts:
    return make_texts(SPEC, tok, chat_template_tokens=TEMPLATE)


def _count(tok: LocalTokenizer, *messages: tuple[str, str]) -> int:
    count = tok.count_chat([{"role": role, "content": text} for role, text in messages])
    assert count is not None
    return count


def test_the_server_counts_each_message_as_the_workload_sized_it(
    tok: LocalTokenizer, texts: AgenticTexts
) -> None:
    assert len(texts.system) == 3 and len(texts.user) == len(texts.tool) == POOL
    assert len(set(texts.system)) == 3  # distinct prompts, shared by the sessions
    system = ("system", texts.system[0])
    assert _count(tok, system) == 200
    assert {_count(tok, system, ("user", t)) for t in texts.user} == {200 + 80}
    assert {_count(tok, system, ("user", t)) for t in texts.tool} == {200 + 50}
    plain = make_texts(SPEC, tok)  # completions: no template, the texts are the counts
    assert {len(tok.encode(t)) for t in plain.user} == {80}
    tiny = dataclasses.replace(SPEC, agentic=AgenticSpec(tool_tokens=3))
    with pytest.raises(ConfigError, match="--tool-tokens"):
        make_texts(tiny, tok, chat_template_tokens=TEMPLATE)


def test_each_turn_carries_the_conversation_with_the_answers_as_they_came(
    texts: AgenticTexts,
) -> None:
    script = session_script(SPEC, 5)
    talk = _Conversation(script, texts, Endpoint.CHAT)
    first = talk.request(0, index=11, max_tokens=16)
    system = ("system", texts.system[script.system_prompt])
    assert first.history == (system,)
    assert first.prompt.startswith("[conv-2-5] ")  # no two sessions share their first message
    assert (first.index, first.turn, first.session_id) == (11, 0, "conv-2-5")
    assert first.input_tokens == script.prompt_tokens(0) and first.max_tokens == 16
    talk.answered("the first answer")
    second = talk.request(1, index=12, max_tokens=16)
    assert second.history == (system, ("user", first.prompt), ("assistant", "the first answer"))
    pool = texts.tool if script.turns[1].tool else texts.user
    assert second.prompt in pool and second.turn == 1
    talk.answered("the second answer")
    third = talk.request(2, index=13, max_tokens=16)
    assert third.history[-2:] == (("user", second.prompt), ("assistant", "the second answer"))
    assert third.input_tokens == script.prompt_tokens(2)


def test_completions_send_the_conversation_as_one_text(texts: AgenticTexts) -> None:
    script = session_script(SPEC, 0)
    talk = _Conversation(script, texts, Endpoint.COMPLETIONS)
    first = talk.request(0, index=0, max_tokens=16)
    talk.answered("ANSWER")
    second = talk.request(1, index=1, max_tokens=16)
    assert second.history == ()
    assert second.prompt.startswith(first.prompt + "\n\nANSWER\n\n")


def _stream(*contents: str) -> bytes:
    events = [
        b'data: {"choices":[{"delta":{"role":"assistant"}}]}',
        *(b'data: {"choices":[{"delta":{"content":"%s"}}]}' % c.encode() for c in contents),
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}',
        b"data: [DONE]",
    ]
    return b"\n\n".join(events) + b"\n\n"


def test_the_scanner_keeps_the_answer_only_when_asked() -> None:
    keeping = EventScanner(Endpoint.CHAT, keep_text=True)
    keeping.feed(_stream("Hel", 'lo \\"you\\"', "!"), 1.0)
    assert keeping.text == 'Hello "you"!' and len(keeping.chunks) == 3 and keeping.done
    keeping.reset()
    assert keeping.text == ""
    plain = EventScanner(Endpoint.CHAT)
    plain.feed(_stream("Hel", "lo", "!"), 1.0)
    assert plain.text == "" and len(plain.chunks) == 3
    completion = EventScanner(Endpoint.COMPLETIONS, keep_text=True)
    completion.feed(b'data: {"choices":[{"text":"a b"}]}\n\ndata: [DONE]\n\n', 1.0)
    assert completion.text == "a b"
