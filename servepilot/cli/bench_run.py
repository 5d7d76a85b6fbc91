"""Running `servepilot bench` for the terminal: progress bar, tables, files."""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from pathlib import Path

from servepilot.bench.client import Target
from servepilot.bench.compare import compare_results, render_comparison
from servepilot.bench.records import Endpoint
from servepilot.bench.records_csv import write_records_csv
from servepilot.bench.report.html import write_html_report
from servepilot.bench.session import (
    LEAK_BYTES_PER_REQUEST,
    BenchOptions,
    BenchOutput,
    BenchReporter,
    LevelProgress,
    run_bench,
)
from servepilot.bench.tokenizer import Tokenizer, open_tokenizer
from servepilot.cli.bench_parse import parse_duration_s, parse_slo
from servepilot.cli.console import out_console, print_step, print_warning
from servepilot.cli.levels_view import fmt_load, level_bars, print_runs, write_results_json
from servepilot.cli.options import base_url
from servepilot.core import loop
from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, load_result
from servepilot.load.arrivals import Arrival
from servepilot.load.levels import LevelOptions
from servepilot.load.sweep import SweepConfig
from servepilot.load.workload import WorkloadSpec


def run(
    args: argparse.Namespace,
    loads: tuple[Load, ...],
    sweep: SweepConfig | None,
    workload: WorkloadSpec,
) -> int:
    root = base_url(args.url, "--url")
    model = args.model or _only_model(root, args.api_key)
    target = Target(
        base_url=root,
        model=model,
        endpoint=Endpoint(args.endpoint),
        api_key=args.api_key,
        timeout_s=args.timeout,
    )
    soak_s = parse_duration_s(args.soak, "--soak") if args.soak else None
    if soak_s is not None and len(loads) != 1:
        raise ConfigError("--soak runs one load level: give one --concurrency or --rate value")
    opts = BenchOptions(
        target=target,
        levels=LevelOptions(
            workload=workload,
            loads=loads,
            sweep=sweep,
            requests=args.requests,
            duration_s=parse_duration_s(args.duration, "--duration") if args.duration else None,
            warmup_requests=args.warmup,
            arrival=Arrival(args.arrival),
            burstiness=args.burstiness,
        ),
        seed=args.seed,
        slo=parse_slo(args.slo),
        soak_s=soak_s,
        window_s=_window_s(args, soak_s),
        processes=args.processes,
        metrics_url=args.metrics_url,
    )
    tokenizer = open_tokenizer(target.base_url, target.model, args.tokenizer)
    output = _run_with_progress(opts, tokenizer)
    _report(output, args.out)
    return 0


def compare(args: argparse.Namespace) -> int:
    comparison = compare_results(load_result(args.a), load_result(args.b))
    out_console.print(render_comparison(comparison, str(args.a), str(args.b)))
    return 0


def _run_with_progress(opts: BenchOptions, tokenizer: Tokenizer) -> BenchOutput:
    with level_bars() as bars:

        def started(load: Load, requests: int | None, duration_s: float | None) -> None:
            bars.start(load, requests if requests is not None else duration_s)

        def progress(p: LevelProgress) -> None:
            done = p.completed + p.failed if p.planned is not None else p.elapsed_s
            counts = f"{p.completed:,} ok" + (f", {p.failed:,} failed" if p.failed else "")
            bars.update(p.load, done, counts)

        reporter = BenchReporter(started, progress, bars.finish, bars.note)
        return loop.run(run_bench(opts, tokenizer, reporter))


def _report(output: BenchOutput, out_dir: Path | None) -> None:
    result = output.result
    print_runs(result)
    for run in result.runs:
        if run.client is not None and run.client.client_bound:
            print_warning(
                f"at {fmt_load(run.load)} the client could not keep up (achieved "
                f"{run.client.achieved_rate:.1f} req/s): the numbers understate the server; "
                "use --processes or a bigger client machine"
            )
        growth = run.memory_growth_bytes_per_request
        if growth is not None and growth > LEAK_BYTES_PER_REQUEST:
            print_warning(
                f"memory grew {growth / 2**20:.1f} MiB per request during the soak: "
                "a leak by the 2 MB/request rule"
            )
    if out_dir is not None:
        write_results_json(out_dir, result)
        write_records_csv(out_dir / "requests.csv", output.records)
        write_html_report(out_dir / "report.html", result, output.records)
        print_step(f"wrote {out_dir}/results.json, requests.csv and report.html")


def _window_s(args: argparse.Namespace, soak_s: float | None) -> float:
    if args.window:
        return parse_duration_s(args.window, "--window")
    return max(10.0, soak_s / 10) if soak_s else 30.0


def _only_model(root: str, api_key: str | None) -> str:
    request = urllib.request.Request(f"{root}/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            doc = json.loads(resp.read())
        ids = [str(m["id"]) for m in doc["data"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot list the models of {root} ({exc})", hint="pass --model NAME"
        ) from None
    if len(ids) != 1:
        raise ConfigError(
            f"{root} serves {len(ids)} models ({', '.join(ids) or 'none'})",
            hint="pick one with --model",
        )
    return ids[0]
