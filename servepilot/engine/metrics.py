"""Parse a vLLM replica's Prometheus `/metrics` text into a typed snapshot."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from servepilot.core.errors import EngineError

# Older vLLM releases called the KV gauge gpu_cache_usage_perc; accept both.
_KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_TTFT = "vllm:time_to_first_token_seconds"


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: `buckets` maps each upper bound (seconds) to a count."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One scrape of a replica, summed over its engines and models."""

    num_requests_running: int
    num_requests_waiting: int
    kv_cache_usage: float
    """Share of KV cache blocks in use, 0..1 (the mean over engines)."""
    prompt_tokens_total: float
    generation_tokens_total: float
    ttft_seconds: Histogram
    process_resident_memory_bytes: int | None


def parse_metrics(text: str) -> EngineSnapshot:
    """Parse `/metrics` text; raise EngineError if it is not Prometheus text."""
    values: dict[str, list[float]] = defaultdict(list)
    buckets: dict[float, float] = defaultdict(float)
    ttft_count = ttft_sum = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == f"{_TTFT}_bucket":
                    buckets[float(sample.labels["le"])] += sample.value
                elif sample.name == f"{_TTFT}_count":
                    ttft_count += sample.value
                elif sample.name == f"{_TTFT}_sum":
                    ttft_sum += sample.value
                else:
                    values[sample.name].append(sample.value)
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"the replica's /metrics is not Prometheus text: {exc}") from None

    kv = next((values[name] for name in _KV_USAGE_NAMES if values.get(name)), [])
    rss = values.get("process_resident_memory_bytes")
    return EngineSnapshot(
        num_requests_running=int(sum(values.get("vllm:num_requests_running", []))),
        num_requests_waiting=int(sum(values.get("vllm:num_requests_waiting", []))),
        kv_cache_usage=sum(kv) / len(kv) if kv else 0.0,
        prompt_tokens_total=sum(values.get("vllm:prompt_tokens_total", [])),
        generation_tokens_total=sum(values.get("vllm:generation_tokens_total", [])),
        ttft_seconds=Histogram(
            buckets=tuple(sorted(buckets.items())), count=ttft_count, sum=ttft_sum
        ),
        process_resident_memory_bytes=int(rss[0]) if rss else None,
    )
