"""Parse a vLLM replica's Prometheus `/metrics` text: the load gauges, or a full snapshot."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from servepilot.core.errors import EngineError

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
# vLLM releases before the V1 engine called the KV cache gauge this.
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
_LOAD_NAMES = (RUNNING, WAITING, KV_USAGE, KV_USAGE_LEGACY)
_TTFT = "vllm:time_to_first_token_seconds"


class LoadGauges(NamedTuple):
    """What routing needs from a replica: its queue and how full its KV cache is."""

    running: int
    waiting: int
    kv_cache_usage: float
    """Share of KV cache blocks in use, 0..1."""


NO_LOAD = LoadGauges(0, 0, 0.0)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: `buckets` pairs each upper bound (seconds) with a count."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """One scrape of a replica, summed over its engines and models."""

    load: LoadGauges
    prompt_tokens_total: float
    generation_tokens_total: float
    ttft_seconds: Histogram
    process_resident_memory_bytes: int | None


def parse_load(text: str) -> LoadGauges:
    """The load gauges; a page without them, or one that does not parse, is no load.

    Running and waiting are summed over label sets. KV use is the largest: it is a fraction
    per engine, and with several data-parallel engines the fullest one is what slows the
    replica down.
    """
    # A vLLM page holds hundreds of histogram lines; parsing only the few we read keeps the
    # health checker's CPU time (which the gateway process pays) small.
    kept = "\n".join(line for line in text.splitlines() if _mentions_load(line))
    try:
        return _load(_samples(kept + "\n"))
    except ValueError:
        return NO_LOAD


def parse_metrics(text: str) -> EngineSnapshot:
    """Every metric servepilot reads; raise EngineError if it is not Prometheus text."""
    try:
        samples = list(_samples(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"the replica's /metrics is not Prometheus text: {exc}") from None
    totals: dict[str, float] = defaultdict(float)
    buckets: dict[float, float] = defaultdict(float)
    for sample in samples:
        if sample.name == f"{_TTFT}_bucket":
            buckets[float(sample.labels["le"])] += sample.value
        else:
            totals[sample.name] += sample.value
    rss = totals.get("process_resident_memory_bytes")
    return EngineSnapshot(
        load=_load(samples),
        prompt_tokens_total=totals["vllm:prompt_tokens_total"],
        generation_tokens_total=totals["vllm:generation_tokens_total"],
        ttft_seconds=Histogram(
            buckets=tuple(sorted(buckets.items())),
            count=totals[f"{_TTFT}_count"],
            sum=totals[f"{_TTFT}_sum"],
        ),
        process_resident_memory_bytes=int(rss) if rss is not None else None,
    )


def _samples(text: str) -> Iterable[Sample]:
    for family in text_string_to_metric_families(text):
        yield from family.samples


def _load(samples: Iterable[Sample]) -> LoadGauges:
    sums: dict[str, float] = defaultdict(float)
    peaks: dict[str, float] = {}
    for sample in samples:
        if sample.name in _LOAD_NAMES:
            sums[sample.name] += sample.value
            peaks[sample.name] = max(peaks.get(sample.name, 0.0), sample.value)
    return LoadGauges(
        running=int(sums[RUNNING]),
        waiting=int(sums[WAITING]),
        kv_cache_usage=peaks.get(KV_USAGE, peaks.get(KV_USAGE_LEGACY, 0.0)),
    )


def _mentions_load(line: str) -> bool:
    if line.startswith("#"):
        parts = line.split(maxsplit=3)
        return len(parts) >= 3 and parts[2] in _LOAD_NAMES
    return line.startswith(_LOAD_NAMES)
