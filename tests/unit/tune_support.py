"""Synthetic trials for the tune tests: bench runs with chosen goodput and latencies."""

from __future__ import annotations

import math
from collections.abc import Callable

from servepilot.core.results import Load, LoadMode, Run, Stats
from servepilot.tune.score import Measurement, Outcome
from servepilot.tune.space import Axis, Knob, SearchSpace, TrialConfig, ladder


def stats(p99: float) -> Stats:
    return Stats(mean=p99 / 2, p50=p99 / 2, p90=p99 * 0.9, p99=p99, count=20)


def run(
    value: float,
    goodput: float,
    *,
    ttft_ms: float = 100.0,
    tpot_ms: float = 10.0,
    failed: int = 0,
    throughput: float | None = None,
    e2e_ms: float | None = None,
) -> Run:
    rate = goodput if throughput is None else throughput
    return Run(
        load=Load(mode=LoadMode.CONCURRENCY, value=value),
        duration_s=10.0,
        completed=20,
        failed=failed,
        request_throughput=rate,
        output_throughput=rate * 10,
        total_token_throughput=rate * 20,
        ttft_ms=stats(ttft_ms),
        tpot_ms=stats(tpot_ms),
        itl_ms=stats(tpot_ms),
        e2e_ms=stats(e2e_ms if e2e_ms is not None else ttft_ms + 100 * tpot_ms),
        goodput_rps=goodput,
        slo_attainment=1.0,
    )


def peak(seqs: float, batched: float) -> float:
    """A unimodal goodput surface in log scale, highest at (48, 1024)."""
    return 10 * math.exp(
        -((math.log2(seqs) - math.log2(48)) ** 2) / 4 - ((math.log2(batched) - 10) ** 2) / 8
    )


def measured(config: TrialConfig, surface: Callable[[float, float], float]) -> Measurement:
    """A trial whose sweep filled its batch (load = 2 x max_num_seqs) within the SLA."""
    seqs = int(config.get(Knob.MAX_NUM_SEQS))
    batched = int(config.get(Knob.MAX_NUM_BATCHED_TOKENS))
    goodput = surface(seqs, batched)
    return Measurement(
        runs=(run(2 * seqs, goodput),),
        capacity=seqs,
        preemptions=0,
        kv_capacity_tokens=None,
        startup_s=0.0,
    )


def two_knob_space(default_seqs: int = 128, default_batched: int = 2048) -> SearchSpace:
    def check(config: TrialConfig) -> str | None:
        seqs, batched = config.get(Knob.MAX_NUM_SEQS), config.get(Knob.MAX_NUM_BATCHED_TOKENS)
        assert isinstance(seqs, int) and isinstance(batched, int)
        return None if batched >= seqs else "max_num_batched_tokens < max_num_seqs"

    return SearchSpace(
        axes=(
            Axis(Knob.MAX_NUM_SEQS, ladder(1, 512), 2),
            Axis(Knob.MAX_NUM_BATCHED_TOKENS, ladder(128, 8192), 2),
        ),
        default=TrialConfig.of(
            {Knob.MAX_NUM_SEQS: default_seqs, Knob.MAX_NUM_BATCHED_TOKENS: default_batched}
        ),
        check=check,
    )


class SurfaceRunner:
    """A trial runner over a synthetic surface; counts what it ran."""

    def __init__(
        self,
        surface: Callable[[float, float], float] = peak,
        fail: Callable[[TrialConfig], Outcome | None] | None = None,
    ) -> None:
        self.surface = surface
        self.fail = fail
        self.ran: list[TrialConfig] = []

    def run(self, config: TrialConfig) -> Outcome:
        self.ran.append(config)
        failure = self.fail(config) if self.fail is not None else None
        return failure if failure is not None else measured(config, self.surface)
