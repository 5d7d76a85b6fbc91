"""The autoscaler's Kubernetes backend against a small API server on 127.0.0.1
(tests/unit/k8s_api_fake.py): the Deployment's scale subresource moves by one, an added pod
counts as starting until it joins, a drained pod gets the lowest deletion cost before the
scale-down, and the API's refusals come back named."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from servepilot.cli.main import main
from servepilot.core.errors import ServepilotError
from servepilot.fleet.k8s.api import KubernetesApi, KubernetesApiError
from servepilot.fleet.k8s.backend import DISCOVERY_INTERVAL_S
from servepilot.fleet.k8s.endpoints import Endpoint, endpoints_from_slices
from servepilot.fleet.k8s.scaling import (
    DELETION_COST,
    KubernetesScaling,
    ScalingForbidden,
    scaler_role,
)
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import run
from tests.unit.k8s_api_fake import (
    DEPLOYMENT,
    SCALE,
    FakeCluster,
    api_server,
    gateway_scaling,
    service_account,
)


class Pods:
    """The discovery source's seam: endpoints with their pods."""

    def __init__(self, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints

    async def list_endpoints(self) -> list[Endpoint]:
        return list(self.endpoints)


def _two_pods() -> Pods:
    return Pods([Endpoint("10.1.0.7", 8000, True, pod="vllm-a"),
                 Endpoint("10.1.0.8", 8000, True, pod="vllm-b")])  # fmt: skip


def _backend(url: str, tmp_path: Path, joined: set[str], pods: Pods) -> KubernetesScaling:
    api = KubernetesApi(api_url=url, account_dir=service_account(tmp_path))
    return KubernetesScaling(api, DEPLOYMENT, pods, lambda: joined)


def test_an_added_replica_is_one_more_in_the_scale_and_starting_until_it_joins(
    tmp_path: Path,
) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 2})
    joined = {"10.1.0.7:8000", "10.1.0.8:8000"}

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, joined, _two_pods())
            assert await backend.add() == "pending-1"
            assert await backend.add() == "pending-2"
            assert cluster.replicas[DEPLOYMENT] == 4
            assert backend.starting() == ("pending-1", "pending-2")
            joined.add("10.1.0.9:8000")  # the first new pod is ready, in the gateway
            assert backend.starting() == ("pending-2",)
            assert backend.launched_as("10.1.0.9:8000") == "pending-1"
            assert backend.launched_as("10.1.0.7:8000") == ""  # serving before it was asked
        assert cluster.calls == [("GET", SCALE), ("PATCH", SCALE)] * 2
        assert set(cluster.tokens) == {"Bearer tok-1"}

    run(body())


def test_a_drained_replica_gets_the_lowest_deletion_cost_before_the_scale_down(
    tmp_path: Path,
) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 2}, pods={"vllm-a": {}, "vllm-b": {}})

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, {"10.1.0.7:8000", "10.1.0.8:8000"}, _two_pods())
            await backend.remove("10.1.0.8:8000")
        assert cluster.pods == {"vllm-a": {}, "vllm-b": {DELETION_COST: "-2147483648"}}
        assert cluster.replicas[DEPLOYMENT] == 1
        pod = "/api/v1/namespaces/llm/pods/vllm-b"
        assert cluster.calls == [("PATCH", pod), ("GET", SCALE), ("PATCH", SCALE)]

    run(body())


def test_a_starting_replica_removed_is_a_plain_scale_down(tmp_path: Path) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 2}, pods={"vllm-a": {}, "vllm-b": {}})

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, {"10.1.0.7:8000", "10.1.0.8:8000"}, _two_pods())
            rid = await backend.add()
            await backend.remove(rid)
            assert backend.starting() == ()
        assert cluster.replicas[DEPLOYMENT] == 2
        assert all(not annotations for annotations in cluster.pods.values())

    run(body())


def test_pods_the_deployment_asks_for_beyond_the_gateways_count_as_starting(
    tmp_path: Path,
) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 3})
    joined = {"10.1.0.7:8000"}

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, joined, _two_pods())
            await backend.prime()
            assert backend.starting() == ("pending-1", "pending-2")
            joined.update({"10.1.0.8:8000", "10.1.0.9:8000"})
            assert backend.starting() == ()

    run(body())


def test_a_refused_scale_names_the_role_and_the_apis_reason(tmp_path: Path) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 2}, forbidden={"deployments/scale"})

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, set(), _two_pods())
            with pytest.raises(ScalingForbidden) as refused:
                await backend.add()
        message = str(refused.value)
        assert "may not get deployments/scale" in message
        assert "the Role servepilot-vllm-scaler" in message
        assert 'cannot get resource "deployments/scale" in API group "apps"' in message
        assert backend.starting() == ()

    run(body())


def test_a_refused_pod_patch_stops_before_the_scale_down(tmp_path: Path) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 2}, pods={"vllm-a": {}}, forbidden={"pods"})

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, {"10.1.0.7:8000"}, _two_pods())
            with pytest.raises(ScalingForbidden, match=r"may not patch pods \(vllm-a\)"):
                await backend.remove("10.1.0.7:8000")
        assert cluster.replicas[DEPLOYMENT] == 2  # no other pod deleted in its place

    run(body())


def test_a_replica_without_a_known_pod_is_not_scaled_down(tmp_path: Path) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 2})

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, set(), Pods([]))
            with pytest.raises(ServepilotError, match=r"no pod found for replica 10\.1\.0\.7"):
                await backend.remove("10.1.0.7:8000")
        assert cluster.replicas[DEPLOYMENT] == 2
        assert cluster.calls == []

    run(body())


def test_an_unknown_deployment_is_the_apis_not_found(tmp_path: Path) -> None:
    cluster = FakeCluster(replicas={"other": 1})

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, set(), _two_pods())
            with pytest.raises(KubernetesApiError) as missing:
                await backend.add()
        assert missing.value.status == 404
        assert f'HTTP 404 deployments.apps "{DEPLOYMENT}" not found' in str(missing.value)

    run(body())


def test_a_scale_changed_since_it_was_read_is_read_again(tmp_path: Path) -> None:
    cluster = FakeCluster(replicas={DEPLOYMENT: 2}, races=1)

    async def body() -> None:
        async with api_server(cluster) as url:
            backend = _backend(url, tmp_path, set(), _two_pods())
            await backend.add()
            assert cluster.replicas[DEPLOYMENT] == 3
            cluster.races = 3  # it keeps changing: the conflict comes back, nothing written
            with pytest.raises(KubernetesApiError, match="HTTP 409") as conflict:
                await backend.add()
        assert conflict.value.status == 409
        assert cluster.replicas[DEPLOYMENT] == 3
        assert backend.starting() == ("pending-1",)

    run(body())


def test_the_role_is_named_after_the_deployment() -> None:
    assert scaler_role("fleet-vllm") == "fleet-vllm-scaler"


def test_endpoint_slices_name_the_pod_behind_each_endpoint() -> None:
    body = {"items": [{"ports": [{"name": "http", "port": 8000}], "endpoints": [
        {"addresses": ["10.1.0.7"], "targetRef": {"kind": "Pod", "name": "vllm-a"}},
        {"addresses": ["10.1.0.8"]},
    ]}]}  # fmt: skip
    assert [e.pod for e in endpoints_from_slices(body)] == ["vllm-a", None]


# --- in the gateway: `gateway --discover k8s:SVC --scale-deployment NAME` ---------------------


def test_the_gateway_scales_its_deployment_up_to_the_minimum(tmp_path: Path) -> None:
    async def body() -> None:
        a, b = await FakeUpstream("a").start(), await FakeUpstream("b").start()
        cluster = FakeCluster(replicas={DEPLOYMENT: 1},
                              endpoints={"vllm-a": ("127.0.0.1", a.port, True)})  # fmt: skip

        seen: dict[str, float] = {}

        def scaled_then_joined() -> bool:
            now = time.monotonic()
            if cluster.replicas[DEPLOYMENT] == 2:
                seen.setdefault("scaled", now)
            if "scaled" in seen and now - seen["scaled"] > 1.0 and "ready" not in seen:
                # The pod is ready after a second of ticks: it counted as starting meanwhile.
                cluster.endpoints["vllm-b"] = ("127.0.0.1", b.port, True)
                seen["ready"] = now
            # The watch lists every 2 s: then a few ticks with both in the gateway.
            return "ready" in seen and now - seen["ready"] > DISCOVERY_INTERVAL_S + 1.0

        await gateway_scaling(cluster, tmp_path, {"min_replicas": 2, "max_replicas": 3},
                               scaled_then_joined)  # fmt: skip
        # One step: the new pod counted as starting, then as the second replica.
        assert cluster.replicas[DEPLOYMENT] == 2
        assert cluster.calls.count(("PATCH", SCALE)) == 1
        await a.stop()
        await b.stop()

    run(body(), timeout_s=30)


def test_the_gateway_drains_a_pod_and_has_kubernetes_delete_that_one(tmp_path: Path) -> None:
    async def body() -> None:
        ups = [await FakeUpstream(n).start() for n in "abc"]
        pods = {f"vllm-{u.name}": ("127.0.0.1", u.port, True) for u in ups}
        cluster = FakeCluster(replicas={DEPLOYMENT: 3}, endpoints=dict(pods),
                              pods={pod: {} for pod in pods})  # fmt: skip
        await gateway_scaling(cluster, tmp_path, {"min_replicas": 1, "max_replicas": 2},
                               lambda: cluster.replicas[DEPLOYMENT] == 2)  # fmt: skip
        marked = [pod for pod, notes in cluster.pods.items() if notes]
        assert len(marked) == 1
        assert cluster.pods[marked[0]] == {DELETION_COST: "-2147483648"}
        pod_patch = cluster.calls.index(("PATCH", f"/api/v1/namespaces/llm/pods/{marked[0]}"))
        assert pod_patch < cluster.calls.index(("PATCH", SCALE))
        for upstream in ups:
            await upstream.stop()

    run(body(), timeout_s=30)


def test_scale_deployment_needs_discovery_and_an_enabled_section(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    assert main(["gateway", "--replica", "http://127.0.0.1:9", "--scale-deployment", "v"]) == 2
    assert "--scale-deployment: the gateway finds the pods with --discover" in (
        capsys.readouterr().err
    )
    config = tmp_path / "fleet.yaml"
    config.write_text("autoscale: {enabled: false}\n")
    argv = ["gateway", "-c", str(config), "--discover", "k8s:s.llm", "--scale-deployment", "v"]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "autoscale section is not enabled" in err
    assert "Traceback" not in err
