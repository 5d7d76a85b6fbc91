"""Batch utilisation and cost per QPS: the seeds' gauges that no exporter has.

vLLM exports requests running but not max_num_seqs, and nothing knows what the fleet costs,
so whoever launches the fleet tells the gateway both (`FleetFacts`). Everything here runs at
scrape time, from state the gateway already keeps; the hot path pays nothing for it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric

from servepilot.gateway.replica import ReplicaInfo, SleepState
from servepilot.gateway.series import gauge

INFERENCE_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions"})
QPS_WINDOW_S = 300.0
"""Sustained QPS is measured over 5 minutes: the window of the seeds' batch utilisation alert."""
_MIN_SAMPLE_GAP_S = 1.0


@dataclass(frozen=True, slots=True)
class FleetFacts:
    """What the gateway cannot learn from its replicas' /metrics."""

    max_num_seqs: int
    """vLLM's --max-num-seqs of every replica (its default when not set)."""
    replica_usd_per_hour: float | None
    """What one replica's share of the hardware costs per hour, at the catalog's price; None
    when the accelerator has no price (no cost gauges then)."""


class QpsWindow:
    """Answered requests per second over the last `window_s`, from the running total that
    each scrape reads: the pairs kept are one per second at most, so memory is bounded."""

    def __init__(
        self, window_s: float = QPS_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window_s = window_s
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def update(self, answered_total: int) -> float | None:
        """The sustained rate, None until two scrapes are at least a second apart."""
        now = self._clock()
        samples = self._samples
        if not samples or now - samples[-1][0] >= _MIN_SAMPLE_GAP_S:
            samples.append((now, answered_total))
        while len(samples) > 2 and now - samples[1][0] >= self._window_s:
            samples.popleft()
        first_s, first_total = samples[0]
        if now - first_s < _MIN_SAMPLE_GAP_S:
            return None
        return (answered_total - first_total) / (now - first_s)


def answered(requests: Mapping[tuple[str, ...], int]) -> int:
    """Inference requests answered without an error, from the gateway's (route, code) counts."""
    return sum(
        count
        for (route, code), count in list(requests.items())
        if route in INFERENCE_ROUTES and code.startswith(("2", "3"))
    )


def batch_families(facts: FleetFacts, replicas: Sequence[ReplicaInfo]) -> Iterator[Metric]:
    per_replica = gauge(
        "batch_utilization",
        "vLLM's requests running / max_num_seqs, per replica (0..1): below 0.7 for 5 minutes "
        "the batch is underfilled.",
        ["replica"],
    )
    for r in replicas:
        per_replica.add_metric([r.replica_id], r.running / facts.max_num_seqs)
    yield per_replica
    live = [r for r in replicas if r.serving]
    if live:
        fleet = gauge(
            "fleet_batch_utilization", "Requests running over the ready replicas' max_num_seqs."
        )
        fleet.add_metric([], sum(r.running for r in live) / (facts.max_num_seqs * len(live)))
        yield fleet


def pool_families(replicas: Sequence[ReplicaInfo]) -> Iterator[Metric]:
    """The warm pool: replicas held asleep or parked (not routed to, not counted as ready)."""
    asleep = gauge("replicas_asleep", "Replicas held asleep (vLLM's sleep mode): a warm pool "
                   "that wakes in about a second, not routed to; each holds its weights in "
                   "host memory, its GPU memory freed.")  # fmt: skip
    asleep.add_metric([], float(sum(1 for r in replicas if r.sleep is SleepState.ASLEEP)))
    yield asleep
    parked = gauge("replicas_parked", "Replicas parked (no sleep mode: vLLM on CPU): loaded "
                   "and running, not routed to; back in rotation at once; each holds all "
                   "its memory.")  # fmt: skip
    parked.add_metric([], float(sum(1 for r in replicas if r.sleep is SleepState.PARKED)))
    yield parked


def cost_families(
    facts: FleetFacts, replicas: Sequence[ReplicaInfo], qps: float | None
) -> Iterator[Metric]:
    if facts.replica_usd_per_hour is None:
        return
    usd_per_hour = facts.replica_usd_per_hour * sum(1 for r in replicas if not r.draining)
    hourly = gauge(
        "fleet_cost_usd_per_hour", "What the fleet's replicas cost per hour (hardware catalog)."
    )
    hourly.add_metric([], usd_per_hour)
    yield hourly
    pool = gauge(
        "warm_pool_cost_usd_per_hour",
        "The part of fleet_cost_usd_per_hour held by the warm pool (replicas asleep or "
        "parked, serving nothing): a sleeping replica frees its GPU memory but keeps its GPU "
        "(billed all the same unless something else uses it) and its weights in host memory.",
    )
    pool.add_metric([], facts.replica_usd_per_hour * sum(1 for r in replicas if r.sleep.held))
    yield pool
    if qps is None:
        return
    sustained = gauge("sustained_qps", "Inference requests answered per second, last 5 min.")
    sustained.add_metric([], qps)
    yield sustained
    if qps > 0:
        # Undefined without traffic (an idle fleet is the batch utilisation alert's case).
        per_qps = gauge(
            "cost_usd_per_qps_hour",
            "Fleet dollars per hour / sustained requests per second: what one QPS costs per "
            "hour (the alert's line is 0.1).",
        )
        per_qps.add_metric([], usd_per_hour / qps)
        yield per_qps
