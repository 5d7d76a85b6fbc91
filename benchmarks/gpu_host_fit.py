"""What a GPU loan's operators do not measure, fitted per model on its calibration cases.

`gpu_sim_report.py --fit` calls `fit_profiles`: vLLM's host time per step, and a request's
time beside the engine's steps (a fixed part and a part per prompt token), written into the
meta of the loan folder's profiles, where `servepilot sim` and `plan` read them. Only the
calibration cases of gpu_sim_cases.py are read (`_case` refuses any other).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.gpu_sim_cases import PROFILES, RUNS
from benchmarks.gpu_sim_report import figures, measurements, predict, sim_fleet, write_meta
from servepilot.bench.token_spread import step_spreads_s, us_per_token
from servepilot.bench.token_times import FILE_NAME as TOKEN_TIMES
from servepilot.bench.token_times import read_token_times
from servepilot.sim.fleet.members import INTAKE_WAIT_S

FIT_CONFIG = {"llama-3.1-8b": "llama-8b", "qwen2.5-32b": "qwen2.5-32b",
              "deepseek-v2-lite": "deepseek-v2-lite"}  # fmt: skip
"""Per model, the config whose calibration cases (closed-short@1: 1,000-token prompts one at a
time; long-max@1: the longest prompt) fit its profiles. A profile of another weight format
of the model (llama-3.1-8b fp8, whose variant runs have no long prompt) takes the same fit:
one host, one vLLM, one model's prefill path."""


def fit_profiles(folder: Path) -> dict[str, dict[str, Any]]:
    """Fit, per model, what the operators do not measure, on its own calibration cases, and
    write it into the meta of the model's profiles in `folder/profiles`:
    - `step_overhead_ms`: vLLM's host time per step beside the GPU's, the TPOT of
      closed-short@1 measured minus simulated without it (one request: a decode step is a
      TPOT);
    - `request_overhead_ms` and `intake_us_per_prompt_token`: what a TTFT has beyond the
      engine's steps, a fixed part and a part per prompt token (tokenising, in the gateway
      for the exact index and in vLLM's API server), solved on closed-short@1 and
      long-max@1 (prompts of 1,000 and up to 32,000 tokens);
    - with the profile's `prefill_scale` as it stands: read before, from the full prefill
      steps of the calibration bursts (gpu_prefill_fit.py), never fitted to TTFTs (a scale
      fitted to them took in the host's per-token time and slowed every simulated step that
      carried a prefill).
    Fitted on one model each, not the median over models: on 2026-12-06 one host term could
    not fit both Llama-3.1-8B (11 ms of TTFT beside the operators) and DeepSeek-V2-Lite
    (82 ms)."""
    fits: dict[str, dict[str, Any]] = {}
    for model, config in FIT_CONFIG.items():
        if not (folder / config / "long-max").is_dir():
            continue
        base = {"step_overhead_ms": 0.0, "request_overhead_ms": 0.0,
                "intake_us_per_prompt_token": 0.0}  # fmt: skip
        step_ms = max(0.0, _gap(folder, config, "closed-short", "tpot_p50_ms", base))
        base["step_overhead_ms"] = step_ms
        # One request at a time: the TTFT is linear in both terms, with nothing queued.
        points = []
        for name in ("closed-short", "long-max"):
            measured, simulated = _ttfts(folder, config, name, base)
            points.append((prompt_tokens(config, name), measured - simulated))
        request_ms, intake_us = solve_host(points[0], points[1])
        if intake_us > 0:  # the simulated intake waits for more prompts first: not twice
            request_ms -= INTAKE_WAIT_S * 1e3
        fits[model] = {
            "step_overhead_ms": round(step_ms, 3),
            "request_overhead_ms": round(max(0.0, request_ms), 2),
            "intake_us_per_prompt_token": round(max(0.0, intake_us), 3),
            "fitted_on": f"closed-short@1 and long-max@1 (calibration) of {config} in "
            f"{folder.name}",
        }
    for model, fit in fits.items():
        write_meta(folder / "profiles", model, fit)
    return fits


def streaming_us_per_token(folders: list[Path]) -> tuple[float, str] | None:
    """vLLM's API server's time per token it streams, from the token arrivals (`bench
    --token-times`) of the calibration cases with more than one request in flight: one
    process detokenises and streams a step's tokens one request after another, so they
    reach the client spread out. Per step, (last - first) / (tokens - 1); the median over
    every step of those cases. None when no calibration case has token arrivals. One
    figure for every model of a host: its API server is the same code whatever it serves."""
    spreads: list[float] = []
    cases = []
    for folder in folders:
        for run in RUNS:
            levels = [level for level in run.calibration if float(level) > 1]
            for rep in measurements(folder / run.config / run.name)[-1:]:
                arrivals = rep.parent / TOKEN_TIMES
                if not levels or not arrivals.exists():
                    continue
                rows = read_token_times(arrivals)
                for level in levels:
                    measured = [r for r in rows if r["load_value"] == float(level)]
                    steps = step_spreads_s([r["chunk_s"] for r in measured if not r["warmup"]])
                    spreads += steps
                    cases.append(f"{run.config}/{run.name}@{level} ({len(steps)} steps)")
    streaming = us_per_token(spreads)
    return None if streaming is None else (streaming, ", ".join(cases) + " (calibration)")


def fit_streaming(folders: list[Path]) -> dict[str, dict[str, Any]]:
    """`streaming_us_per_token` written into the meta of every profile of each folder as
    `output_us_per_token` (the fleet simulator's `FleetReplica.stream`), per folder: a loan's
    own host, read from its own calibration cases (two loans' hosts differed by more than
    twice: 71.7 us a token on the tenth's, 25-31 on the eleventh's, the same levels). A
    folder without token arrivals takes the reading of all the folders. By folder name;
    empty when no folder has token arrivals."""
    pooled = streaming_us_per_token(folders)
    if pooled is None:
        return {}
    fits = {}
    for folder in folders:
        found = streaming_us_per_token([folder]) or pooled
        fit = {"output_us_per_token": found[0], "output_fitted_on": found[1]}
        for path in sorted((folder / "profiles").glob("*.json")):
            write_meta(folder / "profiles", json.loads(path.read_text())["model"], fit)
        fits[folder.name] = fit
    return fits


def prompt_tokens(config: str, run_name: str) -> int:
    run = next(r for r in RUNS if r.config == config and r.name == run_name)
    return int(run.flags[run.flags.index("--input-tokens") + 1])


def solve_host(short: tuple[int, float], long: tuple[int, float]) -> tuple[float, float]:
    """(request overhead ms, intake us per prompt token) from two cases, each (prompt tokens,
    measured TTFT minus simulated without either term, ms): gap = overhead + tokens x intake."""
    (tokens_s, gap_s), (tokens_l, gap_l) = short, long
    intake_ms = (gap_l - gap_s) / (tokens_l - tokens_s)
    return gap_s - intake_ms * tokens_s, intake_ms * 1000.0


def _ttfts(folder: Path, config: str, run_name: str, meta: dict[str, float]) -> tuple[float, float]:
    """(measured, simulated) TTFT p50 of `run_name`@1, simulated with the profile's `meta`."""
    measured, simulated = _case(folder, config, run_name, meta)
    return measured["ttft_p50_ms"], simulated["ttft_p50_ms"]


def _gap(folder: Path, config: str, run_name: str, metric: str, meta: dict[str, float]) -> float:
    measured, simulated = _case(folder, config, run_name, meta)
    return measured[metric] - simulated[metric]


def _case(
    folder: Path, config: str, run_name: str, meta: dict[str, float]
) -> tuple[dict[str, float], dict[str, float]]:
    """`run_name`@1 of `config` (a calibration case): measured (the judged measurement) and
    simulated with the profile's `meta`."""
    import yaml

    run = next(r for r in RUNS if r.config == config and r.name == run_name)
    assert run.case_set("1") == "calibration", f"{config}/{run_name}@1 is not calibration"
    config_dir = folder / config
    reps = measurements(config_dir / run.name)
    model, dtype = PROFILES[config]
    fleet_doc = sim_fleet(config_dir, None)
    gpu = fleet_doc["hardware"]["accelerator"].split("-")[0]
    document = json.loads((folder / "profiles" / f"{gpu}-{model}-{dtype}.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        fleet, profile = Path(tmp) / "fleet.yaml", Path(tmp) / "profile.json"
        fleet.write_text(yaml.safe_dump(fleet_doc))
        profile.write_text(json.dumps({**document, "meta": {**document.get("meta", {}), **meta}}))
        out = predict(run, reps[-1].parent, fleet, profile, Path(tmp) / "sim")
        return figures(reps[-1])["1"], figures(out)["1"]
