"""A full prefill step's time, read from the calibration cases' token arrivals: `prefill_scale`.

The profile composes a step from operators measured one by one. On DeepSeek-V2-Lite the
steps that fill vLLM's 8,192-token budget took about 90 ms in the calibration bursts where
the operators compose 70 (its grouped MoE and MLA prefill at that size are not the
operators'), and under load that gap decides how fast waiting prompts are taken in: the
simulator admitted them a third faster than vLLM, and its TTFT at 256 in flight was a third
of the measured. Llama-3.1-8B (bf16, FP8) and Qwen2.5-32B compose to within a few percent
of theirs.

`fit_prefill_scales` reads, per profile (model, weight format), the full prefill steps of its
calibration cases with more than one request in flight (`servepilot.bench.prefill_cadence`),
composes each step's shape (the budget less its decoders in prefill chunks, beside its
decoders), and takes what the steps took together beyond their decoders' own time as a
multiple of what the operators compose for them: the profile's `meta.prefill_scale`, which
scales what a step's prefill chunks add (compose.py). Together, not a median of ratios: with
async scheduling an eager step's launch overlaps the step before, so single periods alternate
(63 then 94 ms), and what sets how fast prompts are taken in is their sum. Steps that on
average took no longer than the profile's eager launch (the host's, `eager_mixed_step_ms`)
say nothing about the GPU: no fit. Fitted on calibration cases only.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, cast

from benchmarks.gpu_sim_cases import PROFILES, RUNS, Run
from benchmarks.gpu_sim_report import measurements, write_meta
from servepilot.bench.prefill_cadence import FullStep, full_steps
from servepilot.bench.token_times import FILE_NAME as TOKEN_TIMES
from servepilot.bench.token_times import read_token_times
from servepilot.plan.costmodel import StepShape, prefill_pairs
from servepilot.plan.gpu_profile.compose import StepComposer
from servepilot.plan.gpu_profile.table import GpuProfile, load_gpu_profile

MIN_STEPS = 3
"""Fewer full steps than this fit nothing (one burst of 16 prompts gives one or two)."""


def step_times_s(
    step: FullStep, composer: StepComposer, budget_tokens: int, run: Run
) -> tuple[float, float]:
    """(composed, decoders alone): the operators' time for this step's shape, and for its
    decoders without the prefill chunks."""
    prompt = _flag(run, "--input-tokens")
    context = prompt + _flag(run, "--output-tokens") // 2
    prefill = max(0, budget_tokens - step.decoders)
    chunks = step.prompts + 1  # the step also starts the next prompt with what is left
    per_chunk = prefill // chunks
    shape = StepShape(prefill, chunks, step.decoders, step.decoders * context,
                      chunks * prefill_pairs(per_chunk, 0))  # fmt: skip
    alone = composer.gpu_time_s(StepShape(0, 0, step.decoders, step.decoders * context, 0))
    return composer.gpu_time_s(shape), alone


def prefill_scale(steps: list[tuple[float, float, float]], eager_s: float) -> float | None:
    """From (measured, composed, decoders alone) per full step: the steps' prefill time
    together over the operators' for it, at least 1. None for fewer than `MIN_STEPS` steps,
    or steps that on average took no longer than the host's eager launch `eager_s`."""
    if len(steps) < MIN_STEPS:
        return None
    measured = sum(step[0] for step in steps)
    composed = sum(step[1] for step in steps)
    alone = sum(step[2] for step in steps)
    if measured / len(steps) <= eager_s * 1.05:
        return None
    # Not below 1: the simulator's step model keeps the token operators as measured and fits
    # the rest of a step on top (compose.linearize), so a prefill faster than its operators
    # cannot be written; the steps read below 1 (Qwen2.5-32B 0.99) were within their noise.
    return max(1.0, (measured - alone) / (composed - alone))


def fit_prefill_scales(folders: list[Path]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per profile (model, dtype) whose calibration cases' token arrivals hold enough full
    steps (`prefill_scale`), its `prefill_scale`; written into the meta of that profile in
    every folder."""
    steps: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    eager_s: dict[tuple[str, str], float] = {}
    cases: dict[tuple[str, str], list[str]] = {}
    for folder in folders:
        for run in RUNS:
            key = PROFILES[run.config]
            levels = [level for level in run.calibration if float(level) > 1]
            config_dir = folder / run.config
            for rep in measurements(config_dir / run.name) if levels else []:
                arrivals = rep.parent / TOKEN_TIMES
                if not arrivals.exists():
                    continue
                profile = _unscaled(folder, config_dir, key)
                composer = StepComposer(profile, 0.0, 0.0)
                budget = _budget_tokens(config_dir)
                rows = read_token_times(arrivals)
                for level in levels:
                    level_rows = [r for r in rows if r["load_value"] == float(level)]
                    requests = [(cast(float, r["sent_s"]), cast(list[float], r["chunk_s"]))
                                for r in level_rows if not r["warmup"]]  # fmt: skip
                    found = full_steps(requests)
                    for step in found:
                        composed, alone = step_times_s(step, composer, budget, run)
                        steps.setdefault(key, []).append((step.period_s, composed, alone))
                    eager_s[key] = profile.eager_mixed_step_s
                    cases.setdefault(key, []).append(
                        f"{folder.name}/{run.config}/{run.name}@{level}/{rep.parent.name} "
                        f"({len(found)} steps)"
                    )
    fits = {}
    for key, found_steps in steps.items():
        scale = prefill_scale(found_steps, eager_s[key])
        if scale is None:
            continue
        fits[key] = {
            "prefill_scale": round(scale, 3),
            "prefill_scale_fitted_on": ", ".join(cases[key]) + " (calibration)",
        }
        for folder in folders:
            write_meta(folder / "profiles", key[0], fits[key], dtype=key[1])
    return fits


def _unscaled(folder: Path, config_dir: Path, key: tuple[str, str]) -> GpuProfile:
    """The config's profile in `folder`, composing its operators as measured (scale 1)."""
    from benchmarks.gpu_sim_report import sim_fleet

    gpu = sim_fleet(config_dir, None)["hardware"]["accelerator"].split("-")[0]
    profile = load_gpu_profile(folder / "profiles" / f"{gpu}-{key[0]}-{key[1]}.json")
    return dataclasses.replace(profile, prefill_scale=1.0)


def _budget_tokens(config_dir: Path) -> int:
    """The engine's max_num_batched_tokens, as planned for the fleet that was measured."""
    plan = json.loads((config_dir / "plan.json").read_text())
    return int(plan["knobs"]["max_num_batched_tokens"]["value"])


def _flag(run: Run, name: str) -> int:
    return int(run.flags[run.flags.index(name) + 1])
