"""`k8s render` with autoscale.policy step or predictive: the gateway runs the autoscaler, so
no HPA is rendered; the gateway's service account gets a Role to scale the replicas'
Deployment and mark a drained pod, its command the flag, its ConfigMap the section; with
policy target the HPA stays. Every object validates against the Kubernetes schemas."""

from __future__ import annotations

from typing import Any

import pytest

from servepilot.cli.main import build_parser
from servepilot.core.config import parse_config
from servepilot.core.yamlfile import parse_yaml
from servepilot.fleet.k8s import all_objects
from tests.unit.k8s_support import FLEETS, by_kind, fleet, rendered, validate

STEP = {"autoscale": {"enabled": True, "policy": "step", "min_replicas": 2, "max_replicas": 6}}
PREDICTIVE = {"autoscale": {"enabled": True, "policy": "predictive", "replica_rps": 4.0,
                            "min_replicas": 1, "max_replicas": 8}}  # fmt: skip


def _gateway_command(files: Any) -> list[str]:
    (gateway,) = [
        d for d in by_kind(files, "Deployment") if d["metadata"]["name"].endswith("gateway")
    ]
    command: list[str] = gateway["spec"]["template"]["spec"]["containers"][0]["command"]
    return command


@pytest.mark.parametrize("name", ["embedded", "deepseek-h200"])
@pytest.mark.parametrize("section", [STEP, PREDICTIVE], ids=["step", "predictive"])
def test_step_and_predictive_render_the_scalers_rbac_instead_of_the_hpa(
    name: str, section: dict[str, Any]
) -> None:
    files = rendered(fleet(FLEETS[name] | section))
    for obj in all_objects(files):
        validate(obj)
    assert not by_kind(files, "HorizontalPodAutoscaler")
    assert not by_kind(files, "ScaledObject")
    roles = {r["metadata"]["name"]: r["rules"] for r in by_kind(files, "Role")}
    assert roles["servepilot-vllm-scaler"] == [
        {"apiGroups": ["apps"], "resources": ["deployments/scale"],
         "resourceNames": ["servepilot-vllm"], "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
    ]  # fmt: skip
    bindings = {b["metadata"]["name"]: b for b in by_kind(files, "RoleBinding")}
    binding = bindings["servepilot-vllm-scaler"]
    assert binding["roleRef"]["name"] == "servepilot-vllm-scaler"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "servepilot-gateway", "namespace": "servepilot"}
    ]


def test_the_gateway_runs_the_section_on_the_deployment() -> None:
    config = fleet(FLEETS["deepseek-h200"] | PREDICTIVE)
    files = rendered(config)
    args = build_parser().parse_args(_gateway_command(files)[1:])
    assert args.scale_deployment == "servepilot-vllm"
    assert args.discover == "k8s:servepilot-vllm"
    (config_map,) = [
        c for c in by_kind(files, "ConfigMap") if c["metadata"]["name"].endswith("gateway")
    ]
    loaded = parse_config(parse_yaml(config_map["data"]["fleet.yaml"], origin="cm"), origin="cm")
    assert loaded.autoscale == config.autoscale
    assert loaded.engine.startup_timeout_s == config.engine.startup_timeout_s


def test_policy_target_keeps_the_hpa_and_no_scaler() -> None:
    target = {"autoscale": STEP["autoscale"] | {"policy": "target"}}
    files = rendered(fleet(FLEETS["deepseek-h200"] | target))
    (hpa,) = by_kind(files, "HorizontalPodAutoscaler")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert "servepilot-vllm-scaler" not in {r["metadata"]["name"] for r in by_kind(files, "Role")}
    assert "--scale-deployment" not in _gateway_command(files)
    # A disabled section, whatever its policy, leaves the HPA too.
    off = {"autoscale": STEP["autoscale"] | {"enabled": False}}
    assert by_kind(rendered(fleet(FLEETS["deepseek-h200"] | off)), "HorizontalPodAutoscaler")
