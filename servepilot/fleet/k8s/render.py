"""A fleet.yaml as Kubernetes manifests: one YAML file per component, in a stable order, plus
the kustomization.yaml that lists them (`kubectl apply -k DIR`). Pure: the files are returned
as text; the command writes them (and renders the alert rules and dashboard it passes in)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import yaml

from servepilot.core.config import FleetConfig, Runtime
from servepilot.fleet.k8s.autoscaling import autoscaling_objects, priority_classes
from servepilot.fleet.k8s.gateway import gateway_objects
from servepilot.fleet.k8s.monitoring import Monitoring, monitoring_objects
from servepilot.fleet.k8s.pods import Manifest
from servepilot.fleet.k8s.rayservice import ray_service
from servepilot.fleet.k8s.replicas import replica_objects
from servepilot.fleet.k8s.target import Target, resolve
from servepilot.plan.planner import Plan

KUSTOMIZATION = "kustomization.yaml"
# Every file `render` may write, whatever the runtime and autoscaler: a later render into the
# same folder removes the ones it no longer writes.
FILE_NAMES = (
    "namespace.yaml", "priorityclasses.yaml", "rayservice.yaml", "vllm.yaml",
    "autoscaling.yaml", "gateway.yaml", "monitoring.yaml", KUSTOMIZATION,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ManifestFile:
    name: str
    objects: tuple[Manifest, ...]

    def text(self) -> str:
        return yaml.dump_all(self.objects, Dumper=_PlainDumper, sort_keys=False, width=100)


class _PlainDumper(yaml.SafeDumper):
    """Writes a dict used twice twice, never as a YAML anchor and alias (kubectl reads those,
    people reviewing a manifest should not have to)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text_block(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # A ConfigMap's file (fleet.yaml, the adapter's rules, serveConfigV2) reads as a file.
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_PlainDumper.add_representer(str, _text_block)


def render(config: FleetConfig, plan: Plan, monitoring: Monitoring) -> tuple[ManifestFile, ...]:
    """The manifest files of `config` (whose plan gives the pods' resources; `monitoring` the
    alert rules and the dashboard), kustomization last; a ConfigError names the field of a
    fleet Kubernetes cannot run as asked."""
    target = resolve(config, plan)
    parts: list[tuple[str, Callable[[Target], list[Manifest]]]] = [
        ("namespace.yaml", _namespace),
        ("priorityclasses.yaml", priority_classes),
    ]
    if target.kube.runtime is Runtime.RAY:
        parts.append(("rayservice.yaml", lambda t: [ray_service(t)]))
    else:
        parts += [("vllm.yaml", replica_objects), ("autoscaling.yaml", autoscaling_objects)]
    parts += [
        ("gateway.yaml", gateway_objects),
        ("monitoring.yaml", lambda t: monitoring_objects(t, monitoring)),
    ]
    files = tuple(ManifestFile(name, tuple(build(target))) for name, build in parts)
    return (*files, ManifestFile(KUSTOMIZATION, (_kustomization(target, files),)))


def all_objects(files: tuple[ManifestFile, ...]) -> list[Manifest]:
    """Every object but the kustomization, in file order."""
    return [obj for f in files if f.name != KUSTOMIZATION for obj in f.objects]


def _namespace(target: Target) -> list[Manifest]:
    meta = {"name": target.kube.namespace, "labels": target.names.labels("namespace")}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": meta}]


def _kustomization(target: Target, files: tuple[ManifestFile, ...]) -> dict[str, Any]:
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": target.kube.namespace,
        "resources": [f.name for f in files],
    }
