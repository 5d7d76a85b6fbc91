"""The H200 profiles against today's vLLM on the lent H200, with and without the host terms the
H100 loans fitted (issue 34).

The published H200 runs (bench_profile.py) are a 2024 vLLM's. The bring-up runs of 2026-12-04
(benchmarks/gpu_runs/2026-12-04-llama-8b*, vLLM 0.22.0 on an H200, dummy weights, 1,000-token
prompts and 200-token answers at concurrency 1 and 32) are today's. Each is simulated with the
H200 operator profile as shipped (the nominal 1 ms of host time per step, no request
overhead), and with the fit the H100 loans made for the same model on their calibration cases
(`gpu_sim_report.py --fit`: step overhead, request overhead, intake per prompt token; in the
H100 profiles of benchmarks/gpu_runs/2026-12-06-sim-validate-h100-cold/profiles). Neither the
H200 runs nor the H200 at all took part in that fit: a check on another card.

    PYTHONPATH=. .venv/bin/python benchmarks/h200_today.py
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servepilot.cli.main import main

HERE = Path(__file__).resolve().parent
RUNS_DIR = HERE / "gpu_runs"
PROFILES = HERE / "gpu_profiles"
FIT_DIR = RUNS_DIR / "2026-12-06-sim-validate-h100-cold" / "profiles"
"""The fit for these runs: like them, measured on the first token with text (before `up`
padded the dummy tokenizer; docs/gpu.md)."""
FIRST_TOKEN_FIT_DIR = RUNS_DIR / "2026-12-06-sim-validate-h100-padded" / "profiles"
"""The fit on first tokens: for runs of real weights and tokenizers (bench_profile.py's
published figures)."""
FIT_KEYS = (
    "step_overhead_ms",
    "request_overhead_ms",
    "intake_us_per_prompt_token",
    "prefill_scale",
    "output_us_per_token",
    # Measured beside the fit (a step trace's host time for an eager step, its decode
    # attention as vLLM's kernels ran it), and the fit was made with them: they go together.
    "eager_step_ms",
    "eager_mixed_step_ms",
    "eager_host_ms",
    "eager_host_us_per_seq",
    "decode_attention_us",
    "decode_attention_scale",
)
METRICS = (("ttft_p50_ms", "TTFT p50 ms"), ("tpot_p50_ms", "TPOT p50 ms"),
           ("output_tok_s", "output tok/s"))  # fmt: skip


@dataclass(frozen=True)
class TodayRun:
    folder: str
    """Its bring-up folder under gpu_runs/ (fleet.yaml, vLLM's log, bench's results)."""
    profile: str
    """The H200 profile it is simulated with."""
    concurrency: int
    requests: int


RUNS = (
    TodayRun("2026-12-04-llama-8b", "h200-llama-3.1-8b-bf16.json", 1, 8),
    TodayRun("2026-12-04-llama-8b", "h200-llama-3.1-8b-bf16.json", 32, 64),
    TodayRun("2026-12-04-llama-8b-fp8", "h200-llama-3.1-8b-fp8.json", 1, 8),
    TodayRun("2026-12-04-llama-8b-fp8", "h200-llama-3.1-8b-fp8.json", 32, 64),
)


def fit_for(model: str, fit_dir: Path = FIT_DIR) -> dict[str, Any] | None:
    """The H100 loans' fit for `model` in `fit_dir` (its bf16 profile's meta: fp8 takes the
    same fit, as the GPU report does); None where no loan fitted the model."""
    path = fit_dir / f"h100-{model}-bf16.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text()).get("meta", {})
    return {k: meta[k] for k in FIT_KEYS if k in meta} or None


def fitted_profile(name: str, work: Path, fit_dir: Path = FIT_DIR) -> Path | None:
    """The H200 profile `name` with the H100 fit of its model (from `fit_dir`) in its meta;
    None without one."""
    document = json.loads((PROFILES / name).read_text())
    fit = fit_for(document["model"], fit_dir)
    if fit is None:
        return None
    path = work / f"fitted-{name}"
    path.write_text(json.dumps({**document, "meta": {**document.get("meta", {}), **fit}}))
    return path


def measured(run: TodayRun) -> dict[str, float]:
    from benchmarks.gpu_sim_report import figures

    return figures(RUNS_DIR / run.folder / f"bench-c{run.concurrency}-results.json")[
        f"{run.concurrency:g}"
    ]


def simulate(run: TodayRun, profile: Path, work: Path) -> dict[str, float]:
    """`servepilot sim` of the run: the fleet vLLM ran (gpu_sim_report.sim_fleet), `profile`."""
    import yaml

    from benchmarks.gpu_sim_report import figures, sim_fleet

    fleet = work / f"{run.folder}.yaml"
    fleet.write_text(yaml.safe_dump(sim_fleet(RUNS_DIR / run.folder, None)))
    out = work / f"{run.folder}-c{run.concurrency}-{profile.stem}"
    args = ["sim", "-c", str(fleet), "--profile", str(profile), "--concurrency",
            str(run.concurrency), "--requests", str(run.requests), "--input-tokens", "1000",
            "--output-tokens", "200", "--warmup", "1", "--out", str(out)]  # fmt: skip
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        code = main(args)
    if code != 0:
        raise SystemExit(f"sim failed for {run.folder} c{run.concurrency}:\n{log.getvalue()}")
    return figures(out / "results.json")[f"{run.concurrency:g}"]


def report() -> dict[str, float]:
    """Prints the table; the median |error| of each source over every figure."""
    errors: dict[str, list[float]] = {"shipped": [], "H100 fit": []}
    print(f"{'run':<32} {'source':<9} " + " ".join(f"{label:>24}" for _, label in METRICS))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for run in RUNS:
            truth = measured(run)
            fitted = fitted_profile(run.profile, work)
            sources = {"shipped": PROFILES / run.profile, "H100 fit": fitted}
            for source, profile in sources.items():
                if profile is None:
                    continue
                got = simulate(run, profile, work)
                cells = []
                for key, _ in METRICS:
                    error = got[key] / truth[key] - 1
                    errors[source].append(abs(error))
                    cells.append(f"{got[key]:>8.1f} ({truth[key]:>7.1f}) {error:>+6.0%}")
                name = f"{run.folder[11:]} @{run.concurrency}"
                print(f"{name:<32} {source:<9} " + " ".join(cells))
    medians = {k: statistics.median(v) for k, v in errors.items() if v}
    for source, median in medians.items():
        print(f"median |error| {source}: {median:.1%} over {len(errors[source])} figures")
    return medians


if __name__ == "__main__":
    report()
