"""Monitoring on Kubernetes: a ServiceMonitor for the gateway and the replicas, and a
PrometheusRule with the alerts.

The alerts read vLLM's current metric names (`vllm:kv_cache_usage_perc`, not the removed
`vllm:gpu_cache_usage_perc`; counters with their `_total`) and servepilot's own `servepilot_*`;
nothing is re-exported under `vllm:`.
"""

from __future__ import annotations

from servepilot.core.slo import Metric
from servepilot.fleet.k8s.pods import Manifest
from servepilot.fleet.k8s.target import Target

MONITORING_API = "monitoring.coreos.com/v1"
# Without an SLO in fleet.yaml, interactive TTFT p99 above this alerts.
DEFAULT_TTFT_P99_MS = 2000.0


def monitoring_objects(target: Target) -> list[Manifest]:
    return [service_monitor(target), prometheus_rule(target)]


def service_monitor(target: Target) -> Manifest:
    names = target.names
    selector = {"app.kubernetes.io/name": "servepilot", "app.kubernetes.io/instance": names.prefix}
    return {
        "apiVersion": MONITORING_API,
        "kind": "ServiceMonitor",
        "metadata": target.metadata(names.prefix, "monitoring"),
        "spec": {
            "selector": {"matchLabels": selector},
            "namespaceSelector": {"matchNames": [target.kube.namespace]},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def prometheus_rule(target: Target) -> Manifest:
    return {
        "apiVersion": MONITORING_API,
        "kind": "PrometheusRule",
        "metadata": target.metadata(target.names.prefix, "monitoring"),
        "spec": {"groups": [{"name": "servepilot", "rules": alert_rules(target)}]},
    }


def alert_rules(target: Target) -> list[Manifest]:
    ns = f'namespace="{target.kube.namespace}"'
    ttft_s = (target.config.slo.per_request_ms(Metric.TTFT) or DEFAULT_TTFT_P99_MS) / 1000
    p99 = 'histogram_quantile(0.99, sum by (le) (rate(servepilot_ttft_seconds_bucket{%s,class="0"}[5m])))'  # noqa: E501
    rows = [
        ("ServepilotNoReadyReplica", "critical", "1m",
         # `or vector(0)`: a gateway with no replica at all exports no series to sum.
         f"(sum(servepilot_replica_healthy{{{ns}}}) or vector(0)) == 0",
         "No replica is in rotation: the gateway answers 503 (or holds requests in a cold "
         "start)."),
        ("ServepilotShedding", "warning", "5m",
         f"sum(rate(servepilot_shed_total{{{ns}}}[5m])) "
         f"/ sum(rate(servepilot_requests_total{{{ns}}}[5m])) > 0.05",
         "The gateway refuses more than 5% of requests (429/503): add replicas or raise "
         "autoscaling.max_replicas."),
        ("ServepilotInteractiveTtftHigh", "warning", "5m", f"{p99 % ns} > {ttft_s:g}",
         f"Interactive (class 0) TTFT p99 at the gateway is above {ttft_s:g} s."),
        ("ServepilotUnderBatched", "info", "5m",
         f"sum(servepilot_in_flight_requests{{{ns}}}) "
         f"/ sum(servepilot_replica_capacity{{{ns}}}) < 0.7",
         "Replicas use less than 70% of their concurrency budgets: consolidate or raise "
         "max_num_seqs (the 70% batch-utilisation rule)."),
        ("VllmKvCacheNearlyFull", "warning", "5m",
         f"max(vllm:kv_cache_usage_perc{{{ns}}}) > 0.95",
         "A replica's KV cache is over 95% full: requests queue and get preempted."),
        ("VllmPreempting", "warning", "10m",
         f"sum(rate(vllm:num_preemptions_total{{{ns}}}[5m])) > 0",
         "vLLM preempts requests (KV cache too small for the batch): lower max_num_seqs or "
         "add replicas."),
        ("VllmRequestsWaiting", "warning", "5m",
         f"avg(vllm:num_requests_waiting{{{ns}}}) > 5",
         "More than 5 requests wait in each replica's own queue on average."),
    ]  # fmt: skip
    return [
        {
            "alert": name,
            "expr": expr,
            "for": duration,
            "labels": {"severity": severity},
            "annotations": {"summary": summary},
        }
        for name, severity, duration, expr, summary in rows
    ]
