"""The batch scheduler's Prometheus metrics, registered in the gateway's registry."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from servepilot.gateway.batch.scheduler import BatchScheduler


class BatchCollector:
    def __init__(self, scheduler: BatchScheduler) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        scheduler = self._scheduler
        yield GaugeMetricFamily(
            "servepilot_batch_window",
            "Batch lines allowed in flight now (the AIMD window)",
            value=scheduler.window.limit,
        )
        yield GaugeMetricFamily(
            "servepilot_batch_lines_in_flight", "Batch lines sent and not answered yet",
            value=scheduler.in_flight,
        )  # fmt: skip
        lines = CounterMetricFamily(
            "servepilot_batch_lines",
            "Batch line answers since the gateway started, by outcome: completed (2xx, in the "
            "output file), failed (in the error file), stepped_aside (429/503: sent again "
            "later), retried (the replica failed: sent again)",
            labels=["outcome"],
        )
        for outcome, count in sorted(scheduler.outcomes.items()):
            lines.add_metric([outcome], count)
        yield lines
