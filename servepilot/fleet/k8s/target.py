"""What a fleet becomes on Kubernetes before any manifest is written: names, the pods of one
replica, the model's path in the volume, resources; and the refusals of a fleet that cannot run
there as asked, each naming the field to change."""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from servepilot.core.config import (
    EMBEDDED_MODEL,
    Autoscaler,
    Device,
    FleetConfig,
    KubernetesConfig,
    Runtime,
    ScalingPolicyName,
)
from servepilot.core.errors import ConfigError
from servepilot.engine.model_source import EMBEDDED_DIR_NAME
from servepilot.plan.export import planned_engine
from servepilot.plan.hardware import AcceleratorKind
from servepilot.plan.planner import Plan
from servepilot.scaling.step import StepRules

GIB = 2**30
HTTP_PORT = 8000
VLLM_GPU_IMAGE = "vllm/vllm-openai:v0.11.0"
VLLM_CPU_IMAGE = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.11.0"
# Where the embedded model's init container converts it, below the model volume's mount.
EMBEDDED_CACHE = ".servepilot"
# Beyond the weights: the server process, the tokenizer, CUDA's host-side context.
_HOST_OVERHEAD_GIB = 8
_CPU_OVERHEAD_GIB = 1
_CPUS_PER_GPU = 4
STARTUP_PERIOD_S = 10


@dataclass(frozen=True, slots=True)
class Names:
    prefix: str

    @property
    def vllm(self) -> str:
        return f"{self.prefix}-vllm"

    @property
    def gateway(self) -> str:
        return f"{self.prefix}-gateway"

    def labels(self, component: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "servepilot",
            "app.kubernetes.io/instance": self.prefix,
            "app.kubernetes.io/component": component,
        }


@dataclass(frozen=True, slots=True)
class PodLayout:
    """The pods of one replica: one, or a leader and workers when it spans nodes."""

    pods: int
    gpus_per_pod: int

    @property
    def multi_node(self) -> bool:
        return self.pods > 1


@dataclass(frozen=True, slots=True)
class PodResources:
    cpus: int
    memory_gib: int
    gpus: int


@dataclass(frozen=True, slots=True)
class ScalingBounds:
    """kubernetes.autoscaling with the seeds' step rules (scaling.step) where it is unset."""

    min_replicas: int
    max_replicas: int
    target_utilisation: float
    scale_up_percent: int
    scale_down_percent: int


@dataclass(frozen=True, slots=True)
class Target:
    config: FleetConfig
    names: Names
    layout: PodLayout
    resources: PodResources
    model_path: str
    served_name: str
    image: str
    embedded: bool
    """The embedded model: an init container converts it into the volume first."""
    scaling: ScalingBounds

    @property
    def kube(self) -> KubernetesConfig:
        return self.config.kubernetes

    def metadata(self, name: str, component: str) -> dict[str, Any]:
        """A namespaced object's metadata, labelled with its component."""
        return {"name": name, "namespace": self.kube.namespace,
                "labels": self.names.labels(component)}  # fmt: skip

    @property
    def gateway_scales(self) -> bool:
        """The gateway runs the autoscaler (`gateway_autoscaling`) instead of an HPA/KEDA."""
        return gateway_scales(self.config)

    @property
    def startup_failures(self) -> int:
        """startupProbe failureThreshold: failures x period covers engine.startup_timeout_s
        (10 minutes by default: llm-d sees real vLLM pods take 2-8 minutes)."""
        return math.ceil(self.config.engine.startup_timeout_s / STARTUP_PERIOD_S)


def check(config: FleetConfig) -> None:
    """Refuse, naming the field, what stops the fleet on Kubernetes before it is planned (the
    pods of a replica, the model's place in the volume, the autoscaling bounds)."""
    _check_whole_gpus(config)
    pod_layout(config)
    model_path(config)
    scaling_bounds(config)
    _check_gateway_scaling(config)
    _check_warm_pool(config)


def _check_whole_gpus(config: FleetConfig) -> None:
    shared = config.hardware.replicas_per_gpu
    if shared == 1:
        return
    raise ConfigError(
        f"hardware.replicas_per_gpu {shared}: a Kubernetes pod gets whole GPUs "
        "(nvidia.com/gpu is counted in whole devices), so replica pods share a GPU only where "
        "the cluster's device plugin slices GPUs (time-slicing or MIG), which servepilot does "
        "not set up",
        hint="set hardware.replicas_per_gpu: 1 for `k8s render`; on a cluster with GPU "
        "time-slicing or MIG, plan each replica for one slice instead "
        "(hardware.memory_gib, hardware.count)",
    )


def gateway_scales(config: FleetConfig) -> bool:
    """An enabled `autoscale` section picks `step` or `predictive`: policies an HPA cannot
    run, so the gateway runs them (`target` stays the HPA's or KEDA's rule)."""
    section = config.autoscale
    rules = (ScalingPolicyName.STEP, ScalingPolicyName.PREDICTIVE)
    return section.enabled and section.policy in rules and config.kubernetes.runtime is Runtime.VLLM


def _check_gateway_scaling(config: FleetConfig) -> None:
    if not gateway_scales(config):
        return
    policy = config.autoscale.policy.value
    if config.autoscale.min_replicas < 1:
        raise ConfigError(
            f"autoscale.min_replicas 0: with autoscale.policy {policy} the gateway runs the "
            "autoscaler, which keeps at least 1 replica (as `up` does)",
            hint="set autoscale.min_replicas: 1, or autoscale.policy: target with autoscaler keda",
        )
    if pod_layout(config).multi_node:
        raise ConfigError(
            f"autoscale.policy {policy}: a replica spanning nodes is a LeaderWorkerSet, which "
            "removes its last group on a scale-down, not the one the gateway drained",
            hint="use autoscale.policy: target (the HPA or KEDA scales it)",
        )
    if config.kubernetes.gateway_replicas > 1:
        raise ConfigError(
            f"kubernetes.gateway_replicas {config.kubernetes.gateway_replicas}: with "
            f"autoscale.policy {policy} the gateway runs the autoscaler, and each replica of it "
            "would scale the fleet on its own share of the load",
            hint="keep 1 gateway replica, or use autoscale.policy: target",
        )


def _check_warm_pool(config: FleetConfig) -> None:
    asleep = config.replicas.asleep
    if asleep and not gateway_scales(config):
        raise ConfigError(
            f"replicas.asleep {asleep}: on Kubernetes only the gateway's autoscaler keeps a "
            "warm pool (an HPA or KEDA would count a sleeping pod as capacity and never wake it)",
            hint="set autoscale.enabled: true with autoscale.policy: step or predictive, or "
            "replicas.asleep: 0",
        )


def pods_sleep(config: FleetConfig) -> bool:
    """The replica pods run vLLM's sleep mode: asked for (engine.sleep_mode), or a warm pool
    on GPUs (replicas.asleep > 0). On CPU, where vLLM has none, the pool parks its pods."""
    pool_on_gpu = config.replicas.asleep > 0 and config.hardware.device is Device.GPU
    return config.engine.sleep_mode or pool_on_gpu


def scaling_bounds(config: FleetConfig) -> ScalingBounds:
    """kubernetes.autoscaling's bounds; where it leaves them out, those of fleet.yaml's
    `autoscale` section when it is enabled (the fleet `up --autoscale` runs), else the seeds'
    2 and 20."""
    given, seeds = config.kubernetes.autoscaling, StepRules()
    fleet = config.autoscale
    low = fleet.min_replicas if fleet.enabled else seeds.min_replicas
    high = fleet.max_replicas if fleet.enabled else seeds.max_replicas
    bounds = ScalingBounds(
        min_replicas=low if given.min_replicas is None else given.min_replicas,
        max_replicas=high if given.max_replicas is None else given.max_replicas,
        target_utilisation=given.target_utilisation or seeds.upper,
        scale_up_percent=given.scale_up_percent or _percent(seeds.up_share),
        scale_down_percent=given.scale_down_percent or _percent(seeds.down_share),
    )
    if (
        bounds.min_replicas == 0
        and given.autoscaler is Autoscaler.HPA
        and not gateway_scales(config)
    ):
        raise ConfigError(
            "autoscale.min_replicas 0: an HPA never scales to zero",
            hint="set kubernetes.autoscaling.min_replicas, or autoscaler: keda",
        )
    if bounds.min_replicas > bounds.max_replicas:
        raise ConfigError(
            f"kubernetes.autoscaling.min_replicas {bounds.min_replicas} is above max_replicas "
            f"{bounds.max_replicas}"
        )
    return bounds


def resolve(config: FleetConfig, plan: Plan) -> Target:
    """The fleet on Kubernetes, or a ConfigError naming the field that stops it. Its engine
    is the one `plan` prints for it (layout, precision, knobs), which the HPA is sized on."""
    check(config)
    _check_device(config, plan)
    engine = planned_engine(plan, config.engine).model_copy(
        update={"sleep_mode": pods_sleep(config)}
    )
    config = config.model_copy(update={"engine": engine})
    layout = pod_layout(config)
    return Target(
        config=config,
        names=Names(config.kubernetes.name),
        layout=layout,
        resources=_resources(config, plan, layout),
        model_path=model_path(config),
        served_name=config.model.served_name or PurePosixPath(config.model.source).name,
        image=config.kubernetes.vllm_image or _default_image(config),
        embedded=config.model.source == EMBEDDED_MODEL and config.kubernetes.model_path is None,
        scaling=scaling_bounds(config),
    )


def pod_layout(config: FleetConfig) -> PodLayout:
    """One pod per replica when it fits a node; else whole pipeline stages per node."""
    engine, node_gpus = config.engine, config.hardware.count
    if config.hardware.device is Device.CPU:
        return PodLayout(pods=1, gpus_per_pod=0)
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    gpus = tp * pp * engine.data_parallel_size
    if gpus <= node_gpus:
        return PodLayout(pods=1, gpus_per_pod=gpus)
    if engine.data_parallel_size > 1:
        raise ConfigError(
            f"engine.data_parallel_size {engine.data_parallel_size}: a replica of {gpus} GPUs "
            f"is over a node's {node_gpus} (hardware.count), and data parallelism across "
            "nodes is not rendered",
            hint="run more replicas instead (the HPA scales them), or lower data_parallel_size",
        )
    if tp > node_gpus:
        raise ConfigError(
            f"engine.tensor_parallel_size {tp} is over a node's {node_gpus} GPUs "
            "(hardware.count): tensor parallelism needs NVLink inside one node",
            hint="split across nodes with engine.pipeline_parallel_size, TP within each node",
        )
    stages_per_pod = node_gpus // tp
    if pp % stages_per_pod:
        raise ConfigError(
            f"engine.pipeline_parallel_size {pp}: {stages_per_pod} stage(s) of TP {tp} fill a "
            f"node of {node_gpus} GPUs (hardware.count), so the stages must be a multiple of "
            f"{stages_per_pod} to fill whole nodes"
        )
    pods = pp // stages_per_pod
    if pods > config.hardware.nodes:
        raise ConfigError(
            f"hardware.nodes {config.hardware.nodes}: one replica needs {pods} nodes of "
            f"{node_gpus} GPUs (TP {tp} x PP {pp})"
        )
    return PodLayout(pods=pods, gpus_per_pod=tp * stages_per_pod)


def model_path(config: FleetConfig) -> str:
    """The model folder in the containers; refused when the volume does not hold it."""
    kube = config.kubernetes
    mount = kube.model_volume.mount_path
    if kube.model_path is not None:
        if not _below(kube.model_path, mount):
            raise ConfigError(
                f"kubernetes.model_path {kube.model_path} is not below the model volume "
                f"(kubernetes.model_volume.mount_path {mount}): the pods would not find it"
            )
        return kube.model_path
    source = config.model.source
    if source == EMBEDDED_MODEL:
        return posixpath.join(mount, EMBEDDED_CACHE, "models", EMBEDDED_DIR_NAME)
    if not source.startswith("/"):
        raise ConfigError(
            f"model.source {source!r} is not a folder in the model volume (a preset name or "
            "a relative path); the pods read the model from the volume",
            hint=f"set kubernetes.model_path to its folder below {mount}",
        )
    if not _below(source, mount):
        raise ConfigError(
            f"model.source {source} is not below the model volume "
            f"(kubernetes.model_volume.mount_path {mount}): the pods would not find it",
            hint="put the model in the volume and set kubernetes.model_path to its folder",
        )
    return source


def _check_device(config: FleetConfig, plan: Plan) -> None:
    hardware = config.hardware
    accelerator = plan.request.accelerator
    if hardware.device is Device.CPU and accelerator.kind is AcceleratorKind.GPU:
        raise ConfigError(
            f"hardware.accelerator {hardware.accelerator} is a GPU but hardware.device is cpu: "
            "the pods would request no GPU and run vLLM for CPU",
            hint="set hardware.device: gpu, or hardware.accelerator: cpu",
        )
    if hardware.device is Device.GPU and accelerator.kind is AcceleratorKind.CPU:
        raise ConfigError(
            "hardware.device gpu with hardware.accelerator cpu: the pods would request GPUs "
            "that the plan does not count",
            hint="name the GPU in hardware.accelerator (h100-80, h200-141, ...)",
        )
    if config.kubernetes.runtime is Runtime.RAY and hardware.device is Device.CPU:
        raise ConfigError(
            "kubernetes.runtime ray serves with Ray Serve LLM on GPUs; hardware.device is cpu",
            hint="use kubernetes.runtime: vllm (or --runtime vllm) on CPU",
        )


def _resources(config: FleetConfig, plan: Plan, layout: PodLayout) -> PodResources:
    memory = plan.option.memory
    if config.hardware.device is Device.CPU:
        # On CPU the weights, activations and the KV space all live in the pod's memory.
        used = memory.weights_bytes + memory.activation_bytes + memory.usable_bytes
        cpus = config.engine.cpu_threads or 2
        return PodResources(cpus, math.ceil(used / GIB) + _CPU_OVERHEAD_GIB, 0)
    # The weights pass through host memory while they load; a CPU tier of the KV cache is
    # pinned there for good, each pod holding its ranks' share of it.
    weights_gib = math.ceil(memory.weights_bytes * layout.gpus_per_pod / GIB)
    return PodResources(
        cpus=_CPUS_PER_GPU * layout.gpus_per_pod,
        memory_gib=weights_gib + _kv_tier_gib(plan, layout) + _HOST_OVERHEAD_GIB,
        gpus=layout.gpus_per_pod,
    )


def _kv_tier_gib(plan: Plan, layout: PodLayout) -> int:
    offload = plan.request.kv_offload
    if offload is None:
        return 0
    par = plan.option.parallelism
    return math.ceil(offload.replica_bytes(par) * layout.gpus_per_pod / par.devices / GIB)


def _percent(share: float) -> int:
    return round(share * 100)


def _default_image(config: FleetConfig) -> str:
    return VLLM_CPU_IMAGE if config.hardware.device is Device.CPU else VLLM_GPU_IMAGE


def _below(path: str, folder: str) -> bool:
    normal = posixpath.normpath(path)
    return normal != folder and normal.startswith(folder.rstrip("/") + "/")
