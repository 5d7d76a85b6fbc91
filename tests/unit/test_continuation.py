"""Stream continuation's pure parts: reading what was sent, the request for the rest, the
rewriting of the rest's events, and the decision."""

from __future__ import annotations

import json
from typing import Any

import pytest

from servepilot.core.config.gateway import ContinuationConfig
from servepilot.gateway.continuation.policy import (
    Candidate,
    Continue,
    Failure,
    Finish,
    GiveUp,
    Situation,
    Stop,
    decide,
)
from servepilot.gateway.continuation.splice import Splicer
from servepilot.gateway.continuation.transcript import (
    NotContinuable,
    Transcript,
    continuation_body,
    read_transcript,
)
from servepilot.gateway.continuation.whole import assemble, plain, whole_events


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def _chat(content: str | None, role: bool = False, finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {"content": content}
    if role:
        delta["role"] = "assistant"
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return _event({"id": "chatcmpl-A", "created": 100, "choices": [choice]})


def _text(text: str, finish: str | None = None, answer_id: str = "cmpl-A") -> bytes:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    return _event({"id": answer_id, "created": 100, "choices": [choice]})


def test_a_chat_transcript_counts_content_events_not_the_role_event() -> None:
    sent = read_transcript(_chat("", role=True) + _chat(" Hi") + _chat(" there"), chat=True)
    assert (sent.answer_id, sent.created) == ("chatcmpl-A", 100)
    assert (sent.text, sent.tokens, sent.finish_reason) == (" Hi there", 2, None)
    assert sent.whole_events


def test_a_transcript_cut_inside_an_event_is_not_whole() -> None:
    relayed = _text(" a") + _text(" b")[:-5]
    sent = read_transcript(relayed, chat=False)
    assert (sent.text, sent.tokens, sent.whole_events) == (" a", 1, False)


def test_the_rest_of_a_completion_is_asked_with_the_text_appended_and_fewer_tokens() -> None:
    sent = read_transcript(_text(" a") + _text(" b") + _text(" c"), chat=False)
    doc = {"model": "m", "prompt": "x:", "max_tokens": 10, "seed": 7, "temperature": 0.0,
           "stream": True}  # fmt: skip
    body = continuation_body(doc, sent, chat=False)
    assert body["prompt"] == "x: a b c" and body["max_tokens"] == 7
    assert (body["seed"], body["temperature"]) == (7, 0.0)
    assert body["stream_options"] == {"include_usage": True}
    assert doc["prompt"] == "x:"  # the original is left as it was


def test_the_rest_of_a_chat_continues_the_partial_assistant_message() -> None:
    sent = read_transcript(_chat("", role=True) + _chat("Hel") + _chat("lo"), chat=True)
    doc = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5}
    body = continuation_body(doc, sent, chat=True)
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["max_completion_tokens"] == 3


@pytest.mark.parametrize(
    "doc", [{"prompt": [1, 2, 3]}, {"prompt": "x", "echo": True}, {"prompt": "x", "n": 2}]
)
def test_token_ids_an_echoed_prompt_or_several_choices_are_not_continuable(
    doc: dict[str, Any],
) -> None:
    with pytest.raises(NotContinuable):
        continuation_body(doc, read_transcript(_text(" a"), chat=False), chat=False)


def test_a_chat_cut_before_its_first_token_is_asked_again_as_it_was() -> None:
    doc = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    body = continuation_body(doc, read_transcript(_chat("", role=True), chat=True), chat=True)
    assert body["messages"] == doc["messages"] and "continue_final_message" not in body
    assert body["max_tokens"] == 5


def _sent(tokens: int = 3, finish: str | None = None, whole: bool = True) -> Transcript:
    return Transcript("cmpl-A", 100, " a b c", tokens, tokens, finish, whole)


def test_the_rest_reads_as_the_same_answer_with_usage_summed() -> None:
    splicer = Splicer(_sent(3), usage_asked=True)
    rest = (
        _text(" d", answer_id="cmpl-B")
        + _text(" e", finish="length", answer_id="cmpl-B")
        + _event({"id": "cmpl-B", "created": 200, "choices": [],
                  "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}})
        + b"data: [DONE]\n\n"
    )  # fmt: skip
    # In pieces that split events anywhere.
    out = b"".join(splicer.feed(rest[i : i + 7]) for i in range(0, len(rest), 7))
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and splicer.done
    docs = [json.loads(e[6:]) for e in events[:-1]]
    assert {(d["id"], d["created"]) for d in docs} == {("cmpl-A", 100)}
    assert [d["choices"][0]["text"] for d in docs[:2]] == [" d", " e"]
    # 8 prompt tokens of the continuation = 5 of the original prompt + the 3 sent.
    assert docs[2]["usage"] == {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
    whole = splicer.transcript()
    assert (whole.text, whole.tokens, whole.finish_reason) == (" a b c d e", 5, "length")


def test_a_chat_continuation_drops_its_role_event_and_an_unasked_usage_event() -> None:
    splicer = Splicer(_sent(1), usage_asked=False)
    usage = {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5}
    rest = (
        _chat("", role=True)
        + _chat(" x", finish="stop")
        + _event({"id": "chatcmpl-B", "choices": [], "usage": usage})
        + b"data: [DONE]\n\n"
    )
    events = [e for e in splicer.feed(rest).split(b"\n\n") if e]  # fmt: skip
    assert len(events) == 2 and events[-1] == b"data: [DONE]"
    assert json.loads(events[0][6:])["choices"][0]["delta"] == {"content": " x"}


CONFIG = ContinuationConfig()
REPLICAS = [Candidate("r0", True, 100), Candidate("r1", True, 100), Candidate("r2", False, 100)]


def _situation(**changes: Any) -> Situation:
    base = dict(failure=Failure.RESET, continuations=0, opted_out=False, sent=_sent(),
                continuable=True, context_tokens=50, used=frozenset({"r0"}),
                failed_on="r0")  # fmt: skip
    return Situation(**{**base, **changes})


def test_the_rest_goes_to_a_healthy_replica_the_request_has_not_used() -> None:
    assert decide(_situation(), CONFIG, REPLICAS) == Continue(("r1",))


@pytest.mark.parametrize(
    ("situation", "config", "reason"),
    [
        (_situation(), ContinuationConfig(enabled=False), GiveUp.DISABLED),
        (_situation(opted_out=True), CONFIG, GiveUp.OPTED_OUT),
        (_situation(continuations=2), CONFIG, GiveUp.LIMIT),
        (_situation(sent=_sent(whole=False)), CONFIG, GiveUp.NOT_AT_EVENT_END),
        (_situation(continuable=False), CONFIG, GiveUp.NOT_CONTINUABLE),
        (_situation(context_tokens=100), CONFIG, GiveUp.OVER_MAX_MODEL_LEN),
    ],
)
def test_a_stream_that_cannot_go_on_stops_with_its_reason(
    situation: Situation, config: ContinuationConfig, reason: GiveUp
) -> None:
    decision = decide(situation, config, REPLICAS)
    assert isinstance(decision, Stop) and decision.reason is reason


def test_with_no_other_replica_in_rotation_the_stream_cannot_go_on_yet() -> None:
    only_the_failed = [Candidate("r0", True, 100), Candidate("r1", False, 100)]
    decision = decide(_situation(), CONFIG, only_the_failed)
    assert isinstance(decision, Stop) and decision.reason is GiveUp.NO_REPLICA


def test_a_replica_the_request_was_on_before_is_taken_again_once_it_serves() -> None:
    # On r0, then r1; r1 failed too: r0 is back from its restart, r2 is still down.
    situation = _situation(used=frozenset({"r0", "r1"}), failed_on="r1")
    assert decide(situation, CONFIG, REPLICAS) == Continue(("r0",))
    # A replica new to the request comes first.
    replicas = [*REPLICAS[:2], Candidate("r2", True, 100)]
    assert decide(situation, CONFIG, replicas) == Continue(("r2",))


def test_an_answer_whose_finish_reason_was_sent_only_needs_its_end() -> None:
    assert decide(_situation(sent=_sent(finish="stop")), CONFIG, REPLICAS) == Finish()


def test_a_replica_of_unknown_model_length_is_a_candidate() -> None:
    replicas = [Candidate("r0", True), Candidate("r1", True)]
    assert decide(_situation(context_tokens=10**6), CONFIG, replicas) == Continue(("r1",))


def test_a_whole_answer_is_made_of_every_part_with_the_first_id_and_the_summed_usage() -> None:
    first = _chat("", role=True) + _chat("Hel") + _chat("lo")
    # The continuation as the splicer passed it on: the first part's id, usage summed.
    sent = read_transcript(first, chat=True)
    splicer = Splicer(sent, usage_asked=True)
    usage = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
    rest = splicer.feed(
        _chat("", role=True)
        + _chat(" wor")
        + _chat("ld", finish="length")
        + _event({"id": "chatcmpl-B", "choices": [], "usage": usage})
        + b"data: [DONE]\n\n"
    )
    answer = json.loads(assemble(first + rest, chat=True))
    assert (answer["id"], answer["object"], answer["created"]) == (
        "chatcmpl-A", "chat.completion", 100)  # fmt: skip
    (choice,) = answer["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello world", "tool_calls": []}
    assert choice["finish_reason"] == "length"
    # 9 prompt tokens of the continuation = 7 of the original prompt + the 2 sent.
    assert answer["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


def test_a_whole_completion_takes_each_events_text() -> None:
    answer = json.loads(assemble(_text(" a") + _text(" b", finish="stop"), chat=False))
    assert answer["object"] == "text_completion" and answer["usage"] is None
    assert answer["choices"] == [
        {"index": 0, "text": " a b", "logprobs": None, "finish_reason": "stop", "stop_reason": None}
    ]


def test_a_part_cut_inside_an_event_goes_on_after_its_last_whole_event() -> None:
    assert whole_events(_text(" a") + _text(" b")[:-4]) == _text(" a")
    assert whole_events(b"data: {") == b""


@pytest.mark.parametrize(
    ("doc", "chat", "plain_"),
    [
        ({"messages": [], "max_tokens": 3, "seed": 1}, True, True),
        ({"prompt": "x"}, False, True),
        ({"prompt": ["x"]}, False, True),
        ({"prompt": [1, 2]}, False, False),
        ({"prompt": "x", "echo": True}, False, False),
        ({"prompt": "x", "logprobs": 0}, False, False),
        ({"messages": [], "logprobs": False}, True, True),
        ({"messages": [], "tools": []}, True, False),
        ({"messages": [], "n": 2}, True, False),
    ],
)
def test_only_plain_requests_are_asked_as_a_stream(
    doc: dict[str, Any], chat: bool, plain_: bool
) -> None:
    assert plain(doc, chat=chat) is plain_


def test_an_error_event_in_the_rest_is_not_passed_on_and_stops_the_part() -> None:
    splicer = Splicer(_sent(3), usage_asked=False)
    error = _event({"error": {"message": "EngineCore encountered an issue.", "code": 500}})
    out = splicer.feed(_text(" d", answer_id="cmpl-B") + error + _text(" e", answer_id="cmpl-B"))
    assert [json.loads(e[6:])["choices"][0]["text"] for e in out.split(b"\n\n") if e] == [" d"]
    assert splicer.error is not None and "EngineCore" in splicer.error and not splicer.done
    assert splicer.transcript().text == " a b c d"
