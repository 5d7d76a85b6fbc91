"""Judge `servepilot sim` against the GPU validation suite's measurements (gpu_sim_validate.py).

For every measured case of a run folder (benchmarks/gpu_runs/<date>-sim-validate-<gpu>/), the
same bench flags go to `servepilot sim` with the fleet vLLM really ran (its knobs read from the
replica's startup log: max_num_seqs, max_num_batched_tokens, gpu_memory_utilization), on the
accelerator the loan gave, with the operator profile measured there. Per case: TTFT p50, TPOT
p50 and output throughput measured (first measurement), the floor (how far the second
measurement moved), and the prediction's error; then the medians and p90s per set.

    python benchmarks/gpu_sim_report.py benchmarks/gpu_runs/2026-12-05-sim-validate-h100 \\
        --accelerator h100-80 [--write cases.json]
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_judged_table import table
from benchmarks.gpu_judging import dummy_routing, startup_logs
from benchmarks.gpu_sim_cases import PROFILES, RUNS, Run
from benchmarks.gpu_ttft_split import cache_hit_pct, engine_split, split_table
from servepilot.core.results import Run as BenchRun
from servepilot.core.results import load_result
from servepilot.load.sweep import sweet_spot


def figures(results: Path) -> dict[str, dict[str, float]]:
    """Level value -> the three figures, from a bench or sim results.json."""
    out = {}
    for run in json.loads(results.read_text())["runs"]:
        out[f"{run['load']['value']:g}"] = {
            "ttft_p50_ms": run["ttft_ms"]["p50"],
            "tpot_p50_ms": run["tpot_ms"]["p50"],
            "output_tok_s": run["output_throughput"],
        }
    return out


def measurements(run_dir: Path) -> list[Path]:
    """A case's results.json files, in the order measured. The case is judged on the last:
    the first pass after a start pays vLLM's first compilations of each new batch shape
    (Triton kernels of MoE, FP8 and attention; on DeepSeek-V2-Lite a 4-request burst took
    639 ms the first time and 28 ms the second); the first pass gives the floor."""
    reps = sorted(run_dir.glob("rep*/results.json"), key=lambda p: int(p.parent.name[3:]))
    return reps


def vllm_knobs(config_dir: Path) -> dict[str, Any]:
    """The engine arguments vLLM logged as non-default at start."""
    for text in startup_logs(config_dir):
        for line in text.splitlines():
            if "non-default args:" in line:
                text = line.split("non-default args:", 1)[1].strip()
                # Config objects (kv_events_config=KVEventsConfig(...)) are no literals and
                # carry none of the knobs read here.
                text = re.sub(r"[A-Za-z_]\w*\((?:[^()]|\([^()]*\))*\)", "None", text)
                args = ast.literal_eval(text)
                keys = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")
                return {k: args[k] for k in keys if k in args}
    raise SystemExit(f"{config_dir}: no vLLM startup log with its arguments")


def sim_fleet(config_dir: Path, accelerator: str | None) -> dict[str, Any]:
    import yaml

    fleet: dict[str, Any] = yaml.safe_load((config_dir / "fleet.yaml").read_text())
    fleet["hardware"]["accelerator"] = accelerator or fleet["hardware"]["accelerator"]
    fleet["engine"] = {**fleet["engine"], **vllm_knobs(config_dir)}
    fleet["engine"].pop("env", None)
    return fleet


def predict(run: Run, rep: Path, fleet: Path, profile: Path, out: Path) -> Path:
    """`servepilot sim` of the measurement in `rep`: its flags, its trace and its seed."""
    trace = rep / "trace.jsonl"
    flags = run.bench_flags(trace if trace.exists() else None)
    command = rep / "command.txt"
    seed = re.search(r"--seed (\d+)", command.read_text()) if command.exists() else None
    if seed is not None:  # the layout (prefix groups, mixes) the measurement had
        flags += ["--seed", seed.group(1)]
    args = [sys.executable, "-m", "servepilot", "sim", "-c", str(fleet), "--profile",
            str(profile), *flags, "--out", str(out)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"sim failed for {run.config}/{run.name}: {done.stderr[-800:]}")
    return out / "results.json"


def workload(run: Run, level: str) -> dict[str, Any]:
    """What a case sent: bench's flags, its level, and the seeded trace where it replays one."""
    mode = "rate" if run.name.startswith("open") or run.trace is not None else "concurrency"
    return {"bench_flags": list(run.flags), mode: float(level), "trace": run.trace}


Ladders = dict[str, tuple[list[BenchRun], list[BenchRun]]]
"""Per config, the closed loops of LADDER_RUNS: (measured runs, predicted runs)."""


def judge(
    folder: Path,
    accelerator: str | None,
    ladders: Ladders | None = None,
    splits: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Every measured case against its prediction; `ladders`, when given, collects the closed
    loops of LADDER_RUNS (measured and predicted) for `sweet_spots`, and `splits` each run's
    `engine_split`."""
    import yaml

    rows = []
    for config_dir in sorted(p for p in folder.iterdir() if (p / "fleet.yaml").exists()):
        config = config_dir.name
        model, dtype = PROFILES[config]
        fleet_doc = sim_fleet(config_dir, accelerator)
        gpu = fleet_doc["hardware"]["accelerator"].split("-")[0]
        profile = folder / "profiles" / f"{gpu}-{model}-{dtype}.json"
        routing = dummy_routing(config_dir)
        with tempfile.TemporaryDirectory() as tmp:
            fleet = Path(tmp) / "fleet.yaml"
            fleet.write_text(yaml.safe_dump(fleet_doc))
            for run in (r for r in RUNS if r.config == config):
                reps = measurements(config_dir / run.name)
                if not reps:
                    continue
                measured = figures(reps[-1])
                again = figures(reps[0]) if len(reps) > 1 else {}
                sim_out = Path(tmp) / run.name
                sim_result = predict(run, reps[-1].parent, fleet, profile, sim_out)
                predicted = figures(sim_result)
                own = {f"{r['load']['value']:g}": r.get("prefix_cache_hit_rate")
                       for r in json.loads(sim_result.read_text())["runs"]}  # fmt: skip
                if splits is not None:
                    splits.append({"run": f"{config}/{run.name}",
                                   **engine_split(reps[-1].parent, sim_result)})  # fmt: skip
                # A MoE on its dummy routers is not judged, nor is its sweet spot.
                if ladders is not None and run.name in LADDER_RUNS and not routing:
                    ladders.setdefault(config, ([], []))
                    ladders[config][0].extend(load_result(reps[-1]).runs)
                    ladders[config][1].extend(load_result(sim_result).runs)
                for level in run.levels:
                    key = f"{float(level):g}"
                    row: dict[str, Any] = {
                        "case": f"{config}/{run.name}@{level}", "set": run.case_set(level),
                        "workload": workload(run, level),
                        "measured": measured[key], "predicted": predicted[key],
                    }  # fmt: skip
                    if key in again:
                        row["again"] = again[key]
                    row["cache_hit_pct"] = cache_hit_pct(reps[-1].parent)
                    row["dummy_routing"] = routing
                    if own.get(key) is not None:
                        row["sim_cache_hit_pct"] = 100 * own[key]
                    rows.append(row)
    return rows


LADDER_RUNS = ("closed-short", "closed-mid", "closed-high")
"""One workload (1,000-token prompts, 200-token answers) at concurrency 1, 4, 16, 64, 256, 512:
the ladder a sweet spot is read from."""

SWEET_SLOS = ((1000.0, 40.0), (3000.0, 60.0))
"""(TTFT p99, TPOT p99) limits in ms: an interactive SLO and a looser one. Within an SLO:
every request served (no 429) and both p99s at most these."""


def within_slo(run: BenchRun, slo: tuple[float, float]) -> bool:
    ttft, tpot = run.ttft_ms.p99, run.tpot_ms.p99
    return (run.failed == 0 and ttft is not None and tpot is not None
            and ttft <= slo[0] and tpot <= slo[1])  # fmt: skip


def sweet_concurrency(runs: list[BenchRun], slo: tuple[float, float]) -> float | None:
    """Where throughput stops growing within the SLO: bench's sweet spot (the first level at
    90% of the peak throughput) over the levels within it."""
    spot = sweet_spot([r for r in runs if within_slo(r, slo)], slo_set=False)
    return None if spot is None else spot.load.value


def sweet_spots(ladders: Ladders) -> list[dict[str, Any]]:
    """Per config and SLO: the measured and the simulated sweet spot, and how many ladder steps
    apart they are."""
    rows = []
    for config, (measured, predicted) in sorted(ladders.items()):
        ladder = sorted({r.load.value for r in measured})
        for slo in SWEET_SLOS:
            meas, pred = sweet_concurrency(measured, slo), sweet_concurrency(predicted, slo)
            steps = None
            if meas is not None and pred is not None and pred in ladder:
                steps = abs(ladder.index(pred) - ladder.index(meas))
            rows.append({"config": config, "ttft_p99_ms": slo[0], "tpot_p99_ms": slo[1],
                         "ladder": ladder, "measured": meas, "predicted": pred,
                         "steps_apart": steps})  # fmt: skip
    return rows


def lend_fits(fits: dict[Path, dict[str, dict[str, Any]]]) -> None:
    """Into a folder's profiles of a model it has no calibration cases of (a loan that
    measured Llama-3.1-8B FP8 alone), the fit of the first folder that fitted that model."""
    lent: dict[str, dict[str, Any]] = {}
    for found in fits.values():
        for model, fit in found.items():
            lent.setdefault(model, fit)
    for folder, found in fits.items():
        for model, fit in lent.items():
            if model not in found:
                write_meta(folder / "profiles", model, fit)


def write_meta(profiles: Path, model: str, meta: dict[str, Any], dtype: str | None = None) -> None:
    """Merge `meta` into the meta of every profile of `model` (of `dtype`, when given) in
    `profiles`."""
    for path in sorted(profiles.glob("*.json")):
        doc = json.loads(path.read_text())
        if doc["model"] == model and dtype in (None, doc["dtype"]):
            doc["meta"] = {**doc.get("meta", {}), **meta}
            path.write_text(json.dumps(doc, indent=1) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "folders",
        type=Path,
        nargs="+",
        metavar="folder",
        help="loan folders, judged together (each case with its own folder's profiles)",
    )
    parser.add_argument(
        "--accelerator",
        help="the catalog name of the GPU the runs used "
        "(default: the runs' fleet.yaml; the first runs wrote h200-141 on an H100)",
    )
    parser.add_argument("--write", type=Path, help="also write the cases as JSON here")
    parser.add_argument(
        "--eager-traces",
        type=Path,
        nargs="+",
        default=[],
        metavar="TRACES",
        help="step-trace folders (gpu_step_trace.py --burst): write each model's host time "
        "for a step run without a CUDA graph (gpu_step_report.eager_step_ms) into the meta "
        "of each folder's profiles of that model, before --fit",
    )
    parser.add_argument(
        "--host-traces",
        type=Path,
        nargs="+",
        default=[],
        metavar="TRACES",
        help="burst step-trace folders whose steps' kernels were joined to them: write each "
        "model's host time between eager launches (gpu_step_report.eager_host_fit) into the "
        "meta of each folder's profiles, before --fit. Not --eager-traces: their spans carry "
        "the profiler's cost, which differs by host, and their GPU-bound steps no floor",
    )
    parser.add_argument(
        "--decode-traces",
        type=Path,
        nargs="+",
        default=[],
        metavar="TRACES",
        help="step-trace folders of decode steps (gpu_step_trace.py without --burst): write "
        "each model's decode attention as vLLM's kernels ran it against its operators' "
        "(gpu_step_report.attention_fit) into the meta of each folder's profiles, before --fit",
    )
    parser.add_argument(
        "--fit",
        "--fit-host",  # its name before the fit was per model
        action="store_true",
        help="first fit, per model, vLLM's host time per step and a request's beside the "
        "engine (fixed and per prompt token) on its calibration cases (gpu_host_fit.py), and "
        "per folder (a loan's host), the API server's time per streamed token from its "
        "calibration cases' token arrivals; write them into the meta of each folder's profiles",
    )
    args = parser.parse_args()
    ladders: Ladders = {}
    splits: list[dict[str, Any]] = []
    rows = []
    if args.fit:  # the fit predicts with this module's `predict`: imported here, not above
        from benchmarks.gpu_host_fit import fit_profiles, fit_streaming

        streaming = fit_streaming(args.folders)
        for name, fit in streaming.items():
            print(f"streaming, the profiles of {name}: {fit}")
        if not streaming:
            print("streaming: no calibration case has token times")
    if args.eager_traces or args.decode_traces or args.host_traces:
        from benchmarks.gpu_traced import write_traces

        write_traces(args.eager_traces, args.decode_traces, args.folders, args.host_traces)
    if args.fit:
        from benchmarks.gpu_prefill_fit import fit_prefill_scales

        for (model_name, dtype), scale in fit_prefill_scales(args.folders).items():
            print(f"prefill scale of {model_name} {dtype}: {scale}")
        fits = {folder: fit_profiles(folder) for folder in args.folders}
        for folder, found in fits.items():
            for model, fit in found.items():
                print(f"fitted {model} in {folder.name}: {fit}")
        lend_fits(fits)
    for folder in args.folders:
        rows += judge(folder, args.accelerator, ladders, splits)
    print(table(rows))
    print("\nwhere a TTFT goes, per run (its levels together)")
    print(split_table(splits))
    spots = sweet_spots(ladders)
    print("\nsweet spot (concurrency within the SLO: p99s at most these, no request refused)")
    for spot in spots:
        print(f"  {spot['config']:18s} TTFT {spot['ttft_p99_ms']:5.0f} ms TPOT "
              f"{spot['tpot_p99_ms']:3.0f} ms: measured {spot['measured']}  simulated "
              f"{spot['predicted']}  steps apart {spot['steps_apart']}")  # fmt: skip
    if args.write:
        args.write.write_text(json.dumps(rows, indent=1))
        args.write.with_name("sweet_spots.json").write_text(json.dumps(spots, indent=1))
        args.write.with_name("ttft_split.json").write_text(json.dumps(splits, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
