"""Throughput and latency of a planned replica, from the step cost model.

Two points per replica, in bench's units (ms, tokens/s, requests/s), so a plan can be held
against `servepilot bench` or `servepilot sim` of the same configuration:

- idle: one request alone: its prefill step is its TTFT, each decode step one TPOT.
- capacity: the steady state with as many requests in flight as the replica holds (the
  smaller of max_num_seqs and what its KV cache holds at the traffic's mean lengths), or as
  many as the per-step token budget lets through. Each engine step then carries the
  decodes of the running requests and the prefills of the requests that replace the
  finished ones; its time is the cost model's for that mix.

Replicas that share a GPU (hardware.replicas_per_gpu) take turns on it: at capacity, with
all of them busy, each one's steps take replicas_per_gpu times as long (the GPU time-slices
between processes); alone, a request runs at the GPU's full speed.

A fluid approximation, not a simulation: every request has the mean prompt and output
length, a prompt is prefilled within one step (its chunks' attention pairs are counted all
the same), no prefix-cache hits, no preemption, and no request waits for the token budget
(TTFT at capacity is one step carrying its prefill). Against the replica simulator in
closed loop at the capacity concurrency (tests/unit/test_plan_estimate.py), throughput and
TPOT agree within a few percent; TTFT is low where prefills crowd the token budget, where
queues form. `servepilot sim` predicts the rest (queues, bursts, mixes).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from servepilot.plan.costmodel import CostModel, StepShape, prefill_pairs


class Limit(enum.Enum):
    """What stops a replica from taking more requests at once."""

    MAX_NUM_SEQS = "max_num_seqs"
    KV_CACHE = "kv_cache"
    TOKEN_BUDGET = "max_num_batched_tokens"


@dataclass(frozen=True, slots=True)
class LoadPoint:
    concurrency: float
    """Requests in flight on the replica."""
    step_ms: float
    ttft_ms: float
    tpot_ms: float
    output_tokens_per_s: float
    requests_per_s: float


@dataclass(frozen=True, slots=True)
class Estimates:
    source: str
    """The cost model's: "roofline: ..." or "calibrated: ..."."""
    idle: LoadPoint
    capacity: LoadPoint
    limit: Limit
    replicas: int
    replicas_for_target: int | None
    """Replicas the target QPS needs at capacity; None without a target."""

    @property
    def fleet_output_tokens_per_s(self) -> float:
        return self.capacity.output_tokens_per_s * self.replicas

    @property
    def fleet_requests_per_s(self) -> float:
        return self.capacity.requests_per_s * self.replicas


@dataclass(frozen=True, slots=True)
class ReplicaLoad:
    """What the estimate needs to know about one replica and its traffic."""

    input_tokens: int
    output_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int


def estimate(
    cost: CostModel,
    load: ReplicaLoad,
    *,
    replicas: int,
    target_qps: float | None,
    replicas_per_device: int = 1,
) -> Estimates:
    capacity, limit = _capacity(cost, load)
    capacity = _time_sliced(capacity, replicas_per_device)
    needed = None
    if target_qps is not None:
        needed = max(1, math.ceil(target_qps / capacity.requests_per_s))
    return Estimates(
        source=cost.source,
        idle=_idle(cost, load),
        capacity=capacity,
        limit=limit,
        replicas=replicas,
        replicas_for_target=needed,
    )


def _time_sliced(point: LoadPoint, replicas_per_device: int) -> LoadPoint:
    """`point` when `replicas_per_device` replicas, all as busy, take turns on the device."""
    n = replicas_per_device
    return LoadPoint(
        concurrency=point.concurrency,
        step_ms=point.step_ms * n,
        ttft_ms=point.ttft_ms * n,
        tpot_ms=point.tpot_ms * n,
        output_tokens_per_s=point.output_tokens_per_s / n,
        requests_per_s=point.requests_per_s / n,
    )


def _idle(cost: CostModel, load: ReplicaLoad) -> LoadPoint:
    prompt, output = load.input_tokens, load.output_tokens
    prefill_s = _prefill_alone_s(cost, prompt, load.max_num_batched_tokens)
    tpot_s = cost.step_time_s(StepShape(0, 0, 1, prompt + output // 2, 0))
    e2e_s = prefill_s + (output - 1) * tpot_s
    return LoadPoint(
        concurrency=1.0,
        step_ms=tpot_s * 1e3,
        ttft_ms=prefill_s * 1e3,
        tpot_ms=tpot_s * 1e3,
        output_tokens_per_s=output / e2e_s,
        requests_per_s=1 / e2e_s,
    )


def _prefill_alone_s(cost: CostModel, prompt: int, budget: int) -> float:
    """A prompt alone, in chunks of the token budget (the last chunk yields the token)."""
    total, done = 0.0, 0
    while done < prompt:
        chunk = min(budget, prompt - done)
        total += cost.step_time_s(StepShape(chunk, 1, 0, done, prefill_pairs(chunk, done)))
        done += chunk
    return total


def _capacity(cost: CostModel, load: ReplicaLoad) -> tuple[LoadPoint, Limit]:
    prompt, output = load.input_tokens, load.output_tokens
    held = load.kv_capacity_tokens / (prompt + output)
    running, limit = float(load.max_num_seqs), Limit.MAX_NUM_SEQS
    if held < running:
        running, limit = held, Limit.KV_CACHE
    # Requests finishing per step: each yields `output` tokens, one from its prefill step
    # and the rest one per decode step; a step carries at most the budget's tokens.
    finishing = running / output
    by_budget = load.max_num_batched_tokens / (prompt + output - 1)
    if by_budget < finishing:
        finishing, limit = by_budget, Limit.TOKEN_BUDGET
        running = finishing * output
    decoders = finishing * (output - 1)
    # A request's own prefill rides on a step that carries, besides it, the mean number of
    # other prefills (arrivals seen from a request are size-biased: one more than average).
    tokens = finishing * prompt + decoders
    own_prefill_s = (
        cost.per_prefill_token_s * prompt
        + cost.per_prefill_seq_s
        + cost.per_prefill_pair_s * prefill_pairs(prompt, 0)
        + cost.token_ops_s(tokens + prompt)
        - cost.token_ops_s(tokens)
    )
    step_s = (
        cost.base_s
        + cost.per_prefill_token_s * finishing * prompt
        + cost.per_prefill_seq_s * finishing
        + cost.per_decode_seq_s * decoders
        + cost.per_context_token_s * decoders * (prompt + output / 2)
        + cost.per_prefill_pair_s * finishing * prefill_pairs(prompt, 0)
        + cost.token_ops_s(tokens)
    )
    return (
        LoadPoint(
            concurrency=running,
            step_ms=step_s * 1e3,
            ttft_ms=(step_s + own_prefill_s) * 1e3,
            tpot_ms=step_s * 1e3,
            output_tokens_per_s=finishing * output / step_s,
            requests_per_s=finishing / step_s,
        ),
        limit,
    )
