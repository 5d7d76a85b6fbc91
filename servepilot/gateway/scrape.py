"""Reading the load gauges a vLLM replica exports on /metrics."""

from __future__ import annotations

from typing import NamedTuple

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
# vLLM releases before the V1 engine called the KV cache gauge this.
KV_USAGE_LEGACY = "vllm:gpu_cache_usage_perc"
_WANTED = (RUNNING, WAITING, KV_USAGE, KV_USAGE_LEGACY)


class LoadGauges(NamedTuple):
    running: int
    waiting: int
    kv_cache_usage: float
    """Fraction 0..1."""


NO_LOAD = LoadGauges(0, 0, 0.0)


def parse_load_gauges(text: str) -> LoadGauges:
    """Running and waiting requests (summed over label sets) and KV cache use.

    KV cache use is the largest over label sets: it is a fraction per engine, so with several
    data-parallel engines the fullest one is what makes the replica slow. Names that are
    absent count as zero, and a page that does not parse counts as no load at all.
    """
    # A vLLM page holds hundreds of histogram lines; parsing only the few we read keeps the
    # health checker's CPU time (which the gateway process pays) small.
    kept = "\n".join(line for line in text.splitlines() if _mentions_wanted(line))
    sums: dict[str, float] = {}
    peaks: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(kept + "\n"):
            for sample in family.samples:
                if sample.name in _WANTED:
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                    peaks[sample.name] = max(peaks.get(sample.name, 0.0), sample.value)
    except ValueError:
        return NO_LOAD
    kv = peaks.get(KV_USAGE, peaks.get(KV_USAGE_LEGACY, 0.0))
    return LoadGauges(
        running=int(sums.get(RUNNING, 0.0)),
        waiting=int(sums.get(WAITING, 0.0)),
        kv_cache_usage=kv,
    )


def _mentions_wanted(line: str) -> bool:
    if line.startswith("#"):
        parts = line.split(maxsplit=3)
        return len(parts) >= 3 and parts[2] in _WANTED
    return line.startswith(_WANTED)
