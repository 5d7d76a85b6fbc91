"""How long one vLLM engine step takes: a cost model linear in the step's shape.

A step (one forward pass of the v1 engine) is described by five counts (`StepShape`); its
time is `base + a x prefill tokens + b x prefill sequences + c x decode sequences + d x
context tokens + e x prefill attention pairs`. The last term is the quadratic part of a
prefill: a chunk's queries attend to the chunk itself, so a long prompt costs more than
its length says (on vLLM-CPU prefill time is visibly convex in the prompt's length).
The coefficients come either from a roofline of the model on an accelerator of the
planner's catalog (`roofline_cost_model`), or from measurements of a real replica
(`fit_cost_model`, saved and read back as a profile file by costprofile.py).

Linear is what the simulators that come closest to vLLM use (BLIS's alpha/beta model, the
llm-d simulator's prefill-time-per-token) and it can be fitted from a few hundred steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.hardware import Accelerator, AcceleratorKind
from servepilot.plan.memory import weight_bytes
from servepilot.plan.parallel import Parallelism
from servepilot.plan.spec import ModelSpec

COEFFICIENTS = (
    "base_s",
    "per_prefill_token_s",
    "per_prefill_seq_s",
    "per_decode_seq_s",
    "per_context_token_s",
    "per_prefill_pair_s",
)

# Nominal figures for what a roofline cannot see (calibration replaces all of them).
# Per step: vLLM v1's scheduler, input preparation and sampler launch. About 1 ms on a GPU
# with CUDA graphs; on a 2-core CPU the same Python work takes several times longer.
GPU_STEP_OVERHEAD_S = 1.0e-3
CPU_STEP_OVERHEAD_S = 5.0e-3
# Per scheduled sequence: its share of input preparation, sampling and output processing.
GPU_SEQ_OVERHEAD_S = 5.0e-6
CPU_SEQ_OVERHEAD_S = 50.0e-6
# One all-reduce's latency on NVLink / PCIe (NCCL ring, small messages).
ALLREDUCE_LATENCY_S = 10.0e-6
# Two all-reduces per decoder layer under tensor parallelism (after attention, after MLP).
_ALLREDUCES_PER_LAYER = 2
_ACTIVATION_BYTES = 2


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one engine step computes."""

    prefill_tokens: int
    """Prompt tokens computed this step (chunks included; prefix-cache hits excluded)."""
    prefill_seqs: int
    """Sequences with a prefill chunk this step."""
    decode_seqs: int
    """Sequences producing one token this step (not counting a prefill's first token)."""
    context_tokens: int
    """KV tokens attention reads: over the scheduled sequences, their tokens already in KV,
    where decoders share a cached prefix its tokens once (the simulated engine: a block the
    batch shares is read once from memory)."""
    prefill_pairs: int
    """Query-key pairs of the prefill chunks' attention: a chunk of c tokens after k in KV
    has c x k + c (c + 1) / 2 (`prefill_pairs`)."""


def prefill_pairs(chunk_tokens: int, computed_tokens: int) -> int:
    """Query-key pairs a prefill chunk's causal attention computes."""
    return chunk_tokens * computed_tokens + chunk_tokens * (chunk_tokens + 1) // 2


@dataclass(frozen=True, slots=True)
class CostModel:
    """Step time, linear in the step's shape; coefficients in seconds."""

    base_s: float
    per_prefill_token_s: float
    per_prefill_seq_s: float
    per_decode_seq_s: float
    per_context_token_s: float
    per_prefill_pair_s: float
    source: str
    """"roofline: <accelerator>/<model>" or "calibrated: <url> <date>"."""
    token_table_s: tuple[float, ...] = ()
    """Where a GPU operator profile times the step: seconds of the operators every token
    of the step passes through (linears, norms, activations, MoE experts) at 0, 1, 2, ...
    tokens, as measured; past its end, proportional to its last entry. No straight line
    fits them: they read the weights at any size (a floor) and grow with the tokens only
    past a knee, and a MoE layer's experts fill in as the tokens grow. Empty where the
    linear terms carry them (the roofline, a CPU calibration)."""
    eager_floor_s: float = 0.0
    """The least a step takes that runs without a CUDA graph (more tokens than
    `graph_max_tokens`): the host's time to launch it kernel by kernel, which the GPU waits
    for when its own work is shorter (DeepSeek-V2-Lite on vLLM 0.22: about 57 ms a prefill
    step, 72 ms traced, its kernels 20-40 ms). 0: none (a CPU replica, a roofline)."""
    eager_mixed_floor_s: float = 0.0
    """The same for a step that also carries decoders (the decode path's kernels too)."""
    eager_host_s: float = 0.0
    eager_host_per_seq_s: float = 0.0
    """The host's time between two launches where it is the bottleneck (a step run without a
    CUDA graph): taking the step before's outputs in and scheduling the next, a fixed part
    and a part for each sequence the step carries (vLLM's scheduler and output handling go
    request by request: DeepSeek-V2-Lite on an H100, 4 ms and 25 us a sequence, traced). A
    graph's step hides it behind the GPU's. 0: not measured."""
    graph_max_tokens: int = 0
    """The largest step vLLM runs as a CUDA graph (its largest capture size)."""

    def step_time_s(self, shape: StepShape) -> float:
        # The replica simulator computes this same expression, in this order
        # (sim/engine/steptime.py), so both agree to the last bit.
        tokens = shape.prefill_tokens + shape.decode_seqs
        duration = (
            self.base_s
            + self.per_prefill_token_s * shape.prefill_tokens
            + self.per_prefill_seq_s * shape.prefill_seqs
            + self.per_decode_seq_s * shape.decode_seqs
            + self.per_context_token_s * shape.context_tokens
            + self.per_prefill_pair_s * shape.prefill_pairs
            + self.token_ops_s(tokens)
        )
        floor = self.eager_launch_s(tokens, shape.decode_seqs, shape.prefill_seqs)
        return floor if duration < floor else duration

    def eager_launch_s(self, tokens: int, decode_seqs: int, prefill_seqs: int) -> float:
        """The host's time for a step of `tokens` launched kernel by kernel: 0 for one that
        replays a CUDA graph (at most `graph_max_tokens`), else the eager floor (with
        decoders, the mixed one) and the host's work beside the launch."""
        if tokens <= self.graph_max_tokens:
            return 0.0
        floor = self.eager_mixed_floor_s if decode_seqs else self.eager_floor_s
        return floor + self.eager_host_s + self.eager_host_per_seq_s * (prefill_seqs + decode_seqs)

    @classmethod
    def of(cls, coefficients: dict[str, float], *, source: str) -> CostModel:
        """The model of `COEFFICIENTS` by name (a profile's or the command line's)."""
        base, prefill_token, prefill_seq, decode_seq, context, pair = (
            coefficients[name] for name in COEFFICIENTS
        )
        return cls(base, prefill_token, prefill_seq, decode_seq, context, pair, source)

    def token_ops_s(self, tokens: float) -> float:
        """`token_table_s` at `tokens` (interpolated between whole tokens); 0 without one."""
        table = self.token_table_s
        if not table:
            return 0.0
        last = len(table) - 1
        if tokens > last:
            return table[last] * tokens / last
        whole = int(tokens)
        fraction = tokens - whole
        if not fraction:
            return table[whole]
        return table[whole] + (table[whole + 1] - table[whole]) * fraction

    @property
    def coefficients(self) -> tuple[float, float, float, float, float, float]:
        """In the order of `COEFFICIENTS`."""
        return (
            self.base_s,
            self.per_prefill_token_s,
            self.per_prefill_seq_s,
            self.per_decode_seq_s,
            self.per_context_token_s,
            self.per_prefill_pair_s,
        )


# ---- roofline ----------------------------------------------------------------------------


def active_params(spec: ModelSpec) -> int:
    """Parameters one token multiplies through, without the embedding lookup and the LM
    head (those are counted per sampled sequence): attention, dense MLPs, shared experts,
    norms and routers, and `experts_per_token` of the routed experts of each MoE layer."""
    if spec.params is None:
        raise ValueError(f"{spec.name}: parameters were not counted")
    p = spec.params
    routed = 0
    if spec.moe is not None and spec.moe.routed_experts:
        routed = p.routed_experts * spec.moe.experts_per_token // spec.moe.routed_experts
    return p.attention + p.dense_mlp + p.shared_experts + p.other + routed


def roofline_cost_model(
    spec: ModelSpec,
    accelerator: Accelerator,
    *,
    weights_dtype: WeightDtype,
    kv_bytes_per_token: float,
    tp: int = 1,
) -> CostModel:
    """A cost model from peak rates, for when no replica has been measured.

    `kv_bytes_per_token` is what one token adds to the KV cache of one rank
    (`KvCacheShape.bytes_per_token` of the same `tp`). Pipeline parallelism is not modelled.

    Assumptions (each one a source of error that calibration removes):
    - Ceilings are the catalog's measured ones where it has them (`measured_*`: H200),
      else the datasheet's peaks.
    - Every step reads all the weights on a rank once, at the peak memory bandwidth: the
      memory floor of a step, `base`. For MoE this overstates small batches, which touch
      only some experts.
    - Compute runs at the peak dense rate of the weights' format (`Accelerator.flops_for`),
      2 FLOPs per active parameter per token, split over `tp` ranks: no MFU discount.
    - Compute time and weight-reading time add up instead of overlapping (a roofline takes
      their max), so a step near the ridge point is overstated by up to 2x.
    - Each sampled sequence (prefill or decode) multiplies one token through the LM head
      (2 x vocab x hidden FLOPs); a decode sequence also costs one token's FLOPs.
    - Attention reads `kv_bytes_per_token` (per rank) for every context token at the peak
      bandwidth; a prefill's attention computes QK^T and PV (4 x layers x heads x head_dim
      FLOPs per query-key pair for GQA) at the peak rate. Decode attention FLOPs are not
      counted (reading the KV bounds it).
    - Under TP, every token crosses two all-reduces per layer on the intranode link (ring:
      2 (tp-1)/tp of the activation bytes), and each all-reduce adds a fixed latency.
    - A fixed per-step and per-sequence overhead (vLLM's Python side), nominal constants.
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    bandwidth = accelerator.roofline_bandwidth_bytes_per_s
    flops = accelerator.roofline_flops_for(weights_dtype) * tp
    cpu = accelerator.kind is AcceleratorKind.CPU
    per_rank_weights = weight_bytes(spec, weights_dtype, Parallelism(tp=tp)).per_rank
    token_s = 2 * active_params(spec) / flops
    head_s = 2 * spec.vocab_size * spec.hidden_size / flops
    comm_token_s, comm_step_s = allreduce_costs(spec, accelerator, tp)
    seq_s = CPU_SEQ_OVERHEAD_S if cpu else GPU_SEQ_OVERHEAD_S
    step_s = CPU_STEP_OVERHEAD_S if cpu else GPU_STEP_OVERHEAD_S
    return CostModel(
        base_s=per_rank_weights / bandwidth + step_s + comm_step_s,
        per_prefill_token_s=token_s + comm_token_s,
        per_prefill_seq_s=head_s + seq_s,
        per_decode_seq_s=token_s + comm_token_s + head_s + seq_s,
        per_context_token_s=kv_bytes_per_token / bandwidth,
        per_prefill_pair_s=spec.num_layers * _attention_flops_per_pair(spec) / flops,
        source=f"roofline: {accelerator.name}/{spec.name}",
    )


def _attention_flops_per_pair(spec: ModelSpec) -> int:
    """One layer's FLOPs for one query-key pair of a prefill: QK^T and PV over all heads
    (MLA prefills unabsorbed: keys of nope + rope dimensions, values of v_head_dim)."""
    if spec.mla is not None:
        mla = spec.mla
        width = mla.qk_nope_head_dim + mla.qk_rope_head_dim + mla.v_head_dim
        return 2 * spec.num_attention_heads * width
    return 4 * spec.num_attention_heads * spec.head_dim


def allreduce_costs(spec: ModelSpec, accelerator: Accelerator, tp: int) -> tuple[float, float]:
    """(seconds per token, seconds per step) of TP's all-reduces; zero without TP."""
    if tp == 1:
        return 0.0, 0.0
    # NVIDIA quotes NVLink and PCIe both directions together; a ring sends one way.
    link = accelerator.intranode_bytes_per_s or accelerator.internode_bytes_per_s * 2
    count = _ALLREDUCES_PER_LAYER * spec.num_layers
    bytes_per_token = count * spec.hidden_size * _ACTIVATION_BYTES * 2 * (tp - 1) / tp
    return bytes_per_token / (link / 2), count * ALLREDUCE_LATENCY_S


# ---- fitting -----------------------------------------------------------------------------

MIN_DISTINCT_SAMPLES = 10


def fit_cost_model(samples: Sequence[tuple[StepShape, float]], *, source: str) -> CostModel:
    """Coefficients >= 0 that best explain measured `(shape, seconds)` steps.

    Minimizes the squared *relative* error (each row weighted by 1 / its time), so the short
    decode steps that set TPOT count as much as the long prefill steps that set TTFT.
    A term the samples never vary (e.g. `prefill_pairs` when every prefill is short) is
    fitted as 0 rather than refused, except the four linear terms, whose absence means the
    measurement is unfit for the simulator.
    Raises ValueError when the samples cannot tell the linear terms apart: fewer than
    `MIN_DISTINCT_SAMPLES` distinct shapes, a term that never varies, or terms that move in
    lockstep."""
    rows = [(_features(shape), float(seconds)) for shape, seconds in samples]
    bad = [seconds for _, seconds in rows if not (math.isfinite(seconds) and seconds > 0)]
    if bad:
        raise ValueError(f"step times must be finite and > 0; got {bad[0]!r}")
    distinct = {features for features, _ in rows}
    if len(distinct) < MIN_DISTINCT_SAMPLES:
        raise ValueError(
            f"{len(distinct)} distinct step shapes; fitting needs at least "
            f"{MIN_DISTINCT_SAMPLES} (vary prompt lengths, batch sizes and context lengths)"
        )
    x = np.array([features for features, _ in rows], dtype=float)
    y = np.array([seconds for _, seconds in rows], dtype=float)
    _check_identifiable(x[:, :_LINEAR_TERMS])
    if np.linalg.matrix_rank(x / _column_scale(x)) < x.shape[1]:
        x[:, _LINEAR_TERMS:] = 0.0  # the quadratic term cannot be told apart: fit it as 0
    weights = 1.0 / y
    scale = _column_scale(x)
    solution = nnls(x / scale * weights[:, None], y * weights) / scale
    values = [float(v) for v in solution]
    return CostModel(
        base_s=values[0],
        per_prefill_token_s=values[1],
        per_prefill_seq_s=values[2],
        per_decode_seq_s=values[3],
        per_context_token_s=values[4],
        per_prefill_pair_s=values[5],
        source=source,
    )


def _features(shape: StepShape) -> tuple[int, int, int, int, int, int]:
    return (
        1,
        shape.prefill_tokens,
        shape.prefill_seqs,
        shape.decode_seqs,
        shape.context_tokens,
        shape.prefill_pairs,
    )


_LINEAR_TERMS = 5
"""The base and the four linear terms; `prefill_pairs` follows."""


_Matrix = np.ndarray[Any, np.dtype[np.float64]]


def _column_scale(x: _Matrix) -> _Matrix:
    scale = np.abs(x).max(axis=0)
    return np.where(scale > 0, scale, 1.0)


def _check_identifiable(x: np.ndarray[Any, np.dtype[np.float64]]) -> None:
    names = ("prefill_tokens", "prefill_seqs", "decode_seqs", "context_tokens")
    still = [name for name, column in zip(names, x[:, 1:].T, strict=True) if np.ptp(column) == 0]
    if still:
        raise ValueError(
            f"the samples never vary {', '.join(still)}: its cost cannot be told apart from "
            "the base time; measure steps where it changes"
        )
    scaled = x / np.abs(x).max(axis=0)
    if np.linalg.matrix_rank(scaled) < x.shape[1]:
        raise ValueError(
            "the samples' terms move in lockstep (e.g. every prefill has the same length), "
            "so their costs cannot be separated; vary them independently"
        )


def nnls(
    a: np.ndarray[Any, np.dtype[np.float64]],
    b: np.ndarray[Any, np.dtype[np.float64]],
    *,
    max_iter: int | None = None,
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """argmin ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method; scipy is
    not a dependency). Meant for a handful of columns."""
    rows, cols = a.shape
    x = np.zeros(cols)
    passive = np.zeros(cols, dtype=bool)
    tolerance = 10 * np.finfo(float).eps * np.linalg.norm(a, 1) * max(rows, cols)
    for _ in range(max_iter or 3 * cols):
        gradient = a.T @ (b - a @ x)
        candidates = ~passive & (gradient > tolerance)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, gradient, -np.inf))] = True
        x = _nnls_inner(a, b, x, passive, tolerance)
    return x


def _nnls_inner(
    a: np.ndarray[Any, np.dtype[np.float64]],
    b: np.ndarray[Any, np.dtype[np.float64]],
    x: np.ndarray[Any, np.dtype[np.float64]],
    passive: np.ndarray[Any, np.dtype[np.bool_]],
    tolerance: float,
) -> np.ndarray[Any, np.dtype[np.float64]]:
    """Solve on the passive set; step back toward feasibility while a variable goes < 0."""
    while True:
        z = np.zeros_like(x)
        z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
        if (z[passive] > tolerance).all():
            return z
        blocking = passive & (z <= tolerance)
        gap = x[blocking] - z[blocking]
        # A variable already at 0 (gap 0) blocks at once: alpha 0 drops it.
        alpha = float(np.min(np.where(gap > 0, x[blocking] / np.where(gap > 0, gap, 1.0), 0.0)))
        x = x + alpha * (z - x)
        passive &= x > tolerance
        x[~passive] = 0.0
