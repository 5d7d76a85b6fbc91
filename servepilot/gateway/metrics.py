"""The gateway's Prometheus metrics (all prefixed `servepilot_`), one registry per Gateway.

The hot path only bumps plain ints and bucket counts (`series`); everything is turned into
metric families when /metrics is scraped, together with the state read from the pool, the
dispatcher and the routing policy at that moment. docs/gateway.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, Metric

from servepilot.gateway.fleet_gauges import (
    FleetFacts,
    QpsWindow,
    answered,
    batch_families,
    cost_families,
    pool_families,
)
from servepilot.gateway.gpu_gauges import GpuGauges, gpu_families
from servepilot.gateway.replica import ReplicaInfo
from servepilot.gateway.series import Counts, Histogram, Histograms, counter, gauge, histogram
from servepilot.gateway.tenant_metrics import TenantMetrics
from servepilot.routing.admission.decision import Reason
from servepilot.routing.base import RoutingPolicy

if TYPE_CHECKING:
    from servepilot.gateway.access_log import AccessLog
    from servepilot.gateway.relay import Outcome
    from servepilot.routing.admission import AdmissionQueue, BreakerBoard, HardLimit, SoftLimit

_BREAKER_VALUE = {"closed": 0.0, "half_open": 1.0, "open": 2.0}


class _Watched(Protocol):
    """What the metrics read from the dispatcher at scrape time."""

    queue: AdmissionQueue[Any]
    breakers: BreakerBoard
    hard_limit: HardLimit
    soft_limit: SoftLimit


_CLASS = ("0", "1", "2")
_SHED_REASONS = (Reason.NO_REPLICA, Reason.DEGRADED, Reason.HARD_LIMIT, Reason.QUEUE_FULL,
                 Reason.QUEUE_BUDGET)  # fmt: skip
"""The reasons admission refuses a request with (429/503)."""


class RouteLatency:
    """The TTFT and E2E series of one inference route, one per class, bound once: the hot
    path indexes a list instead of building and hashing label keys. A series appears on its
    first observation, so a route nobody calls exports nothing."""

    __slots__ = ("_e2e", "_e2e_of", "_route", "_ttft", "_ttft_of")

    def __init__(self, route: str, ttft: Histograms, e2e: Histograms) -> None:
        self._route = route
        self._ttft = ttft
        self._e2e = e2e
        self._ttft_of: list[Histogram | None] = [None] * len(_CLASS)
        self._e2e_of: list[Histogram | None] = [None] * len(_CLASS)

    def observe(self, priority: int, ttft_s: float | None, e2e_s: float) -> None:
        """TTFT (streamed answers) and E2E as the gateway saw them, queue wait included."""
        if ttft_s is not None:
            ttft = self._ttft_of[priority]
            if ttft is None:
                ttft = self._ttft_of[priority] = self._ttft.series((self._route, _CLASS[priority]))
            ttft.observe(ttft_s)
        e2e = self._e2e_of[priority]
        if e2e is None:
            e2e = self._e2e_of[priority] = self._e2e.series((self._route, _CLASS[priority]))
        e2e.observe(e2e_s)


class ReplicaLister(Protocol):
    """What the metrics read from the pool (`ReplicaPool` is one)."""

    def replicas(self) -> list[ReplicaInfo]: ...


class GatewayMetrics:
    def __init__(self, pool: ReplicaLister, policy: RoutingPolicy) -> None:
        self.registry = CollectorRegistry()
        self._pool = pool
        self._policy = policy
        self._watched: _Watched | None = None
        self._access_log: AccessLog | None = None
        self.requests = Counts()
        self.errors = Counts()
        self.upstream = Counts()
        self.sheds = Counts()
        self.queued = Counts()
        self.tenants = TenantMetrics()
        self.retries = 0
        self.continuations = Counts()
        self.arrivals = 0
        """Generation requests that reached the gateway, ever (an autoscaler's arrival rate
        reads its increase; the hot path pays one increment)."""
        self.breaker_moves = Counts()
        self.degradation_steps = Counts()
        self.ttfb = Histograms()
        self.ttft = Histograms()
        self.e2e = Histograms()
        self.queue_wait = Histograms()
        # At 0 from the start for every label value known upfront: a fleet that never shed or
        # queued still has the series its dashboard panels and alerts read.
        for cls_ in _CLASS:
            self.queue_wait[(cls_,)] = Histogram()
            for reason in _SHED_REASONS:
                self.sheds[(str(reason), cls_)] = 0
        # The series every proxied request updates, bound once: the hot path indexes a dict
        # (by replica) instead of building and hashing label keys; see RouteLatency too.
        self._ttfb_of: dict[str, Histogram] = {}
        self.fleet_facts: FleetFacts | None = None
        self.qps = QpsWindow()
        self.gpus = GpuGauges()
        self.registry.register(_Collector(self))
        # process_resident_memory_bytes and CPU seconds of the gateway process: what a soak
        # test watches for leaks.
        ProcessCollector(registry=self.registry)

    def watch(self, dispatcher: _Watched) -> None:
        self._watched = dispatcher

    def know_tenants(self, tenants: Iterable[str]) -> None:
        """The tenants fleet.yaml names: the label values of the per-tenant series."""
        self.tenants = TenantMetrics(tenants)

    def watch_access_log(self, access_log: AccessLog | None) -> None:
        self._access_log = access_log

    def know_fleet(self, facts: FleetFacts) -> None:
        """Turn on batch utilisation and cost per QPS (the launcher knows max_num_seqs and
        the price; the replicas' /metrics do not say)."""
        self.fleet_facts = facts

    # --- hot path -------------------------------------------------------------------------

    def count_request(self, route: str, status: int) -> None:
        requests, key = self.requests, (route, str(status))
        requests[key] = requests.get(key, 0) + 1

    def count_error(self, reason: str) -> None:
        self.errors.add((reason,))

    def error_counts(self) -> dict[str, int]:
        return {key[0]: count for key, count in self.errors.items()}

    def count_shed(self, reason: str, priority: int) -> None:
        self.sheds.add((str(reason), _CLASS[priority]))

    def count_queued(self, priority: int) -> None:
        self.queued.add((_CLASS[priority],))

    def count_retry(self) -> None:
        self.retries += 1

    def count_continuation(self, reason: str) -> None:
        self.continuations.add((reason,))

    def observe_queue_wait(self, priority: int, tenant: str, wait_s: float) -> None:
        self.queue_wait.observe((_CLASS[priority],), wait_s)
        self.tenants.observe_wait(tenant, wait_s)

    def observe_outcome(self, replica_id: str, priority: int, outcome: Outcome | None) -> None:
        cls_ = _CLASS[priority]
        if outcome is None:
            result = "abandoned"
        elif outcome.timed_out:
            result = "timeout"
        elif outcome.failure is not None:
            result = "failed" if outcome.retryable else "interrupted"
        elif outcome.status >= 500:
            result = "5xx"
        else:
            result = "ok"
        upstream, key = self.upstream, (replica_id, cls_, result)
        upstream[key] = upstream.get(key, 0) + 1
        if outcome is not None and outcome.status:
            ttfb = self._ttfb_of.get(replica_id)
            if ttfb is None:
                ttfb = self._ttfb_of[replica_id] = self.ttfb.series((replica_id,))
            ttfb.observe(outcome.ttfb_s)

    def route_latency(self, route: str) -> RouteLatency:
        """The latency series of inference `route`, for its handler to bind once. Tokenizer
        calls get none: they are not inference, and a load tester makes thousands of them."""
        return RouteLatency(route, self.ttft, self.e2e)

    def count_degradation(self, level: int) -> None:
        self.degradation_steps.add((str(int(level)),))

    def count_breaker(self, replica_id: str, state: str) -> None:
        self.breaker_moves.add((replica_id, str(state)))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Collector:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        m = self._m
        yield counter("requests", "Requests answered, by route and HTTP status.",
                      ["route", "code"], m.requests)  # fmt: skip
        yield counter("request_errors", "Requests that failed in or behind the gateway, by "
                      "reason.", ["reason"], m.errors)  # fmt: skip
        yield counter("upstream_requests", "Requests sent to a replica, by replica, class "
                      "and result.", ["replica", "class", "result"], m.upstream)  # fmt: skip
        yield counter("shed", "Requests refused with 429/503 by admission, by reason and "
                      "class.", ["reason", "class"], m.sheds)  # fmt: skip
        yield counter("queued", "Requests that waited in the gateway's queue, by class.",
                      ["class"], m.queued)  # fmt: skip
        retries = CounterMetricFamily("servepilot_retries", "Requests sent to another "
                                      "replica after a failure before any answer.")  # fmt: skip
        retries.add_metric([], m.retries)
        yield retries
        yield counter("stream_continuations", "Streams sent on to another replica after "
                      "theirs failed mid-answer, by how it failed (reset, eof, stall, "
                      "out_of_rotation).", ["reason"], m.continuations)  # fmt: skip
        yield counter("breaker_transitions", "Circuit breaker state changes, by replica and "
                      "new state.", ["replica", "state"], m.breaker_moves)  # fmt: skip
        yield counter("degradation_steps", "Soft-limit degradation steps, by new level "
                      "(0 normal, 1 shed P2, 2 cap P1 max_tokens).", ["level"],
                      m.degradation_steps)  # fmt: skip
        yield histogram("upstream_ttfb_seconds", "Time from sending a request to a replica "
                        "to its response head.", ["replica"], m.ttfb)  # fmt: skip
        yield histogram("ttft_seconds", "Time to first streamed chunk at the gateway, queue "
                        "wait included, by inference route and class.", ["route", "class"],
                        m.ttft)  # fmt: skip
        yield histogram("e2e_seconds", "Time from arrival to the end of the answer at the "
                        "gateway, by inference route and class (tokenizer calls are not "
                        "inference).", ["route", "class"], m.e2e)  # fmt: skip
        yield histogram("queue_wait_seconds", "Time a request waited in the gateway's "
                        "queue, by class.", ["class"], m.queue_wait)  # fmt: skip
        yield from _replica_state(m)
        yield from _dispatch_state(m)
        watched = m._watched
        yield from m.tenants.families(None if watched is None else watched.queue.depth_by_tenant())
        yield from _policy_stats(m)
        yield from _access_log_state(m)
        yield from _fleet_state(m)
        yield from gpu_families(m.gpus)


def _replica_state(m: GatewayMetrics) -> Iterator[Metric]:
    rows = {
        "in_flight_requests": "Requests sent to the replica and not yet finished.",
        "replica_healthy": "1 if the replica is in rotation, else 0.",
        "replica_capacity": "The replica's concurrency budget (requests in flight at most).",
        "replica_num_requests_running": "vllm:num_requests_running at the last scrape.",
        "replica_num_requests_waiting": "vllm:num_requests_waiting at the last scrape.",
        "replica_kv_cache_usage": "vllm:kv_cache_usage_perc at the last scrape (0..1).",
    }
    families = {name: gauge(name, doc, ["replica"]) for name, doc in rows.items()}
    for info in m._pool.replicas():
        values = (info.in_flight, 1.0 if info.healthy else 0.0, info.capacity, info.running,
                  info.waiting, info.kv_cache_usage)  # fmt: skip
        for family, value in zip(families.values(), values, strict=True):
            family.add_metric([info.replica_id], float(value))
    yield from families.values()
    yield from pool_families(m._pool.replicas())


def _dispatch_state(m: GatewayMetrics) -> Iterator[Metric]:
    watched = m._watched
    if watched is None:
        return
    depth = gauge("queue_depth", "Requests waiting in the gateway's queue, by class.", ["class"])
    for cls_, count in zip(_CLASS, watched.queue.depth_by_class(), strict=True):
        depth.add_metric([cls_], count)
    yield depth
    breaker = gauge("breaker_state", "Circuit breaker per replica: 0 closed, 1 half-open, "
                    "2 open.", ["replica"])  # fmt: skip
    for rid, state in watched.breakers.states().items():
        breaker.add_metric([rid], _BREAKER_VALUE.get(str(state), 0.0))
    yield breaker
    level = gauge("degradation_level", "Soft-limit degradation: 0 normal, 1 P2 shed, 2 P1 "
                  "max_tokens capped too.")  # fmt: skip
    level.add_metric([], float(watched.soft_limit.level))
    yield level
    hard = gauge("hard_limit_crossed", "1 while a replica's median upstream time to first "
                 "byte is over the hard limit (a share of P2 is shed).")  # fmt: skip
    hard.add_metric([], 1.0 if watched.hard_limit.crossed() else 0.0)
    yield hard


def _policy_stats(m: GatewayMetrics) -> Iterator[Metric]:
    stats = m._policy.stats()
    if not stats:
        return
    family = gauge("routing_stat", "Counters of the routing policy (prefix blocks looked up "
                   "and matched, session hits, shard moves...).", ["policy", "stat"])  # fmt: skip
    for name, value in stats.items():
        family.add_metric([m._policy.name, name], float(value))
    yield family
    total = stats.get("prefix_blocks_total")
    if total:
        rate = gauge("prefix_hit_rate_estimate", "Share of prompt prefix blocks routed to "
                     "the replica that most likely holds them in its prefix cache.")  # fmt: skip
        rate.add_metric([], float(stats.get("prefix_blocks_matched", 0.0)) / total)
        yield rate


def _access_log_state(m: GatewayMetrics) -> Iterator[Metric]:
    access = m._access_log
    if access is None:
        return
    written = CounterMetricFamily("servepilot_access_log_lines", "Access log lines written.")
    written.add_metric([], access.written)
    yield written
    dropped = CounterMetricFamily("servepilot_access_log_dropped", "Access log lines lost: "
                                  "buffer_full (the writer fell behind), write_failed.",
                                  labels=["reason"])  # fmt: skip
    for reason, count in access.dropped.items():
        dropped.add_metric([reason], count)
    yield dropped
    buffered = gauge("access_log_buffered", "Access log lines held in memory, waiting for "
                     "the writer.")  # fmt: skip
    buffered.add_metric([], float(access.buffered))
    yield buffered


def _fleet_state(m: GatewayMetrics) -> Iterator[Metric]:
    facts = m.fleet_facts
    if facts is None:
        return
    replicas = m._pool.replicas()
    yield from batch_families(facts, replicas)
    yield from cost_families(facts, replicas, m.qps.update(answered(m.requests)))
