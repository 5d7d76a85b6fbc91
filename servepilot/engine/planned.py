"""A plan with what to run: the checkpoint and `vllm serve` line of the plan, or when nothing
fits of the ladder's first rung that does, and a rung at the original precision beside it.
What `servepilot plan` prints, writes and answers in JSON (`k8s render` runs the same line)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.core.config import EngineConfig
from servepilot.core.errors import ConfigError
from servepilot.engine.args import vllm_command
from servepilot.engine.dummy_model import dummy_serving_folder
from servepilot.plan.checkpoint import checkpoint_for
from servepilot.plan.export import fleet_config, fleet_yaml, plan_json
from servepilot.plan.ladder import LadderStep
from servepilot.plan.launch import Launch
from servepilot.plan.planner import Plan, make_plan
from servepilot.plan.request import PlanRequest


def launch_of(plan: Plan, given: EngineConfig | None = None) -> Launch:
    """How to start `plan` as printed: the checkpoint it serves and its `vllm serve` line,
    with the engine section `given` as planned."""
    req = plan.request
    checkpoint = checkpoint_for(req.model, req.model_ref, req.weights_dtype)
    model = checkpoint.model
    if req.dummy_weights:
        # No checkpoint to download: the config's folder with a tokenizer, which `up` writes.
        model = str(dummy_serving_folder(req.model_ref))
    command = vllm_command(fleet_config(plan, given), model, req.model.name)
    return Launch(command, nodes=plan.option.parallelism.pp, checkpoint=checkpoint)


@dataclass(frozen=True, slots=True)
class PlannedLaunch:
    plan: Plan
    runnable: Plan
    """`plan`, or the ladder's first rung that fits: an answer to act on rather than a
    configuration vLLM would refuse. Its advice, cost, estimates and launch are printed."""
    step: LadderStep | None
    """The rung `runnable` is; None when `plan` fits."""
    launch: Launch | None
    """`runnable`'s; None when nothing fits, even on the ladder."""
    alternative: tuple[str, Launch] | None
    """A rung at the original precision (more accelerators or nodes) besides `step`."""
    given: EngineConfig

    def as_json(self) -> dict[str, Any]:
        data = plan_json(self.plan) | _launch_json(self.launch if self.plan.fits else None)
        if self.step is not None:
            advice = plan_json(self.runnable)["advice"]
            data["suggested"] = {"action": self.step.action, "advice": advice}
            data["suggested"] |= _launch_json(self.launch)
        if self.alternative is not None:
            action, launch = self.alternative
            data["alternative"] = {"action": action} | _launch_json(launch)
        return data

    def warnings(self, cpu_flags: frozenset[str]) -> list[str]:
        """The runnable plan's, and on a roofline estimate whether this host can run it."""
        found, req = list(self.runnable.advice.warnings), self.plan.request
        if req.cost_model is None and (
            mismatch := req.accelerator.host_mismatch(req.weights_dtype, cpu_flags)
        ):
            found.append(mismatch)
        return found

    def write_fleet_yaml(self, path: Path) -> None:
        """The runnable plan's fleet.yaml (refused by the caller when nothing fits)."""
        try:
            path.write_text(fleet_yaml(self.runnable, self.given), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--out {path}: cannot write it ({exc.strerror})") from None


def plan_launch(request: PlanRequest, given: EngineConfig) -> PlannedLaunch:
    plan = make_plan(request)
    step = None if plan.fits else plan.first_fitting_step
    runnable = plan if step is None else make_plan(step.request)
    wider = next((s for s in plan.ladder if s.fits and s.widens and s is not step), None)
    also = None if wider is None else (wider.action, launch_of(make_plan(wider.request), given))
    launch = launch_of(runnable, given) if runnable.fits else None
    return PlannedLaunch(plan, runnable, step, launch, also, given)


def _launch_json(launch: Launch | None) -> dict[str, object]:
    if launch is None:
        return {"vllm_command": None, "launch": None}
    return {"vllm_command": launch.command, "launch": list(launch.steps)}
