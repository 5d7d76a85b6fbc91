"""Scaffolding for the end-to-end gateway tests: a gateway in front of fake upstreams
(fake_upstream.py), a fake clock, and helpers to call it and read its /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families

from servepilot.core import accel
from servepilot.core.config import GatewayConfig, PolicyName
from servepilot.gateway import Gateway
from servepilot.routing import StepTimeModel
from tests.unit.fake_upstream import FakeUpstream

HEADER = "X-Servepilot-Replica"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
STREAM_CHAT = {**CHAT, "stream": True}
PYTHON_FRAMES = pytest.mark.skipif(
    accel.compiled(accel.GATEWAY),
    reason="counts Python frames of the data path: compiled (make gateway-fast), it has none",
)
VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_count{model_name="m"} 1.0
vllm:e2e_request_latency_seconds_sum{model_name="m"} 0.5
"""


# A P0 key, which X-Priority may lower to any class (`as_class`): some tests that mix classes
# send them with it, so that the API-key path is exercised too.
URGENT_KEY: dict[str, Any] = {"keys": [{"name": "ops", "key": "sk-ops", "priority": 0}]}


def priority(cls_: int) -> dict[str, str]:
    """Headers asking for class `cls_` (without API keys the header decides)."""
    return {"X-Priority": str(cls_)}


def as_class(cls_: int) -> dict[str, str]:
    """Headers for a request of class `cls_` under `URGENT_KEY`."""
    return {"Authorization": "Bearer sk-ops", "X-Priority": str(cls_)}


def vllm_metrics(kv_cache_usage: float, running: int = 0, waiting: int = 0) -> str:
    """A minimal vLLM /metrics page reporting this load."""
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv_cache_usage}\n'
    )


def run(coro: Awaitable[None], timeout_s: float = 10) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro, timeout=timeout_s)

    asyncio.run(bounded())


def chat(content: str, **extra: Any) -> dict[str, Any]:
    """A chat body whose one user message is `content` (a marker the upstream records)."""
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def content_of(body: Mapping[str, Any]) -> str:
    """The last message's content of a chat body an upstream received."""
    content: str = body["messages"][-1]["content"]
    return content


class FakeClock:
    """A clock the test moves by hand, to inject into `Gateway(..., clock=)`.

    `reads` counts the calls: while no request is in flight only the dispatcher's ticker
    reads the clock, so `wait_read` is a way to wait for its next tick.
    """

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def wait_read(self, timeout_s: float = 3.0) -> None:
        """Wait until someone (the dispatcher's ticker, when idle) reads the clock again."""
        seen = self.reads

        async def read() -> bool:
            return self.reads > seen

        await eventually(read, timeout_s)


@contextlib.asynccontextmanager
async def gateway_in_front_of(
    upstreams: Sequence[FakeUpstream],
    *,
    clock: Callable[[], float] | None = None,
    seed: int | None = 0,
    step_model: Callable[[str], StepTimeModel] | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[Gateway, str]]:
    """A started gateway (round robin unless overridden) with the upstreams registered.

    `overrides` are GatewayConfig fields; sections take dicts (`admission={...}`).
    """
    settings: dict[str, Any] = {
        "port": 0,
        "health_interval_s": 0.05,
        "connect_timeout_s": 1.0,
        "policy": PolicyName.ROUND_ROBIN,
        **overrides,
    }
    config = GatewayConfig(**settings)
    gateway = (
        Gateway(config, seed=seed, step_model=step_model)
        if clock is None
        else Gateway(config, seed=seed, clock=clock, step_model=step_model)
    )
    for upstream in upstreams:
        await gateway.pool.add(
            upstream.name,
            upstream.url,
            upstream.capacity,
            upstream.group,
            starting=upstream.starting,
        )
    port = await gateway.start("127.0.0.1", 0)
    try:
        yield gateway, f"http://127.0.0.1:{port}"
    finally:
        for upstream in upstreams:
            upstream.release_all()
        await gateway.stop(drain_timeout_s=1.0)
        for upstream in upstreams:
            await upstream.stop()


async def error_of(resp: aiohttp.ClientResponse, status: int) -> dict[str, Any]:
    """The OpenAI error object of `resp`, after checking its status and shape."""
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    error: dict[str, Any] = (await resp.json())["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and isinstance(error["code"], str)
    return error


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


def until(condition: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    """A synchronous condition as a check for `eventually`."""

    async def check() -> bool:
        return condition()

    return check


def reaches(value: Callable[[], int], target: int) -> Callable[[], Awaitable[bool]]:
    """Check for `eventually`: `value()` equals `target`."""
    return until(lambda: value() == target)


def queued(gw: Gateway, count: int) -> Callable[[], Awaitable[bool]]:
    """Check for `eventually`: the gateway's queue holds `count` requests."""
    return until(lambda: len(gw.dispatcher.queue) == count)


async def read_event(resp: aiohttp.ClientResponse) -> bytes:
    """The next SSE event (up to and including its blank line)."""
    event = b""
    while not event.endswith(b"\n\n"):
        line = await resp.content.readline()
        assert line, f"stream ended inside an event: {event!r}"
        event += line
    return event


@dataclass(frozen=True)
class Reply:
    """A response read whole, so that it can be awaited from a background task."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self, status: int) -> dict[str, Any]:
        """The OpenAI error object, after checking the status and the shape."""
        assert self.status == status, (self.status, self.body)
        assert self.headers["Content-Type"].startswith("application/json")
        error: dict[str, Any] = self.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str) and isinstance(error["code"], str)
        return error

    @property
    def replica(self) -> str:
        return self.headers[HEADER]


async def call(
    client: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any] | None = None,
    *,
    path: str = "/v1/chat/completions",
    headers: Mapping[str, str] | None = None,
    method: str = "POST",
    raw: bytes | None = None,
) -> Reply:
    """One request to the gateway, read whole: `body` as JSON (CHAT for a POST without one),
    or the `raw` bytes."""
    payload = raw
    if payload is None and (body is not None or method == "POST"):
        payload = json.dumps(CHAT if body is None else body).encode()
    async with client.request(
        method, url + path, data=payload, headers=dict(headers or {})
    ) as resp:
        return Reply(resp.status, CIMultiDict(resp.headers), await resp.read())


def in_background(
    client: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> asyncio.Task[Reply]:
    """`call` in a task (for requests that will wait in the gateway or at the upstream)."""
    return asyncio.ensure_future(call(client, url, body, **kwargs))


Labels = Mapping[str, str]


class Scrape:
    """One /metrics page, parsed: `value(name, labels)` of any sample."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in self.families.values()
            for s in family.samples
        }

    def value(self, name: str, labels: Labels | None = None) -> float:
        """The sample's value; KeyError when the gateway does not export it."""
        return self.samples[(name, frozenset((labels or {}).items()))]

    def get(self, name: str, labels: Labels | None = None, default: float = 0.0) -> float:
        return self.samples.get((name, frozenset((labels or {}).items())), default)

    def labelled(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        """Every sample called `name`, by label set."""
        return {labels: value for (n, labels), value in self.samples.items() if n == name}


def classes_served(metrics: Scrape) -> dict[str, float]:
    """Requests answered by the gateway, by the class they were served as."""
    served: dict[str, float] = {}
    for labels, count in metrics.labelled("servepilot_e2e_seconds_count").items():
        cls_ = dict(labels)["class"]
        served[cls_] = served.get(cls_, 0.0) + count
    return served


async def scrape(client: aiohttp.ClientSession, url: str) -> Scrape:
    async with client.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return Scrape(await resp.text())


CLASSES = ("0", "1", "2")
"""The priority classes as the metrics label them."""


def idle(gw: Gateway) -> Callable[[], Awaitable[bool]]:
    """Nothing in flight on any replica and nothing queued."""
    return until(lambda: gw.pool.total_in_flight() == 0 and len(gw.dispatcher.queue) == 0)


async def assert_all_counters_zero(gw: Gateway, client: aiohttp.ClientSession, url: str) -> None:
    await eventually(idle(gw))
    assert all(info.in_flight == 0 for info in gw.pool.replicas())
    assert gw.dispatcher.queue.depth_by_class() == (0, 0, 0)
    assert gw.dispatcher.queue.held() == 0  # no removed ticket left behind either
    metrics = await scrape(client, url)
    for cls_ in CLASSES:
        assert metrics.value("servepilot_queue_depth", {"class": cls_}) == 0
    for info in gw.pool.replicas():
        assert metrics.value("servepilot_in_flight_requests", {"replica": info.replica_id}) == 0
