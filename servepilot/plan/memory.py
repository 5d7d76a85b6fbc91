"""Memory of one accelerator under vLLM: weights, activations, runtime, KV pool, headroom.

vLLM (v1/worker/gpu_worker.py) takes `ceil(total x gpu_memory_utilization)`, profiles a
forward pass of `max_num_batched_tokens` tokens, and gives the KV cache what is left after
weights, the activation peak, non-torch memory (CUDA context, NCCL, cuBLAS) and the CUDA-graph
estimate. On CPU the KV cache is sized directly (--kv-cache-memory-bytes) and the weights live
beside it in host memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.hardware import Accelerator, AcceleratorKind
from servepilot.plan.parallel import Parallelism
from servepilot.plan.spec import ModelSpec

GIB = 2**30

# Non-torch memory vLLM's profiler sees on a CUDA device: the CUDA context and cuBLAS
# workspaces, plus NCCL's buffers once ranks talk to each other. Typical values from vLLM's
# startup logs ("non-torch memory"); they vary with driver and library versions.
_CUDA_CONTEXT_BYTES = int(0.5 * GIB)
_NCCL_BYTES = int(0.5 * GIB)
# vLLM (0.21+) takes its estimate of the CUDA-graph pool out of the KV budget. The estimate
# grows with the number of graphs it captures (capture_sizes below) at a cost per graph that
# grows with the model: fitted to the estimates vLLM 0.22 logged on the H200
# (benchmarks/gpu_runs/2026-12-04-*: SmolLM2 3.0 MiB a graph, Llama-3.1-8B 5.0,
# Qwen2.5-32B 9.0; DeepSeek-V2-Lite 8.9, 2.4x a dense model of its size: its MoE and MLA
# layers split into more pieces).
_GRAPH_BASE_MIB = 2.67
_GRAPH_MIB_PER_LAYER_HIDDEN = 1.943e-5
_GRAPH_MOE_FACTOR = 2.4
# The profiling pass's activation peak (activation_bytes), fitted to the same runs.
_DENSE_VALUES_PER_HIDDEN = 13
_MOE_VALUES_PER_EXPERT_WIDTH = 4.8
_SAMPLER_BYTES_PER_LOGIT = 6.6


@dataclass(frozen=True, slots=True)
class WeightBytes:
    """Weight bytes on the most loaded rank."""

    per_rank: int
    total: int
    """All ranks of one replica together (replicated parts counted once per rank)."""


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One accelerator's memory, in bytes. On CPU: `total` is the KV space and the weights,
    activations and runtime live outside it, in host memory."""

    total_bytes: int
    usable_bytes: int
    """What vLLM may use: total x gpu_memory_utilization (CPU: the KV space)."""
    weights_bytes: int
    activation_bytes: int
    runtime_bytes: int
    """Non-torch memory and CUDA graphs (0 on CPU)."""
    kv_bytes: int
    """What is left for the KV cache; negative when the rest does not fit."""

    @property
    def headroom_bytes(self) -> int:
        return self.total_bytes - self.usable_bytes

    @property
    def fits(self) -> bool:
        return self.kv_bytes > 0


def serving_params(spec: ModelSpec) -> int:
    """Parameters vLLM loads to serve (the MTP module is left out)."""
    if spec.params is None:
        raise ValueError(f"{spec.name}: parameters were not counted")
    return spec.params.total - spec.params.mtp


def weight_bytes(spec: ModelSpec, dtype: WeightDtype, par: Parallelism) -> WeightBytes:
    """Weights on the most loaded rank of one replica.

    TP slices attention, dense MLPs, shared experts and the vocabulary (embedding and head are
    vocab-parallel). Routed experts are sliced by TP, or spread whole over TP x DP ranks with
    expert parallelism. With DP attention each rank holds the full attention and dense layers.
    PP gives each stage its share of the layers; the first stage holds the embedding too and
    the last the head, so one stage (no PP) holds both: vLLM's "Model loading took" on the
    H200 counts an untied head (Llama-3.1-8B 15.0 GiB, Qwen2.5-32B 61.04 GiB).
    Quantized checkpoints keep the embedding, head and norms in 16 bits, as DeepSeek's fp8
    release and vLLM's fp8/AWQ/GPTQ methods do."""
    if spec.params is None:
        raise ValueError(f"{spec.name}: parameters were not counted")
    p = spec.params
    dense = dtype.bytes_per_param
    expert = _expert_dtype(spec, dtype).bytes_per_param
    wide = 4.0 if dtype is WeightDtype.FP32 else 2.0
    layer_share = 1.0 / par.pp
    expert_split = par.ep if par.expert_parallel else par.tp
    per_rank = (
        (p.attention * dense / par.tp + p.dense_mlp * dense / par.tp) * layer_share
        + p.shared_experts * dense / par.tp * layer_share
        + p.routed_experts * expert / expert_split * layer_share
        + p.other * wide * layer_share
        + _vocab_on_a_stage(p.embedding, p.lm_head, par.pp) * wide / par.tp
    )
    total = (
        (p.attention + p.dense_mlp + p.shared_experts) * dense * par.dp
        + p.routed_experts * expert * (par.dp if not par.expert_parallel else 1)
        + p.other * wide * par.tp * par.dp
        + (p.embedding + p.lm_head) * wide * par.dp
    )
    return WeightBytes(per_rank=math.ceil(per_rank), total=math.ceil(total))


def _vocab_on_a_stage(embedding: int, lm_head: int, stages: int) -> int:
    """Vocabulary parameters on the most loaded pipeline stage."""
    return embedding + lm_head if stages == 1 else max(embedding, lm_head)


def _expert_dtype(spec: ModelSpec, dtype: WeightDtype) -> WeightDtype:
    """Experts stored in their own format (DeepSeek-V4's fp4) keep it unless the user asks
    for a smaller one."""
    if spec.expert_dtype is None:
        return dtype
    if dtype.bytes_per_param < spec.expert_dtype.bytes_per_param:
        return dtype
    return spec.expert_dtype


def activation_bytes(
    spec: ModelSpec, par: Parallelism, *, batched_tokens: int, max_num_seqs: int, wide: bool
) -> int:
    """Peak activation memory of vLLM's profiling pass (an estimate): `batched_tokens` tokens
    through the model, then the sampler over `max_num_seqs` positions.

    Fitted to what vLLM 0.22 left for the KV cache on the H200 (benchmarks/gpu_runs/
    2026-12-04-*, at max_num_seqs 34 and 1,024): a dense model's forward pass peaks at about
    13 x hidden values a token whatever its MLP width (torch.compile fuses the gate, up and
    activation), an MoE adds about 4.8 x the chosen experts' width (the fused-MoE workspaces),
    and the sampler takes 6.6 bytes a position and vocabulary entry (fp32 logits and what it
    derives from them)."""
    act = 4 if wide else 2
    values: float = _DENSE_VALUES_PER_HIDDEN * spec.hidden_size
    if spec.moe is not None:
        width = spec.moe.experts_per_token * spec.moe.expert_intermediate_size
        values += _MOE_VALUES_PER_EXPERT_WIDTH * width / max(1, par.tp)
    logits = max_num_seqs * (spec.vocab_size // max(1, par.tp)) * _SAMPLER_BYTES_PER_LOGIT
    return math.ceil(batched_tokens * values * act + logits)


def device_memory(
    spec: ModelSpec,
    accelerator: Accelerator,
    par: Parallelism,
    *,
    weights_dtype: WeightDtype,
    gpu_memory_utilization: float,
    batched_tokens: int,
    max_num_seqs: int,
    cuda_graphs: bool,
) -> DeviceMemory:
    weights = weight_bytes(spec, weights_dtype, par).per_rank
    activations = activation_bytes(
        spec,
        par,
        batched_tokens=batched_tokens,
        max_num_seqs=max_num_seqs,
        wide=weights_dtype is WeightDtype.FP32,
    )
    total = accelerator.memory_bytes
    if accelerator.kind is AcceleratorKind.CPU:
        return DeviceMemory(
            total_bytes=total,
            usable_bytes=total,
            weights_bytes=weights,
            activation_bytes=activations,
            runtime_bytes=0,
            kv_bytes=total,
        )
    usable = math.ceil(total * gpu_memory_utilization)
    runtime = _CUDA_CONTEXT_BYTES + (_NCCL_BYTES if par.devices > 1 else 0)
    if cuda_graphs:
        runtime += cuda_graph_bytes(spec, par, max_num_seqs=max_num_seqs,
                                    batched_tokens=batched_tokens)  # fmt: skip
    return DeviceMemory(
        total_bytes=total,
        usable_bytes=usable,
        weights_bytes=weights,
        activation_bytes=activations,
        runtime_bytes=runtime,
        kv_bytes=usable - weights - activations - runtime,
    )


def capture_sizes(max_num_seqs: int, batched_tokens: int) -> tuple[int, ...]:
    """The batch sizes vLLM 0.22 captures piecewise CUDA graphs for by default: 1, 2, 4, then
    steps of 8 to 256 and of 16 beyond, up to min(2 x max_num_seqs, 512, batched_tokens)."""
    largest = min(2 * max_num_seqs, 512, batched_tokens)
    sizes = {s for s in (1, 2, 4) if s <= largest}
    sizes |= set(range(8, min(largest + 1, 256), 8)) | set(range(256, largest + 1, 16))
    if batched_tokens <= largest:
        sizes.add(batched_tokens)
    return tuple(sorted(sizes))


def cuda_graph_bytes(
    spec: ModelSpec, par: Parallelism, *, max_num_seqs: int, batched_tokens: int
) -> int:
    """vLLM's estimate of its CUDA-graph pool on one rank: the piecewise graphs of every
    capture size and the full decode graphs of the sizes up to max_num_seqs (vLLM logs
    "PIECEWISE=51 (largest=512), FULL=51" at its defaults on an H200)."""
    sizes = capture_sizes(max_num_seqs, batched_tokens)
    graphs = len(sizes) + sum(1 for s in sizes if s <= max_num_seqs)
    layers = spec.num_layers / par.pp
    per_graph_mib = (
        _GRAPH_BASE_MIB + _GRAPH_MIB_PER_LAYER_HIDDEN * layers * spec.hidden_size / par.tp
    )
    if spec.moe is not None:
        per_graph_mib *= _GRAPH_MOE_FACTOR
    return math.ceil(graphs * per_graph_mib * 2**20)
