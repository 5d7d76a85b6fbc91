"""The engine `up` launches: the one `plan` prints for the same fleet.yaml (layout, precision,
and the knobs the file leaves out), so a fleet started here runs the capacity `plan`, `k8s
render` and the autoscaler were sized on, not vLLM's defaults. A knob the file sets is used
as set. Where `plan` cannot size the fleet (a model it cannot read, a fleet that does not
fit), `up` still starts it as the file says, and says so."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.config import EngineKind, FleetConfig
from servepilot.core.errors import ServepilotError
from servepilot.engine.cpu import cpu_flags
from servepilot.plan.export import planned_engine
from servepilot.plan.planner import make_plan
from servepilot.plan.request import PlanRequest


@dataclass(frozen=True, slots=True)
class Launched:
    config: FleetConfig
    note: str | None
    """Why the engine is not plan's, in words for the user; None when it is."""


def launched_fleet(config: FleetConfig) -> Launched:
    """`config` with the engine `plan` prints for it (vLLM replicas only: a simulated
    replica's knobs are its own)."""
    if config.engine.kind is not EngineKind.VLLM:
        return Launched(config, None)
    try:
        plan = make_plan(PlanRequest.from_fleet(config, cpu_flags()))
    except ServepilotError as exc:
        return Launched(config, _as_given(f"`plan` cannot size this fleet ({exc.message})"))
    if not plan.fits:
        return Launched(config, _as_given("`plan` says this fleet does not fit its hardware"))
    return Launched(config.model_copy(update={"engine": planned_engine(plan, config.engine)}), None)


def _as_given(why: str) -> str:
    return (
        f"{why}: the replicas start with fleet.yaml's engine section as it is, and vLLM's "
        "own defaults for the knobs it leaves out"
    )
