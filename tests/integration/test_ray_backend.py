"""The Ray backend on a real local multi-node Ray cluster (ray.cluster_utils.Cluster: a head
and 3 nodes of 2 CPUs and 2 logical GPUs), with simulated replicas: placement spreads the
replicas over distinct nodes, an impossible placement fails within its timeout saying what is
missing, and nothing of ours is left on the cluster afterwards."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import openai
import pytest
import yaml

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from servepilot.core.errors import FleetError  # noqa: E402
from servepilot.fleet.ray.backend import RayBackend  # noqa: E402
from servepilot.fleet.ray.replicas import RayReplicas  # noqa: E402
from tests.integration.fleetproc import cli, running_fleet, wait_until  # noqa: E402
from tests.support.ray_cluster import our_actors_alive, our_groups_left, sim_fleet  # noqa: E402
from tests.support.ray_node_loss import node_loss_under_load  # noqa: E402
from tests.unit.backend_conformance import conforms  # noqa: E402

pytestmark = pytest.mark.ray


GPU_FLEET = {
    "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 2},
    "engine": {"tensor_parallel_size": 2},
    "model": {"source": "llama-3.1-8b"},
}


def _server_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {key: value for key, _, value in pairs}


def test_spread_replicas_land_on_distinct_nodes_with_their_gpus(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = sim_fleet(replicas={"count": 3}, **GPU_FLEET)
    replicas = RayReplicas(config, tmp_path, "servepilot-spread")

    async def start_and_stop() -> list[tuple[str, str, dict[str, str]]]:
        infos = await replicas.start(lambda info: None)
        try:
            seen = []
            for info in infos:
                answer = replicas.answers[info.replica_id]
                seen.append((answer.node_id, info.url, _server_env(info.pid)))
            return seen
        finally:
            await replicas.stop()

    seen = asyncio.run(start_and_stop())
    worker_ids = {n["NodeID"] for n in ray.nodes() if n["Resources"].get("GPU")}
    assert {node for node, _, _ in seen} == worker_ids  # 3 replicas, 3 GPU nodes, one each
    # Each server sees the two GPUs its group's GPU bundles hold (logical ids 0 and 1).
    assert [sorted(env["CUDA_VISIBLE_DEVICES"].split(",")) for _, _, env in seen] == [
        ["0", "1"]
    ] * 3
    assert our_groups_left() == []
    assert our_actors_alive() == []


def test_more_spread_replicas_than_nodes_fail_within_the_timeout_saying_why(
    cluster: Cluster, tmp_path: Path
) -> None:
    timeout_s = 4.0
    config = sim_fleet(
        replicas={"count": 4}, cluster={"placement_timeout_s": timeout_s}, **GPU_FLEET
    )
    replicas = RayReplicas(config, tmp_path, "servepilot-impossible")
    began = time.monotonic()
    with pytest.raises(FleetError) as caught:
        asyncio.run(replicas.start(lambda info: None))
    elapsed_s = time.monotonic() - began
    assert timeout_s <= elapsed_s < timeout_s + 10
    assert str(caught.value).startswith(
        "the replicas' placement groups were not placed within 4 s: 4 replicas STRICT_SPREAD "
        "need 4 nodes with 1 CPU and 2 GPUs free; the cluster has 3 "
        "(nodes: 3 x 2 CPUs and 2 GPUs, 1 x 1 CPU)"
    )
    assert our_groups_left() == []
    assert our_actors_alive() == []


def test_up_status_down_from_the_command_line(cluster: Cluster, tmp_path: Path) -> None:
    """`servepilot up -c fleet.yaml` joins the cluster by its address; status shows its nodes,
    the placement group and the replica actors; down leaves no actor and no group."""
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(
        yaml.safe_dump(
            {
                "engine": {"kind": "sim", "sim_step_ms": 5},
                "model": {"source": "llama-3.1-8b"},
                "cluster": {"backend": "ray", "address": cluster.address},
            }
        )
    )
    with running_fleet(tmp_path / "state", 2, ["-c", str(fleet_yaml)]) as fleet:
        client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model="llama-3.1-8b", prompt="hello", max_tokens=8)
        assert answer.choices[0].text
        status = ""

        def shows_the_cluster() -> bool:
            nonlocal status
            status = cli(["status", "--port", str(fleet.port)], fleet.env).stdout
            return "replica actors" in status

        assert wait_until(shows_the_cluster, 30), status
        assert f"Ray cluster {cluster.address}: 4 of 4 nodes alive" in status
        assert f"servepilot-{fleet.port}-{fleet.proc.pid}-spread" in status
        assert "CREATED" in status
        assert status.count(" ready ") == 2, status
        done = cli(["down", "--port", str(fleet.port)], fleet.env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert fleet.proc.wait(timeout=60) == 0
    assert "placing one STRICT_SPREAD placement group" in fleet.log()
    assert our_groups_left() == []
    assert wait_until(lambda: our_actors_alive() == [], 10)


# --- node loss under load (last: it takes a node away from the module's cluster) ------------


def test_node_loss_under_load_every_request_ends_once_and_the_replica_comes_back(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = sim_fleet(replicas={"count": 3}, model={"source": "llama-3.1-8b"})
    # On its node's loss the replica must come back on the one node that holds no replica
    # (spread still holds).
    loss = asyncio.run(node_loss_under_load(cluster, config, tmp_path, "servepilot-loss"))
    outcomes, lost_id, after, said = loss.outcomes, loss.lost_id, loss.after, loss.said
    back_line = [line for line in said if "serves again" in line]
    assert len(back_line) == 1, said
    recovery_s = float(back_line[0].rsplit(", ", 1)[1].split(" s after")[0])
    assert 0 < recovery_s < 90, back_line
    # From the node's loss: Ray notices the node is dead, then places the replica elsewhere.
    assert 0 < loss.dead_s < loss.recovery_s < 90, (loss.dead_s, loss.recovery_s)
    assert recovery_s <= loss.recovery_s, (recovery_s, loss.recovery_s)
    kinds = Counter(o.kind for o in outcomes)
    assert kinds["complete"] > 20, kinds
    # No request fails: those not streaming yet are retried on a survivor, those the lost
    # replica was streaming go on from a survivor (continuation), each read as one answer.
    assert set(kinds) == {"complete"}, [o for o in outcomes if o.kind != "complete"]
    assert loss.continued >= 1, "the loss cut no stream in flight"
    assert all(o.streamed for o in outcomes)
    # The restarted replica is back in the gateway, on the one node no other replica holds.
    assert all(o.kind == "complete" for o in after), after
    assert lost_id in {o.replica for o in after}
    assert len(set(loss.nodes)) == 3, loss.nodes
    assert our_groups_left() == []
    assert our_actors_alive() == []


class _RayHarness:
    def __init__(self, backend: RayBackend) -> None:
        self.backend = backend

    async def serve(self, started_id: str) -> None:
        """A simulated replica's actor gets ready by itself."""

    async def gone(self, replica_id: str) -> None:
        """Its actor and group are removed by the backend itself."""


def test_the_ray_backend_conforms(cluster: Cluster, tmp_path: Path) -> None:
    scaling = {"enabled": True, "min_replicas": 1, "max_replicas": 3}
    config = sim_fleet(replicas={"count": 1}, autoscale=scaling)
    backend = RayBackend(RayReplicas(config, tmp_path, "servepilot-conform"), print, print)

    async def body() -> None:
        try:
            assert await backend.start(1) == ("r0",)
            assert len(await backend.wait_started(lambda info: None)) == 1
            await conforms(_RayHarness(backend))
        finally:
            await backend.stop_all()

    asyncio.run(body())
    assert our_groups_left() == []
    assert our_actors_alive() == []
