"""The Ray backend on a real local multi-node Ray cluster (ray.cluster_utils.Cluster: a head
and 3 nodes of 2 CPUs and 2 logical GPUs), with simulated replicas: placement spreads the
replicas over distinct nodes, an impossible placement fails within its timeout saying what is
missing, and nothing of ours is left on the cluster afterwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.placement_group import placement_group_table  # noqa: E402

from servepilot.core.errors import FleetError  # noqa: E402
from servepilot.fleet.ray.replicas import RayReplicas  # noqa: E402
from tests.integration.ray_support import our_actors_alive, sim_fleet, start_cluster  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster()


GPU_FLEET = {
    "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 2},
    "engine": {"tensor_parallel_size": 2},
    "model": {"source": "llama-3.1-8b"},
}


def _server_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = (item.decode(errors="replace").partition("=") for item in raw if item)
    return {key: value for key, _, value in pairs}


def _groups_left() -> list[str]:
    return [
        g["name"] for g in placement_group_table().values()
        if g["name"].startswith("servepilot-") and g["state"] != "REMOVED"
    ]  # fmt: skip


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
    assert _groups_left() == []
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
    assert _groups_left() == []
    assert our_actors_alive() == []
