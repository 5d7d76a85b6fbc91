"""Monitoring on Kubernetes: a ServiceMonitor for the gateway and the replicas, a
PrometheusRule with the alerts and the Grafana dashboard as a ConfigMap.

The alert rules and the dashboard are inputs: observe renders them (its one copy, the same
`servepilot observe render` writes) and the command passes them in, as fleet does not import
observe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from servepilot.fleet.k8s.pods import Manifest
from servepilot.fleet.k8s.target import Target

MONITORING_API = "monitoring.coreos.com/v1"
DASHBOARD_FILE = "servepilot-fleet.json"
GRAFANA_DASHBOARD_LABEL = "grafana_dashboard"
"""The label Grafana's dashboard sidecar looks for (kube-prometheus-stack's default)."""


@dataclass(frozen=True, slots=True)
class Monitoring:
    rule_groups: tuple[Manifest, ...]
    """Prometheus rule groups (a rule file's `groups`), scoped to the fleet's namespace."""
    dashboard: Manifest
    """Grafana's dashboard JSON model."""


def monitoring_objects(target: Target, monitoring: Monitoring) -> list[Manifest]:
    return [
        service_monitor(target),
        prometheus_rule(target, monitoring.rule_groups),
        dashboard_config_map(target, monitoring.dashboard),
    ]


def service_monitor(target: Target) -> Manifest:
    names = target.names
    selector = {"app.kubernetes.io/name": "servepilot", "app.kubernetes.io/instance": names.prefix}
    return {
        "apiVersion": MONITORING_API,
        "kind": "ServiceMonitor",
        "metadata": target.metadata(names.prefix, "monitoring"),
        "spec": {
            "selector": {"matchLabels": selector},
            "namespaceSelector": {"matchNames": [target.kube.namespace]},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def prometheus_rule(target: Target, groups: tuple[Manifest, ...]) -> Manifest:
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": target.metadata(target.names.prefix, "monitoring"),
        "spec": {"groups": list(groups)},
    }


def dashboard_config_map(target: Target, dashboard: Manifest) -> Manifest:
    """The dashboard where Grafana's sidecar picks it up: any ConfigMap labelled
    grafana_dashboard: "1" (in the namespaces the sidecar watches)."""
    metadata = target.metadata(f"{target.names.prefix}-dashboard", "monitoring")
    metadata["labels"] = {**metadata["labels"], GRAFANA_DASHBOARD_LABEL: "1"}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {DASHBOARD_FILE: json.dumps(dashboard, indent=2) + "\n"},
    }
