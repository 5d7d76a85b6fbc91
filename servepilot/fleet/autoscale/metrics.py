"""The controller's metrics, served on the gateway's /metrics (a collector added to its
registry, read at scrape time like the gateway's own)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from servepilot.fleet.autoscale.controller import AutoscaleController


class AutoscaleCollector:
    def __init__(self, controller: AutoscaleController) -> None:
        self._controller = controller

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        c = self._controller
        last = c.last
        if last is not None:
            desired = GaugeMetricFamily(
                "servepilot_autoscale_desired_replicas",
                "Replicas the autoscaling policy wanted at its last decision.",
            )
            desired.add_metric([], last.desired)
            yield desired
            current = GaugeMetricFamily(
                "servepilot_autoscale_current_replicas",
                "Replicas ready or starting at the autoscaler's last decision.",
            )
            current.add_metric([], last.current)
            yield current
        decisions = CounterMetricFamily(
            "servepilot_autoscale_decisions",
            "Autoscaling decisions, by direction (up, down, hold) and the policy's reason.",
            labels=["direction", "reason"],
        )
        for (direction, reason), count in sorted(c.decisions.items()):
            decisions.add_metric([direction, reason], count)
        yield decisions
        errors = CounterMetricFamily(
            "servepilot_autoscale_errors",
            "Changes the autoscaler could not make (a launch, drain or stop that failed); "
            "each is tried again at a later tick.",
        )
        errors.add_metric([], c.errors)
        yield errors
        gave_up = CounterMetricFamily(
            "servepilot_autoscale_gave_up",
            "Replicas removed because they were still not ready past the startup budget "
            "(engine.startup_timeout_s): a pod never scheduled, an image never pulled.",
        )
        gave_up.add_metric([], c.gave_up)
        yield gave_up
        unstopped = GaugeMetricFamily(
            "servepilot_autoscale_unstopped_replicas",
            "Replicas drained out of the gateway whose stop failed: they serve nothing and "
            "still cost; the autoscaler stops them again every tick until the backend does.",
        )
        unstopped.add_metric([], len(c.unstopped))
        yield unstopped
        yield from _pool_families(c)


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
    target = GaugeMetricFamily(
        "servepilot_autoscale_pool_target_replicas",
        "Replicas the autoscaler keeps in the warm pool (replicas.asleep).",
    )
    target.add_metric([], c.pool_target)
    yield target
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
    held = GaugeMetricFamily(
        "servepilot_autoscale_cold_starts_held",
        "1 when cold starts are held: a replica failed to start, and so did its replacement "
        "(see `status` and the replicas' logs); wakes from the warm pool go on.",
    )
    held.add_metric([], 1 if c.starts.held else 0)
    yield held
