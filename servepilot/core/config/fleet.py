"""`FleetConfig`: the one configuration that drives plan, up, tune and sim.

Every field has a default that works on a 2-core CPU machine with no GPU, so running with no
file at all serves the embedded model. A `fleet.yaml` overrides any subset; unknown keys and
bad values are refused with a message that names the field.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from servepilot.core.config.autoscale import AutoscaleConfig
from servepilot.core.config.cluster import ClusterConfig
from servepilot.core.config.engine import EngineConfig, shared_memory_utilization
from servepilot.core.config.gateway import GatewayConfig
from servepilot.core.config.hardware import Device, HardwareConfig
from servepilot.core.config.kubernetes import KubernetesConfig
from servepilot.core.config.model import ModelConfig
from servepilot.core.config.replicas import ReplicasConfig
from servepilot.core.config.section import Section as _Section
from servepilot.core.config.traffic import TrafficConfig
from servepilot.core.errors import ConfigError
from servepilot.core.slo import Slo
from servepilot.core.yamlfile import parse_yaml, read_user_file


class FleetConfig(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig)
    """Which model to serve."""

    hardware: HardwareConfig = Field(default_factory=HardwareConfig)
    """What the replicas run on."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    """vLLM's knobs, the same for every replica."""

    replicas: ReplicasConfig = Field(default_factory=ReplicasConfig)
    """How many replicas `up` starts, and where."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """The OpenAI-compatible endpoint in front of the replicas."""

    slo: Slo = Field(default_factory=Slo)
    """Latency limits that bench, sim and tune measure against, as `KEY: MS` with KEY
    <ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms, e.g. {ttft_p99_ms: 500, itl_p99_ms: 50}.
    The ttft/tpot/e2e p99 limits are also held to each request (goodput counts the requests
    within all of them); every other limit is checked on each load level's statistics."""

    traffic: TrafficConfig = Field(default_factory=TrafficConfig)
    """The traffic to plan for."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Where `up` runs the replicas: this machine (`local`) or a Ray cluster (`ray`)."""

    autoscale: AutoscaleConfig = Field(default_factory=AutoscaleConfig)
    """Whether and how `up` adds and removes replicas as the load changes (local replicas or
    Ray actors; on Kubernetes: kubernetes.autoscaling)."""

    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    """What `servepilot k8s render` writes for a Kubernetes cluster: images, the model
    volume, autoscaling, the runtime."""

    @model_validator(mode="after")
    def _device_fits_knobs(self) -> FleetConfig:
        engine = self.engine
        parallel = engine.tensor_parallel_size * engine.pipeline_parallel_size
        if self.hardware.device is Device.CPU and parallel > 1:
            raise ValueError(
                "engine.tensor_parallel_size or pipeline_parallel_size > 1 needs "
                "hardware.device: gpu; on CPU run "
                "more replicas instead (replicas.count)"
            )
        if self.hardware.device is Device.CPU and engine.kv_offload_gib is not None:
            raise ValueError(
                "engine.kv_offload_gib needs hardware.device: gpu; vLLM's KV offloading "
                "is CUDA-only, and on CPU the KV cache already lives in host memory: size it "
                "with engine.cpu_kv_cache_space_gib"
            )
        return self

    @model_validator(mode="after")
    def _shared_gpus_fit_memory(self) -> FleetConfig:
        shared = self.hardware.replicas_per_gpu
        if shared == 1:
            return self
        if self.hardware.device is not Device.GPU:
            raise ValueError(
                f"hardware.replicas_per_gpu {shared} needs hardware.device: gpu; on CPU set "
                "replicas.count and engine.cpu_threads instead"
            )
        engine = self.engine
        if "gpu_memory_utilization" not in engine.model_fields_set:
            # Written into __dict__ and left out of the fields set: the value stays a default,
            # so a copy with another replicas_per_gpu (with_overrides) derives it again.
            derived = engine.model_copy(
                update={"gpu_memory_utilization": shared_memory_utilization(shared)}
            )
            object.__setattr__(derived, "__pydantic_fields_set__", set(engine.model_fields_set))
            self.__dict__["engine"] = derived
            return self
        if shared * engine.gpu_memory_utilization > 1 + 1e-9:
            raise ValueError(
                f"hardware.replicas_per_gpu: {shared} replicas share each GPU at "
                f"engine.gpu_memory_utilization {engine.gpu_memory_utilization:g} each: "
                f"{shared * engine.gpu_memory_utilization:.0%} of it; set "
                f"engine.gpu_memory_utilization to {shared_memory_utilization(shared):g} or "
                "less, or lower hardware.replicas_per_gpu"
            )
        return self

    def with_overrides(
        self, overrides: dict[str, Any], names: Mapping[str, str] | None = None
    ) -> FleetConfig:
        """A copy with dotted-path overrides applied (`{"replicas.count": 2}`), validated.
        `names`: what the user typed for a path (`{"replicas.count": "--replicas"}`), which
        an error then names first."""
        # Only the fields that were set, so the copy still knows which ones were given (plan
        # derives the rest from the traffic).
        data = self.model_dump(mode="json", exclude_unset=True)
        for dotted, value in overrides.items():
            node = data
            *parents, leaf = dotted.split(".")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        return parse_config(data, origin="command-line flags", names=names or {})


def parse_config(
    data: object, *, origin: str, names: Mapping[str, str] | None = None
) -> FleetConfig:
    """Validate a mapping into a FleetConfig; errors name `origin` and each bad field."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: expected a mapping of sections at the top level")
    try:
        return FleetConfig.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(err, names or {}) for err in exc.errors()]
        raise ConfigError(
            f"{origin} is not valid:\n" + "\n".join(f"  - {line}" for line in lines),
            hint="`servepilot config` prints every field with its default and what it means",
        ) from None


def load_config(path: Path | None) -> FleetConfig:
    """Read fleet.yaml at `path`; with no path, every default."""
    if path is None:
        return FleetConfig()
    text = read_user_file(path, what="fleet.yaml")
    data = parse_yaml(text, origin=str(path))
    return parse_config(data, origin=str(path))


def _describe(err: Any, names: Mapping[str, str]) -> str:
    loc = ".".join(str(part) for part in err["loc"]) or "(top level)"
    if loc in names:
        loc = f"{names[loc]} ({loc})"
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown field{_suggestion(err['loc'])}"
    value = err.get("input")
    shown = "" if isinstance(value, dict) else f" (got {value!r})"
    return f"{loc}: {err['msg']}{shown}"


def _suggestion(loc: tuple[Any, ...]) -> str:
    model: type[BaseModel] = FleetConfig
    for part in loc[:-1]:
        annotation = model.model_fields[str(part)].annotation
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return ""
        model = annotation
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f"; did you mean `{close[0]}`?" if close else f"; known: {', '.join(model.model_fields)}"
