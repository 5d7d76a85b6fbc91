"""Kubernetes: a fleet.yaml rendered as manifests (pure functions to plain dicts)."""

from servepilot.fleet.k8s.render import KUSTOMIZATION, ManifestFile, all_objects, render
from servepilot.fleet.k8s.target import check

__all__ = ["KUSTOMIZATION", "ManifestFile", "all_objects", "check", "render"]
