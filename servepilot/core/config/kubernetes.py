"""fleet.yaml's `kubernetes` section: how `servepilot k8s render` turns the fleet into manifests
(images, the model volume, autoscaling, the runtime).

The defaults follow the seeds where they give a number (HPA min 2 / max 20, +10% / -5% steps,
80% target utilisation) and otherwise what a plain cluster with the NVIDIA device plugin,
prometheus-operator and prometheus-adapter offers.
"""

from __future__ import annotations

import enum
import re

from pydantic import Field, field_validator, model_validator

from servepilot.core.config.section import Section as _Section

# RFC 1123 label: what Kubernetes accepts as a namespace and as a Service name.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class VolumeKind(enum.StrEnum):
    PVC = "pvc"
    """A PersistentVolumeClaim (ReadOnlyMany on a shared filesystem, or one per node)."""
    HOST_PATH = "host_path"
    """A folder on every node (local NVMe, filled beforehand)."""


class Autoscaler(enum.StrEnum):
    HPA = "hpa"
    """An autoscaling/v2 HorizontalPodAutoscaler on an external metric served by
    prometheus-adapter."""
    KEDA = "keda"
    """A KEDA ScaledObject with a Prometheus trigger (KEDA makes the HPA)."""


class Runtime(enum.StrEnum):
    VLLM = "vllm"
    """vLLM pods: a Deployment, or a LeaderWorkerSet when one replica spans several nodes."""
    RAY = "ray"
    """A KubeRay RayService serving the model with Ray Serve LLM."""


class ModelVolumeConfig(_Section):
    kind: VolumeKind = VolumeKind.PVC
    """`pvc`: the PersistentVolumeClaim `claim_name`; `host_path`: the nodes' folder
    `host_path`."""

    claim_name: str = "models"
    """kind pvc: the claim holding the model folders."""

    host_path: str | None = None
    """kind host_path: the folder on each node holding the model folders."""

    mount_path: str = "/models"
    """Where the volume is mounted in the vLLM containers; the model folder is below it."""

    @field_validator("mount_path", "host_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return value

    @model_validator(mode="after")
    def _host_path_given(self) -> ModelVolumeConfig:
        if self.kind is VolumeKind.HOST_PATH and self.host_path is None:
            raise ValueError("kind host_path needs host_path (the nodes' folder)")
        return self


class KubernetesAutoscalingConfig(_Section):
    autoscaler: Autoscaler = Autoscaler.HPA
    """`hpa` (autoscaling/v2 through prometheus-adapter) or `keda` (a ScaledObject)."""

    min_replicas: int | None = Field(default=None, ge=0)
    """Replicas kept at least. None: the step rules' 2 (scaling.step), so one node loss
    leaves one serving. 0 (KEDA only): none while no request comes; the gateway holds the
    first ones through the cold start (gateway.admission.cold_start_wait_s) and its queue is
    the demand that wakes them."""

    max_replicas: int | None = Field(default=None, ge=1)
    """Replicas at most. None: the step rules' 20."""

    target_utilisation: float | None = Field(default=None, gt=0.0, le=1.0)
    """Share of the replicas' concurrency budgets (gateway.admission.replica_concurrency)
    that the gateway's demand (requests in flight plus queued) should fill. None: the step rules'
    upper line, 80%."""

    scale_up_percent: int | None = Field(default=None, ge=1)
    """Replicas added per period at most, in percent, at least one pod. None: the step rules'
    10%."""

    scale_down_percent: int | None = Field(default=None, ge=1)
    """Replicas removed per period at most, in percent, at least one pod (or 5% of fewer
    than 20 replicas would round to none). None: the step rules' 5%."""

    period_s: int = Field(default=60, ge=1, le=1800)
    """The period the percentages apply to."""

    scale_up_window_s: int = Field(default=0, ge=0, le=3600)
    """Stabilisation window before scaling up (0: at once; the cold start is delay enough)."""

    scale_down_window_s: int = Field(default=300, ge=0, le=3600)
    """Stabilisation window before scaling down: a dip between bursts keeps its replicas."""

    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """autoscaler keda: the Prometheus the ScaledObject queries."""

    @model_validator(mode="after")
    def _bounds_ordered(self) -> KubernetesAutoscalingConfig:
        if self.min_replicas == 0 and self.autoscaler is Autoscaler.HPA:
            raise ValueError("min_replicas 0 needs autoscaler keda: an HPA never scales to zero")
        low, high = self.min_replicas, self.max_replicas
        if low is not None and high is not None and low > high:
            raise ValueError(f"min_replicas ({low}) is above max_replicas ({high})")
        return self


class KubernetesConfig(_Section):
    name: str = "servepilot"
    """Prefix of every object's name (two fleets in one namespace need two names)."""

    namespace: str = "servepilot"
    """Namespace of every namespaced object (`k8s render --namespace` overrides)."""

    runtime: Runtime = Runtime.VLLM
    """`vllm`: vLLM pods (LeaderWorkerSet for multi-node replicas); `ray`: a KubeRay
    RayService (`k8s render --runtime` overrides)."""

    vllm_image: str | None = None
    """Image of the vLLM containers. None: vllm/vllm-openai on GPUs, the vLLM CPU release
    image on CPU."""

    ray_image: str = "rayproject/ray-llm:2.52.0-py311-cu128"
    """runtime ray: image of the Ray head and workers (Ray with vLLM)."""

    gateway_image: str = "servepilot:latest"
    """Image of the gateway: any image with servepilot installed (docs/kubernetes.md: "Deploying on
    Kubernetes" builds one)."""

    gpu_resource: str = "nvidia.com/gpu"
    """The extended resource a GPU is requested as (the device plugin's name)."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Labels the vLLM pods' nodes must carry (e.g. a GPU product label)."""

    model_volume: ModelVolumeConfig = Field(default_factory=ModelVolumeConfig)
    """Where the model folders are: a PVC or a folder on each node."""

    model_path: str | None = None
    """The model folder in the containers. None: model.source when it is a folder below
    model_volume.mount_path; the embedded model: converted into the volume by an init
    container (the gateway image's `servepilot models pull`)."""

    shm_gib: float | None = Field(default=None, gt=0)
    """Size of /dev/shm (a memory-backed emptyDir). None: 16 GiB on GPUs (NCCL and the
    workers' shared buffers), 2 GiB on CPU."""

    drain_s: int = Field(default=30, ge=0)
    """preStop pause of a vLLM pod: the gateway stops sending it new requests (its endpoint
    turns not ready) and its requests in flight finish before vLLM gets SIGTERM."""

    gateway_replicas: int = Field(default=1, ge=1)
    """Gateway pods (each has its own queue and routing tables)."""

    autoscaling: KubernetesAutoscalingConfig = Field(default_factory=KubernetesAutoscalingConfig)
    """HPA or KEDA bounds and steps."""

    @field_validator("name", "namespace")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not _DNS_LABEL.fullmatch(value) or len(value) > 40:
            raise ValueError(
                "must be lowercase letters, digits and '-', start and end alphanumeric, "
                "at most 40 characters (suffixes are added to it)"
            )
        return value

    @field_validator("model_path")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError("must be an absolute path in the container")
        return value
