"""What a router costs over a run, and what its exact prefix index predicted: read from /proc
and from the router's own metrics, for bench-kv-routing (and the GPU host probe's CPU split).

A router's CPU per request is its process's CPU over the run, less what it spends with no
request (`idle_cpu`, measured beside the run: after it, in bench-kv-routing), divided by the
requests it answered. A router on the exact
index also counts the prompt tokens it predicted its chosen replicas hold; over a run they
are held against what vLLM reports it reused (issue 35: within 5%).
"""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.samples import Sample

PREDICTED_STATS = {"prefix_affinity": ("exact_cached_tokens_predicted", "exact_routed"),
                   "predicted_latency": ("predicted_cached_tokens", None)}  # fmt: skip
"""Per policy on the exact index: its routing stat of the prompt tokens it predicted the
chosen replica holds (summed over requests), and of the requests it routed on the index
(None: every request it routes)."""


def cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds (user and system) the processes have used so far, together."""
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def idle_cpu(pids: Sequence[int], seconds: float = 10.0) -> float:
    """CPU seconds per second the routers spend with no request (health checks, metrics, KV
    event probes), together: taken off their CPU over a run, so that what is left is the
    requests'."""
    before, started = cpu_s(pids), time.monotonic()
    time.sleep(seconds)
    return (cpu_s(pids) - before) / (time.monotonic() - started)


def samples(url: str, name: str) -> list[Sample]:
    """The samples named `name` of the gateway's /metrics; none when it does not answer."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return []
    return [sample for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == name]  # fmt: skip


def routing_stats(url: str) -> dict[str, float]:
    """The gateway's routing stats (servepilot_routing_stat) by stat; empty without them."""
    return {s.labels["stat"]: s.value for s in samples(url, "servepilot_routing_stat")}


def answered(url: str) -> float:
    """Generation requests the gateway at `url` has answered (not its health checks: a
    balancer in front of it sends one a second)."""
    from servepilot.observe.promql import GENERATION_ROUTES

    return sum(s.value for s in samples(url, "servepilot_requests_total")
               if s.labels.get("route") in GENERATION_ROUTES)  # fmt: skip


def event_batches(url: str) -> float:
    """KV event batches the gateway has applied, every replica (0 without its exact index)."""
    return sum(s.value for s in samples(url, "servepilot_kv_event_batches_total"))


def predicted_vs_reused(policy: str, stats_before: dict[str, float],
                        stats_after: dict[str, float], reused: float,
                        sent: float) -> dict[str, float | None]:  # fmt: skip
    """Over a run on the exact index: the prompt tokens the gateway predicted the chosen
    replicas hold, the ones vLLM reports it reused (`reused`: its prefix_cache_hits, every
    replica), and the share of the run's requests routed on the index (the issue's 5%
    compares the first two; it is only a comparison where that share is whole)."""
    names = PREDICTED_STATS.get(policy)
    if names is None or names[0] not in stats_after:
        return {"predicted_tokens": None, "reused_tokens": None, "on_index": None}
    tokens, routed = names
    delta = {k: stats_after.get(k, 0.0) - stats_before.get(k, 0.0) for k in (tokens, routed)
             if k is not None}  # fmt: skip
    on_index = delta[routed] / sent if routed is not None and sent else 1.0
    return {"predicted_tokens": delta[tokens], "reused_tokens": reused, "on_index": on_index}
