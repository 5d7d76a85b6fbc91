"""`servepilot tune`: find the configuration that meets the SLA with the most goodput."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich import box
from rich.table import Table
from rich.text import Text

from servepilot.cli.console import out_console, print_step, print_warning, simple_table
from servepilot.cli.load_options import add_workload_flags, workload_from_args
from servepilot.cli.options import Commands, add_command, add_config_flag, config_from_args
from servepilot.core.config import EngineKind
from servepilot.tune import narration
from servepilot.tune.artifacts import fleet_command, tuned_fleet, write_artifacts
from servepilot.tune.search import SearchResult, run_search
from servepilot.tune.setup import TuneOptions, TuneSetup, build_setup
from servepilot.tune.space import Knob
from servepilot.tune.summary import Summary, summarize_search

DESCRIPTION = """\
Search vLLM's knobs for the configuration that carries the most goodput (requests per second
meeting every SLO) under your SLA, in few trials, as an operator tunes by hand.

The search starts from `servepilot plan`'s configuration for the fleet and the workload and
moves one knob at a time (max_num_seqs, max_num_batched_tokens, max_model_len, the KV
cache's memory and dtype, weight quantization, TP size against replica count), guided by
what each trial's metrics say: preemptions or out of memory -> cut max_model_len, lower
max_num_seqs, quantize; batch full with SLA slack -> raise the concurrency knobs; P99 rising
while throughput is flat -> back off; an ITL or TPOT limit binds -> smaller prefill chunks.
Doubling steps first, then a bisection around the best, until no neighbour beats the best by
--min-gain or --budget trials ran. A configuration the planner says will not fit is never
launched.

Each trial starts the replica(s) (`--engine vllm`: real vLLM servers, as `servepilot up`
does; `--engine sim`: the simulator, in seconds), sweeps the load up to the SLA and records
its goodput there. Trials go to OUT/trials.jsonl as they finish, so the same --out resumes;
the best configuration goes to OUT/fleet.yaml, and every trial and the gain over the default
are printed.

examples:
  servepilot tune --slo ttft_p99_ms=2000,tpot_p99_ms=100 --engine sim
  servepilot tune -c fleet.yaml --slo ttft_p99_ms=500,tpot_p99_ms=50 --budget 8 --out runs/tune
  servepilot tune --slo e2e_p90_ms=20000 --workload mixed --input-tokens 512 --engine sim
"""


def register(sub: Commands) -> None:
    help = "search the vLLM knobs for the most goodput under an SLA"
    parser = add_command(sub, "tune", help, DESCRIPTION, run)
    add_config_flag(parser)
    add = parser.add_argument_group("search").add_argument
    add("--slo", metavar="K=MS,...", help="the SLA: <ttft|tpot|itl|e2e>_<p50|p90|p99|mean>_ms "
        "limits, e.g. ttft_p99_ms=500,tpot_p99_ms=50 (default: fleet.yaml's slo "
        "section)")  # fmt: skip
    add("--engine", choices=[k.value for k in EngineKind], help="vllm: real replicas "
        "(default: engine.kind); sim: the simulator, in seconds")  # fmt: skip
    add("--budget", type=int, default=12, metavar="N", help="most trials (default 12)")
    knobs = ", ".join(k.value for k in Knob)
    add("--knobs", metavar="K,...", help=f"search only these knobs (default all): {knobs}")
    add("--min-gain", type=float, default=2.0, metavar="PCT",
        help="a trial must beat the best by more than this to replace it (default 2)")  # fmt: skip
    add("--profile", type=Path, metavar="PROFILE.json", help="sim: step times from `servepilot "
        "calibrate` or `servepilot profile` (default: the roofline estimate)")  # fmt: skip
    add = parser.add_argument_group("load sweep of each trial").add_argument
    add("--requests", type=int, metavar="N",
        help="requests per load level (default: bench's, max(100, 5 x concurrency))")  # fmt: skip
    add("--max-concurrency", type=int, default=256, metavar="N",
        help="highest concurrency of the sweep (default 256)")  # fmt: skip
    add("--refine-levels", type=int, default=2, metavar="N",
        help="levels bisecting the load where the SLA breaks (default 2)")  # fmt: skip
    add_workload_flags(parser)
    parser.add_argument("--out", type=Path, default=Path("runs/tune"), metavar="DIR",
                        help="where trials.jsonl, fleet.yaml, vllm_command.txt and report.html "
                        "go (default runs/tune); an existing trials.jsonl is resumed")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    opts = tune_options(args)
    setup = build_setup(opts, config_from_args(args, {}), workload_from_args(args),
                        on_level=lambda run, sla: print_step(narration.level_line(run, sla)),
                        on_step=print_step)  # fmt: skip
    return _report(setup, search(setup))


def tune_options(args: argparse.Namespace) -> TuneOptions:
    return TuneOptions(
        engine=EngineKind(args.engine) if args.engine else None, slo=args.slo, knobs=args.knobs,
        budget_trials=args.budget, min_gain_pct=args.min_gain,
        max_concurrency=args.max_concurrency, refine_levels=args.refine_levels,
        requests_per_level=args.requests, profile=args.profile, out=args.out,
    )  # fmt: skip


def search(setup: TuneSetup) -> SearchResult:
    events = narration.search_events(setup, print_step)
    return run_search(setup.space.space, setup.goal, setup.runner, setup.store, events)


def _report(setup: TuneSetup, result: SearchResult) -> int:
    summary = summarize_search(setup.space.space, setup.goal, result)
    out_console.print(_table(summary))
    print_step(f"search stopped: {result.stop.detail}")
    chosen = summary.chosen
    if chosen is None:
        print_warning("no trial could be measured: nothing to write")
        return 1
    fleet = tuned_fleet(setup, chosen.trial)
    command = fleet_command(fleet)
    verdict = narration.verdict(summary)
    if verdict.met:
        out_console.print(Text(verdict.head, style="bold green") + Text(verdict.text))
    else:
        print_warning(verdict.text)
    write_artifacts(setup, summary, fleet, command)
    out_console.print(f"vLLM command: {command}", soft_wrap=True)
    print_step(f"wrote {setup.out}/fleet.yaml, vllm_command.txt, report.html and trials.jsonl")
    return 0 if summary.met else 1


def _table(summary: Summary) -> Table:
    table = simple_table(
        "servepilot tune: trials", narration.TABLE_COLUMNS, (), right=narration.RIGHT_COLUMNS,
        box=box.SIMPLE_HEAD, caption=f"SLA {summary.sla.describe()}", caption_justify="left",
    )  # fmt: skip
    chosen = summary.chosen
    for row in summary.rows:
        spot = chosen is not None and row.trial.index == chosen.trial.index
        table.add_row(*narration.table_cells(row), style="bold green" if spot else None)
    return table
