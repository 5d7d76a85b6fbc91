"""`servepilot bench`: load-test any OpenAI-compatible endpoint; `bench compare A B`."""

from __future__ import annotations

import argparse
from pathlib import Path

from servepilot.bench.records import Endpoint
from servepilot.cli.bench_parse import parse_levels
from servepilot.cli.bench_run import compare, run
from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.load.arrivals import Arrival
from servepilot.load.sweep import SweepConfig
from servepilot.load.workload import WorkloadKind, WorkloadSpec, parse_priority_mix

DESCRIPTION = """\
Load-test an OpenAI-compatible endpoint (a vLLM server, a servepilot gateway, any other) and
report TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99), throughput, goodput
under your SLOs, and the sweet spot: the load where throughput is near its peak just before
P99 latency turns sharply up.

Load is either closed-loop (--concurrency: that many requests in flight at all times) or
open-loop (--rate: requests per second on a fixed schedule; latency counts from when each
request was due, so a slow server cannot hide its queueing). --sweep raises the load level by
level and stops by itself once throughput stops rising while latency keeps climbing.

Prompts have exact token counts by the server's own tokenizer. Results go to --out: results.json
(schema servepilot.bench/v1), requests.csv (one row per request) and report.html (plots).

examples:
  servepilot bench --url http://127.0.0.1:8000 --sweep --out runs/sweep
  servepilot bench --url http://127.0.0.1:8000 --rate 2,4,8 --duration 60s --slo ttft_p99_ms=500
  servepilot bench --url http://127.0.0.1:8000 --concurrency 8 --soak 30m --out runs/soak
  servepilot bench compare predicted/results.json measured/results.json
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "bench",
        help="load-test an OpenAI-compatible endpoint; find the sweet spot",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _target_flags(parser)
    add_load_flags(parser)
    add_workload_flags(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="write results.json, requests.csv and report.html here",
    )
    parser.set_defaults(run=_run)

    bench_sub = parser.add_subparsers(dest="bench_command", metavar="compare")
    cmp = bench_sub.add_parser(
        "compare",
        help="print the differences between two results.json files, run by run",
        description="Match the runs of two results (by load) and print the differences: "
        "throughput, TTFT, TPOT, ITL, E2E, goodput. Either side may be measured (bench) or "
        "simulated (sim).",
    )
    cmp.add_argument("a", type=Path, metavar="A.json")
    cmp.add_argument("b", type=Path, metavar="B.json")
    cmp.set_defaults(run=compare)


def _target_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("target")
    g.add_argument(
        "--url",
        metavar="URL",
        help="base URL of the server, e.g. http://127.0.0.1:8000 (with or without /v1)",
    )
    g.add_argument(
        "--model", metavar="NAME", help="model to ask for (default: the server's only model)"
    )
    g.add_argument(
        "--endpoint",
        choices=[e.value for e in Endpoint],
        default="chat",
        help="chat (/v1/chat/completions, default) or completions",
    )
    g.add_argument("--api-key", metavar="KEY", help="sent as Authorization: Bearer KEY")
    g.add_argument(
        "--tokenizer",
        type=Path,
        metavar="PATH",
        help="a local Hugging Face tokenizer folder, for servers without vLLM's /tokenize",
    )
    g.add_argument(
        "--metrics-url",
        metavar="URL",
        help="where to read the target's memory during --soak (default: URL/metrics)",
    )
    g.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="per-request timeout in seconds (default 600)",
    )


def add_load_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("load")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument(
        "--concurrency",
        metavar="N[,N...]",
        help="closed loop: requests in flight at all times; a list runs one level each",
    )
    mode.add_argument("--rate", metavar="R[,R...]", help="open loop: requests per second")
    g.add_argument(
        "--sweep",
        action="store_true",
        help="raise the load level by level until "
        "throughput stops rising (concurrency 1, 2, 4, ...; with --rate, from its "
        "first value)",
    )
    g.add_argument(
        "--arrival",
        choices=[a.value for a in Arrival],
        default="poisson",
        help="open-loop arrivals (default poisson)",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        metavar="B",
        help="gamma arrivals: 1 is Poisson, below 1 burstier, above 1 smoother",
    )
    stop = g.add_mutually_exclusive_group()
    stop.add_argument(
        "--requests",
        type=int,
        metavar="N",
        help="requests per level (default: max(100, 5 x concurrency) or max(100, 30 x rate))",
    )
    stop.add_argument("--duration", metavar="T", help="time per level instead (90s, 10m)")
    g.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="N",
        help="requests sent first at each level and left out of the results",
    )
    g.add_argument(
        "--slo",
        metavar="K=MS,...",
        help="ttft_p99_ms, tpot_p99_ms, e2e_p99_ms: a "
        "request meets the SLO when it is within every limit; goodput counts those",
    )
    g.add_argument(
        "--soak",
        metavar="T",
        help="one long run at one load level (e.g. 30m), "
        "reported in windows, with the target's memory growth per request",
    )
    g.add_argument(
        "--window",
        metavar="T",
        help="soak window length (default: a tenth of the soak, at least 10s)",
    )
    g.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="client processes (default: as many as the load needs)",
    )


def add_workload_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--workload",
        choices=[k.value for k in WorkloadKind],
        default="random",
        help="random (default); mixed (short and long prompts); shared_prefix (N prefixes x "
        "suffixes); multi_turn (chat sessions whose history grows); trace (--trace FILE)",
    )
    g.add_argument(
        "--input-tokens", type=int, default=256, metavar="N", help="prompt tokens (default 256)"
    )
    g.add_argument(
        "--output-tokens",
        type=int,
        default=128,
        metavar="N",
        help="max_tokens of every request (default 128)",
    )
    g.add_argument(
        "--long-fraction",
        type=float,
        default=0.2,
        metavar="F",
        help="mixed: share of long prompts (default 0.2)",
    )
    g.add_argument(
        "--long-input-tokens",
        type=int,
        metavar="N",
        help="mixed: tokens of a long prompt (default 4 x --input-tokens)",
    )
    g.add_argument(
        "--num-prefixes",
        type=int,
        default=8,
        metavar="N",
        help="shared_prefix: distinct prefixes (default 8)",
    )
    g.add_argument(
        "--prefix-tokens",
        type=int,
        metavar="N",
        help="shared_prefix: tokens of each prefix (default 3/4 of --input-tokens)",
    )
    g.add_argument(
        "--turns",
        type=int,
        default=4,
        metavar="N",
        help="multi_turn: turns per conversation (default 4)",
    )
    g.add_argument(
        "--trace",
        type=Path,
        metavar="FILE",
        help="trace: JSONL lines with timestamp, input_tokens, output_tokens, "
        "optional prefix_group and priority",
    )
    g.add_argument(
        "--priority-mix",
        metavar="0=W,1=W,2=W",
        help="send X-Priority 0 (interactive), 1 or 2 (batch) with these weights",
    )
    g.add_argument(
        "--sessions", type=int, metavar="N", help="spread requests over N X-Session-Id values"
    )
    g.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default 0)")


def _run(args: argparse.Namespace) -> int:
    if args.url is None:
        raise ConfigError("--url is required", hint="e.g. --url http://127.0.0.1:8000")
    return run(args, loads_from_args(args), sweep_from_args(args), workload_from_args(args))


def loads_from_args(args: argparse.Namespace) -> tuple[Load, ...]:
    if args.rate:
        return tuple(Load(mode=LoadMode.RATE, value=v) for v in parse_levels(args.rate, "--rate"))
    if args.concurrency:
        values = parse_levels(args.concurrency, "--concurrency")
        if any(v != int(v) for v in values):
            raise ConfigError(f"--concurrency {args.concurrency!r}: levels must be whole numbers")
        return tuple(Load(mode=LoadMode.CONCURRENCY, value=v) for v in values)
    return () if args.sweep else (Load(mode=LoadMode.CONCURRENCY, value=1),)


def sweep_from_args(args: argparse.Namespace) -> SweepConfig | None:
    if not args.sweep:
        return None
    if args.soak:
        raise ConfigError("--sweep and --soak do not go together: soak runs one load level")
    mode = LoadMode.RATE if args.rate else LoadMode.CONCURRENCY
    start = parse_levels(args.rate or args.concurrency or "1", "--rate")[0]
    return SweepConfig(mode=mode, start=start)


def workload_from_args(args: argparse.Namespace) -> WorkloadSpec:
    return WorkloadSpec(
        kind=WorkloadKind(args.workload),
        input_tokens=args.input_tokens,
        output_tokens=args.output_tokens,
        seed=args.seed,
        long_fraction=args.long_fraction,
        long_input_tokens=args.long_input_tokens,
        num_prefixes=args.num_prefixes,
        prefix_tokens=args.prefix_tokens,
        turns=args.turns,
        trace_path=args.trace,
        priority_mix=parse_priority_mix(args.priority_mix) if args.priority_mix else None,
        sessions=args.sessions,
    )
