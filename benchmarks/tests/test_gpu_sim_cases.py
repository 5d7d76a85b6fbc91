"""The GPU validation suite's cases (gpu_sim_cases.py): enough of them, each judged or fitted
on but never both, within each model's length, and the long-tailed trace as stated."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from benchmarks.gpu_sim_cases import CONFIGS, LONGTAIL, PROFILES, RUNS, cases, longtail_trace


def test_at_least_forty_validation_cases_and_every_case_in_one_set() -> None:
    rows = cases()
    names = [name for name, _ in rows]
    assert len(names) == len(set(names))
    assert sum(which == "validation" for _, which in rows) >= 40
    assert {which for _, which in rows} == {"calibration", "validation"}
    # Every model has calibration cases of its own, and every config a profile.
    models = {PROFILES[name.split("/")[0]][0] for name, which in rows if which == "calibration"}
    assert models == {model for model, _ in PROFILES.values()}
    assert set(PROFILES) == set(CONFIGS) == {run.config for run in RUNS}


def test_every_prompt_and_answer_fits_its_models_length() -> None:
    for run in RUNS:
        limit = CONFIGS[run.config]["engine"]["max_model_len"]
        flags = dict(zip(run.flags[::2], run.flags[1::2], strict=False))
        if run.trace is None:
            assert int(flags["--input-tokens"]) + int(flags["--output-tokens"]) <= limit, run
        else:
            lines = [json.loads(line) for line in longtail_trace(**run.trace)]
            assert max(x["input_tokens"] + x["output_tokens"] for x in lines) <= limit, run


def test_the_long_tailed_trace_has_the_stated_medians_and_rate() -> None:
    lines = [json.loads(line) for line in longtail_trace(20.0, 4000, 7, 33792)]
    inputs = [x["input_tokens"] for x in lines]
    outputs = [x["output_tokens"] for x in lines]
    # Log-normal: the median is the stated one (the clipping touches only the tails).
    assert math.isclose(statistics.median(inputs), LONGTAIL["input_median_tokens"], rel_tol=0.06)
    assert math.isclose(statistics.median(outputs), LONGTAIL["output_median_tokens"], rel_tol=0.06)
    assert max(outputs) <= LONGTAIL["output_max_tokens"] and min(inputs) >= 64
    assert max(inputs) > 8 * LONGTAIL["input_median_tokens"]  # a long tail
    span_s = lines[-1]["timestamp"] - lines[0]["timestamp"]
    assert math.isclose((len(lines) - 1) / span_s, 20.0, rel_tol=0.05)
    # Seeded: a shorter trace of the same seed is the longer one's start; another seed differs.
    assert longtail_trace(20.0, 50, 7, 33792) == longtail_trace(20.0, 4000, 7, 33792)[:50]
    assert longtail_trace(20.0, 50, 8, 33792) != longtail_trace(20.0, 50, 7, 33792)


def test_the_report_reads_what_vllm_ran_and_what_bench_measured() -> None:
    from benchmarks.gpu_sim_report import figures, sim_fleet, vllm_knobs

    runs = Path(__file__).resolve().parents[1] / "gpu_runs/2026-12-05-sim-validate-h100/llama-8b"
    knobs = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.9}
    assert vllm_knobs(runs) == knobs
    fleet = sim_fleet(runs, "h100-80")
    assert fleet["hardware"]["accelerator"] == "h100-80" and "env" not in fleet["engine"]
    assert fleet["engine"] == {"max_model_len": 33792, **knobs}
    measured = figures(runs / "closed-short/rep1/results.json")
    assert set(measured) == {"1", "4"}
    assert round(measured["1"]["ttft_p50_ms"], 1) == 44.0
    assert round(measured["1"]["tpot_p50_ms"], 2) == 6.68
