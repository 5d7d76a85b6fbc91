"""The PrometheusRule and the Grafana dashboard of `servepilot k8s render` are observe's, the
one copy `servepilot observe render` writes: the rules matched to the fleet's namespace (their
promtool tests, with and without the matcher, are in test_observe_alerts.py), the dashboard
as a ConfigMap Grafana's sidecar picks up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from servepilot.cli.main import main
from servepilot.observe import alert_rules, dashboard
from tests.unit.k8s_support import FLEETS, fleet, validate

# A GPU fleet with an SLO renders every rule, the GPU row and the SLA alert among them.
SLO_GPU = {**FLEETS["deepseek-h200"], "slo": {"ttft_p99_ms": 800}}
CASES = {"embedded": FLEETS["embedded"], "deepseek-h200-slo": SLO_GPU}


def _render(tmp_path: Path, data: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """`servepilot k8s render --namespace llm`: the objects of each written file."""
    source = tmp_path / "fleet.yaml"
    source.write_text(yaml.safe_dump(data))
    out = tmp_path / "k8s"
    assert main(["k8s", "render", "-c", str(source), "--out", str(out), "--namespace", "llm"]) == 0
    return {p.name: [o for o in yaml.safe_load_all(p.read_text()) if o] for p in out.iterdir()}


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind]
    return obj


@pytest.mark.parametrize("name", list(CASES))
def test_the_prometheus_rule_holds_observes_rules_for_its_namespace(
    tmp_path: Path, name: str
) -> None:
    files = _render(tmp_path, CASES[name])
    rule = _one(files["monitoring.yaml"], "PrometheusRule")
    config = fleet(CASES[name], namespace="llm")
    assert rule["spec"]["groups"] == alert_rules(config, {"namespace": "llm"})["groups"]
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert all('namespace="llm"' in expr for expr in exprs), exprs
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"ServepilotNoReadyReplica", "ServepilotShedding", "ServepilotKvCacheNearFull"} <= names
    assert ("ServepilotTtftP99OverSla" in names) is (name == "deepseek-h200-slo")


@pytest.mark.parametrize("name", list(CASES))
def test_the_dashboard_config_map_holds_observes_dashboard(tmp_path: Path, name: str) -> None:
    files = _render(tmp_path, CASES[name])
    config_map = next(
        o for o in files["monitoring.yaml"]
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "servepilot-dashboard"
    )  # fmt: skip
    validate(config_map)
    assert config_map["metadata"]["namespace"] == "llm"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = config_map["data"].values()
    board = json.loads(text)
    assert board == dashboard(fleet(CASES[name], namespace="llm"))
    gpu_row = any(p["title"].startswith("GPUs") for p in board["panels"])
    assert gpu_row is (name == "deepseek-h200-slo")
    (kustomization,) = files["kustomization.yaml"]
    assert "monitoring.yaml" in kustomization["resources"]
