"""Kubernetes discovery, the Kubernetes backend's watch, by behaviour: endpoints appear, become
ready, disappear, and the gateway's pool follows through its membership (add, and
drain-then-remove); the Kubernetes source reads EndpointSlices from a fake API server with the
service account's token."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from servepilot.cli.main import main
from servepilot.core.config import GatewayConfig
from servepilot.fleet.k8s.backend import KubernetesBackend
from servepilot.fleet.k8s.endpoints import (
    DiscoveryError,
    Endpoint,
    KubernetesEndpoints,
    endpoints_from_slices,
)
from servepilot.fleet.membership import MembershipFeed, following
from servepilot.gateway import ReplicaPool, serve
from servepilot.gateway.membership import Membership
from tests.unit.fake_upstream import FakeUpstream, free_port
from tests.unit.gateway_support import run


class FakeEndpoints:
    """The seam's fake: the test says what the cluster has now."""

    def __init__(self) -> None:
        self.now: list[Endpoint] = []
        self.failing = False

    async def list_endpoints(self) -> list[Endpoint]:
        if self.failing:
            raise DiscoveryError("the API server is unreachable")
        return list(self.now)


def _at(upstream: FakeUpstream, ready: bool = True) -> Endpoint:
    return Endpoint(ip="127.0.0.1", port=upstream.port, ready=ready)


def _ids(pool: ReplicaPool) -> list[str]:
    return sorted(info.replica_id for info in pool.replicas())


async def _until(condition: Callable[[], bool], timeout_s: float = 3.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


class Watching:
    """A Kubernetes backend on `source` whose listings the test takes one at a time (`sync`),
    fed into `pool`'s membership."""

    def __init__(self, pool: ReplicaPool, source: FakeEndpoints, **kw: float) -> None:
        self.backend = KubernetesBackend(source, **kw)
        self.feed = MembershipFeed(self.backend.watch(), Membership(pool))

    async def sync(self) -> None:
        for event in await self.backend.poll():
            await self.feed.apply(event)

    @property
    def replica_ids(self) -> frozenset[str]:
        return self.feed.joined

    async def stop(self) -> None:
        await self.feed.stop()


@contextlib.asynccontextmanager
async def _pool() -> AsyncIterator[ReplicaPool]:
    pool = ReplicaPool(GatewayConfig())
    try:
        yield pool
    finally:
        await pool.close()


def test_the_pool_follows_endpoints_that_appear_become_ready_and_disappear() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        source = FakeEndpoints()
        async with _pool() as pool:
            watcher = Watching(pool, source, drain_timeout_s=1.0)
            source.now = [_at(a, ready=False)]  # a pod still loading its model
            await watcher.sync()
            assert _ids(pool) == []
            source.now = [_at(a), _at(b, ready=False)]
            await watcher.sync()
            assert _ids(pool) == [f"127.0.0.1:{a.port}"]
            assert pool.get(f"127.0.0.1:{a.port}").healthy
            source.now = [_at(a), _at(b)]
            await watcher.sync()
            assert _ids(pool) == sorted([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"])
            source.now = [_at(b)]  # a's pod was deleted (scaled down)
            await watcher.sync()
            assert watcher.replica_ids == frozenset({f"127.0.0.1:{b.port}"})
            await _until(lambda: len(_ids(pool)) == 1)
            assert _ids(pool) == [f"127.0.0.1:{b.port}"]
            await watcher.stop()
        await a.stop()
        await b.stop()

    run(body())


def test_a_terminating_replica_drains_its_requests_before_it_leaves() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        source = FakeEndpoints()
        async with _pool() as pool:
            watcher = Watching(pool, source, drain_timeout_s=5.0)
            source.now = [_at(a)]
            await watcher.sync()
            replica = pool.acquire(f"127.0.0.1:{a.port}")  # a request in flight
            source.now = [_at(a, ready=False)]  # preStop: the endpoint turns not ready
            await watcher.sync()
            await asyncio.sleep(0.1)
            assert _ids(pool) == [f"127.0.0.1:{a.port}"]  # still draining
            assert watcher.replica_ids == frozenset()
            pool.release(replica)
            await _until(lambda: not _ids(pool))
            await watcher.stop()
        await a.stop()

    run(body())


def test_a_failed_listing_keeps_the_replicas() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        source = FakeEndpoints()
        async with _pool() as pool:
            watcher = Watching(pool, source)
            source.now = [_at(a)]
            await watcher.sync()
            source.failing = True
            await watcher.sync()
            assert _ids(pool) == [f"127.0.0.1:{a.port}"]
            await watcher.stop()
        await a.stop()

    run(body())


def test_the_watch_follows_on_its_own_and_stops_in_order() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        source = FakeEndpoints()
        async with _pool() as pool:
            backend = KubernetesBackend(source, interval_s=0.02, drain_timeout_s=0.5)
            feed = MembershipFeed(backend.watch(), Membership(pool))
            await feed.start()  # synced: the first listing (nothing yet) is applied
            source.now = [_at(a)]
            await _until(lambda: bool(_ids(pool)))
            assert _ids(pool) == [f"127.0.0.1:{a.port}"]
            pool.acquire(f"127.0.0.1:{a.port}")  # never released: a drain that would hang
            source.now = []
            await asyncio.sleep(0.1)
            await feed.stop()  # cancels the drain and the watch, and returns
            source.now = [_at(a)]
            await asyncio.sleep(0.1)
            assert feed.joined == frozenset()  # nothing runs after stop
        await a.stop()

    run(body())


def test_serve_with_a_source_routes_to_what_it_discovers() -> None:
    async def body() -> None:
        a = await FakeUpstream("a").start()
        source = FakeEndpoints()
        source.now = [_at(a)]
        stop = asyncio.Event()
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(
            serve(GatewayConfig(port=0), [], stop=stop, on_started=started.set_result,
                  members=lambda g: following(KubernetesBackend(source), g.membership),
                  drain_timeout_s=1.0)
        )  # fmt: skip
        port = await started
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}/ready") as resp:
                assert resp.status == 200
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json=body
            ) as resp:
                assert resp.status == 200
                assert resp.headers["X-Servepilot-Replica"] == f"127.0.0.1:{a.port}"
        stop.set()
        await task
        await a.stop()

    run(body())


def test_a_pod_deleted_mid_answer_has_its_stream_go_on_from_another_pod() -> None:
    """Issue 36 on Kubernetes: the pod's endpoint leaves the Service and its server dies with
    the stream it was writing; the client reads one answer, the rest from the other pod."""

    async def body() -> None:
        a, b = FakeUpstream("a"), FakeUpstream("b")
        a.gate, b.first_text = asyncio.Event(), "three"  # a holds its stream after "one"
        await a.start(), await b.start()
        source = FakeEndpoints()
        source.now = [_at(a)]
        stop = asyncio.Event()
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(
            serve(GatewayConfig(port=0), [], stop=stop, on_started=started.set_result,
                  members=lambda g: following(KubernetesBackend(source, interval_s=0.02),
                                              g.membership),
                  drain_timeout_s=5.0)
        )  # fmt: skip
        port = await started
        url = f"http://127.0.0.1:{port}"
        request = {"model": "m", "stream": True, "max_tokens": 8,
                   "messages": [{"role": "user", "content": "count"}]}  # fmt: skip
        async with (
            aiohttp.ClientSession() as client,
            client.post(f"{url}/v1/chat/completions", json=request) as resp,
        ):
            assert resp.status == 200
            first = await resp.content.readuntil(b"\n\n")
            assert b'"one"' in first
            source.now = [_at(b)]  # the pod is deleted: its endpoint goes, b's is there
            async with asyncio.timeout(3):
                while True:
                    async with client.get(f"{url}/admin/replicas") as listing:
                        healthy = {r["id"] for r in await listing.json() if r["healthy"]}
                    if f"127.0.0.1:{b.port}" in healthy:
                        break
                    await asyncio.sleep(0.02)
            a.die_mid_stream = True  # ... and its server dies with the stream
            a.gate.set()
            rest = await resp.read()
        events = [e for e in (first + rest).split(b"\n\n") if e.strip()]
        assert events.count(b"data: [DONE]") == 1 and events[-1] == b"data: [DONE]", events
        text = "".join(
            (json.loads(e[6:])["choices"][0]["delta"].get("content") or "") for e in events[:-1]
        )
        assert text == "onethreetwo", events  # a's "one", then b's rest
        (asked,) = b.received
        assert asked["messages"][-1] == {"role": "assistant", "content": "one"}
        assert asked["continue_final_message"] is True and asked["max_tokens"] == 7
        stop.set()
        await task
        await a.stop()
        await b.stop()

    run(body())


# --- the Kubernetes source -------------------------------------------------------------------

RECORDED = {
    "kind": "EndpointSliceList",
    "apiVersion": "discovery.k8s.io/v1",
    "items": [
        {
            "metadata": {"name": "servepilot-vllm-abcde",
                         "labels": {"kubernetes.io/service-name": "servepilot-vllm"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.1.0.7"],
                 "conditions": {"ready": True, "serving": True, "terminating": False}},
                {"addresses": ["10.1.0.8"],
                 "conditions": {"ready": False, "serving": False, "terminating": False}},
                {"addresses": ["10.1.0.9"],
                 "conditions": {"ready": False, "serving": True, "terminating": True}},
                {"addresses": ["10.1.0.10"], "conditions": {}},
            ],
        },
        {"metadata": {"name": "servepilot-vllm-empty"}, "addressType": "IPv4",
         "ports": None, "endpoints": None},
    ],
}  # fmt: skip


def test_endpoint_slices_parse_into_ready_and_not_ready_endpoints() -> None:
    assert endpoints_from_slices(RECORDED) == [
        Endpoint("10.1.0.10", 8000, ready=True),  # no condition: unknown, taken as ready
        Endpoint("10.1.0.7", 8000, ready=True),
        Endpoint("10.1.0.8", 8000, ready=False),  # starting
        Endpoint("10.1.0.9", 8000, ready=False),  # terminating (preStop drain)
    ]


@contextlib.asynccontextmanager
async def _fake_api(status: int = 200) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    async def slices(request: web.Request) -> web.Response:
        seen.append({"path": request.path, "auth": request.headers.get("Authorization"),
                     "selector": request.query.get("labelSelector")})  # fmt: skip
        return web.Response(status=status, text=json.dumps(RECORDED),
                            content_type="application/json")  # fmt: skip

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", slices)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def _account(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text("tok-1\n")
    (tmp_path / "namespace").write_text("llm\n")
    return tmp_path


def test_kubernetes_source_lists_the_services_slices_with_the_token(tmp_path: Path) -> None:
    async def body() -> None:
        async with _fake_api() as (url, seen):
            source = KubernetesEndpoints("servepilot-vllm", api_url=url,
                                         account_dir=_account(tmp_path))  # fmt: skip
            found = await source.list_endpoints()
            assert [e.replica_id for e in found if e.ready] == ["10.1.0.10:8000", "10.1.0.7:8000"]
            (tmp_path / "token").write_text("tok-2")  # rotated on disk
            await source.list_endpoints()
        assert seen[0] == {
            "path": "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices",
            "auth": "Bearer tok-1",
            "selector": "kubernetes.io/service-name=servepilot-vllm",
        }
        assert seen[1]["auth"] == "Bearer tok-2"

    run(body())


def test_kubernetes_source_says_why_it_cannot_list(tmp_path: Path) -> None:
    async def body() -> None:
        async with _fake_api(status=403) as (url, _):
            source = KubernetesEndpoints("s", "ns", api_url=url, account_dir=_account(tmp_path))
            with pytest.raises(DiscoveryError, match="HTTP 403"):
                await source.list_endpoints()
        gone = KubernetesEndpoints("s", "ns", api_url=f"http://127.0.0.1:{free_port()}",
                                   account_dir=_account(tmp_path))  # fmt: skip
        with pytest.raises(DiscoveryError, match="listing EndpointSlices"):
            await gone.list_endpoints()

    run(body())


def test_gateway_needs_a_replica_or_a_discovery(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway"]) == 2
    assert "--discover k8s:SERVICE" in capsys.readouterr().err
    assert main(["gateway", "--discover", "dns:x"]) == 2
    assert "k8s:SERVICE" in capsys.readouterr().err


def test_discovery_outside_a_pod_is_refused_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert main(["gateway", "--discover", "k8s:servepilot-vllm.llm"]) == 1
    err = capsys.readouterr().err
    assert "KUBERNETES_SERVICE_HOST is unset" in err
    assert "Traceback" not in err
