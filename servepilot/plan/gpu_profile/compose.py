"""A step's time composed from measured operators: the second source of step times, beside
the roofline (costmodel.py), behind the same `CostModel` the planner and simulator use.

`StepComposer.step_time_s(shape)` is the sum, over the operators of the profile, of
count x the measured time at the step's size (interpolated: table.py), plus what one GPU
cannot measure or does not run:
- tensor-parallel all-reduces, from the catalog's interconnect bandwidth and latency
  (catalogued, not measured: the profile is taken on one GPU);
- a per-step and per-sequence CPU overhead (vLLM's scheduler, input preparation, sampling),
  the roofline's nominal constants.

The sizes of a step: every linear runs over its tokens (prefill chunks + decodes), the LM
head over the sequences it samples, MLA's absorbed projections over decode tokens and its
kv_b_proj over prefill tokens; decode attention over (decode sequences, their mean
context); prefill attention over the chunks' query-key pairs.

`linearize` fits a `CostModel` to the composition over the steps a replica serving given
traffic runs (decode batches up to max_num_seqs at the traffic's contexts, with and without
a prefill chunk), so the simulator's step stays one multiply-add per coefficient; the fit's
error is returned with it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import (
    GPU_SEQ_OVERHEAD_S,
    GPU_STEP_OVERHEAD_S,
    CostModel,
    StepShape,
    allreduce_costs,
    fit_cost_model,
    prefill_pairs,
)
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.gpu_profile.table import GpuProfile
from servepilot.plan.hardware import Accelerator
from servepilot.plan.memory import capture_sizes
from servepilot.plan.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class StepComposer:
    profile: GpuProfile
    comm_token_s: float
    """TP all-reduce seconds per token of the step (catalogued link bandwidth)."""
    comm_step_s: float
    """TP all-reduce latency per step (catalogued)."""
    step_overhead_s: float = GPU_STEP_OVERHEAD_S
    seq_overhead_s: float = GPU_SEQ_OVERHEAD_S

    def token_ops_s(self, tokens: int) -> float:
        """The operators every token of a step passes through, at `tokens` tokens."""
        return sum(
            op.count * op.curve.at(tokens) for op in self.profile.token_ops if op.axis == "tokens"
        )

    def gpu_time_s(self, shape: StepShape) -> float:
        """The measured operators, what the step's prefill chunks add to them scaled by the
        profile's `prefill_scale`."""
        scale = self.profile.prefill_scale
        measured = self._operators_s(shape)
        if scale == 1.0 or not shape.prefill_tokens:
            return measured
        # The decoders' own context: `context_tokens` counts the chunks' cached tokens too.
        seqs = shape.decode_seqs + shape.prefill_seqs
        context = shape.context_tokens * shape.decode_seqs // seqs
        alone = self._operators_s(StepShape(0, 0, shape.decode_seqs, context, 0))
        return alone + scale * (measured - alone)

    def _operators_s(self, shape: StepShape) -> float:
        tokens = shape.prefill_tokens + shape.decode_seqs
        sizes = {
            "tokens": tokens,
            "sampled": shape.prefill_seqs + shape.decode_seqs,
            "decode": shape.decode_seqs,
            "prefill": shape.prefill_tokens,
        }
        total = sum(op.count * op.curve.at(sizes[op.axis]) for op in self.profile.token_ops)
        if shape.decode_seqs:
            # context_tokens counts the cached tokens of prefill chunks too; their attention
            # to it is in prefill_pairs, so decode attention gets the decoders' share.
            seqs = shape.decode_seqs + shape.prefill_seqs
            per_seq = shape.context_tokens / seqs
            total += self.decode_attention_s(shape.decode_seqs, per_seq)
        total += sum(
            op.count * op.curve.at(shape.prefill_pairs) for op in self.profile.prefill_attention
        )
        return total

    def decode_attention_s(self, decoders: int, context_tokens: float) -> float:
        """Decode attention of `decoders` sequences of `context_tokens` each, as vLLM's
        kernels run it: the operators' composition corrected by the profile's fixed part and
        scale (1 and 0 where no trace measured them)."""
        profile = self.profile
        operators = sum(
            op.count * op.at(decoders, context_tokens) for op in profile.decode_attention
        )
        if not profile.decode_attention:
            return operators
        return profile.decode_attention_fixed_s + profile.decode_attention_scale * operators

    def step_time_s(self, shape: StepShape) -> float:
        tokens = shape.prefill_tokens + shape.decode_seqs
        seqs = shape.prefill_seqs + shape.decode_seqs
        comm = self.comm_step_s + self.comm_token_s * tokens if tokens else 0.0
        return self.gpu_time_s(shape) + comm + self.step_overhead_s + self.seq_overhead_s * seqs


def composer(
    profile: GpuProfile,
    spec: ModelSpec,
    accelerator: Accelerator,
    *,
    tp: int,
    where: str,
    weights: WeightDtype | None = None,
) -> StepComposer:
    """The composer for `spec` served at `tp` (and `weights`, when given) on `accelerator`;
    the profile must have been taken for the same model, TP and weight format (its shapes
    are one rank's)."""
    if weights is not None and profile.dtype != weights.value:
        raise ConfigError(
            f"{where}: the profile times {profile.dtype} weights; the fleet runs {weights.value}",
            hint=f"profile it: servepilot profile --model {spec.name} --dtype {weights.value}",
        )
    if profile.model != spec.name:
        raise ConfigError(
            f"{where}: the profile is of {profile.model}, the fleet serves {spec.name}",
            hint=f"profile it: servepilot profile --model {spec.name}",
        )
    if profile.tp != tp:
        raise ConfigError(
            f"{where}: the profile's shapes are one rank of tp {profile.tp}; the fleet runs "
            f"tp {tp}",
            hint=f"profile it: servepilot profile --model {spec.name} --tp {tp}",
        )
    comm_token_s, comm_step_s = allreduce_costs(spec, accelerator, tp)
    if profile.step_overhead_s is None:
        return StepComposer(profile, comm_token_s, comm_step_s)
    return StepComposer(profile, comm_token_s, comm_step_s, profile.step_overhead_s)


_TABLE_TOKENS = 65536
"""Past this many tokens in a step the token operators are proportional (compute-bound)."""


@dataclass(frozen=True, slots=True)
class Operating:
    """The traffic and limits a replica is linearized for."""

    input_tokens: int
    output_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_context_tokens: int | None = None
    """The longest prompt the replica may be sent (the simulator: max_model_len). Its
    chunks, each attending to the ones before, are fitted too: a fit to the traffic's short
    chunks alone, where attention is launch-bound, put a 32,000-token prompt's TTFT at 9.3 s
    on an H100 that took 1.26 s."""

    cuda_graphs: bool = True
    """False with `enforce_eager`: vLLM captures no graph, and every step is launched eagerly."""

    @property
    def graph_max_tokens(self) -> int:
        """The largest step vLLM 0.22 runs as a CUDA graph at these limits."""
        if not self.cuda_graphs:
            return 0
        return max(capture_sizes(self.max_num_seqs, self.max_num_batched_tokens), default=0)


@dataclass(frozen=True, slots=True)
class Linearized:
    model: CostModel
    median_error: float
    """Relative, over the fitted steps."""
    max_error: float


def linearize(step: StepComposer, at: Operating) -> Linearized:
    """A `CostModel` of `step` for a replica at `at`: the token operators as measured (a
    table by the step's tokens), the rest (attention, sampling, overheads) linear, fitted
    over the steps such a replica runs."""
    table = tuple(
        step.token_ops_s(t) for t in range(min(at.max_num_batched_tokens, _TABLE_TOKENS) + 1)
    )
    steps = [(shape, step.step_time_s(shape)) for shape in _operating_steps(at)]
    rest = [(s, t - table_s(table, s.prefill_tokens + s.decode_seqs)) for s, t in steps]
    fitted = fit_cost_model(rest, source=f"{step.profile.source} (measured token operators)")
    model = replace(fitted, token_table_s=table)
    # The error is the linear fit's, against the composition, before the host's floor.
    errors = sorted(abs(model.step_time_s(s) / t - 1) for s, t in steps)
    profile = step.profile
    model = replace(
        model,
        eager_floor_s=profile.eager_step_s,
        eager_mixed_floor_s=profile.eager_mixed_step_s,
        eager_host_s=profile.eager_host_s,
        eager_host_per_seq_s=profile.eager_host_per_seq_s,
        graph_max_tokens=at.graph_max_tokens,
    )
    return Linearized(model, errors[len(errors) // 2], errors[-1])


def table_s(table: tuple[float, ...], tokens: int) -> float:
    last = len(table) - 1
    return table[tokens] if tokens <= last else table[last] * tokens / last


def _operating_steps(at: Operating) -> Iterator[StepShape]:
    prompt, output = max(1, at.input_tokens), max(1, at.output_tokens)
    batches = sorted({min(b, at.max_num_seqs) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)})
    contexts = (prompt, prompt + output // 2, prompt + output)
    chunk = min(prompt, at.max_num_batched_tokens)
    for b in batches:
        for context in contexts:
            yield StepShape(0, 0, b, b * context, 0)
            room = at.max_num_batched_tokens - b
            if room > 0:
                c = min(chunk, room)
                yield StepShape(c, 1, b, b * context, prefill_pairs(c, 0))
    # Bursts: a closed loop's start, an open loop past saturation: as many prompts as the
    # token budget holds, beside the decoders.
    for b in (0, *batches):
        fit = (at.max_num_batched_tokens - b) // chunk
        if fit > 1:
            pairs = fit * prefill_pairs(chunk, 0)
            yield StepShape(fit * chunk, fit, b, b * contexts[1], pairs)
    for size in sorted({chunk, max(1, chunk // 2), max(1, chunk // 4)}):
        yield StepShape(size, 1, 0, 0, prefill_pairs(size, 0))
        half = max(1, size // 2)
        yield StepShape(2 * half, 2, 0, 0, 2 * prefill_pairs(half, 0))
    longest, full = at.max_context_tokens or 0, at.max_num_batched_tokens
    for cached in range(0, max(0, longest - full) + 1, full) if longest > prompt else ():
        yield StepShape(full, 1, 0, 0, prefill_pairs(full, cached))
