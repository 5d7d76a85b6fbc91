"""`servepilot bench`: load-test any OpenAI-compatible endpoint; `bench compare A B`."""

from __future__ import annotations

import argparse
from pathlib import Path

from servepilot.bench.compare import compare_results, render_comparison
from servepilot.bench.flags import BenchFlags, bench_setup
from servepilot.bench.outputs import check_out_dir, write_outputs
from servepilot.bench.records import Endpoint
from servepilot.bench.session import run_bench
from servepilot.bench.token_times import FILE_NAME as TOKEN_TIMES
from servepilot.bench.token_times import write_token_times
from servepilot.cli.console import out_console, print_step, print_warning
from servepilot.cli.levels_view import (
    bench_reporter,
    exit_code,
    level_bars,
    memory_sources,
    print_runs,
)
from servepilot.cli.load_options import add_load_flags, add_workload_flags, levels_from_args
from servepilot.cli.options import Commands, add_command, add_server_flags, record_of
from servepilot.core import loop
from servepilot.core.errors import ConfigError
from servepilot.core.results import load_result

DESCRIPTION = """\
Load-test an OpenAI-compatible endpoint (a vLLM server, a servepilot gateway, any other) and
report TTFT, TPOT, ITL and end-to-end latency (mean, p50, p90, p99), throughput, goodput
under your SLOs, and the sweet spot: the load where throughput is near its peak just before
P99 latency turns sharply up.

Load is either closed-loop (--concurrency: that many requests in flight at all times) or
open-loop (--rate: requests per second on a fixed schedule; latency counts from when each
request was due, so a slow server cannot hide its queueing). --sweep raises the load level by
level and stops by itself once throughput stops rising while latency keeps climbing.

A request refused with 429 (or 503 with Retry-After) is counted as refused, and a closed-loop
worker waits out its Retry-After before sending again: a server that sheds load is not flooded.

Bench estimates the run's length before the first request (for --requests levels, a range
once the first answer is in, re-made after every level). When stderr is not a terminal (a log
file, CI), progress comes as plain lines, at most one every 10 s while a level runs.

Prompts have exactly --input-tokens tokens as the server counts them (usage.prompt_tokens), cut
with its own tokenizer; on chat the template's tokens, measured once, come off each message's
text. Results go to --out: results.json (schema servepilot.bench/v1), requests.csv (one row per
request), report.html (plots) and, with --token-times, every token's arrival time. Ctrl-C
keeps the levels already finished, or a soak's finished windows (results marked interrupted;
exit code 130).

examples:
  # sized for the default fleet of `make serve` (one vLLM-CPU replica): minutes each
  servepilot bench --url http://127.0.0.1:8000 --sweep --requests 16 --output-tokens 64
  servepilot bench --url http://127.0.0.1:8000 --rate 0.2,0.4 --duration 60s --output-tokens 64
  servepilot bench --url http://127.0.0.1:8000 --concurrency 2 --soak 5m --out runs/soak
  # a GPU server: the default sizes (100+ requests a level, 128 output tokens)
  servepilot bench --url http://gpu-host:8000 --sweep --out runs/sweep
  servepilot bench compare predicted/results.json measured/results.json
"""


def register(sub: Commands) -> None:
    help = "load-test an OpenAI-compatible endpoint; find the sweet spot"
    parser = add_command(sub, "bench", help, DESCRIPTION, _run)
    target = parser.add_argument_group("target")
    target.add_argument("--url", metavar="URL", help="base URL of the server, e.g. "
                        "http://127.0.0.1:8000 (with or without /v1)")  # fmt: skip
    add_server_flags(target, "the server's only model")
    target.add_argument("--endpoint", choices=[e.value for e in Endpoint], default="chat",
                        help="chat (/v1/chat/completions, default) or completions")  # fmt: skip
    target.add_argument("--tokenizer", type=Path, metavar="PATH", help="a local Hugging Face "
                        "tokenizer folder, for servers without vLLM's /tokenize")  # fmt: skip
    target.add_argument("--metrics-url", metavar="URL",
                        help="where to read the target's memory during --soak (default: "
                             "URL/metrics); a servepilot fleet on this machine is also read "
                             "per replica process and per GPU")  # fmt: skip
    target.add_argument("--timeout", type=float, default=600.0, metavar="S",
                        help="per-request timeout in seconds (default 600)")  # fmt: skip
    add_load_flags(parser)
    add_workload_flags(parser)
    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, metavar="DIR",
                     help="write results.json, requests.csv and report.html here")  # fmt: skip
    out.add_argument("--token-times", action="store_true",
                     help="also write token_times.jsonl.gz to --out: when each streamed "
                          "token of each request arrived (for stalls inside streams)")  # fmt: skip
    cmp = parser.add_subparsers(dest="bench_command", metavar="compare").add_parser(
        "compare", help="print the differences between two results.json files, run by run",
        description="Match the runs of two results (by load) and print the differences: "
        "throughput, TTFT, TPOT, ITL, E2E, goodput. Either side may be measured (bench) or "
        "simulated (sim).",
    )  # fmt: skip
    cmp.add_argument("a", type=Path, metavar="A.json")
    cmp.add_argument("b", type=Path, metavar="B.json")
    cmp.set_defaults(run=compare)


def _run(args: argparse.Namespace) -> int:
    flags = record_of(BenchFlags, args)
    levels = levels_from_args(args)
    if args.token_times and args.out is None:
        raise ConfigError("--token-times needs --out", hint="add --out DIR")
    if args.out is not None:
        check_out_dir(args.out)
    setup = bench_setup(flags, levels, memory_sources, _note)
    with level_bars() as bars:
        output = loop.run(run_bench(setup.options, setup.tokenizer, bench_reporter(bars)))
    print_runs(output.result)
    if args.out is not None:
        write_outputs(args.out, output.result, output.records)
        print_step(f"wrote {args.out}/results.json, requests.csv and report.html")
        if args.token_times:
            write_token_times(args.out / TOKEN_TIMES, output.records)
            print_step(f"wrote {args.out}/{TOKEN_TIMES}")
    return exit_code(output.result, measured=True)


def _note(line: str, known: bool) -> None:
    (print_step if known else print_warning)(line)


def compare(args: argparse.Namespace) -> int:
    comparison = compare_results(load_result(args.a), load_result(args.b))
    out_console.print(render_comparison(comparison, str(args.a), str(args.b)))
    return 0
