"""Rules about latency and batching (seed 004's table): high TTFT (queueing or prefill?),
P99 spikes, batches the GPU is not fed enough for.

Latencies are read from the histograms since the gateway (or replica) started: doctor
diagnoses what a fleet has been doing, not one instant of it.
"""

from __future__ import annotations

import math

from servepilot.core.config import Device, FleetConfig
from servepilot.core.slo import Metric
from servepilot.engine.metrics import EngineMetric, Histogram, Scrape
from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity
from servepilot.observe.doctor.memory_rules import KV_NEAR_FULL, max_num_seqs
from servepilot.observe.top.sample import add, gateway_latency, histogram
from servepilot.observe.top.window import quantile

DEFAULT_TTFT_P99_MS = 2_000.0
"""The TTFT P99 held to a fleet whose fleet.yaml sets no slo."""
SPIKE_RATIO = 5.0
"""P99 this many times the median: a tail, not a slow fleet."""
MIN_REQUESTS = 20
"""Fewer answers than this say nothing about a P99."""
LOW_BATCH_UTILISATION = 0.70
"""Seeds 000/003: batch utilisation (running / max_num_seqs) below 70% is under-batched."""
SEED_BATCHED_TOKENS = 8192
"""Seed 004's max-num-batched-tokens once the batch is fed properly."""


def _ttft(evidence: Evidence, pages: dict[str, Scrape]) -> tuple[Histogram, str]:
    """TTFT as users saw it: the gateway's (queue wait included), else the replicas'."""
    gateway = evidence.gateway_page()
    if gateway is not None and (h := gateway_latency(gateway, "servepilot_ttft_seconds")).count:
        return h, "the gateway's servepilot_ttft_seconds"
    return add(*(p.histogram(EngineMetric.TTFT) for p in pages.values())), "vLLM's TTFT"


def high_ttft(evidence: Evidence) -> list[Finding]:
    pages = evidence.pages()
    ttft, source = _ttft(evidence, pages)
    p99 = quantile(0.99, ttft)
    limit_ms = evidence.config.slo.per_request_ms(Metric.TTFT) or DEFAULT_TTFT_P99_MS
    if ttft.count < MIN_REQUESTS or p99 is None or p99 * 1000 <= limit_ms:
        return []
    queue_s, prefill_s = _queue_and_prefill_s(evidence, pages)
    seen = (
        f"TTFT p99 {p99 * 1000:,.0f} ms over {ttft.count:,.0f} requests ({source}), "
        f"limit {limit_ms:,.0f} ms; {queue_s:,.1f} s queued, {prefill_s:,.1f} s in prefill"
    )
    config = evidence.config
    if queue_s >= prefill_s:
        count = config.replicas.count
        return [
            Finding(
                "high_ttft",
                Severity.PROBLEM,
                "high TTFT from queueing: requests wait for a free slot longer than their "
                "prefill takes",
                evidence=seen,
                fix=f"add capacity: replicas.count {count} -> {count + 1} (or let the autoscaler "
                "do it), or raise engine.max_num_seqs if the KV cache has room",
                knob="replicas.count",
                value=str(count + 1),
            )
        ]
    return [_prefill_finding(config, seen)]


def _prefill_finding(config: FleetConfig, seen: str) -> Finding:
    summary = "high TTFT from prefill: long prompts take long to prefill"
    if config.engine.enable_chunked_prefill is False:
        return Finding(
            "high_ttft",
            Severity.PROBLEM,
            summary,
            evidence=seen,
            fix="enable chunked prefill so a long prompt does not hold the batch",
            knob="engine.enable_chunked_prefill",
            value="true",
        )
    if config.hardware.device is Device.CPU:
        # A CPU prefills at its compute rate whatever the step's token budget: only more
        # cores (replicas) or fewer tokens to prefill (prefix caching) shorten it.
        count = config.replicas.count
        return Finding(
            "high_ttft",
            Severity.PROBLEM,
            summary,
            evidence=seen,
            fix=f"spread prefills over more cores: replicas.count {count} -> {count + 1}; turn "
            "on engine.enable_prefix_caching for prompts that share prefixes",
            knob="replicas.count",
            value=str(count + 1),
        )
    current = config.engine.max_num_batched_tokens
    value = max(SEED_BATCHED_TOKENS, 2 * current) if current else SEED_BATCHED_TOKENS
    return Finding(
        "high_ttft",
        Severity.PROBLEM,
        summary,
        evidence=seen,
        fix=f"raise engine.max_num_batched_tokens to {value:,} (prefill more tokens a step); "
        "turn on engine.enable_prefix_caching for prompts that share prefixes",
        knob="engine.max_num_batched_tokens",
        value=str(value),
    )


def _queue_and_prefill_s(evidence: Evidence, pages: dict[str, Scrape]) -> tuple[float, float]:
    """Seconds requests spent queued (gateway and vLLM) and in vLLM's prefill, in all."""
    gateway = evidence.gateway_page()
    queued = histogram(gateway, "servepilot_queue_wait_seconds").sum if gateway else 0.0
    queued += sum(p.histogram(EngineMetric.QUEUE_TIME).sum for p in pages.values())
    prefill = sum(p.histogram(EngineMetric.PREFILL_TIME).sum for p in pages.values())
    return queued, prefill


def p99_spikes(evidence: Evidence) -> list[Finding]:
    pages = evidence.pages()
    gateway = evidence.gateway_page()
    e2e = gateway_latency(gateway, "servepilot_e2e_seconds") if gateway else None
    source = "the gateway's servepilot_e2e_seconds"
    if e2e is None or not e2e.count:
        e2e, source = add(*(p.histogram(EngineMetric.E2E) for p in pages.values())), "vLLM's E2E"
    p50, p99 = quantile(0.5, e2e), quantile(0.99, e2e)
    if e2e.count < MIN_REQUESTS or not p50 or p99 is None or p99 < SPIKE_RATIO * p50:
        return []
    seen = (
        f"E2E p50 {p50 * 1000:,.0f} ms, p99 {p99 * 1000:,.0f} ms ({p99 / p50:.1f}x) "
        f"over {e2e.count:,.0f} requests ({source})"
    )
    engine = evidence.config.engine
    if engine.enable_chunked_prefill is False:
        return [
            Finding(
                "p99_spikes",
                Severity.WARNING,
                "P99 spikes: long requests hold up short ones",
                evidence=seen,
                fix="enable chunked prefill",
                knob="engine.enable_chunked_prefill",
                value="true",
            )
        ]
    lower = max(1, max_num_seqs(evidence.config) // 2)
    return [
        Finding(
            "p99_spikes",
            Severity.WARNING,
            "P99 spikes: the load is past the sweet spot (more concurrency adds tail latency, "
            "not throughput)",
            evidence=seen,
            fix=f"find the sweet spot (`servepilot bench --sweep` or `servepilot accept`) and cap "
            f"concurrency there, e.g. engine.max_num_seqs {max_num_seqs(evidence.config)} -> "
            f"{lower}; or free KV room by quantizing (engine.kv_cache_dtype: fp8)",
            knob="engine.max_num_seqs",
            value=str(lower),
        )
    ]


def low_batch_utilisation(evidence: Evidence) -> list[Finding]:
    pages = {rid: page for rid, page in evidence.pages().items() if page.is_vllm()}
    if not pages:
        return []
    limit = max_num_seqs(evidence.config)
    running = {rid: page.total(EngineMetric.RUNNING) for rid, page in pages.items()}
    waiting = sum(page.total(EngineMetric.WAITING) for page in pages.values())
    total = sum(running.values())
    utilisation = total / (limit * len(pages))
    if total == 0 or utilisation >= LOW_BATCH_UTILISATION:
        return []  # an idle fleet is not under-batched, it is idle
    per_replica = ", ".join(f"{r} {n:g}" for r, n in running.items())
    seen = (
        f"{total:,.0f} running on {len(pages)} replica{'s' if len(pages) > 1 else ''} with "
        f"max_num_seqs {limit}: "
        f"batch utilisation {utilisation:.0%} ({per_replica})"
        f"; {waiting:,.0f} waiting"
    )
    if waiting:
        # A full KV cache holding the batch back is kv_near_full's finding, with its own fix.
        kv_full = any(p.peak(EngineMetric.KV_CACHE_USAGE) >= KV_NEAR_FULL for p in pages.values())
        return [] if kv_full else [_held_back(evidence.config, seen, utilisation)]
    count = evidence.config.replicas.count
    fewer = max(1, math.ceil(total / (LOW_BATCH_UTILISATION * limit)))
    if fewer >= count:
        return []
    return [
        Finding(
            "low_batch_utilisation",
            Severity.WARNING,
            f"batches are {utilisation:.0%} full and nothing waits: more replicas than the traffic "
            "needs",
            evidence=seen,
            fix=f"consolidate: replicas.count {count} -> {fewer} (or a lower autoscaler minimum)",
            knob="replicas.count",
            value=str(fewer),
        )
    ]


def _held_back(config: FleetConfig, seen: str, utilisation: float) -> Finding:
    current = config.engine.max_num_batched_tokens
    value = max(SEED_BATCHED_TOKENS, 2 * current) if current else SEED_BATCHED_TOKENS
    return Finding(
        "low_batch_utilisation",
        Severity.PROBLEM,
        f"batches are {utilisation:.0%} full while requests wait: the token budget or the KV "
        "cache, not max_num_seqs, holds the batch back",
        evidence=seen,
        fix=f"raise engine.max_num_batched_tokens to {value:,}; if the KV cache is near full, "
        "give it more room first",
        knob="engine.max_num_batched_tokens",
        value=str(value),
    )
