"""Kubernetes: a fleet.yaml rendered as manifests (pure functions to plain dicts)."""

from servepilot.fleet.k8s.render import KUSTOMIZATION, ManifestFile, all_objects, render

__all__ = ["KUSTOMIZATION", "ManifestFile", "all_objects", "render"]
