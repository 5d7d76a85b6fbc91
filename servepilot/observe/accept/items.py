"""Seed 004's acceptance checklist for a single-node deployment, as pure verdicts on what
`accept` measured: the eight items, in the seed's order, each passed or failed with its
evidence (or not applicable to this fleet, and why).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from servepilot.bench.shortfalls import (
    LEAK_BYTES_PER_REQUEST,
    leak_bytes_per_request,
    leaking_sources,
)
from servepilot.core.config import Device, FleetConfig
from servepilot.core.results import BenchResult, Run
from servepilot.core.slo import Metric
from servepilot.engine.startup_log import KvCapacity

MAX_FAILED_SHARE = 0.01
"""A soak that fails more than 1% of its requests avalanched."""
MAX_P99_DRIFT = 2.0
"""A soak whose last window's E2E P99 is more than twice its first drifted."""
MIN_DRIFT_WINDOW_REQUESTS = 100
"""Below a hundred requests a window's P99 is its slowest request or two: a drift between
two such windows is one request's luck, not the fleet's (a short soak's windows)."""
SEED_SOAK_S = 30 * 60.0
"""Seed 004 soaks for 30 minutes at least."""


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NOT_APPLICABLE = "n/a"


@dataclass(frozen=True, slots=True)
class Item:
    number: int
    title: str
    verdict: Verdict
    evidence: str


@dataclass(frozen=True, slots=True)
class Smoke:
    ok: bool
    detail: str
    """The answer's start, or the error."""
    latency_s: float


@dataclass(frozen=True, slots=True)
class Measured:
    """Everything `accept` found, the inputs of the verdicts."""

    config: FleetConfig
    kv: Mapping[str, KvCapacity | None]
    """Each replica's startup KV report by id; empty when no log could be read."""
    smoke: Smoke
    sweep: BenchResult | None
    soak: Run | None
    soak_s: float
    preemptions: float | None
    """Preemptions on the replicas during the sweep and the soak; None when not read."""
    recorded: bool
    """The configuration and the steps were written into the report."""
    replicas: int = 1
    """Replicas the gateway routes to."""
    moe: bool | None = None
    """Whether the model is a mixture of experts; None when its spec could not be read."""


def checklist(m: Measured) -> tuple[Item, ...]:
    return (
        tensor_parallel(m.config, m.replicas, m.moe),
        smoke(m.smoke),
        startup_baseline(m.kv, m.config),
        sweep_measured(m.sweep),
        sweet_spot(m.sweep, m.config),
        quantization(m.preemptions, m.config),
        soak(m.soak, m.soak_s, m.config),
        Item(
            8,
            "configuration and steps written down, reproducibly",
            Verdict.PASS if m.recorded else Verdict.FAIL,
            "report.json holds the effective fleet.yaml and the commands that ran"
            if m.recorded
            else "the report could not be written",
        ),
    )


def tensor_parallel(config: FleetConfig, replicas: int, moe: bool | None = None) -> Item:
    title = "TP fills the node (= its GPUs); MoE adds EP"
    engine, hardware = config.engine, config.hardware
    if hardware.device is Device.CPU:
        return Item(
            1,
            title,
            Verdict.NOT_APPLICABLE,
            f"CPU replicas: no tensor parallelism ({replicas} replica{_plural(replicas)})",
        )
    per_replica = engine.tensor_parallel_size * engine.data_parallel_size
    ep = ", expert parallel on" if engine.enable_expert_parallel else ""
    seen = (
        f"tensor_parallel_size {engine.tensor_parallel_size} x data_parallel_size "
        f"{engine.data_parallel_size} on a node of {hardware.count} GPUs{ep}"
    )
    if per_replica != hardware.count:
        return Item(1, title, Verdict.FAIL, seen)
    if moe and not engine.enable_expert_parallel:
        return Item(
            1,
            title,
            Verdict.FAIL,
            f"{seen}; the model is MoE: set engine.enable_expert_parallel: true",
        )
    if moe is None:
        seen += "; MoE or not: the model's spec could not be read"
    return Item(1, title, Verdict.PASS, seen)


def smoke(result: Smoke) -> Item:
    title = "a minimal request runs: the model loads and answers"
    if result.ok:
        return Item(
            2,
            title,
            Verdict.PASS,
            f"answered in {result.latency_s * 1000:,.0f} ms: {result.detail!r}",
        )
    return Item(2, title, Verdict.FAIL, result.detail)


def startup_baseline(kv: Mapping[str, KvCapacity | None], config: FleetConfig) -> Item:
    title = "startup logs read: KV capacity, the tuning baseline"
    if not kv:
        return Item(
            3,
            title,
            Verdict.NOT_APPLICABLE,
            "no replica log here (a fleet given by --url that `up` does not run here)",
        )
    parts, missing = [], []
    for replica_id, capacity in kv.items():
        if capacity is None:
            missing.append(replica_id)
            continue
        conc = (
            f", {capacity.max_concurrency:g} requests of {capacity.max_model_len_tokens:,} "
            "tokens at once"
            if capacity.max_concurrency
            else ""
        )
        parts.append(f"{replica_id}: {capacity.kv_capacity_tokens:,} KV tokens{conc}")
    if missing:
        parts.append(f"no KV capacity line in the log of {', '.join(missing)}")
    seqs = config.engine.max_num_seqs
    parts.append(f"max_num_seqs {seqs if seqs is not None else 'vLLM default'}")
    return Item(3, title, Verdict.FAIL if missing else Verdict.PASS, "; ".join(parts))


def sweep_measured(sweep: BenchResult | None) -> Item:
    title = "load test: throughput, TTFT, TPOT and P99 over a concurrency curve"
    if sweep is None or not sweep.runs:
        return Item(4, title, Verdict.FAIL, "the sweep did not run")
    lines = [_level_line(run) for run in sweep.runs]
    measured = [r for r in sweep.runs if r.completed and r.ttft_ms.p99 is not None]
    complete = len(measured) >= 2 and all(r.tpot_ms.p99 is not None for r in measured)
    return Item(
        4,
        title,
        Verdict.PASS if complete else Verdict.FAIL,
        f"{len(sweep.runs)} levels: " + "; ".join(lines),
    )


def _level_line(run: Run) -> str:
    return (
        f"c={run.load.value:g} {run.output_throughput:,.1f} tok/s, TTFT p99 {_ms(run.ttft_ms.p99)}"
        f", TPOT p99 {_ms(run.tpot_ms.p99)}, E2E p99 {_ms(run.e2e_ms.p99)}"
        + (f", {run.failed} failed" if run.failed else "")
    )


def sweet_spot(sweep: BenchResult | None, config: FleetConfig) -> Item:
    title = "the sweet spot found, one knob (concurrency) at a time; P99 within the SLA there"
    spot = sweep.sweet_spot if sweep is not None else None
    if sweep is None or spot is None:
        return Item(5, title, Verdict.FAIL, "no sweet spot: the sweep found no knee")
    run = next(r for r in sweep.runs if r.load == spot.load)
    over = slo_breaches(run, config)
    seen = f"c={spot.load.value:g} ({spot.reason}): {_level_line(run)}"
    if over:
        return Item(5, title, Verdict.FAIL, f"{seen}; over the SLA: {', '.join(over)}")
    limits = ", ".join(f"{k} {v:g}" for k, v in config.slo.as_dict().items()) or "none set"
    return Item(5, title, Verdict.PASS, f"{seen}; SLA ({limits}) met")


def slo_breaches(run: Run, config: FleetConfig) -> list[str]:
    """The fleet.yaml slo limits `run` exceeds: its level limits and its p99 limits."""
    over = list(config.slo.violated(run))
    for metric in (Metric.TTFT, Metric.TPOT, Metric.E2E):
        limit = config.slo.per_request_ms(metric)
        value = getattr(run, f"{metric.value}_ms").p99
        if limit is not None and value is not None and value > limit:
            over.append(f"{metric.value}_p99_ms {value:,.0f} > {limit:g}")
    return over


def quantization(preemptions: float | None, config: FleetConfig) -> Item:
    title = "quantization when the KV budget binds (FP8/INT8 weights, KV cache quantization)"
    engine = config.engine
    quantized = engine.quantization is not None or engine.kv_cache_dtype != "auto"
    if preemptions is None:
        return Item(6, title, Verdict.NOT_APPLICABLE, "the replicas' preemptions were not read")
    if not preemptions:
        return Item(
            6, title, Verdict.PASS, "not needed: no preemption during the sweep and the soak"
        )
    seen = f"{preemptions:,.0f} preemptions during the sweep and the soak: the KV cache binds"
    if quantized:
        return Item(
            6,
            title,
            Verdict.PASS,
            f"{seen}; quantized (quantization "
            f"{engine.quantization}, kv_cache_dtype {engine.kv_cache_dtype})",
        )
    return Item(
        6, title, Verdict.FAIL, f"{seen}, and nothing is quantized: try engine.kv_cache_dtype: fp8"
    )


def soak(run: Run | None, soak_s: float, config: FleetConfig) -> Item:
    title = f"soak at the sweet spot: no leak, no avalanche ({SEED_SOAK_S / 60:.0f} min+ to accept)"
    if run is None:
        return Item(7, title, Verdict.FAIL, "the soak did not run")
    attempted = run.completed + run.failed
    problems = _leaks(run)
    if not attempted or run.failed / attempted > MAX_FAILED_SHARE:
        problems.append(f"{run.failed} of {attempted} requests failed {dict(run.errors)}")
    drift = _p99_drift(run)
    if drift is not None and drift > MAX_P99_DRIFT:
        problems.append(f"E2E P99 drifted {drift:.1f}x from the first window to the last")
    problems += [f"over the SLA: {b}" for b in slo_breaches(run, config)]
    seen = (
        f"{soak_s:,.0f} s at c={run.load.value:g}: {run.completed:,} ok, {run.failed} failed, "
        f"E2E p99 {_ms(run.e2e_ms.p99)}, {_memory_text(run)}, {len(run.windows)} windows"
    )
    if drift is None and len(run.windows) >= 2:
        seen += (
            f"; P99 drift not judged: fewer than two windows hold the "
            f"{MIN_DRIFT_WINDOW_REQUESTS} requests a P99 needs"
        )
    if soak_s < SEED_SOAK_S:
        seen += (
            f" (shorter than the {SEED_SOAK_S / 60:.0f} min acceptance soak: --soak 30m for "
            "the real one)"
        )
    if problems:
        return Item(7, title, Verdict.FAIL, f"{seen}; " + "; ".join(problems))
    return Item(7, title, Verdict.PASS, seen)


def _leaks(run: Run) -> list[str]:
    """The soak's leaks by the 2 MB/request rule, the gateway's and each replica source's; a
    soak that read no replica memory did not check for one (the gateway is not the engine)."""
    above = f"(leak above {LEAK_BYTES_PER_REQUEST / 2**20:g} MiB)"
    found = []
    if (growth := leak_bytes_per_request(run)) is not None:
        found.append(f"memory grew {growth / 2**20:.1f} MiB per request {above}")
    for source, grew in leaking_sources(run).items():
        found.append(f"{source}: memory grew {grew / 2**20:.1f} MiB per request {above}")
    if not run.memory_growth_by_source_bytes_per_request:
        found.append(
            "could not check the replicas for a leak: no replica process or GPU memory was "
            "read (accept reads them for a fleet `servepilot up` runs on this machine)"
        )
    return found


def _memory_text(run: Run) -> str:
    gateway = run.memory_growth_bytes_per_request
    said = "memory a request: the gateway " + (
        "unknown" if gateway is None else f"{gateway / 1024:,.1f} KiB"
    )
    by_source = run.memory_growth_by_source_bytes_per_request
    if by_source:
        worst = max(by_source, key=lambda name: by_source[name])
        said += f", the replicas' at most {by_source[worst] / 1024:,.1f} KiB ({worst})"
    return said


def _p99_drift(run: Run) -> float | None:
    """The last window's E2E P99 over the first's, among windows with enough requests for a
    P99; None where fewer than two have them."""
    p99s = [
        w.e2e_p99_ms
        for w in run.windows
        if w.e2e_p99_ms and w.completed >= MIN_DRIFT_WINDOW_REQUESTS
    ]
    if len(p99s) < 2:
        return None
    return p99s[-1] / p99s[0]


def _plural(count: int) -> str:
    return "" if count == 1 else "s"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} ms"
