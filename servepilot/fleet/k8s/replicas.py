"""The vLLM replicas: a Deployment (a LeaderWorkerSet when one replica spans nodes), the headless
Service the gateway discovers them through, and their PodDisruptionBudget."""

from __future__ import annotations

from servepilot.fleet.k8s.pods import (
    Manifest,
    leader_command,
    pod_spec,
    serving_container,
    vllm_argv,
    worker_container,
)
from servepilot.fleet.k8s.target import HTTP_PORT, Target

LWS_API = "leaderworkerset.x-k8s.io/v1"
# The label LeaderWorkerSet puts on its pods; index 0 is the leader, the one serving HTTP.
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def replica_objects(target: Target) -> list[Manifest]:
    workload = leader_workers(target) if target.layout.multi_node else deployment(target)
    return [workload, headless_service(target), disruption_budget(target)]


def scale_target(target: Target) -> Manifest:
    """What an HPA or ScaledObject scales: the replicas' workload."""
    if target.layout.multi_node:
        return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": target.names.vllm}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": target.names.vllm}


def serving_selector(target: Target) -> dict[str, str]:
    """The labels of the pods that serve HTTP (a multi-node replica's leader only)."""
    labels = target.names.labels("vllm")
    if target.layout.multi_node:
        labels[LWS_WORKER_INDEX] = "0"
    return labels


def deployment(target: Target) -> Manifest:
    labels = target.names.labels("vllm")
    container = serving_container(target, list(vllm_argv(target)))
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": target.metadata(target.names.vllm, "vllm"),
        # No `replicas`: the autoscaler owns the count, and a later `kubectl apply` must not
        # reset it.
        "spec": {
            "selector": {"matchLabels": labels},
            # A new pod must be ready before an old one goes: capacity never dips in a rollout.
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": pod_spec(target, container, labels),
            },
        },
    }  # fmt: skip


def leader_workers(target: Target) -> Manifest:
    labels = target.names.labels("vllm")
    leader = serving_container(target, leader_command(target))
    leader_spec = pod_spec(target, leader, {**labels, LWS_WORKER_INDEX: "0"})
    worker_spec = pod_spec(target, worker_container(target), labels)
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": target.metadata(target.names.vllm, "vllm"),
        "spec": {  # no `replicas`, as for the Deployment
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": target.layout.pods,
                # A lost stage breaks the whole pipeline: the group restarts together.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {"metadata": {"labels": labels}, "spec": leader_spec},
                "workerTemplate": {"metadata": {"labels": labels}, "spec": worker_spec},
            },
        },
    }


def headless_service(target: Target) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": target.metadata(target.names.vllm, "vllm"),
        "spec": {
            "clusterIP": "None",
            # The gateway sees a starting pod (not ready) and adds it once it is.
            "publishNotReadyAddresses": False,
            "selector": serving_selector(target),
            "ports": [{"name": "http", "port": HTTP_PORT, "targetPort": "http"}],
        },
    }


def disruption_budget(target: Target) -> Manifest:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": target.metadata(target.names.vllm, "vllm"),
        "spec": {
            # A node drain takes one pod at a time: one replica, as a node loss would (a
            # multi-node replica's group restarts as a whole when any of its pods goes).
            "maxUnavailable": 1,
            "selector": {"matchLabels": target.names.labels("vllm")},
        },
    }
