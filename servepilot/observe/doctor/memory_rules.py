"""Rules about memory: out of memory, preemptions, a KV cache near full (seed 004's table:
OOM at start -> shorter context or gpu-util 0.85; KV too tight -> more KV room or fewer
sequences)."""

from __future__ import annotations

import math
import re

from servepilot.core.config import Device, FleetConfig
from servepilot.engine.metrics import EngineMetric, Scrape
from servepilot.engine.startup_log import diagnose_failure, parse_kv_capacity
from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity
from servepilot.plan.request import fleet_vllm_defaults

KV_NEAR_FULL = 0.90
"""KV cache usage at which new requests start to wait for blocks (and preemptions follow)."""
SAFE_GPU_MEMORY_UTILIZATION = 0.85
"""Seed 004: the start that runs out of memory gets gpu-memory-utilization 0.85."""
MAX_GPU_MEMORY_UTILIZATION = 0.95
"""vLLM's DeepSeek recipe: the most of a GPU worth giving vLLM."""
# vLLM v1 logs "Preemptions: N" in its periodic stats line; v0 logged each preemption.
_PREEMPTION_LOG = re.compile(r"Preemptions: [1-9]\d*|is preempted by PreemptionMode")
# vLLM's KV-too-small error says what the space it found does hold.
# `(EngineCore pid=4667) ERROR 11-29 10:06:03 [core.py:1510] `: who logged it, and when.
_LOG_PREFIX = re.compile(r"^(\([^)]*\) )?[A-Z]+ [\d-]+ [\d:]+ \[[^\]]*\] ")
_ESTIMATED_MODEL_LEN = re.compile(r"estimated maximum model length is (\d+)")


def oom(evidence: Evidence) -> list[Finding]:
    found = []
    for replica in evidence.replicas:
        line = _oom_line(replica.log)
        if line is None:
            continue
        knob, value, words = _smaller_footprint(evidence.config, line[0], line[1])
        found.append(
            Finding(
                "oom",
                Severity.PROBLEM,
                f"{replica.replica_id} ran out of memory ({line[1]})",
                evidence=f"{replica.replica_id}'s log: {_message(line[0])}",
                fix=words,
                knob=knob,
                value=value,
            )
        )
    return found


def _oom_line(log: str) -> tuple[str, str] | None:
    """The first log line startup_log's failure patterns read as out of memory, and the
    cause they name."""
    for line in log.splitlines():
        cause, _ = diagnose_failure(line, 0)
        if cause.startswith("out of memory"):
            return line, cause
    return None


def _message(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())[:400]


def _smaller_footprint(config: FleetConfig, line: str, cause: str) -> tuple[str, str, str]:
    engine = config.engine
    safe = _each_replicas(SAFE_GPU_MEMORY_UTILIZATION, config)
    if (
        config.hardware.device is Device.GPU
        and "max_model_len" not in cause
        and engine.gpu_memory_utilization > safe
    ):
        value = f"{safe:g}"
        return (
            "engine.gpu_memory_utilization",
            value,
            f"lower engine.gpu_memory_utilization to {value} (from "
            f"{engine.gpu_memory_utilization:g}): room for fragmentation and bursts",
        )
    needed = config.traffic.max_input_tokens or 4 * config.traffic.input_tokens
    needed += config.traffic.max_output_tokens or 4 * config.traffic.output_tokens
    current = engine.max_model_len
    estimate = _ESTIMATED_MODEL_LEN.search(line)
    holds = int(estimate.group(1)) if estimate else None
    if (current is None or needed < current) and (holds is None or needed <= holds):
        was = "the model's own" if current is None else f"{current:,}"
        return (
            "engine.max_model_len",
            str(needed),
            f"lower engine.max_model_len to {needed:,} (from {was}): the longest prompt + "
            "output the traffic needs; every token beyond it is KV memory taken away",
        )
    # The KV space cannot hold even what the traffic needs: it must grow, by what is missing.
    knob, value, words = more_kv_memory(config, needed / holds if holds else 1.5)
    if holds:
        words += f": it holds {holds:,} tokens, the traffic needs {needed:,}"
    return knob, value, words


def more_kv_memory(config: FleetConfig, factor: float = 1.5) -> tuple[str, str, str]:
    """The knob that gives the KV cache more room on this fleet's device, its new value, and
    the fix in words; on CPU the space grows by `factor`."""
    engine = config.engine
    if config.hardware.device is Device.CPU:
        value = f"{math.ceil(engine.cpu_kv_cache_space_gib * factor * 100) / 100:g}"
        return (
            "engine.cpu_kv_cache_space_gib",
            value,
            f"raise engine.cpu_kv_cache_space_gib to {value} (from "
            f"{engine.cpu_kv_cache_space_gib:g})",
        )
    most = _each_replicas(MAX_GPU_MEMORY_UTILIZATION, config)
    value = f"{min(most, engine.gpu_memory_utilization + 0.05):g}"
    return (
        "engine.gpu_memory_utilization",
        value,
        f"raise engine.gpu_memory_utilization to {value} (from "
        f"{engine.gpu_memory_utilization:g}), or set engine.kv_cache_dtype: fp8",
    )


def _each_replicas(share: float, config: FleetConfig) -> float:
    """A whole GPU's `share` as each replica's when hardware.replicas_per_gpu share it (rounded
    down: together they stay within it)."""
    shared = config.hardware.replicas_per_gpu
    return share if shared == 1 else math.floor(share / shared * 1000) / 1000


def max_num_seqs(config: FleetConfig) -> int:
    """The fleet's max_num_seqs: as configured, else vLLM's default on its accelerator."""
    if config.engine.max_num_seqs is not None:
        return config.engine.max_num_seqs
    return fleet_vllm_defaults(config).max_num_seqs


def preemptions(evidence: Evidence) -> list[Finding]:
    pages = evidence.pages()
    found = []
    for replica in evidence.replicas:
        page = pages.get(replica.replica_id)
        count = page.total(EngineMetric.PREEMPTIONS) if page is not None else 0.0
        seen = f"vllm:num_preemptions_total {count:,.0f}"
        if not count and (match := _PREEMPTION_LOG.search(replica.log)):
            seen = f"its log: {match.group(0)}"
        elif not count:
            continue
        found.append(
            _preemption_finding(evidence.config, replica.replica_id, seen, replica.log, page)
        )
    return found


def _preemption_finding(
    config: FleetConfig, replica_id: str, seen: str, log: str, page: Scrape | None
) -> Finding:
    knob, value, words = more_kv_memory(config)
    fix = words
    capacity = parse_kv_capacity(log)
    per_request = _tokens_per_request(config, page)
    if capacity is not None:
        fitting = max(1, math.floor(capacity.kv_capacity_tokens / per_request))
        if fitting < max_num_seqs(config):
            knob, value = "engine.max_num_seqs", str(fitting)
            fix += (
                f", or lower engine.max_num_seqs to {fitting} (from {max_num_seqs(config)}): "
                f"what {capacity.kv_capacity_tokens:,} KV tokens hold at {per_request:,.0f} "
                "tokens a request"
            )
    return Finding(
        "preemptions",
        Severity.PROBLEM,
        f"{replica_id} preempts requests: its KV cache cannot hold every running sequence, so "
        "some are evicted and recomputed (latency spikes, wasted compute)",
        evidence=f"{replica_id}: {seen}",
        fix=fix,
        knob=knob,
        value=value,
    )


def _tokens_per_request(config: FleetConfig, page: Scrape | None) -> float:
    """Prompt + generated tokens of a finished request on the replica, else the traffic's."""
    if page is not None and (done := page.total(EngineMetric.REQUESTS_FINISHED)):
        tokens = page.total(EngineMetric.PROMPT_TOKENS) + page.total(EngineMetric.GENERATION_TOKENS)
        if tokens:
            return tokens / done
    return float(config.traffic.input_tokens + config.traffic.output_tokens)


def kv_near_full(evidence: Evidence) -> list[Finding]:
    found = []
    for replica_id, page in evidence.pages().items():
        usage = page.peak(EngineMetric.KV_CACHE_USAGE)
        if usage < KV_NEAR_FULL:
            continue
        knob, value, words = more_kv_memory(evidence.config)
        found.append(
            Finding(
                "kv_near_full",
                Severity.WARNING,
                f"{replica_id}'s KV cache is {usage:.0%} full: new requests wait for blocks and "
                "running ones are preempted next",
                evidence=f"{replica_id}: {page.family(EngineMetric.KV_CACHE_USAGE)} {usage:.3f}",
                fix=f"{words}, or lower engine.max_model_len to what the traffic needs",
                knob=knob,
                value=value,
            )
        )
    return found
