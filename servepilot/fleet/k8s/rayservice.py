"""`--runtime ray`: a KubeRay RayService serving the model with Ray Serve LLM
(`ray.serve.llm:build_openai_app`), for users who run Ray on Kubernetes.

The engine arguments are the vLLM command `up` launches, turned into Ray Serve LLM's
`engine_kwargs`, so both runtimes run the same knobs. Ray Serve's own autoscaler adds replicas
(within kubernetes.autoscaling's bounds) and KubeRay's adds the worker pods they need.
"""

from __future__ import annotations

from typing import Any

import yaml

from servepilot.fleet.k8s.pods import Manifest, pod_spec, vllm_argv, worker_container
from servepilot.fleet.k8s.target import HTTP_PORT, Target

RAY_API = "ray.io/v1"
# Flags the Ray Serve app sets itself (where it listens, what it calls the model, its executor).
_SERVE_OWNS = frozenset(
    {"model", "host", "port", "served_model_name", "distributed_executor_backend"}
)


def ray_service(target: Target) -> Manifest:
    scaling = target.scaling
    app = {
        "name": "llm",
        "route_prefix": "/",
        "import_path": "ray.serve.llm:build_openai_app",
        "args": {"llm_configs": [_llm_config(target)]},
    }
    serve_config = yaml.safe_dump({"applications": [app]}, sort_keys=False)
    return {
        "apiVersion": RAY_API,
        "kind": "RayService",
        "metadata": target.metadata(target.names.vllm, "vllm"),
        "spec": {
            "serveConfigV2": serve_config,
            "rayClusterConfig": {
                "enableInTreeAutoscaling": True,
                "headGroupSpec": {
                    # The head schedules no model: its GPUs-free pod only runs the proxy.
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-gpus": "0"},
                    "template": {"spec": _head_pod(target)},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu",
                        "replicas": scaling.min_replicas * target.layout.pods,
                        "minReplicas": scaling.min_replicas * target.layout.pods,
                        "maxReplicas": scaling.max_replicas * target.layout.pods,
                        "rayStartParams": {},
                        "template": {
                            "metadata": {"labels": target.names.labels("vllm")},
                            "spec": _worker_pod(target),
                        },
                    }
                ],
            },
        },
    }


def engine_kwargs(argv: tuple[str, ...]) -> dict[str, Any]:
    """vLLM server flags as engine keyword arguments: `--max-num-seqs 256` -> max_num_seqs:
    256, `--enforce-eager` -> True, `--no-enable-prefix-caching` -> enable_prefix_caching:
    False."""
    flags = argv[3:] if argv[:2] == ("vllm", "serve") else argv
    kwargs: dict[str, Any] = {}
    index = 0
    while index < len(flags):
        name = flags[index].removeprefix("--").replace("-", "_")
        following = flags[index + 1] if index + 1 < len(flags) else None
        if following is not None and not following.startswith("--"):
            kwargs[name] = _value(following)
            index += 2
        elif name.startswith("no_"):
            kwargs[name.removeprefix("no_")] = False
            index += 1
        else:
            kwargs[name] = True
            index += 1
    return {k: v for k, v in kwargs.items() if k not in _SERVE_OWNS}


def _llm_config(target: Target) -> dict[str, Any]:
    scaling = target.scaling
    budget = target.config.gateway.admission.replica_concurrency
    return {
        "model_loading_config": {
            "model_id": target.served_name,
            "model_source": target.model_path,
        },
        "engine_kwargs": engine_kwargs(vllm_argv(target)),
        "deployment_config": {
            "autoscaling_config": {
                "min_replicas": scaling.min_replicas,
                "max_replicas": scaling.max_replicas,
                # Ray Serve's default (1e9) never scales: the same target as the HPA's.
                "target_ongoing_requests": round(scaling.target_utilisation * budget),
            }
        },
    }


def _head_pod(target: Target) -> Manifest:
    container = {
        "name": "ray-head",
        "image": target.kube.ray_image,
        "ports": [
            {"name": "gcs", "containerPort": 6379},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "serve", "containerPort": HTTP_PORT},
        ],
        "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
    }
    return {"priorityClassName": f"{target.names.prefix}-interactive", "containers": [container]}


def _worker_pod(target: Target) -> Manifest:
    container = worker_container(target)
    container = {k: v for k, v in container.items() if k != "command"}
    container |= {"name": "ray-worker", "image": target.kube.ray_image}
    return pod_spec(target, container, target.names.labels("vllm"))


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
