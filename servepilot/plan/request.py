"""What `servepilot plan` is asked: a model, hardware, precisions, knobs and traffic."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from servepilot.core.config import HardwareConfig, SloConfig, TrafficConfig
from servepilot.plan.costmodel import CostModel
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.hardware import Accelerator
from servepilot.plan.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class PlanRequest:
    model: ModelSpec
    model_ref: str
    """What the user named the model by (a preset name or a folder): goes in the fleet.yaml."""
    accelerator: Accelerator
    count: int
    """Accelerators per node (on CPU: replicas, each with its own KV space)."""
    nodes: int
    weights_dtype: WeightDtype
    kv_dtype: KvDtype
    traffic: TrafficConfig
    slo: SloConfig
    max_model_len: int | None = None
    """None: derived from the traffic."""
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    enable_chunked_prefill: bool | None = None
    hardware: HardwareConfig | None = None
    """The hardware section the request came from (catalog file, overrides), written back
    into the planned fleet.yaml."""
    block_size: int | None = None
    """None: vLLM's default for the model and device."""
    cost_model: CostModel | None = None
    """Step times for the throughput and latency estimates (a calibrated profile); None:
    the roofline of the model on the accelerator."""

    def replace(self, **changes: object) -> PlanRequest:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def wanted_model_len(self) -> int:
        """Longest prompt + output of the traffic, rounded up to a multiple of 1,024."""
        t = self.traffic
        longest_in = t.max_input_tokens or 4 * t.input_tokens
        longest_out = t.max_output_tokens or 4 * t.output_tokens
        return -(-(longest_in + longest_out) // 1024) * 1024

    @property
    def mean_request_tokens(self) -> int:
        return self.traffic.input_tokens + self.traffic.output_tokens
