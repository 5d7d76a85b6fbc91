"""The one parser of a vLLM replica's Prometheus `/metrics` text, and its metric-name resolver.

Callers ask for a metric by meaning (`EngineMetric.KV_CACHE_USAGE`), never by a name: the
name a page uses depends on who exposes it. vLLM renamed `vllm:gpu_cache_usage_perc` to
`vllm:kv_cache_usage_perc` and `vllm:gpu_prefix_cache_*` to `vllm:prefix_cache_*`; under
Ray, vLLM's metrics go through Ray's exporter, which turns `:` into `_` and prefixes `ray_`
(`ray_vllm_kv_cache_usage_perc`) and, by default, exports each counter twice: as
`<name>_total` and as a gauge `<name>` with the same value. A metric is read under the
first of its names that the page holds, so a Ray counter is never counted twice.
"""

from __future__ import annotations

import enum
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from servepilot.core.errors import EngineError

_VLLM_PREFIX = "vllm:"
_RAY_PREFIX = "ray_vllm_"


def _spellings(names: tuple[str, ...]) -> tuple[str, ...]:
    """vLLM's names, then each as Ray exports it: `ray_` + the name with every character
    OpenTelemetry disallows (vLLM's `:`) made `_`."""
    ray = (f"ray_{re.sub(r'[^a-zA-Z0-9_]', '_', n)}" for n in names if n.startswith(_VLLM_PREFIX))
    return names + tuple(ray)


class Kind(enum.Enum):
    """How a metric's samples are named after its family."""

    GAUGE = ("",)
    COUNTER = ("_total", "")
    """`_total` first; the bare name is Ray's gauge copy of a counter (or an untyped page)."""
    HISTOGRAM = ("_count", "_sum", "_bucket")


class EngineMetric(enum.Enum):
    """What servepilot reads from a replica, by meaning; each with vLLM's names, newest first."""

    RUNNING = (Kind.GAUGE, "vllm:num_requests_running")
    WAITING = (Kind.GAUGE, "vllm:num_requests_waiting")
    KV_CACHE_USAGE = (Kind.GAUGE, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    """Share of KV cache blocks in use, 0..1, per engine."""
    CACHE_CONFIG = (Kind.GAUGE, "vllm:cache_config_info")
    """An info metric: the engine's cache configuration is in its labels."""
    PREEMPTIONS = (Kind.COUNTER, "vllm:num_preemptions")
    PROMPT_TOKENS = (Kind.COUNTER, "vllm:prompt_tokens")
    GENERATION_TOKENS = (Kind.COUNTER, "vllm:generation_tokens")
    PREFIX_CACHE_QUERIES = (
        Kind.COUNTER,
        "vllm:prefix_cache_queries",
        "vllm:gpu_prefix_cache_queries",
    )
    PREFIX_CACHE_HITS = (Kind.COUNTER, "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
    """Prompt tokens the prefix cache supplied."""
    REQUESTS_FINISHED = (Kind.COUNTER, "vllm:request_success")
    """Requests the engine finished, by finished_reason (stop, length, abort, ...)."""
    E2E = (Kind.HISTOGRAM, "vllm:e2e_request_latency_seconds")
    TTFT = (Kind.HISTOGRAM, "vllm:time_to_first_token_seconds")
    TPOT = (
        Kind.HISTOGRAM,
        "vllm:request_time_per_output_token_seconds",
        "vllm:time_per_output_token_seconds",
    )
    """Per request, (E2E - TTFT) / (output tokens - 1); the second name was removed in 0.13."""
    QUEUE_TIME = (Kind.HISTOGRAM, "vllm:request_queue_time_seconds")
    PREFILL_TIME = (Kind.HISTOGRAM, "vllm:request_prefill_time_seconds")
    """Per request, the engine's time from scheduling it to its first token."""
    RESIDENT_MEMORY = (Kind.GAUGE, "process_resident_memory_bytes")
    """prometheus_client's process metric, not vLLM's: it has no Ray spelling."""

    kind: Kind
    families: tuple[str, ...]
    """Every spelling of the metric's family, in the order they are tried."""

    def __init__(self, kind: Kind, *names: str) -> None:
        self.kind = kind
        self.families = _spellings(names)

    def sample_names(self, family: str) -> tuple[str, ...]:
        return tuple(family + suffix for suffix in self.kind.value)


class LoadGauges(NamedTuple):
    """What routing needs from a replica: its queue and how full its KV cache is."""

    running: int
    waiting: int
    kv_cache_usage: float
    """Share of KV cache blocks in use, 0..1."""


NO_LOAD = LoadGauges(0, 0, 0.0)
LOAD_METRICS = (EngineMetric.RUNNING, EngineMetric.WAITING, EngineMetric.KV_CACHE_USAGE)


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: `buckets` pairs each upper bound with a count."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


@dataclass(frozen=True, slots=True)
class Scrape:
    """One parsed /metrics page: its samples by name, read by `EngineMetric`.

    Values of a metric are summed over the label sets that carry every label asked for.
    """

    samples: Mapping[str, tuple[Sample, ...]]

    def family(self, metric: EngineMetric) -> str | None:
        """The spelling of `metric` this page uses; None if it has none."""
        for family in metric.families:
            if any(name in self.samples for name in metric.sample_names(family)):
                return family
        return None

    def has(self, metric: EngineMetric) -> bool:
        return self.family(metric) is not None

    def is_vllm(self) -> bool:
        """Whether the page holds any of vLLM's metrics, in any naming."""
        return any(name.startswith((_VLLM_PREFIX, _RAY_PREFIX)) for name in self.samples)

    def total(self, metric: EngineMetric, **labels: str) -> float:
        """A gauge's or a counter's sum over label sets (0 when the page lacks it)."""
        return sum(s.value for s in self._values(metric, "", labels))

    def peak(self, metric: EngineMetric, **labels: str) -> float:
        """A gauge's largest value over label sets (0 when the page lacks it)."""
        return max((s.value for s in self._values(metric, "", labels)), default=0.0)

    def info(self, metric: EngineMetric) -> dict[str, str]:
        """An info metric's labels (those of its first label set); empty when absent."""
        values = self._values(metric, "", {})
        return dict(values[0].labels) if values else {}

    def histogram(self, metric: EngineMetric, **labels: str) -> Histogram:
        """A histogram summed over label sets (empty when the page lacks it)."""
        buckets: dict[float, float] = defaultdict(float)
        for sample in self._values(metric, "_bucket", labels):
            buckets[float(sample.labels["le"])] += sample.value
        return Histogram(
            buckets=tuple(sorted(buckets.items())),
            count=sum(s.value for s in self._values(metric, "_count", labels)),
            sum=sum(s.value for s in self._values(metric, "_sum", labels)),
        )

    def _values(self, metric: EngineMetric, part: str, labels: Mapping[str, str]) -> list[Sample]:
        """A histogram's `part` (`_count`, `_sum`, `_bucket`), or another kind's value ("")."""
        family = self.family(metric)
        if family is None or (metric.kind is Kind.HISTOGRAM) != bool(part):
            return []
        if part:
            found = self.samples.get(family + part, ())
        else:
            name = next(n for n in metric.sample_names(family) if n in self.samples)
            found = self.samples[name]
        return [s for s in found if labels.items() <= s.labels.items()]


def scrape(text: str, only: Iterable[EngineMetric] | None = None) -> Scrape:
    """Parse a page; with `only`, parse just those metrics' lines (a vLLM page holds hundreds
    of histogram lines, and a poller's CPU time is taken from what it measures). Raise
    EngineError if the text is not Prometheus text."""
    if only is not None:
        text = _lines_of(text, tuple(f for m in only for f in m.families))
    by_name: dict[str, list[Sample]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                by_name[sample.name].append(sample)
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise EngineError(f"the replica's /metrics is not Prometheus text: {exc}") from None
    return Scrape({name: tuple(found) for name, found in by_name.items()})


def _lines_of(text: str, families: tuple[str, ...]) -> str:
    """The lines (samples and their HELP and TYPE) of names that start with a family's: a few
    too many is harmless, since samples are then read by their exact names."""
    starts = families + tuple(f"# {word} {f}" for word in ("HELP", "TYPE") for f in families)
    return "\n".join(line for line in text.splitlines() if line.startswith(starts)) + "\n"


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
    # Parsing only the few lines we read keeps the health checker's CPU time (which the
    # gateway process pays) small.
    try:
        return _load(scrape(text, LOAD_METRICS))
    except EngineError:
        return NO_LOAD


def parse_metrics(text: str) -> EngineSnapshot:
    """Every metric servepilot reads; raise EngineError if it is not Prometheus text."""
    page = scrape(text)
    memory = EngineMetric.RESIDENT_MEMORY
    return EngineSnapshot(
        load=_load(page),
        prompt_tokens_total=page.total(EngineMetric.PROMPT_TOKENS),
        generation_tokens_total=page.total(EngineMetric.GENERATION_TOKENS),
        ttft_seconds=page.histogram(EngineMetric.TTFT),
        process_resident_memory_bytes=int(page.total(memory)) if page.has(memory) else None,
    )


def _load(page: Scrape) -> LoadGauges:
    return LoadGauges(
        running=int(page.total(EngineMetric.RUNNING)),
        waiting=int(page.total(EngineMetric.WAITING)),
        kv_cache_usage=page.peak(EngineMetric.KV_CACHE_USAGE),
    )
