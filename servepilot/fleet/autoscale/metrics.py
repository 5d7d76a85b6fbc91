"""The controller's metrics, served on the gateway's /metrics (a collector added to its
registry, read at scrape time like the gateway's own)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from servepilot.fleet.autoscale.controller import AutoscaleController
from servepilot.scaling.adaptive_budget import Band


class AutoscaleCollector:
    def __init__(self, controller: AutoscaleController) -> None:
        self._controller = controller

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        c = self._controller
        last = c.last
        if last is not None:
            yield _gauge(
                "desired_replicas",
                last.desired,
                "Replicas the autoscaling policy wanted at its last decision.",
            )
            yield _gauge(
                "current_replicas",
                last.current,
                "Replicas ready or starting at the autoscaler's last decision.",
            )
        decisions = CounterMetricFamily(
            "servepilot_autoscale_decisions",
            "Autoscaling decisions, by direction (up, down, hold) and the policy's reason.",
            labels=["direction", "reason"],
        )
        for (direction, reason), count in sorted(c.decisions.items()):
            decisions.add_metric([direction, reason], count)
        yield decisions
        yield _counter(
            "errors",
            c.errors,
            "Changes the autoscaler could not make (a launch, drain, stop, sleep or "
            "wake that failed); each is tried again at a later tick.",
        )
        yield _counter(
            "gave_up",
            c.gave_up,
            "Replicas removed because they were still not ready past the startup "
            "budget (engine.startup_timeout_s): a pod never scheduled, an image "
            "never pulled.",
        )
        yield _gauge(
            "unstopped_replicas",
            len(c.unstopped),
            "Replicas drained out of the gateway whose stop failed: they serve "
            "nothing and still cost; the autoscaler stops them again every tick "
            "until the backend does.",
        )
        yield from _pool_families(c)
        if last is not None and last.budget is not None:
            yield from _budget_families(last.budget.budget, last.budget.band,
                                        last.budget.rate_rps)  # fmt: skip


def _gauge(name: str, value: float, doc: str) -> Metric:
    gauge = GaugeMetricFamily(f"servepilot_autoscale_{name}", doc)
    gauge.add_metric([], value)
    return gauge


def _counter(name: str, value: float, doc: str) -> Metric:
    counter = CounterMetricFamily(f"servepilot_autoscale_{name}", doc)
    counter.add_metric([], value)
    return counter


def _pool_families(c: AutoscaleController) -> Iterator[Metric]:
    """The warm pool and the starts: replicas held apart from those serving."""
    pool = GaugeMetricFamily(
        "servepilot_autoscale_pool_replicas",
        "The warm pool at the autoscaler's last decision, apart from the replicas serving: "
        "held (asleep: weights in host memory, GPU memory freed; or parked: running, all "
        "memory held) and on the way (a refill's cold start, or one falling asleep).",
        labels=["state"],
    )
    pool.add_metric(["held"], c.last_pool.asleep)
    pool.add_metric(["on_the_way"], c.last_pool.refilling)
    yield pool
    yield _gauge(
        "pool_target_replicas",
        c.pool_target,
        "Replicas the autoscaler keeps in the warm pool (replicas.asleep).",
    )
    starts = CounterMetricFamily(
        "servepilot_autoscale_replica_starts",
        "How the autoscaler added capacity: woken from the warm pool, or launched cold (to "
        "serve or to refill the pool); and launches that failed to start.",
        labels=["how"],
    )
    starts.add_metric(["wake"], c.wakes)
    starts.add_metric(["cold"], c.cold_starts)
    starts.add_metric(["failed"], c.starts.failed)
    yield starts
    yield _gauge(
        "cold_starts_held",
        1 if c.starts.held else 0,
        "1 when cold starts are held: a replica failed to start, and so did its "
        "replacement (see `status` and the replicas' logs); wakes from the warm "
        "pool go on.",
    )


def _budget_families(budget: int, band: Band, rate_rps: float) -> Iterator[Metric]:
    """The adaptive budget (autoscale.adaptive_budget) at the last decision."""
    yield _gauge(
        "replica_budget",
        budget,
        "Requests in flight per replica the adaptive budget set at the last decision "
        "(each replica's capped at its own hard capacity: servepilot_replica_capacity).",
    )
    bands = GaugeMetricFamily(
        "servepilot_autoscale_budget_band",
        "1 for the arrival-rate band the adaptive budget is in (low, middle, peak).",
        labels=["band"],
    )
    for each in Band:
        bands.add_metric([each.value], 1 if each is band else 0)
    yield bands
    yield _gauge(
        "budget_rate_rps",
        rate_rps,
        "The arrival rate the adaptive budget compared with its lines (requests/s, "
        "fleet-wide or per replica as autoscale.adaptive_budget.rate says).",
    )
