"""The gateway's own Prometheus metrics, in a registry per Gateway (tests run several).

Request and error counts are plain dict increments on the hot path, and per-replica gauges
are read from the pool only when /metrics is scraped: a prometheus_client labelled child
takes a lock per update, which the proxied request would pay for nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from servepilot.gateway.pool import ReplicaPool

# Upstream time to first byte spans a cached short answer (ms) to a long queued prefill (min).
_TTFB_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class GatewayMetrics:
    def __init__(self, pool: ReplicaPool) -> None:
        self.registry = CollectorRegistry()
        self._requests: dict[tuple[str, int], int] = {}
        self._errors: dict[str, int] = {}
        self.upstream_ttfb = Histogram(
            "servepilot_upstream_ttfb_seconds",
            "Time from sending a request to a replica to receiving its response headers.",
            buckets=_TTFB_BUCKETS_S,
            registry=self.registry,
        )
        self.registry.register(_StateCollector(self, pool))
        # process_resident_memory_bytes and CPU seconds of the gateway process: what a soak
        # test watches for leaks.
        ProcessCollector(registry=self.registry)

    def count_request(self, route: str, status: int) -> None:
        key = (route, status)
        self._requests[key] = self._requests.get(key, 0) + 1

    def count_error(self, reason: str) -> None:
        self._errors[reason] = self._errors.get(reason, 0) + 1

    def request_counts(self) -> dict[tuple[str, int], int]:
        return dict(self._requests)

    def error_counts(self) -> dict[str, int]:
        return dict(self._errors)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    def __init__(self, metrics: GatewayMetrics, pool: ReplicaPool) -> None:
        self._metrics = metrics
        self._pool = pool

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        requests, errors, in_flight, healthy = self._families()
        for (route, status), count in self._metrics.request_counts().items():
            requests.add_metric([route, str(status)], count)
        for reason, count in self._metrics.error_counts().items():
            errors.add_metric([reason], count)
        for info in self._pool.replicas():
            in_flight.add_metric([info.replica_id], info.in_flight)
            healthy.add_metric([info.replica_id], 1.0 if info.healthy else 0.0)
        return [requests, errors, in_flight, healthy]

    @staticmethod
    def _families() -> tuple[
        CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily, GaugeMetricFamily
    ]:
        return (
            CounterMetricFamily(
                "servepilot_requests_total",
                "Requests answered by the gateway, by route and HTTP status.",
                labels=["route", "code"],
            ),
            CounterMetricFamily(
                "servepilot_request_errors_total",
                "Requests that failed in or behind the gateway, by reason.",
                labels=["reason"],
            ),
            GaugeMetricFamily(
                "servepilot_in_flight_requests",
                "Requests sent to a replica and not yet finished.",
                labels=["replica"],
            ),
            GaugeMetricFamily(
                "servepilot_replica_healthy",
                "1 if the replica is in rotation, else 0.",
                labels=["replica"],
            ),
        )
