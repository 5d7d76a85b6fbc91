"""`servepilot accept`'s steps against a live fleet: the startup logs, a smoke request, the
sweep and the soak (bench's session, in process: the same load, the same numbers as
`servepilot bench`), the replicas' preemptions around them; then seed 004's verdicts."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from servepilot.bench.chat_template import measure_chat_frame
from servepilot.bench.client import Target
from servepilot.bench.session import BenchOptions, BenchOutput, BenchReporter, run_bench
from servepilot.bench.soak import MemorySampler
from servepilot.bench.tokenizer import Tokenizer
from servepilot.core.config import FleetConfig
from servepilot.core.errors import FleetError, ServepilotError
from servepilot.core.results import Load, LoadMode
from servepilot.engine.metrics import EngineMetric
from servepilot.engine.startup_log import parse_kv_capacity
from servepilot.load.arrivals import Arrival
from servepilot.load.levels import LevelOptions
from servepilot.load.sweep import SweepConfig
from servepilot.load.workload import WorkloadSpec
from servepilot.observe.accept.items import Item, Measured, Smoke, checklist
from servepilot.observe.top.poll import gateway_pages, replica_pages
from servepilot.plan.presets import load_model

SMOKE_PROMPT = "Say hello in five words."
SMOKE_MAX_TOKENS = 16


@dataclass(frozen=True, slots=True)
class AcceptOptions:
    target: Target
    config: FleetConfig
    logs: Mapping[str, str]
    """Each replica's log text by id (the run folder's, when `up` runs the fleet here)."""
    requests: int
    """Requests per sweep level."""
    max_concurrency: int
    """The sweep's highest level."""
    input_tokens: int
    output_tokens: int
    soak_s: float
    seed: int = 0
    memory_sources: MemorySampler | None = None
    """The soak's memory beyond the gateway's /metrics: the replicas' processes and GPUs, as
    `bench --soak` reads them (fleet/soak_memory.py)."""


@dataclass(frozen=True, slots=True)
class Acceptance:
    items: tuple[Item, ...]
    measured: Measured
    sweep: BenchOutput | None
    soak: BenchOutput | None


async def run_accept(
    opts: AcceptOptions,
    tokenizer: Tokenizer,
    reporter: BenchReporter,
    step: Callable[[str], None],
) -> Acceptance:
    kv = {replica_id: parse_kv_capacity(log) for replica_id, log in opts.logs.items()}
    step("smoke: one request")
    smoke = await smoke_request(opts.target)
    sweep = soak = None
    before, replicas = fleet_counts(opts.target.base_url)
    if smoke.ok:
        step(
            f"sweep: concurrency 1 to at most {opts.max_concurrency}, {opts.requests} "
            "requests a level"
        )
        sweep = await run_bench(_sweep_options(opts, tokenizer), tokenizer, reporter)
        spot = sweep.result.sweet_spot
        load = spot.load if spot is not None else Load(mode=LoadMode.CONCURRENCY, value=1)
        step(f"soak: {opts.soak_s:,.0f} s at concurrency {load.value:g}")
        soak = await run_bench(_soak_options(opts, tokenizer, load), tokenizer, reporter)
    after, _ = fleet_counts(opts.target.base_url)
    measured = Measured(
        config=opts.config,
        kv=kv,
        smoke=smoke,
        sweep=sweep.result if sweep else None,
        soak=soak.result.runs[0] if soak and soak.result.runs else None,
        soak_s=opts.soak_s,
        preemptions=None if before is None or after is None else max(0.0, after - before),
        recorded=True,
        replicas=replicas,
        moe=is_moe(opts.config),
    )
    return Acceptance(checklist(measured), measured, sweep, soak)


def _levels(
    opts: AcceptOptions, loads: tuple[Load, ...], sweep: SweepConfig | None
) -> LevelOptions:
    return LevelOptions(
        workload=WorkloadSpec(
            input_tokens=opts.input_tokens, output_tokens=opts.output_tokens, seed=opts.seed
        ),
        loads=loads,
        sweep=sweep,
        requests=opts.requests if sweep is not None else None,
        duration_s=None,
        warmup_requests=0,
        arrival=Arrival.POISSON,
        burstiness=1.0,
    )


def _sweep_options(opts: AcceptOptions, tokenizer: Tokenizer) -> BenchOptions:
    sweep = SweepConfig(max_value=float(opts.max_concurrency))
    return BenchOptions(
        target=opts.target,
        levels=_levels(opts, (), sweep),
        seed=opts.seed,
        slo=opts.config.slo,
        chat=measure_chat_frame(tokenizer, opts.target.endpoint),
    )


def _soak_options(opts: AcceptOptions, tokenizer: Tokenizer, load: Load) -> BenchOptions:
    return BenchOptions(
        target=opts.target,
        levels=_levels(opts, (load,), None),
        seed=opts.seed + 1,
        slo=opts.config.slo,
        soak_s=opts.soak_s,
        window_s=max(5.0, opts.soak_s / 6),
        memory_sources=opts.memory_sources,
        chat=measure_chat_frame(tokenizer, opts.target.endpoint),
    )


async def smoke_request(target: Target) -> Smoke:
    """One short chat request, not streamed: does the model load and answer?"""
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": SMOKE_PROMPT}],
        "max_tokens": SMOKE_MAX_TOKENS,
    }
    headers = {"Authorization": f"Bearer {target.api_key}"} if target.api_key else {}
    started = time.perf_counter()
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=target.timeout_s)) as s,
            s.post(f"{target.base_url}/v1/chat/completions", json=body, headers=headers) as resp,
        ):
            text = await resp.text()
            if resp.status != 200:
                return Smoke(False, f"HTTP {resp.status}: {text[:300]}", _since(started))
            doc = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Smoke(False, f"the request failed: {exc!r}", _since(started))
    content = _content(doc)
    if not content:
        return Smoke(False, f"an answer without text: {text[:300]}", _since(started))
    return Smoke(True, content[:120], _since(started))


def _content(doc: Any) -> str:
    try:
        return str(doc["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        return ""


def _since(started: float) -> float:
    return time.perf_counter() - started


def is_moe(config: FleetConfig) -> bool | None:
    """Whether the fleet's model is a mixture of experts (its preset or config.json)."""
    try:
        return load_model(config.model.source).is_moe
    except ServepilotError:
        return None


def fleet_counts(gateway_url: str) -> tuple[float | None, int]:
    """vLLM's preemptions summed over the fleet's replicas (None when a page was not read),
    and how many replicas the gateway routes to."""
    try:
        _, replicas = gateway_pages(gateway_url)
    except FleetError:  # a gateway that stopped answering: the verdict says it was not read
        return None, 0
    pages, _, problems = replica_pages(replicas)
    if problems or not pages:
        return None, len(replicas)
    return sum(page.total(EngineMetric.PREEMPTIONS) for page in pages.values()), len(replicas)
