"""Streaming metrics of a simulated level, summarised exactly as bench summarises a measured one.

Definitions (DESIGN.md, bench/metrics.py): TTFT and E2E from the intended send time (open
loop) or the send time (closed loop) to the first and the last token at the client; TPOT =
(E2E - TTFT) / (output tokens - 1) per request with more than one token; ITL pooled over
requests; goodput = requests per second meeting every SLO; SLO attainment = their share of
all requests, failed ones included; the window is the first send to the last answer.

Storage stays compact for tens of millions of requests: per-request latencies go into
`array("d")` columns (8 bytes each, read by numpy without a copy), and ITL, which has one
sample per token, into a weighted histogram: every decoding request of a step has the same
gap (`StepResult.itl_s`), so a step adds one value with its decode count as the weight.
The histogram keeps exact values until it holds `EXACT_VALUES` distinct ones, then falls
back to logarithmic bins `ITL_BIN_REL` wide (percentiles within 0.01%).
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from servepilot.core.results import Load, LoadMode, Run, Stats
from servepilot.core.slo import Metric, Slo
from servepilot.sim.fleet.records import FleetStats

if TYPE_CHECKING:
    from collections.abc import Iterable

    from servepilot.sim.fleet.members import FleetRequest

EXACT_VALUES = 100_000
ITL_BIN_REL = 1e-4
_PERCENTILES = (50.0, 90.0, 99.0)


class WeightedHistogram:
    """Values with integer weights; percentiles as if each value were repeated `weight`
    times (numpy's default linear interpolation over that expanded sample)."""

    def __init__(self) -> None:
        self._exact: dict[float, int] | None = {}
        self._bins: dict[int, int] = {}
        self._scale = 1.0 / math.log1p(ITL_BIN_REL)
        self.count = 0
        self.total = 0.0

    def add(self, value: float, weight: int) -> None:
        self.count += weight
        self.total += value * weight
        exact = self._exact
        if exact is not None:
            exact[value] = exact.get(value, 0) + weight
            if len(exact) > EXACT_VALUES:
                self._to_bins()
            return
        key = math.floor(math.log(value) * self._scale) if value > 0 else -(2**62)
        bins = self._bins
        bins[key] = bins.get(key, 0) + weight

    def _to_bins(self) -> None:
        exact, self._exact = self._exact or {}, None
        for value, weight in exact.items():
            self.count -= weight
            self.total -= value * weight
            self.add(value, weight)

    def _values(self) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        if self._exact is not None:
            items = sorted(self._exact.items())
            return np.array([v for v, _ in items]), np.array([w for _, w in items])
        keys = sorted(self._bins)
        # A bin stands for its geometric middle.
        values = [math.exp((k + 0.5) / self._scale) if k > -(2**62) else 0.0 for k in keys]
        return np.array(values), np.array([self._bins[k] for k in keys])

    def stats_ms(self) -> Stats:
        if not self.count:
            return Stats(mean=None, p50=None, p90=None, p99=None, count=0)
        values, weights = self._values()
        ends = np.cumsum(weights)  # the expanded sample's last index of each value, plus 1
        out = []
        for q in _PERCENTILES:
            rank = q / 100.0 * (self.count - 1)
            low = math.floor(rank)
            i = int(np.searchsorted(ends, low, side="right"))
            j = int(np.searchsorted(ends, min(low + 1, self.count - 1), side="right"))
            out.append(float(values[i] + (values[j] - values[i]) * (rank - low)) * 1000.0)
        return Stats(
            mean=self.total / self.count * 1000.0, p50=out[0], p90=out[1], p99=out[2],
            count=self.count,
        )  # fmt: skip


def stats_ms(values_s: array[float]) -> Stats:
    """Mean and p50/p90/p99 in ms, as bench.metrics.stats computes them."""
    if not len(values_s):
        return Stats(mean=None, p50=None, p90=None, p99=None, count=0)
    arr = np.frombuffer(values_s, dtype=np.float64) * 1000.0
    p50, p90, p99 = np.percentile(arr, _PERCENTILES)
    return Stats(
        mean=float(arr.mean()), p50=float(p50), p90=float(p90), p99=float(p99), count=len(arr)
    )


class RunCollector:
    """One level's requests as they end; `run(load)` is its `core.results.Run`."""

    def __init__(self, slo: Slo) -> None:
        self._slo = slo
        self._ttft_limit = _limit_s(slo, Metric.TTFT)
        self._tpot_limit = _limit_s(slo, Metric.TPOT)
        self._e2e_limit = _limit_s(slo, Metric.E2E)
        self.ttft_s: array[float] = array("d")
        self.e2e_s: array[float] = array("d")
        self.tpot_s: array[float] = array("d")
        self.itl = WeightedHistogram()
        self.completed = 0
        self.failed = 0
        self.good = 0
        self.output_tokens = 0
        self.input_tokens = 0
        self.errors: Counter[str] = Counter()
        self.first_send_s = math.inf
        self.last_end_s = -math.inf
        self._engine_timed = 0
        self._engine_queue_s = 0.0
        self._engine_prefill_s = 0.0

    def ok(
        self, send_s: float, first_s: float, end_s: float, input_tokens: int, output_tokens: int
    ) -> None:
        """A measured request answered in full: first and last token at the client."""
        ttft = first_s - send_s
        e2e = end_s - send_s
        self.ttft_s.append(ttft)
        self.e2e_s.append(e2e)
        good = ttft <= self._ttft_limit and e2e <= self._e2e_limit
        if output_tokens > 1:
            tpot = (e2e - ttft) / (output_tokens - 1)
            self.tpot_s.append(tpot)
            good = good and tpot <= self._tpot_limit
        self.good += good
        self.completed += 1
        self.output_tokens += output_tokens
        self.input_tokens += input_tokens
        if send_s < self.first_send_s:
            self.first_send_s = send_s
        if end_s > self.last_end_s:
            self.last_end_s = end_s

    def answered(self, request: FleetRequest, first_s: float, end_s: float) -> None:
        """A measured request answered in full, its first and last token at the client at
        `first_s` and `end_s`: `ok`, and its time in its engine as vLLM splits it (queued,
        then from its first scheduled step to its first token)."""
        self.ok(request.arrival_s, first_s, end_s, request.prompt_tokens, request.output_tokens)
        scheduled, first = request.scheduled_s, request.first_token_s
        if scheduled is None or first is None:
            return
        self._engine_timed += 1
        self._engine_queue_s += scheduled - request.queued_s
        self._engine_prefill_s += first - scheduled

    def with_engine_times(self, stats: FleetStats) -> FleetStats:
        """`stats` with the mean engine times of `answered`'s requests, comparable with the
        differences of vLLM's histograms over a measured run."""
        n = self._engine_timed
        if not n:
            return stats
        return dataclasses.replace(
            stats,
            engine_queue_s=self._engine_queue_s / n,
            engine_prefill_s=self._engine_prefill_s / n,
        )

    def fail(self, send_s: float, end_s: float, reason: str) -> None:
        self.failed += 1
        self.errors[reason] += 1
        self.first_send_s = min(self.first_send_s, send_s)
        self.last_end_s = max(self.last_end_s, end_s)

    def cancel(self, requests: Iterable[FleetRequest], end_s: float) -> None:
        """`requests`, still unanswered at `end_s`, fail as cancelled (warm-ups not counted)."""
        for request in requests:
            if not request.warmup:
                self.fail(request.arrival_s, end_s, "cancelled_at_end")

    @property
    def window_s(self) -> float:
        if self.completed + self.failed == 0:
            return 0.0
        return self.last_end_s - self.first_send_s

    def run(self, load: Load, peak_in_flight: int) -> Run:
        """`peak_in_flight`: the most requests in flight at once, warm-up ones included."""
        duration = self.window_s
        per_s = 1.0 / duration if duration > 0 else 0.0
        attempted = self.completed + self.failed
        run = Run(
            load=load,
            duration_s=duration,
            completed=self.completed,
            failed=self.failed,
            request_throughput=self.completed * per_s,
            output_throughput=self.output_tokens * per_s,
            total_token_throughput=(self.input_tokens + self.output_tokens) * per_s,
            ttft_ms=stats_ms(self.ttft_s),
            tpot_ms=stats_ms(self.tpot_s),
            itl_ms=self.itl.stats_ms(),
            e2e_ms=stats_ms(self.e2e_s),
            goodput_rps=self.good * per_s,
            slo_attainment=self.good / attempted if attempted else 0.0,
            input_tokens_mean=self.input_tokens / self.completed if self.completed else None,
            output_tokens_mean=self.output_tokens / self.completed if self.completed else None,
            errors=dict(self.errors),
            peak_in_flight=peak_in_flight,
            load_reached=_load_reached(load, peak_in_flight),
        )
        return self._slo.with_verdict(run)


def _load_reached(load: Load, peak_in_flight: int) -> bool:
    """bench's rule (bench/runner.py): a closed loop reached its load when as many requests
    as its concurrency were in flight at once; too few requests never get there. The
    simulated client sends every open-loop request on its schedule, so a rate is always
    reached (bench's shortfall is a client falling behind, which a simulation does not)."""
    return load.mode is LoadMode.RATE or peak_in_flight >= load.value


def _limit_s(slo: Slo, metric: Metric) -> float:
    """The per-request limit on `metric` in seconds (goodput's bound; inf when none is set)."""
    limit_ms = slo.per_request_ms(metric)
    return limit_ms / 1000.0 if limit_ms is not None else math.inf
