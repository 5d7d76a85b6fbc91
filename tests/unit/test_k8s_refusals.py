"""A fleet that cannot run on Kubernetes as asked is refused by `k8s render` with the field to
change, exit code 2 and no traceback; nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from servepilot.cli.main import main
from tests.unit.k8s_support import DEEPSEEK_H200, TWO_NODE


def _gpu(**engine: Any) -> dict[str, Any]:
    return {**DEEPSEEK_H200, "engine": {**DEEPSEEK_H200["engine"], **engine}}


CASES = [
    # GPUs per replica over the node's, in ways no multi-node layout can fix.
    (_gpu(tensor_parallel_size=16), "engine.tensor_parallel_size 16 is over a node's 8 GPUs"),
    (_gpu(data_parallel_size=2, tensor_parallel_size=8), "engine.data_parallel_size 2"),
    ({**TWO_NODE, "hardware": {**TWO_NODE["hardware"], "nodes": 1}}, "hardware.nodes 1"),
    (
        {**TWO_NODE, "engine": {**TWO_NODE["engine"], "tensor_parallel_size": 2,
                                "pipeline_parallel_size": 6}},
        "engine.pipeline_parallel_size 6",
    ),
    # A model path that is not in the volume.
    ({**DEEPSEEK_H200, "kubernetes": {"model_path": "/data/DeepSeek-V3"}},
     "kubernetes.model_path /data/DeepSeek-V3 is not below the model volume"),
    ({**DEEPSEEK_H200, "kubernetes": {}}, "model.source 'deepseek-v3' is not a folder"),
    ({"model": {"source": "/home/me/models/smollm2"}}, "model.source /home/me/models/smollm2"),
    # A CPU fleet that names a GPU.
    ({"hardware": {"device": "cpu", "accelerator": "h100-80"}},
     "hardware.accelerator h100-80 is a GPU but hardware.device is cpu"),
    ({"hardware": {"device": "gpu", "accelerator": "cpu"}},
     "hardware.device gpu with hardware.accelerator cpu"),
    # Invalid values of the section itself.
    ({"kubernetes": {"namespace": "Prod_NS"}}, "kubernetes.namespace"),
    ({"kubernetes": {"autoscaling": {"min_replicas": 5, "max_replicas": 3}}},
     "kubernetes.autoscaling: Value error, min_replicas (5) is above max_replicas (3)"),
    ({"kubernetes": {"model_volume": {"kind": "host_path"}}}, "kubernetes.model_volume"),
    # Above the seeds' max (20), which it leaves unset.
    ({"kubernetes": {"autoscaling": {"min_replicas": 25}}},
     "kubernetes.autoscaling.min_replicas 25 is above max_replicas 20"),
    ({"kubernetes": {"autoscaling": {"min_replicas": 0}}},
     "min_replicas 0 needs autoscaler keda"),
    ({"gateway": {"auth": {"keys": [{"name": "a", "key": "sk-1"}]}}}, "gateway.auth.keys.0.key"),
    # The `autoscale` section's bounds carry over, and an HPA cannot take its 0.
    ({"autoscale": {"enabled": True, "policy": "target", "min_replicas": 0, "max_replicas": 4}},
     "autoscale.min_replicas 0: an HPA never scales to zero"),
    # step and predictive run in the gateway: one gateway, one pod per replica, at least 1.
    ({"autoscale": {"enabled": True, "min_replicas": 0, "max_replicas": 4}},
     "autoscale.min_replicas 0: with autoscale.policy step the gateway runs the autoscaler"),
    ({**TWO_NODE, "autoscale": {"enabled": True, "min_replicas": 1, "max_replicas": 4}},
     "autoscale.policy step: a replica spanning nodes is a LeaderWorkerSet"),
    ({"kubernetes": {"gateway_replicas": 2}, "autoscale": {"enabled": True}},
     "kubernetes.gateway_replicas 2: with autoscale.policy step the gateway runs the autoscaler"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "named"), CASES)
def test_refused_with_the_field_named(
    data: dict[str, Any], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "fleet.yaml"
    source.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    code = main(["k8s", "render", "-c", str(source), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert named in " ".join(err.split())
    assert "Traceback" not in err
    assert not out.exists()


def test_the_cpu_fleet_with_a_gpu_runtime_flag_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["k8s", "render", "--out", str(tmp_path / "o"), "--runtime", "ray"])
    assert code == 2
    assert "kubernetes.runtime ray" in capsys.readouterr().err
