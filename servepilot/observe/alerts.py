"""Prometheus alert rules carrying the seeds' thresholds, as a plain dict (a rule file).

The one copy: `servepilot observe render` writes them as a rule file and `servepilot k8s
render` puts the same groups in a PrometheusRule, scoped to its namespace by label matchers.
Each rule's summary says what the alert means and its description what to do, taken from
seed 004's troubleshooting table and seeds 000/003's operating lines. Every rule has a
promtool unit test that fires it at its threshold after its `for:` window, and not before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servepilot.core.config import FleetConfig
from servepilot.core.slo import Metric
from servepilot.observe.dashboard import Features, features_of
from servepilot.observe.promql import (
    matchers,
    memory_growth_per_request,
    on_inference_routes,
    quantile,
    selector,
    shed_rate,
)

GROUP = "servepilot"
BATCH_UTILIZATION_FLOOR = 0.7
COST_USD_PER_QPS_HOUR_CEILING = 0.1
GPU_UTILIZATION_CEILING = 0.95
MEMORY_GROWTH_BYTES_PER_REQUEST = 2e6
KV_CACHE_NEAR_FULL = 0.9
"""Below the gateway's own 0.95 (admission.kv_full_usage), where it stops routing to a replica."""
REQUESTS_WAITING_CEILING = 5
"""Requests in one replica's own vLLM queue: past a few, each waits out whole batches."""


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {"summary": self.summary, "description": self.description},
        }


def _capacity_rules(scope: str) -> list[Rule]:
    healthy = selector("servepilot_replica_healthy", scope)
    return [
        # `or vector(0)`: a gateway whose pool is empty exports no series to sum.
        Rule("ServepilotNoReadyReplica", f"(sum({healthy}) or vector(0)) == 0", "1m",
             "critical",
             "No replica is in rotation: the gateway answers 503 (or holds requests through "
             "a cold start).",
             "See why the replicas are out: `servepilot status` (or `kubectl get pods`) shows "
             "them starting, crashed or unschedulable; `servepilot doctor` names OOM, a small "
             "/dev/shm or placement that cannot be met, with the knob to change."),
        Rule("ServepilotBatchUnderfilled",
             f"{selector('servepilot_fleet_batch_utilization', scope)} < "
             f"{BATCH_UTILIZATION_FLOOR}", "5m", "warning",
             "Batch utilisation {{ $value | humanizePercentage }} (running / max_num_seqs) has "
             "been under 70% for 5 minutes.",
             "The replicas are underfed (low utilisation, poor throughput per GPU). With "
             "traffic queued, raise engine.max_num_seqs / max_num_batched_tokens; with little "
             "traffic, consolidate onto fewer replicas (replicas.count or autoscale bounds)."),
        Rule("ServepilotCostPerQpsHigh",
             f"{selector('servepilot_cost_usd_per_qps_hour', scope)} > "
             f"{COST_USD_PER_QPS_HOUR_CEILING}", "10m",
             "warning",
             "One QPS costs ${{ $value | printf \"%.3f\" }} per hour (fleet USD/h over "
             "sustained QPS), above the $0.1 line.",
             "Serve the same QPS on less hardware: raise batch utilisation (max_num_seqs), "
             "quantize (fp8) to fit more sequences per GPU, or scale in; "
             "`servepilot tune` finds the knobs for the SLA."),
        Rule("ServepilotShedding", f"{shed_rate('5m', scope=scope)} > 0", "2m", "warning",
             "The gateway is refusing requests ({{ $labels.reason }}) at {{ $value | "
             "printf \"%.2f\" }}/s.",
             "queue_budget / queue_full: the fleet is short of replicas, add some (or raise "
             "the autoscaler's max); no_replica: replicas are down, see `servepilot status`; "
             "degraded / hard_limit: the fleet is saturated and sheds batch (P2) work first "
             "by design, add capacity if it lasts."),
    ]  # fmt: skip


def _engine_rules(scope: str) -> list[Rule]:
    kv_usage = selector("vllm:kv_cache_usage_perc", scope)
    preemptions = selector("vllm:num_preemptions_total", scope)
    waiting = selector("vllm:num_requests_waiting", scope)
    return [
        Rule("ServepilotKvCacheNearFull",
             f"max by (instance) ({kv_usage}) > {KV_CACHE_NEAR_FULL}", "5m",
             "warning",
             "KV cache of {{ $labels.instance }} is {{ $value | humanizePercentage }} full.",
             "vLLM will preempt and recompute (KV tight -> the memory/context "
             "knobs): raise gpu_memory_utilization (at most 0.9) or cpu_kv_cache_space_gib, "
             "lower max_model_len to what the traffic needs, use kv_cache_dtype fp8, or add "
             "replicas."),
        Rule("ServepilotPreempting",
             f"sum by (instance) (rate({preemptions}[5m])) > 0", "5m", "warning",
             "{{ $labels.instance }} preempts {{ $value | printf \"%.2f\" }} requests/s.",
             "Its KV cache cannot hold the batch: lower max_num_seqs, or give the KV cache "
             "more memory (gpu_memory_utilization, cpu_kv_cache_space_gib, fp8 KV)."),
        Rule("ServepilotRequestsWaiting",
             f"sum by (instance) ({waiting}) > {REQUESTS_WAITING_CEILING}", "5m", "warning",
             "{{ $labels.instance }} holds {{ $value }} requests in vLLM's own queue.",
             "They wait for a batch slot (max_num_seqs) or KV blocks before their prefill, "
             "which adds straight to TTFT. With KV cache to spare (the KV panels), raise "
             "engine.max_num_seqs; otherwise add replicas (or raise the autoscaler's max)."),
        Rule("ServepilotMemoryGrowthPerRequest",
             f"{memory_growth_per_request('15m', scope)} > "
             f"{MEMORY_GROWTH_BYTES_PER_REQUEST:.0f}",
             "15m", "warning",
             "{{ $labels.instance }}'s resident memory grows {{ $value | humanize }}B per "
             "request (over 2 MB: a leak).",
             "The soak's leak rule: memory that climbs with requests is a leak (or KV "
             "fragmentation). Compare with a `servepilot bench --soak`; restart the replica "
             "(drain it through /admin/replicas) and report it with the version."),
    ]  # fmt: skip


def _gpu_rule(scope: str) -> Rule:
    utilization = selector("servepilot_gpu_utilization", scope)
    return Rule(
        "ServepilotGpuSaturated", f"{utilization} > {GPU_UTILIZATION_CEILING}", "30s", "info",
        "GPU {{ $labels.gpu }} has been over 95% busy for 30 s.",
        "Informational: continuous batching pegs GPUs near 100% (llm-d). Act only if TTFT or "
        "queue wait rises too: then the fleet is past its sweet spot (P99 up, "
        "throughput flat): lower the concurrency or add replicas.",
    )  # fmt: skip


def _sla_rule(config: FleetConfig, scope: str) -> Rule | None:
    limit_ms = config.slo.per_request_ms(Metric.TTFT)
    if limit_ms is None:
        return None
    limit_s = limit_ms / 1000
    return Rule(
        "ServepilotTtftP99OverSla",
        f"{quantile(0.99, 'servepilot_ttft_seconds', '5m', scope=on_inference_routes(scope))} "
        f"> {limit_s:g}", "5m",
        "critical",
        f"TTFT p99 at the gateway is {{{{ $value | humanizeDuration }}}}, over the SLA's "
        f"{limit_ms:g} ms (fleet.yaml slo.ttft_p99_ms).",
        "Queue wait high (the queue panels): add replicas or raise the autoscaler's max. "
        "Prefill slow: enable chunked prefill, lower max_num_batched_tokens. P99 up while "
        "throughput is flat: past the concurrency sweet spot, lower max_num_seqs "
        "or quantize.",
    )  # fmt: skip


def rules(
    config: FleetConfig,
    features: Features | None = None,
    labels: Mapping[str, str] | None = None,
) -> list[Rule]:
    """The alerts of the fleet `config` describes; `labels` (e.g. {"namespace": "llm"}) are
    matched in every selector, so the rules read that fleet's series only."""
    features = features if features is not None else features_of(config)
    scope = matchers(labels or {})
    out = _capacity_rules(scope) + _engine_rules(scope)
    if features.gpu:
        out.append(_gpu_rule(scope))
    sla = _sla_rule(config, scope)
    if sla is not None:
        out.append(sla)
    return out


def alert_rules(config: FleetConfig, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The rule file (Prometheus's `rule_files` format; a PrometheusRule's `spec` too)."""
    groups = [{"name": GROUP, "rules": [r.to_dict() for r in rules(config, labels=labels)]}]
    return {"groups": groups}
