"""Fleets rendered for the Kubernetes tests, and the validators they must pass: the Kubernetes
API's JSON schemas (kubernetes-validate, strict) for core kinds, the CRDs' published
openAPIV3Schema (tests/data/crds) for the others."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

from servepilot.cli.k8s_cmd import monitoring_of
from servepilot.core.config import FleetConfig, parse_config
from servepilot.fleet.k8s import ManifestFile, render
from servepilot.plan.planner import make_plan
from servepilot.plan.request import PlanRequest

KUBERNETES_VERSION = "1.33"
CRDS = Path(__file__).parent.parent / "data" / "crds"
CRD_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects_v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors_v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "monitoring.coreos.com_prometheusrules_v1.json",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): (
        "leaderworkerset.x-k8s.io_leaderworkersets_v1.json"
    ),
    ("ray.io/v1", "RayService"): "ray.io_rayservices_v1.json",
}

EMBEDDED: dict[str, Any] = {}
DEEPSEEK_H200: dict[str, Any] = {
    "model": {"source": "deepseek-v3"},
    "hardware": {"device": "gpu", "accelerator": "h200-141", "count": 8, "nodes": 4},
    "engine": {"tensor_parallel_size": 8, "enable_expert_parallel": True, "max_model_len": 8192},
    "kubernetes": {"model_path": "/models/DeepSeek-V3"},
}
TWO_NODE: dict[str, Any] = {
    "model": {"source": "deepseek-v3"},
    "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8, "nodes": 4},
    "engine": {"tensor_parallel_size": 8, "pipeline_parallel_size": 2, "max_model_len": 8192},
    "kubernetes": {
        "model_path": "/models/DeepSeek-V3",
        "model_volume": {"kind": "host_path", "host_path": "/mnt/nvme/models"},
    },
}
FLEETS = {"embedded": EMBEDDED, "deepseek-h200": DEEPSEEK_H200, "two-node": TWO_NODE}


def fleet(data: dict[str, Any], **kubernetes: Any) -> FleetConfig:
    merged = dict(data)
    merged["kubernetes"] = {**data.get("kubernetes", {}), **kubernetes}
    return parse_config(merged, origin="test")


def rendered(config: FleetConfig) -> tuple[ManifestFile, ...]:
    # No CPU flags: `dtype: auto` resolves the same on every machine.
    plan = make_plan(PlanRequest.from_fleet(config, frozenset()))
    return render(config, plan, monitoring_of(config))


def by_kind(files: tuple[ManifestFile, ...], kind: str) -> list[dict[str, Any]]:
    return [obj for f in files for obj in f.objects if obj["kind"] == kind]


def validate(obj: dict[str, Any]) -> None:
    """Raise if `obj` is not a valid object of its kind."""
    crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if crd is None:
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    else:
        jsonschema.validate(obj, crd_schema(crd), cls=jsonschema.Draft7Validator)


@functools.cache
def crd_schema(name: str) -> dict[str, Any]:
    return _closed(json.loads((CRDS / name).read_text()))


def _closed(node: Any) -> Any:
    """Unknown fields refused where the schema lists its fields, as the API server's strict
    field validation does (it prunes or refuses what a CRD does not declare)."""
    if isinstance(node, list):
        return [_closed(v) for v in node]
    if not isinstance(node, dict):
        return node
    closed = {k: _closed(v) for k, v in node.items()}
    pattern = closed.get("pattern")
    if isinstance(pattern, str) and pattern.startswith("^(?i)"):
        # Go's regexp takes inline flags anywhere; Python's only at the start.
        closed["pattern"] = "(?i)^" + pattern.removeprefix("^(?i)")
    if (
        "properties" in closed
        and "additionalProperties" not in closed
        and not closed.get("x-kubernetes-preserve-unknown-fields")
    ):
        closed["additionalProperties"] = False
    return closed
