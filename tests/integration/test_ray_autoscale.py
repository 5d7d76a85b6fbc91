"""`up --autoscale 1:2` on the Ray backend, on a real local multi-node Ray cluster (a head and
3 nodes; simulated replicas): load from `servepilot bench` fills r0, the controller adds r1 as
one more actor, on a node r0 is not on (placement spread), and the gateway routes to it; the
load drops, r1 is drained and its actor and placement group removed; no request is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.integration.fleetproc import (  # noqa: E402
    RunningFleet,
    cli,
    down,
    running_fleet,
    wait_until,
)
from tests.integration.test_up_autoscale import FAST_RULES, ramp_up_and_down  # noqa: E402
from tests.support.ray_cluster import our_actors_alive, our_groups_left  # noqa: E402

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow(
        reason="a minute (a 25 s load, then the drain) on its own Ray cluster; its parts run in "
        "every suite: the ramp through `up --autoscale` (test_up_autoscale.py), real actors and "
        "placement groups (test_ray_backend.py), the Ray scaler's adds, removals and groups "
        "(tests/unit/test_ray_scaling.py)"
    ),
]


def _nodes_of(fleet: RunningFleet) -> dict[str, str]:
    """Each replica's node (short id) as `status` shows the cluster."""
    status = cli(["status", "--port", str(fleet.port)], fleet.env).stdout
    rows = status.split("replica   state", 1)[-1].splitlines()[1:]
    return {cells[0]: cells[2] for line in rows if len(cells := line.split()) >= 4}


def test_up_autoscale_on_ray_adds_an_actor_on_a_free_node_then_removes_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({
        "engine": {"kind": "sim", "sim_step_ms": 20, "max_num_seqs": 4},
        "model": {"source": "llama-3.1-8b"},
        "gateway": {"health_interval_s": 0.5},
        "cluster": {"backend": "ray", "address": cluster.address, "placement_timeout_s": 30},
        "autoscale": FAST_RULES,
    }))  # fmt: skip
    nodes: dict[str, str] = {}

    def on_distinct_nodes() -> None:
        def both_shown() -> bool:
            nodes.update(_nodes_of(fleet))
            return {"r0", "r1"} <= nodes.keys()

        assert wait_until(both_shown, 10), nodes
        assert nodes["r0"] != nodes["r1"], nodes

    extra = ["-c", str(fleet_yaml), "--autoscale", "1:2"]
    with running_fleet(tmp_path / "state", 1, extra) as fleet:
        ramp_up_and_down(fleet, tmp_path, output_tokens=32, busy_s=25, with_two=on_distinct_nodes)
        log = fleet.log()
        assert "replica r1 serves at http://" in log
        assert "shares a node" not in log
        gateway_log = cli(["logs", "gateway", "--port", str(fleet.port)], fleet.env).stdout
        assert "replica r1 removed (drained=True)" in gateway_log
        status = cli(["status", "--port", str(fleet.port)], fleet.env).stdout
        assert "autoscale: step between 1 and 2 replicas; last decision at" in status
        # Its own STRICT_PACK group went with it; r0's (the spread group) stays.
        spread_group = f"servepilot-{fleet.port}-{fleet.proc.pid}-spread"
        assert wait_until(lambda: our_groups_left() == [spread_group], 10)
        assert wait_until(lambda: len(our_actors_alive()) == 1, 10)
        down(fleet, timeout_s=60)
    assert our_groups_left() == []
    assert wait_until(lambda: our_actors_alive() == [], 10)


@pytest.mark.vllm
def test_up_autoscale_on_ray_with_vllm_cpu_replicas(cluster: Cluster, tmp_path: Path) -> None:
    """The same ramp with vLLM-CPU replicas of the embedded model as the actors (each loads in
    about 40 s alone, minutes beside a busy replica on a 2-core machine): r1 is added on a
    node of its own, serves, is drained and removed; no request fails.

    On 2 cores, Ray's own processes beside two engines stretch a step to half a second: the
    ramp's fifth request, waiting for a slot while r1 loads, was predicted to wait past the
    default queue budgets (2, 10, 30 s) and refused (429), 3 of 525 times. The budgets are
    the user's to set; here they let a request wait out the load."""
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({
        "engine": {"max_num_seqs": 4},
        "gateway": {"health_interval_s": 1.0,
                    "admission": {"queue_budget_ms": [120_000, 120_000, 120_000]}},
        "cluster": {"backend": "ray", "address": cluster.address, "placement_timeout_s": 120},
        "autoscale": {**FAST_RULES, "up_cooldown_s": 120},
    }))  # fmt: skip
    extra = ["-c", str(fleet_yaml), "--autoscale", "1:2"]
    with running_fleet(tmp_path / "state", 1, extra) as fleet:
        ramp_up_and_down(fleet, tmp_path, output_tokens=16, busy_s=240)
        gateway_log = cli(["logs", "gateway", "--port", str(fleet.port)], fleet.env).stdout
        assert "replica r1 removed (drained=True)" in gateway_log
        assert wait_until(lambda: len(our_actors_alive()) == 1, 30)
        down(fleet, timeout_s=120)
    assert wait_until(lambda: our_actors_alive() == [], 30)
