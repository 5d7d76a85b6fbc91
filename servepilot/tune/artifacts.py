"""What a tuning run leaves in --out: the best fleet.yaml, its vLLM command, the HTML report."""

from __future__ import annotations

from pathlib import Path

import yaml

from servepilot.core.config import EMBEDDED_MODEL, FleetConfig
from servepilot.core.errors import ConfigError, ServepilotError
from servepilot.engine.args import vllm_command
from servepilot.load.workload import describe
from servepilot.plan.presets import load_model
from servepilot.tune.report_html import render_report, write_report
from servepilot.tune.score import Trial
from servepilot.tune.setup import TuneSetup
from servepilot.tune.summary import Summary


def tuned_fleet(setup: TuneSetup, trial: Trial) -> FleetConfig:
    """The trial's configuration as a fleet.yaml to deploy: the engine kind as given, and every
    limit of the SLA it was tuned for, so `tune -c` on it (no --slo) tunes for the same SLA."""
    overrides = {"engine.kind": setup.config.engine.kind.value, "slo": setup.goal.sla.as_dict()}
    return setup.space.fleet(trial.config).with_overrides(overrides)


def fleet_command(config: FleetConfig) -> str:
    """The vLLM command that starts one replica of `config`; a preset by its hub repository,
    as `plan` prints it."""
    source = config.model.source
    model = source if source == EMBEDDED_MODEL else _model_ref(source)
    return vllm_command(config, model, config.model.served_name or Path(source).name)


def write_artifacts(setup: TuneSetup, summary: Summary, fleet: FleetConfig, command: str) -> None:
    """fleet.yaml, vllm_command.txt and report.html in setup.out (trials.jsonl is already)."""
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
        "Workload": ", ".join(f"{k}={v}" for k, v in describe(setup.workload).items()),
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


def _model_ref(source: str) -> str:
    """A folder as it is; a preset by its hub repository."""
    if Path(source).expanduser().exists():
        return source
    try:
        return load_model(source).repo_id or source
    except ServepilotError:
        return source
