"""Autoscaling and priorities on Kubernetes: the PriorityClasses, and an autoscaling/v2 HPA on
the gateway's demand (through prometheus-adapter, whose rule ships as a ConfigMap) or a KEDA
ScaledObject on the same query, both with the seeds' steps. With autoscale.policy `step` or
`predictive` the gateway runs the autoscaler itself (`fleet.k8s.scaling`); it gets the Role to
scale the replicas' Deployment instead.

The demand is what the gateway holds: requests in flight on the replicas plus those queued in
it. Queued requests count, so replicas are added while a cold start holds requests (scale from
zero never drops them: the gateway buffers them for gateway.admission.cold_start_wait_s).
"""

from __future__ import annotations

import yaml

from servepilot.core.config import Autoscaler
from servepilot.fleet.k8s.pods import Manifest
from servepilot.fleet.k8s.replicas import scale_target
from servepilot.fleet.k8s.scaling import scaler_role
from servepilot.fleet.k8s.target import Target

DEMAND_METRIC = "servepilot_demand_requests"
INTERACTIVE_PRIORITY = 100_000
BATCH_PRIORITY = 1_000
_KEDA_POLL_S = 15


def priority_classes(target: Target) -> list[Manifest]:
    prefix = target.names.prefix
    interactive = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": f"{prefix}-interactive", "labels": target.names.labels("vllm")},
        "value": INTERACTIVE_PRIORITY,
        "globalDefault": False,
        "preemptionPolicy": "PreemptLowerPriority",
        "description": "servepilot's serving pods (vLLM replicas, the gateway): a user waits.",
    }
    batch = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": f"{prefix}-batch", "labels": target.names.labels("batch")},
        "value": BATCH_PRIORITY,
        "globalDefault": False,
        # Batch work waits for room; it never evicts anything to get it.
        "preemptionPolicy": "Never",
        "description": "Batch or background pods: preempted first, never preempt.",
    }
    return [interactive, batch]


def autoscaling_objects(target: Target) -> list[Manifest]:
    if target.gateway_scales:
        return [scaler_role_object(target), scaler_binding(target)]
    if target.kube.autoscaling.autoscaler is Autoscaler.KEDA:
        return [scaled_object(target)]
    return [hpa(target), adapter_rules(target)]


def scaler_role_object(target: Target) -> Manifest:
    """What the gateway's autoscaler calls: the Deployment's scale subresource, and a pod's
    metadata (the deletion cost that makes a scale-down delete the pod it drained)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": target.metadata(scaler_role(target.names.vllm), "autoscaling"),
        "rules": [
            {
                "apiGroups": ["apps"],
                "resources": ["deployments/scale"],
                "resourceNames": [target.names.vllm],
                "verbs": ["get", "patch"],
            },
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
        ],
    }


def scaler_binding(target: Target) -> Manifest:
    name = scaler_role(target.names.vllm)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": target.metadata(name, "autoscaling"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": target.names.gateway,
             "namespace": target.kube.namespace}
        ],
    }  # fmt: skip


def behaviour(target: Target) -> Manifest:
    """The seeds' steps: up by 10% (at least one pod) at once, down by 5% (at least one pod,
    or it never shrinks below 20) after the stabilisation window."""
    config, bounds = target.kube.autoscaling, target.scaling
    period = config.period_s

    def rule(percent: int, window_s: int) -> Manifest:
        return {
            "stabilizationWindowSeconds": window_s,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": percent, "periodSeconds": period},
                {"type": "Pods", "value": 1, "periodSeconds": period},
            ],
        }

    return {
        "scaleUp": rule(bounds.scale_up_percent, config.scale_up_window_s),
        "scaleDown": rule(bounds.scale_down_percent, config.scale_down_window_s),
    }


def demand_per_replica(target: Target) -> float:
    """The demand one replica should carry: the target share of its concurrency budget."""
    budget = target.config.gateway.admission.replica_concurrency
    return target.scaling.target_utilisation * budget


def demand_query(target: Target, matchers: str) -> str:
    in_flight = f"sum(servepilot_in_flight_requests{{{matchers}}})"
    queued = f"(sum(servepilot_queue_depth{{{matchers}}}) or vector(0))"
    return f"{in_flight} + {queued}"


def hpa(target: Target) -> Manifest:
    scaling = target.scaling
    metric = {
        "name": DEMAND_METRIC,
        "selector": {"matchLabels": {"service": target.names.gateway}},
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": target.metadata(target.names.vllm, "vllm"),
        "spec": {
            "scaleTargetRef": scale_target(target),
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": [
                {
                    # desired = ceil(demand / averageValue), as scaling/'s TargetUtilisation.
                    "type": "External",
                    "external": {
                        "metric": metric,
                        "target": {
                            "type": "AverageValue",
                            "averageValue": quantity(demand_per_replica(target)),
                        },
                    },
                }
            ],
            "behavior": behaviour(target),
        },
    }


def adapter_rules(target: Target) -> Manifest:
    """prometheus-adapter's external rule serving DEMAND_METRIC (merge it into the adapter's
    config; docs/kubernetes.md)."""
    rule = {
        "seriesQuery": 'servepilot_in_flight_requests{namespace!="",service!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "name": {"as": DEMAND_METRIC},
        "metricsQuery": demand_query(target, "<<.LabelMatchers>>"),
    }
    text = yaml.safe_dump({"externalRules": [rule]}, sort_keys=False, width=200)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": target.metadata(f"{target.names.prefix}-adapter-rules", "autoscaling"),
        "data": {"config.yaml": text},
    }


def scaled_object(target: Target) -> Manifest:
    scaling, config = target.scaling, target.kube.autoscaling
    matchers = f'namespace="{target.kube.namespace}",service="{target.names.gateway}"'
    trigger = {
        "type": "prometheus",
        "metricType": "AverageValue",
        "metadata": {
            "serverAddress": config.prometheus_url,
            "query": demand_query(target, matchers),
            "threshold": _number(demand_per_replica(target)),
            "activationThreshold": "0",
        },
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": target.metadata(target.names.vllm, "vllm"),
        "spec": {
            "scaleTargetRef": scale_target(target),
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "pollingInterval": _KEDA_POLL_S,
            "cooldownPeriod": config.scale_down_window_s,
            # Prometheus unreachable: hold the floor rather than scale on no data.
            "fallback": {"failureThreshold": 3, "replicas": max(1, scaling.min_replicas)},
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behaviour(target)}},
            "triggers": [trigger],
        },
    }


def quantity(value: float) -> str:
    """A Kubernetes quantity: whole numbers as they are, others in thousandths (204800m)."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
