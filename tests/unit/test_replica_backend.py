"""The `ReplicaBackend` contract, checked against each implementation that runs here: local
(real simulated replica processes) and Kubernetes (the fake API server of k8s_api_fake.py,
which answers as Kubernetes does); Ray's runs in tests/integration/test_ray_backend.py's
cluster. Then the membership path: a backend's watch in, the gateway's pool changes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from servepilot.core.config import GatewayConfig, parse_config
from servepilot.engine.simserver.args import sim_model
from servepilot.fleet.backend import (
    Joined,
    Left,
    Lost,
    ReplicaEvent,
    ReplicaState,
    Synced,
)
from servepilot.fleet.k8s.backend import KubernetesBackend
from servepilot.fleet.k8s.endpoints import KubernetesEndpoints
from servepilot.fleet.k8s.scaling import KubernetesScaling
from servepilot.fleet.local import LocalBackend, LocalReplicas
from servepilot.fleet.membership import MembershipFeed
from servepilot.gateway import ReplicaPool
from servepilot.gateway.membership import Membership
from tests.unit.backend_conformance import Events, conforms, until
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import run
from tests.unit.k8s_api_fake import FakeCluster, api_server, service_account

DEPLOYMENT = "servepilot-vllm"


# --- local: real simulated replicas --------------------------------------------------------


class LocalHarness:
    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend

    async def serve(self, started_id: str) -> None:
        """A simulated replica gets ready by itself."""

    async def gone(self, replica_id: str) -> None:
        """Its process is stopped by the backend itself."""


@contextlib.asynccontextmanager
async def _local(tmp_path: Path) -> AsyncIterator[LocalHarness]:
    config = parse_config(
        {"engine": {"kind": "sim", "sim_step_ms": 10},
         "autoscale": {"enabled": True, "min_replicas": 1, "max_replicas": 3}},
        origin="test",
    )  # fmt: skip
    model = sim_model(config.model, config.engine.sim_tokenizer)
    backend = LocalBackend(LocalReplicas(config, model, tmp_path), lambda info: 8, poll_s=0.05)
    try:
        assert len(await backend.start(1)) == 1
        assert len(await backend.wait_started(lambda info: None)) == 1
        yield LocalHarness(backend)
    finally:
        await backend.stop_all()


def test_the_local_backend_conforms(tmp_path: Path) -> None:
    async def body() -> None:
        async with _local(tmp_path) as harness:
            await conforms(harness)
            assert [r.state for r in harness.backend.list()] == [ReplicaState.READY]
            assert harness.backend.list()[0].pid > 0
        processes = harness.backend.replicas.processes
        assert processes and all(p.exit_code() is not None for p in processes)  # stop_all

    run(body(), timeout_s=120)


def test_a_local_replica_whose_process_dies_is_lost(tmp_path: Path) -> None:
    async def body() -> None:
        async with _local(tmp_path) as harness:
            backend = harness.backend
            events = Events(backend)
            assert isinstance(await events.next(), Joined)
            assert isinstance(await events.next(), Synced)
            backend.replicas.processes[0].terminate()
            lost = await events.next()
            await events.stop()
            assert lost.replica_id == "r0" and "exited with code" in lost.why  # type: ignore[union-attr]
            assert [r.state for r in backend.list()] == [ReplicaState.LOST]

    run(body(), timeout_s=120)


# --- Kubernetes: the fake API server -------------------------------------------------------


class KubernetesHarness:
    def __init__(self, backend: KubernetesBackend, cluster: FakeCluster) -> None:
        self.backend = backend
        self.cluster = cluster
        self._next_port = 9100

    async def serve(self, started_id: str) -> None:
        # The ReplicaSet made a pod for the scale-up; it is ready now.
        self._next_port += 1
        self.cluster.endpoints[f"vllm-{self._next_port}"] = ("10.1.0.9", self._next_port, True)
        self.cluster.pods[f"vllm-{self._next_port}"] = {}

    async def gone(self, replica_id: str) -> None:
        # Scaled down, the ReplicaSet deletes the pod the backend marked.
        for pod, (ip, port, _) in list(self.cluster.endpoints.items()):
            if f"{ip}:{port}" == replica_id:
                del self.cluster.endpoints[pod]


def test_the_kubernetes_backend_conforms(tmp_path: Path) -> None:
    cluster = FakeCluster(
        replicas={DEPLOYMENT: 1},
        endpoints={"vllm-a": ("10.1.0.7", 8000, True)},
        pods={"vllm-a": {}},
    )

    async def body() -> None:
        async with api_server(cluster) as url:
            source = KubernetesEndpoints(DEPLOYMENT, api_url=url,
                                         account_dir=service_account(tmp_path))  # fmt: skip

            def scaling(backend: KubernetesBackend) -> KubernetesScaling:
                return KubernetesScaling(source.api, DEPLOYMENT, source, backend.ready_ids)

            backend = KubernetesBackend(source, scaling, interval_s=0.05, drain_timeout_s=1.0)
            await conforms(KubernetesHarness(backend, cluster))
        assert cluster.replicas[DEPLOYMENT] == 1  # up one, down one, up one, down one

    run(body(), timeout_s=60)


# --- the membership path: a watch in, the pool follows ----------------------------------------


class Scripted:
    """A watch the test writes, one event at a time."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[ReplicaEvent] = asyncio.Queue()

    async def events(self) -> AsyncIterator[ReplicaEvent]:
        while True:
            yield await self.queue.get()


def test_events_in_change_the_gateways_pool() -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        pool = ReplicaPool(GatewayConfig())
        watch = Scripted()
        heard: list[ReplicaEvent] = []
        feed = MembershipFeed(watch.events(), Membership(pool), heard.append)
        try:
            await watch.queue.put(Joined("a", a.url, capacity=3))
            await watch.queue.put(Synced())
            await feed.start()  # returns once synced: "a" is in the pool, probed
            assert [(r.replica_id, r.capacity, r.healthy) for r in pool.replicas()] == [
                ("a", 3, True)
            ]
            await watch.queue.put(Joined("b", b.url))
            await until(lambda: len(pool.replicas()) == 2)
            held = pool.acquire("a")  # a request in flight on "a"
            await watch.queue.put(Left("a", drain_timeout_s=5.0))
            await until(lambda: feed.joined == {"b"})
            assert {r.replica_id for r in pool.replicas()} == {"a", "b"}  # "a" drains
            pool.release(held)
            await until(lambda: [r.replica_id for r in pool.replicas()] == ["b"])
            await watch.queue.put(Lost("b", "its process exited with code 1"))
            await until(lambda: not pool.get("b").healthy)
            assert [type(e).__name__ for e in heard] == ["Joined", "Synced", "Joined", "Left",
                                                         "Lost"]  # fmt: skip
        finally:
            await feed.stop()
            await pool.close()
            await a.stop()
            await b.stop()

    run(body())


def test_a_replica_rejoining_while_it_drains_joins_once_the_drain_is_done() -> None:
    """A Ray replica restarted at a new URL leaves, then joins again under the same id."""

    async def body() -> None:
        a = await FakeUpstream("a").start()
        pool = ReplicaPool(GatewayConfig())
        feed = MembershipFeed(Scripted().events(), Membership(pool))
        try:
            await feed.apply(Joined("r0", a.url))
            held = pool.acquire("r0")
            await feed.apply(Left("r0", drain_timeout_s=5.0))
            await feed.apply(Joined("r0", a.url))  # chained after the drain: no duplicate
            await asyncio.sleep(0.1)
            assert pool.get("r0").draining
            pool.release(held)
            await until(lambda: [(r.replica_id, r.draining) for r in pool.replicas()]
                         == [("r0", False)])  # fmt: skip
            assert feed.joined == {"r0"}
        finally:
            await feed.stop()
            await pool.close()
            await a.stop()

    run(body())
