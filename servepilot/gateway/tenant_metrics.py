"""Admission by tenant (fair shares), for /metrics: requests admitted, queued and refused per
tenant, how long they waited, and those waiting now.

Label values are the tenants fleet.yaml names (the keys' tenants, keys without one being
their own, the weighted tenants, the anonymous and batch callers) plus "other": a label is
never made from what a client sent, so the series stay bounded whatever arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from servepilot.gateway.series import Histograms, gauge, histogram

OTHER = "other"
"""The label of a tenant fleet.yaml does not name."""


class TenantMetrics:
    """Per-tenant admission counts and queue waits; the hot path bumps a plain int or a
    bucket count."""

    __slots__ = ("admitted", "labels", "queued", "rejected", "wait")

    def __init__(self, tenants: Iterable[str] = ()) -> None:
        self.labels: dict[str, str] = {tenant: tenant for tenant in tenants}
        self.labels[OTHER] = OTHER
        # At 0 from the start: a tenant that was never refused still has the series its
        # dashboard and alerts read.
        self.admitted = dict.fromkeys(self.labels.values(), 0)
        self.queued = dict.fromkeys(self.labels.values(), 0)
        self.rejected = dict.fromkeys(self.labels.values(), 0)
        self.wait = Histograms()

    def label(self, tenant: str) -> str:
        return self.labels.get(tenant, OTHER)

    def count_admitted(self, tenant: str) -> None:
        """It got a replica slot (at once or after waiting)."""
        self.admitted[self.labels.get(tenant, OTHER)] += 1

    def count_queued(self, tenant: str) -> None:
        self.queued[self.labels.get(tenant, OTHER)] += 1

    def count_rejected(self, tenant: str) -> None:
        """Admission refused it (429 or 503)."""
        self.rejected[self.labels.get(tenant, OTHER)] += 1

    def observe_wait(self, tenant: str, wait_s: float) -> None:
        """Time it waited in the gateway's queue."""
        self.wait.observe((self.label(tenant),), wait_s)

    def families(self, waiting: Mapping[str, int] | None) -> Iterator[Metric]:
        """The counters, the queue waits, and the gauge of requests waiting per tenant
        (`waiting`: the queue's `depth_by_tenant`; None while no dispatcher is watched)."""
        rows = (
            ("admitted", "given a replica slot", self.admitted),
            ("queued", "that waited in the gateway's queue", self.queued),
            ("rejected", "refused by admission (429/503)", self.rejected),
        )
        for name, what, counts in rows:
            family = CounterMetricFamily(
                f"servepilot_tenant_{name}", f"Requests {what}, by tenant.", labels=["tenant"]
            )
            for tenant, count in counts.items():
                family.add_metric([tenant], count)
            yield family
        yield histogram("tenant_queue_wait_seconds", "Time a request waited in the "
                        "gateway's queue, by tenant.", ["tenant"], self.wait)  # fmt: skip
        if waiting is None:
            return
        depth = dict.fromkeys(self.labels.values(), 0)
        for tenant, count in waiting.items():
            depth[self.label(tenant)] += count
        now = gauge("tenant_queue_depth", "Requests waiting in the gateway's queue now, by tenant.",
                    ["tenant"])  # fmt: skip
        for tenant, count in depth.items():
            now.add_metric([tenant], count)
        yield now
