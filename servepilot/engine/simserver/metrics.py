"""The simulated replica's /metrics: vLLM 0.32's metric names, labels and histogram buckets.

Names and buckets are those of vllm/v1/metrics/loggers.py and buckets.py (PrometheusStatLogger),
each labelled `model_name` and `engine="0"` as vLLM labels them, so servepilot.engine.metrics,
Grafana dashboards and autoscalers read a simulated replica as they read vLLM. Only what the
replica model knows is exported: besides the counters and gauges, the TTFT, ITL, TPOT,
end-to-end, queue-time and prefill-time histograms (the last two are what `calibrate` reads to
tell the engine's time from the request's time outside it, as it does with vLLM).
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

# vllm/v1/metrics/buckets.py
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(slots=True)
class Histogram:
    bounds: Sequence[float]
    counts: list[float] = field(default_factory=list)
    total: float = 0.0
    count: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * (len(self.bounds) + 1)

    def observe(self, value: float, weight: float = 1.0) -> None:
        # Prometheus buckets are upper bounds, inclusive (le).
        self.counts[bisect.bisect_left(self.bounds, value)] += weight
        self.total += value * weight
        self.count += weight


@dataclass(slots=True)
class ServerStats:
    """Counters and histograms the engine driver updates; gauges are read from the model."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    """Arrival to the first step that ran part of the request (vLLM's WAITING phase)."""
    prefill: Histogram = field(default_factory=lambda: Histogram(LATENCY_BUCKETS))
    """That step's start to the first token (vLLM's PREFILL phase)."""


@dataclass(frozen=True, slots=True)
class Gauges:
    running: int
    waiting: int
    kv_usage: float
    prefix_queries: int
    prefix_hits: int
    preemptions: int


def render(model_name: str, gauges: Gauges, stats: ServerStats) -> str:
    """Prometheus text exposition (version 0.0.4), as prometheus_client writes it."""
    labels = f'engine="0",model_name="{_escape(model_name)}"'
    out: list[str] = []

    def metric(name: str, kind: str, help_text: str, value: float, extra: str = "") -> None:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        out.append(f"{name}{{{labels}{extra}}} {float(value)!r}\n")

    metric("vllm:num_requests_running", "gauge", "Number of requests in model execution "
           "batches.", gauges.running)  # fmt: skip
    metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
           gauges.waiting)  # fmt: skip
    metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
           gauges.kv_usage)  # fmt: skip
    counters = (
        ("prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
         gauges.prefix_queries),
        ("prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
         gauges.prefix_hits),
        ("num_preemptions", "Cumulative number of preemption from the engine.",
         gauges.preemptions),
        ("prompt_tokens", "Number of prefill tokens processed.", stats.prompt_tokens),
        ("generation_tokens", "Number of generation tokens processed.", stats.generation_tokens),
    )  # fmt: skip
    for short, help_text, value in counters:
        metric(f"vllm:{short}_total", "counter", help_text, value)
    name = "vllm:request_success_total"
    out.append(f"# HELP {name} Count of successfully processed requests.\n")
    out.append(f"# TYPE {name} counter\n")
    for reason, value in (("stop", 0), ("length", stats.finished), ("abort", stats.aborted)):
        out.append(f'{name}{{{labels},finished_reason="{reason}"}} {float(value)!r}\n')
    histograms = (
        ("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
         stats.ttft),
        ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
         stats.itl),
        ("request_time_per_output_token_seconds",
         "Histogram of time_per_output_token_seconds per request.", stats.tpot),
        ("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
         stats.e2e),
        ("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
         stats.queue),
        ("request_prefill_time_seconds",
         "Histogram of time spent in PREFILL phase for request.", stats.prefill),
    )  # fmt: skip
    for short, help_text, histogram in histograms:
        _histogram(out, f"vllm:{short}", help_text, labels, histogram)
    rss = _rss_bytes()
    if rss is not None:
        out.append("# HELP process_resident_memory_bytes Resident memory size in bytes.\n")
        out.append("# TYPE process_resident_memory_bytes gauge\n")
        out.append(f"process_resident_memory_bytes {float(rss)!r}\n")
    return "".join(out)


def _histogram(out: list[str], name: str, help_text: str, labels: str, h: Histogram) -> None:
    out.append(f"# HELP {name} {help_text}\n# TYPE {name} histogram\n")
    cumulative = 0.0
    for bound, count in zip((*h.bounds, float("inf")), h.counts, strict=True):
        cumulative += count
        le = "+Inf" if bound == float("inf") else repr(float(bound))
        out.append(f'{name}_bucket{{{labels},le="{le}"}} {cumulative!r}\n')
    out.append(f"{name}_count{{{labels}}} {float(h.count)!r}\n")
    out.append(f"{name}_sum{{{labels}}} {float(h.total)!r}\n")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None
