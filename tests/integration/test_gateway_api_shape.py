"""vLLM's API shape at the gateway, in front of simulated replicas, as the official `openai`
client and Python's urllib see it: every early refusal (413, 431) reaches a client that
writes its whole body before reading."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

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
