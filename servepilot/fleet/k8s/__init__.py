"""Kubernetes: a fleet.yaml rendered as manifests (pure functions to plain dicts)."""

from servepilot.fleet.k8s.monitoring import Monitoring
from servepilot.fleet.k8s.render import (
    FILE_NAMES,
    KUSTOMIZATION,
    ManifestFile,
    all_objects,
    render,
)
from servepilot.fleet.k8s.target import check

__all__ = [
    "FILE_NAMES",
    "KUSTOMIZATION",
    "ManifestFile",
    "Monitoring",
    "all_objects",
    "check",
    "render",
]
