"""vLLM's API shape at the gateway, in front of simulated replicas, as the official `openai`
client and Python's urllib see it: every early refusal (413, 431) reaches a client that
writes its whole body before reading; a request without `model` is served by the fleet's
only model."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from servepilot.core.config import GatewayConfig
from tests.integration.threaded_gateway import ThreadedGateway, Upstream
from tests.unit.sim_support import BASE_ARGS, ThreadedSim

MODEL = "smollm2"
MAX_BODY = 8 * 1024 * 1024  # the gateway's default max_body_bytes


@pytest.fixture(scope="module")
def sim() -> Iterator[ThreadedSim]:
    with ThreadedSim(BASE_ARGS) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(sim: ThreadedSim) -> Iterator[ThreadedGateway]:
    with ThreadedGateway(GatewayConfig(), [Upstream("r0", sim.url)]) as gw:
        yield gw


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> urllib.request.Request:
    head = {"Content-Type": "application/json", **(headers or {})}
    return urllib.request.Request(url, data=body, headers=head, method="POST")


def _refusal(request: urllib.request.Request) -> tuple[int, dict[str, object]]:
    """The status and OpenAI error of a request urllib must see refused."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    error = json.loads(refused.value.read())["error"]
    assert isinstance(error, dict)
    return refused.value.code, error


def test_urllib_posting_9_mib_reads_the_413_not_a_reset(gateway: ThreadedGateway) -> None:
    # urllib writes the whole 9 MiB before it reads a byte: without a lingering close the
    # gateway's close, with the body unread, resets the connection under the 413.
    body = b'{"model": "smollm2", "prompt": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    status, error = _refusal(_post(f"{gateway.url}/v1/completions", body))
    assert status == 413
    assert error["code"] == "body_too_large" and error["type"] == "invalid_request_error"
    assert error["message"] == f"the request body is larger than {MAX_BODY} bytes"
    _no_lingering(gateway)


def _no_lingering(gateway: ThreadedGateway) -> None:
    """The lingering close ended: the client closed after reading its answer."""
    deadline = time.monotonic() + 3
    while gateway.inspect(lambda g: g._server.lingering):
        assert time.monotonic() < deadline, "a lingering close outlived its client"
        time.sleep(0.02)


def test_urllib_with_headers_over_the_limit_reads_the_431(gateway: ThreadedGateway) -> None:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2}).encode() * 40_000
    big = {"X-Big": "v" * 70_000}
    status, error = _refusal(_post(f"{gateway.url}/v1/completions", body, big))
    assert (status, error["code"]) == (431, "headers_too_large")
    _no_lingering(gateway)


def test_urllib_with_a_head_llhttp_refuses_reads_the_400(gateway: ThreadedGateway) -> None:
    # Content-Length beside chunked coding: refused at the head, with 4 MiB still to come.
    body = b"x" * (4 * 1024 * 1024)
    both = {"Content-Length": str(len(body)), "Transfer-Encoding": "chunked"}
    status, error = _refusal(_post(f"{gateway.url}/v1/completions", body, both))
    assert (status, error["code"], error["type"]) == (400, "bad_http", "invalid_request_error")
    _no_lingering(gateway)


# --- `model` is optional, as in vLLM 0.32 ---------------------------------------------------


def _client(gateway: ThreadedGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def test_openai_without_model_is_served_by_the_fleets_only_model(gateway: ThreadedGateway) -> None:
    client = _client(gateway)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    # `omit` leaves the field out of the body, as a client written for vLLM may.
    chat = client.chat.completions.create(model=openai.omit, messages=messages, max_tokens=3)  # type: ignore[arg-type]
    assert (chat.model, chat.usage and chat.usage.completion_tokens) == (MODEL, 3)
    text = client.completions.create(model=openai.omit, prompt="hi", max_tokens=2)  # type: ignore[arg-type]
    assert (text.model, text.usage and text.usage.completion_tokens) == (MODEL, 2)
    stream = client.chat.completions.create(
        model=openai.omit,  # type: ignore[arg-type]
        messages=messages,
        max_tokens=4,
        stream=True,
    )
    assert sum(1 for c in stream if c.choices and c.choices[0].delta.content) == 4


def test_a_replicas_own_error_reaches_the_client_in_the_gateways_shape(
    gateway: ThreadedGateway,
) -> None:
    """vLLM's error body (`type` a class name, `code` the status again, `param`) becomes the
    gateway's: the same three fields, whoever refused; vLLM's message and the status kept."""
    expected = "max_tokens must be at least 1, got 0."
    with pytest.raises(openai.BadRequestError) as refused:
        _client(gateway).completions.create(model=MODEL, prompt="hi", max_tokens=0)
    assert (refused.value.code, refused.value.type) == ("bad_request", "invalid_request_error")
    assert refused.value.message.endswith(expected)  # the client prefixes "Error code: 400"
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 0}).encode()
    status, error = _refusal(_post(f"{gateway.url}/v1/completions", body))
    assert (status, error) == (
        400, {"message": expected, "type": "invalid_request_error", "code": "bad_request"},
    )  # fmt: skip


def test_urllib_without_model_is_served_by_the_fleets_only_model(gateway: ThreadedGateway) -> None:
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    with urllib.request.urlopen(_post(f"{gateway.url}/v1/completions", body), timeout=10) as resp:
        answer = json.loads(resp.read())
        assert resp.headers["X-Servepilot-Replica"] == "r0"
    assert (answer["model"], answer["usage"]["completion_tokens"]) == (MODEL, 2)


@pytest.fixture(scope="module")
def two_models(sim: ThreadedSim) -> Iterator[ThreadedGateway]:
    with ThreadedSim([*BASE_ARGS, "--served-model-name", "other"]) as other:
        upstreams = [Upstream("r0", sim.url), Upstream("r1", other.url)]
        with ThreadedGateway(GatewayConfig(), upstreams) as gw:
            yield gw


def test_without_model_before_two_models_is_a_400_naming_the_choices(
    two_models: ThreadedGateway,
) -> None:
    expected = (
        "the request body has no `model` and this gateway serves several; "
        "name one of: other, smollm2"
    )
    with pytest.raises(openai.BadRequestError) as refused:
        _client(two_models).chat.completions.create(
            model=openai.omit,  # type: ignore[arg-type]
            messages=[{"role": "user", "content": "hi"}],
        )
    assert refused.value.code == "missing_field" and refused.value.message.endswith(expected)
    body = json.dumps({"prompt": "hi"}).encode()
    status, error = _refusal(_post(f"{two_models.url}/v1/completions", body))
    assert (status, error["code"], error["message"]) == (400, "missing_field", expected)
    named = json.dumps({"model": "other", "prompt": "hi", "max_tokens": 1}).encode()
    with urllib.request.urlopen(
        _post(f"{two_models.url}/v1/completions", named), timeout=10
    ) as resp:
        assert resp.headers["X-Servepilot-Replica"] == "r1"


# --- vLLM's other routes --------------------------------------------------------------------


def test_openai_responses_through_the_gateway(gateway: ThreadedGateway) -> None:
    client = _client(gateway)
    reply = client.responses.create(model=MODEL, input="Tell me a story", max_output_tokens=4)
    assert reply.output_text == " we sat by the"
    assert reply.usage is not None and reply.usage.output_tokens == 4
    bare = client.responses.create(input="hi", max_output_tokens=2, stream=True)  # no model
    events = [e.type for e in bare]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert events.count("response.output_text.delta") == 2


def _not_served(path: str) -> str:
    return (
        f"the model 'smollm2' does not serve POST {path}: replica r0 answered 404 "
        '({"detail":"Not Found"}); vLLM serves '
        f"{path} for "
    )


def test_openai_embeddings_and_audio_get_the_gateways_404(gateway: ThreadedGateway) -> None:
    client = _client(gateway)
    with pytest.raises(openai.NotFoundError) as embeddings:
        client.embeddings.create(model=MODEL, input="hi")
    assert embeddings.value.code == "not_found"
    assert _not_served("/v1/embeddings") in embeddings.value.message
    with pytest.raises(openai.NotFoundError) as audio:
        client.audio.transcriptions.create(model=MODEL, file=("a.wav", b"RIFF" + bytes(64)))
    assert _not_served("/v1/audio/transcriptions") in audio.value.message
    assert "speech-to-text models" in audio.value.message


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"input": "hi"}),
        ("/v1/score", {"text_1": "a", "text_2": "b"}),
        ("/v1/rerank", {"query": "a", "documents": ["b", "c"]}),
        ("/pooling", {"input": "hi"}),
    ],
)
def test_urllib_on_a_pooling_route_gets_the_gateways_404(
    gateway: ThreadedGateway, path: str, body: dict[str, object]
) -> None:
    status, error = _refusal(_post(f"{gateway.url}{path}", json.dumps(body).encode()))
    assert (status, error["code"], error["type"]) == (404, "not_found", "invalid_request_error")
    assert str(error["message"]).startswith(_not_served(path))
    text = urllib.request.urlopen(f"{gateway.url}/metrics", timeout=10).read().decode()
    assert f'servepilot_requests_total{{code="404",route="{path}"}}' in text
