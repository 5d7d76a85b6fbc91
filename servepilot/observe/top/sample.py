"""One look at a running fleet: what the gateway's /metrics and /admin/replicas and each
replica's /metrics said at one moment. Built from parsed pages (engine.metrics' `scrape`, the
one parser), so it is tested on recorded text.

The gateway's own series (`servepilot_*`) are read by their exact names; vLLM's through the
metric-name resolver, so a replica of old vLLM or under Ray reads the same.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servepilot.engine.metrics import EngineMetric, Histogram, Scrape
from servepilot.observe.promql import GENERATION_ROUTES

CLASSES = ("0", "1", "2")
"""The gateway's priority classes (X-Priority), the `class` label of its series."""
DESIRED_REPLICAS = "servepilot_autoscale_desired_replicas"
TTFT = "servepilot_ttft_seconds"


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """One replica as the gateway sees it (/admin/replicas), with what its own page adds."""

    replica_id: str
    url: str
    healthy: bool
    in_flight: int
    running: int
    waiting: int
    kv_cache_usage: float
    """0..1."""
    sleep: str = "awake"
    """The warm pool's state (awake, asleep, parked, waking, falling asleep)."""
    preemptions_total: float | None = None
    """vLLM's counter since the replica started; None when its page was not read."""


@dataclass(frozen=True, slots=True)
class FleetSample:
    at_s: float
    """When it was taken (the caller's clock, in seconds)."""
    replicas: tuple[ReplicaState, ...]
    queue_depth: Mapping[str, int]
    """Requests waiting in the gateway's queue, by class."""
    ttft_by_class: Mapping[str, Histogram]
    """The gateway's TTFT histogram by class (queue wait included), cumulative."""
    sheds_total: Mapping[str, float]
    """Requests shed since the gateway started, by reason."""
    sheds_by_class: Mapping[str, float]
    """The same, by class."""
    tpot: Histogram
    """vLLM's TPOT histogram summed over the replicas whose page was read, cumulative."""
    desired_replicas: float | None = None
    """The autoscaler's last decision; None when the fleet has no autoscaler."""
    degradation_level: int = 0
    problems: tuple[str, ...] = field(default=())
    """What could not be read (a replica's page that did not answer, ...)."""


def replica_states(admin: Sequence[Mapping[str, Any]]) -> tuple[ReplicaState, ...]:
    """The rows of the gateway's /admin/replicas answer, by replica id (r2 before r10): the
    gateway lists them in the order they joined, which a live look and a replay of the same
    fleet must not depend on."""
    rows = sorted(admin, key=lambda row: _natural(str(row.get("id"))))
    return tuple(
        ReplicaState(
            replica_id=str(row.get("id")),
            url=str(row.get("url")),
            healthy=bool(row.get("healthy")),
            in_flight=int(row.get("in_flight") or 0),
            running=int(row.get("running") or 0),
            waiting=int(row.get("waiting") or 0),
            kv_cache_usage=float(row.get("kv_cache_usage") or 0.0),
            sleep=str(row.get("sleep", "awake")),
        )
        for row in rows
    )


def _natural(replica_id: str) -> tuple[tuple[int, str], ...]:
    return tuple((int(part), "") if part.isdigit() else (-1, part)
                 for part in re.split(r"(\d+)", replica_id))  # fmt: skip


def fleet_sample(
    at_s: float,
    gateway: Scrape,
    replicas: tuple[ReplicaState, ...],
    replica_pages: Mapping[str, Scrape],
    problems: tuple[str, ...] = (),
) -> FleetSample:
    """A sample from the gateway's page, its replica rows and the replicas' pages that were
    read (by replica id)."""
    with_preemptions = tuple(
        _with_preemptions(r, replica_pages[r.replica_id]) if r.replica_id in replica_pages else r
        for r in replicas
    )
    desired = gateway.samples.get(DESIRED_REPLICAS)
    level = gateway.samples.get("servepilot_degradation_level")
    return FleetSample(
        at_s=at_s,
        replicas=with_preemptions,
        queue_depth={c: int(_sum(gateway, "servepilot_queue_depth", cls=c)) for c in CLASSES},
        ttft_by_class={c: gateway_latency(gateway, TTFT, cls=c) for c in CLASSES},
        sheds_total=_by_label(gateway, "servepilot_shed_total", "reason"),
        sheds_by_class=_by_label(gateway, "servepilot_shed_total", "class"),
        tpot=add(*(page.histogram(EngineMetric.TPOT) for page in replica_pages.values())),
        desired_replicas=sum(s.value for s in desired) if desired else None,
        degradation_level=int(level[0].value) if level else 0,
        problems=problems,
    )


def _with_preemptions(replica: ReplicaState, page: Scrape) -> ReplicaState:
    if not page.has(EngineMetric.PREEMPTIONS):
        return replica
    return dataclasses.replace(replica, preemptions_total=page.total(EngineMetric.PREEMPTIONS))


def histogram(page: Scrape, family: str, **labels: str) -> Histogram:
    """A `servepilot_*` histogram summed over the label sets that carry `labels` (`cls` stands
    for the `class` label, a Python keyword)."""
    wanted = _labels(labels)
    buckets: dict[float, float] = defaultdict(float)
    for sample in page.samples.get(f"{family}_bucket", ()):
        if wanted.items() <= sample.labels.items():
            buckets[float(sample.labels["le"])] += sample.value
    return Histogram(
        buckets=tuple(sorted(buckets.items())),
        count=_sum(page, f"{family}_count", **labels),
        sum=_sum(page, f"{family}_sum", **labels),
    )


def gateway_latency(page: Scrape, family: str, **labels: str) -> Histogram:
    """A gateway latency histogram (`servepilot_ttft_seconds`, `servepilot_e2e_seconds`) over
    the routes that generate text: their latency is the fleet's, a pooling call's is not."""
    return add(*(histogram(page, family, route=route, **labels) for route in GENERATION_ROUTES))


def add(*histograms: Histogram) -> Histogram:
    """Histograms of the same buckets summed (replicas of one fleet)."""
    buckets: dict[float, float] = defaultdict(float)
    for h in histograms:
        for bound, count in h.buckets:
            buckets[bound] += count
    return Histogram(
        buckets=tuple(sorted(buckets.items())),
        count=sum(h.count for h in histograms),
        sum=sum(h.sum for h in histograms),
    )


def _sum(page: Scrape, name: str, **labels: str) -> float:
    wanted = _labels(labels)
    return sum(s.value for s in page.samples.get(name, ()) if wanted.items() <= s.labels.items())


def _by_label(page: Scrape, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for sample in page.samples.get(name, ()):
        out[sample.labels.get(label, "")] += sample.value
    return dict(out)


def _labels(labels: Mapping[str, str]) -> dict[str, str]:
    return {("class" if key == "cls" else key): value for key, value in labels.items()}
