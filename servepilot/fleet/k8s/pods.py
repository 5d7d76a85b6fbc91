"""The vLLM pod: its container (the command `up` launches), probes sized for the cold start, the
preStop drain, /dev/shm, the model volume, GPU resources and the spread between replicas."""

from __future__ import annotations

import shlex
from typing import Any

from servepilot.core.config import EMBEDDED_MODEL, Device, Placement, VolumeKind
from servepilot.engine.args import serve_argv, server_env, weights_env
from servepilot.fleet.k8s.target import EMBEDDED_CACHE, HTTP_PORT, STARTUP_PERIOD_S, Target

Manifest = dict[str, Any]

RAY_PORT = 6379
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
_MODEL_VOLUME = "model"
_SHM_VOLUME = "dshm"


def vllm_argv(target: Target) -> tuple[str, ...]:
    """The server command, rendered by the code `plan` prints and `up` launches."""
    return serve_argv(target.config, target.model_path, target.served_name, HTTP_PORT)


def leader_command(target: Target) -> list[str]:
    """A multi-node replica's leader: the head of the Ray cluster its stages run on, then
    vLLM (vLLM's documented LeaderWorkerSet recipe)."""
    head = f"ray start --head --port={RAY_PORT}"
    return ["/bin/sh", "-c", f"{head} && exec {shlex.join(vllm_argv(target))}"]


def worker_command() -> list[str]:
    # $(VAR) is expanded by Kubernetes from the env LeaderWorkerSet gives each pod.
    return ["/bin/sh", "-c", f"ray start --address=$(LWS_LEADER_ADDRESS):{RAY_PORT} --block"]


def serving_container(target: Target, command: list[str]) -> Manifest:
    """The container that serves HTTP: probes, the preStop drain and the port."""
    container = _base_container(target, command)
    health = {"path": "/health", "port": "http"}
    container |= {
        "ports": [{"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"}],
        "startupProbe": {
            "httpGet": health,
            "periodSeconds": STARTUP_PERIOD_S,
            "failureThreshold": target.startup_failures,
        },
        "readinessProbe": {
            "httpGet": health, "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": health, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 6,
        },
    }  # fmt: skip
    if target.kube.drain_s > 0:
        # While it sleeps its endpoint is already not ready, so the gateway sends it nothing
        # new, and what it has in flight finishes before SIGTERM stops vLLM.
        pause = ["sleep", str(target.kube.drain_s)]
        container["lifecycle"] = {"preStop": {"exec": {"command": pause}}}
    return container


def worker_container(target: Target) -> Manifest:
    return _base_container(target, worker_command())


def pod_spec(target: Target, container: Manifest, selector: dict[str, str]) -> Manifest:
    """A vLLM pod of the fleet; `selector`: the labels its replicas share (for the spread)."""
    spec: Manifest = {
        "priorityClassName": f"{target.names.prefix}-interactive",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": _grace_s(target),
        "containers": [container],
        "volumes": _volumes(target),
    }
    if target.embedded:
        spec["initContainers"] = [_embedded_model_init(target)]
    if target.kube.node_selector:
        spec["nodeSelector"] = dict(target.kube.node_selector)
    if target.config.cluster.placement is Placement.SPREAD:
        spec["topologySpreadConstraints"] = spread(selector)
    return spec


def spread(selector: dict[str, str]) -> list[Manifest]:
    """The seeds' STRICT_SPREAD between replicas: their pods one node apart, so a lost node
    costs one replica (never packed while another node has room)."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME_TOPOLOGY,
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": dict(selector)},
        }
    ]


def _base_container(target: Target, command: list[str]) -> Manifest:
    mounts = [
        {"name": _SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": _MODEL_VOLUME, "mountPath": target.kube.model_volume.mount_path,
         "readOnly": True},
    ]  # fmt: skip
    env = weights_env(target.config) | server_env(
        target.config.engine, target.config.hardware.device, ()
    )
    container: Manifest = {
        "name": "vllm",
        "image": target.image,
        "command": command,
        "resources": _resources(target),
        "volumeMounts": mounts,
    }
    if env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(env.items())]
    return container


def _resources(target: Target) -> Manifest:
    res = target.resources
    requests = {"cpu": str(res.cpus), "memory": f"{res.memory_gib}Gi"}
    limits = {"memory": f"{res.memory_gib}Gi"}
    if res.gpus:
        requests[target.kube.gpu_resource] = str(res.gpus)
        limits[target.kube.gpu_resource] = str(res.gpus)
    # No CPU limit: throttling a server mid-step costs latency, the request is what counts.
    return {"requests": requests, "limits": limits}


def _volumes(target: Target) -> list[Manifest]:
    volume = target.kube.model_volume
    source: Manifest
    if volume.kind is VolumeKind.PVC:
        source = {"persistentVolumeClaim": {"claimName": volume.claim_name}}
    else:
        source = {"hostPath": {"path": volume.host_path, "type": "Directory"}}
    shm_gib = target.kube.shm_gib or (2 if target.config.hardware.device is Device.CPU else 16)
    shm = {"medium": "Memory", "sizeLimit": _gib(shm_gib)}
    return [{"name": _SHM_VOLUME, "emptyDir": shm}, {"name": _MODEL_VOLUME, **source}]


def _embedded_model_init(target: Target) -> Manifest:
    cache = f"{target.kube.model_volume.mount_path.rstrip('/')}/{EMBEDDED_CACHE}"
    return {
        "name": "model",
        "image": target.kube.gateway_image,
        "command": ["servepilot", "models", "pull", EMBEDDED_MODEL],
        "env": [{"name": "SERVEPILOT_CACHE", "value": cache}],
        "volumeMounts": [{"name": _MODEL_VOLUME, "mountPath": target.kube.model_volume.mount_path}],
    }


def _grace_s(target: Target) -> int:
    return target.kube.drain_s + int(target.config.engine.stop_grace_s) + 5


def _gib(value: float) -> str:
    return f"{int(value)}Gi" if float(value).is_integer() else f"{int(value * 1024)}Mi"
