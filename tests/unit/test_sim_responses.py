"""The simulated replica's Responses API (simserver/responses_api.py) as the official
`openai` client reads it, and its answer on the routes a generative vLLM 0.32 does not
register (its web framework's 404)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.unit.sim_support import BASE_ARGS, ThreadedSim


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSim]:
    with ThreadedSim(BASE_ARGS) as server:
        yield server


def _client(sim: ThreadedSim) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)


def test_a_response_ends_at_max_output_tokens_as_vllm_reports_it(sim: ThreadedSim) -> None:
    reply = _client(sim).responses.create(
        model="smollm2", input="Tell me a story", instructions="Be brief", max_output_tokens=5
    )
    assert reply.model == "smollm2" and reply.object == "response"
    assert reply.output_text == " we sat by the sea"
    assert (reply.status, reply.incomplete_details and reply.incomplete_details.reason) == (
        "incomplete",
        "max_output_tokens",
    )
    assert reply.usage is not None and reply.usage.output_tokens == 5
    # The same prompt as a chat request: `instructions` is its system message.
    chat = _client(sim).chat.completions.create(
        model="smollm2",
        messages=[
            {"role": "system", "content": "Be brief"},
            {"role": "user", "content": "Tell me a story"},
        ],
        max_tokens=1,
    )
    assert chat.usage is not None and reply.usage.input_tokens == chat.usage.prompt_tokens


def test_a_streamed_response_is_vllms_event_sequence(sim: ThreadedSim) -> None:
    events = list(
        _client(sim).responses.create(
            model="smollm2",
            input=[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            max_output_tokens=3,
            stream=True,
        )
    )
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(11))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    last = events[-1]
    assert last.type == "response.completed"
    assert deltas == last.response.output_text == " we sat by"
    assert last.response.usage is not None and last.response.usage.output_tokens == 3


def test_a_response_without_input_is_vllms_400(sim: ThreadedSim) -> None:
    answer = httpx.post(f"{sim.url}/v1/responses", json={"model": "smollm2"})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == 400


@pytest.mark.parametrize(
    "path",
    ["/v1/embeddings", "/v1/score", "/v1/rerank", "/pooling", "/v1/audio/transcriptions"],
)
def test_routes_a_generative_model_lacks_answer_the_frameworks_404(
    sim: ThreadedSim, path: str
) -> None:
    answer = httpx.post(f"{sim.url}{path}", json={"model": "smollm2", "input": "hi"})
    assert (answer.status_code, answer.json()) == (404, {"detail": "Not Found"})
    wrong_method = httpx.get(f"{sim.url}/v1/responses")
    assert (wrong_method.status_code, wrong_method.json()) == (
        405,
        {"detail": "Method Not Allowed"},
    )
