"""The warm pool on Kubernetes (replicas.asleep): `k8s render` turns on vLLM's sleep mode in the
replica pods only for a pool on GPUs (on CPU the pool parks them), tells the gateway's
autoscaler of the pool, and refuses a pool an HPA or KEDA would scale; the gateway's
autoscaler, on a small API server (tests/unit/k8s_api_fake.py) in front of fake pods that
serve vLLM's sleep routes, wakes a pool pod to grow and refills the pool behind it, puts a
drained pod to sleep while the pool is short, has Kubernetes delete a sleeping pod (never an
awake one) when the pool is above its target, and takes a pod found asleep into the pool."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from servepilot.core.config import parse_config, pool_parks
from servepilot.core.errors import ConfigError
from servepilot.core.yamlfile import parse_yaml
from servepilot.engine.args import SLEEP_ENDPOINTS_ENV
from servepilot.fleet.k8s import all_objects
from servepilot.fleet.k8s.scaling import DELETION_COST
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import run
from tests.unit.k8s_api_fake import SCALE, FakeCluster, gateway_scaling
from tests.unit.k8s_support import FLEETS, by_kind, fleet, rendered, validate

STEP = {"enabled": True, "policy": "step", "min_replicas": 2, "max_replicas": 6}
POOL = {"replicas": {"asleep": 2}}
SLEEP_FLAG = "--enable-sleep-mode"

# --- k8s render ------------------------------------------------------------------------------


def _render(name: str, data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The vLLM container and the gateway's fleet.yaml; every object validated first."""
    files = rendered(fleet(FLEETS[name] | data))
    for obj in all_objects(files):
        validate(obj)
    deployments = {d["metadata"]["name"]: d for d in by_kind(files, "Deployment")}
    container = deployments["servepilot-vllm"]["spec"]["template"]["spec"]["containers"][0]
    (config_map,) = [c for c in by_kind(files, "ConfigMap")
                     if c["metadata"]["name"] == "servepilot-gateway"]  # fmt: skip
    return container, parse_yaml(config_map["data"]["fleet.yaml"], origin="fleet.yaml")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def test_a_pool_on_gpus_renders_pods_in_sleep_mode_and_tells_the_gateway() -> None:
    container, gateway_yaml = _render("deepseek-h200", {"autoscale": STEP} | POOL)
    assert container["command"].count(SLEEP_FLAG) == 1
    assert _env(container)[SLEEP_ENDPOINTS_ENV] == "1"
    assert gateway_yaml["replicas"] == {"asleep": 2}
    assert gateway_yaml["engine"]["sleep_mode"] is True
    # What the gateway reads back: a pool of 2 it puts to sleep, not parks.
    config = parse_config(gateway_yaml, origin="ConfigMap")
    assert config.replicas.asleep == 2 and not pool_parks(config)


def test_without_a_pool_or_on_cpu_the_pods_have_no_sleep_mode() -> None:
    container, gateway_yaml = _render("deepseek-h200", {"autoscale": STEP})
    assert SLEEP_FLAG not in container["command"]
    assert SLEEP_ENDPOINTS_ENV not in _env(container)
    assert "replicas" not in gateway_yaml and "sleep_mode" not in gateway_yaml["engine"]
    # On CPU vLLM has no sleep mode: the gateway parks the pool's pods instead.
    container, gateway_yaml = _render("embedded", {"autoscale": STEP} | POOL)
    assert SLEEP_FLAG not in " ".join(container["command"])
    assert SLEEP_ENDPOINTS_ENV not in _env(container)
    config = parse_config(gateway_yaml, origin="ConfigMap")
    assert config.replicas.asleep == 2 and pool_parks(config)


@pytest.mark.parametrize(
    "autoscale", [{}, {"enabled": True, "policy": "target"}], ids=["hpa", "target"]
)
def test_a_pool_that_an_hpa_would_scale_is_refused(autoscale: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=r"replicas\.asleep 2: on Kubernetes only the gate"):
        rendered(fleet(FLEETS["deepseek-h200"] | {"autoscale": autoscale} | POOL))


# --- the gateway's autoscaler ----------------------------------------------------------------

POOL_OF_ONE: dict[str, object] = {"replicas": {"asleep": 1}, "engine": {"sleep_mode": True}}
_SETTLE_S = 1.5
"""Ticks (every 0.2 s) and listings (every 0.5 s) after the change: nothing more happens."""


async def _pods(names: str, asleep: str = "") -> dict[str, FakeUpstream]:
    pods = {}
    for name in names:
        upstream = FakeUpstream(name)
        upstream.sleep_mode = True
        upstream.sleeping = name in asleep
        pods[f"vllm-{name}"] = await upstream.start()
    return pods


def _cluster(pods: dict[str, FakeUpstream], serving: str) -> FakeCluster:
    endpoints = {pod: ("127.0.0.1", u.port, True) for pod, u in pods.items() if u.name in serving}
    return FakeCluster(replicas={"servepilot-vllm": len(endpoints)}, endpoints=endpoints,
                       pods={pod: {} for pod in pods})  # fmt: skip


class Settled:
    """`until` for the gateway: `done()` holds, then `_SETTLE_S` more."""

    def __init__(self, done: Any) -> None:
        self.done = done
        self.since: float | None = None

    def __call__(self) -> bool:
        if self.since is None and self.done():
            self.since = time.monotonic()
        return self.since is not None and time.monotonic() - self.since > _SETTLE_S


async def _stop(pods: dict[str, FakeUpstream]) -> None:
    for upstream in pods.values():
        await upstream.stop()


def test_up_wakes_a_pool_pod_and_the_deployment_grows_only_to_refill_the_pool(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        pods = await _pods("abc", asleep="b")
        a, b, c = pods.values()
        cluster = _cluster(pods, serving="ab")  # b asleep (a gateway before this one)

        def refill_joins() -> bool:
            if cluster.replicas["servepilot-vllm"] == 3 and "vllm-c" not in cluster.endpoints:
                cluster.endpoints["vllm-c"] = ("127.0.0.1", c.port, True)  # the new pod
            return c.sleeping

        await gateway_scaling(cluster, tmp_path, STEP | {"max_replicas": 3},
                              Settled(refill_joins), POOL_OF_ONE, interval_s=0.5)  # fmt: skip
        # The minimum of 2 serving: b woken, no pod started for it; the Deployment grew by
        # one, the pool's refill, which was put to sleep once it served.
        assert (a.sleep_calls, b.sleep_calls, c.sleep_calls) == ([], ["/wake_up"], ["/sleep"])
        assert cluster.replicas["servepilot-vllm"] == 3
        assert cluster.calls.count(("PATCH", SCALE)) == 1
        assert all(not notes for notes in cluster.pods.values())
        await _stop(pods)

    run(body(), timeout_s=30)


def test_down_puts_a_drained_pod_to_sleep_while_the_pool_is_short(tmp_path: Path) -> None:
    async def body() -> None:
        pods = await _pods("abc")
        cluster = _cluster(pods, serving="abc")

        def one_asleep() -> bool:
            return sum(u.sleeping for u in pods.values()) == 1

        await gateway_scaling(cluster, tmp_path, STEP | {"max_replicas": 2},
                              Settled(one_asleep), POOL_OF_ONE, interval_s=0.5)  # fmt: skip
        # 2 serve, 1 asleep in the pool: the Deployment unchanged, no pod marked to go.
        assert sorted(u.sleep_calls for u in pods.values()) == [[], [], ["/sleep"]]
        assert cluster.replicas["servepilot-vllm"] == 3
        assert ("PATCH", SCALE) not in cluster.calls
        assert all(not notes for notes in cluster.pods.values())
        await _stop(pods)

    run(body(), timeout_s=30)


def test_a_pool_above_its_target_has_kubernetes_delete_a_sleeping_pod(tmp_path: Path) -> None:
    async def body() -> None:
        pods = await _pods("abc", asleep="bc")
        cluster = _cluster(pods, serving="abc")

        def one_gone() -> bool:
            marked = [pod for pod, notes in cluster.pods.items() if notes]
            for pod in marked:  # the ReplicaSet deletes it: terminating, not ready, a while
                ip, port, _ = cluster.endpoints[pod]
                cluster.endpoints[pod] = (ip, port, False)
            return cluster.replicas["servepilot-vllm"] == 2

        await gateway_scaling(cluster, tmp_path, STEP | {"min_replicas": 1, "max_replicas": 1},
                              Settled(one_gone), POOL_OF_ONE, interval_s=0.5)  # fmt: skip
        # One of the two asleep is marked and deleted, once; the awake one serves on.
        marked = {pod: notes for pod, notes in cluster.pods.items() if notes}
        assert list(marked.values()) == [{DELETION_COST: "-2147483648"}]
        assert set(marked) < {"vllm-b", "vllm-c"}
        assert cluster.calls.count(("PATCH", SCALE)) == 1
        assert all(not u.sleep_calls for u in pods.values())
        await _stop(pods)

    run(body(), timeout_s=30)
