"""fleet.yaml's `engine` section: vLLM's knobs (or the simulated engine's), the same for every
replica."""

from __future__ import annotations

import enum
import math

from pydantic import Field, model_validator

from servepilot.core.config.hardware import Device
from servepilot.core.config.section import Section as _Section

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
"""servepilot's --gpu-memory-utilization, which `up` always passes on a GPU: not vLLM's own
default, which moves between versions (0.92 in vLLM 0.32; 0.22 logs 0.9 as non-default)."""


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

    kv_events: bool = True
    """--kv-events-config: each replica publishes its KV cache events (blocks stored and
    removed) over ZMQ on ports of its own, so the gateway knows exactly which prompt prefixes
    it holds. False: the gateway guesses from what it sent where."""

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
