"""`--profile FILE` for plan, sim and tune: either a calibrated cost profile
(`servepilot.costmodel/v1`, from `servepilot calibrate`) or a GPU operator profile
(`servepilot.gpuprofile/v1`, from `servepilot profile`), told apart by the schema."""

from __future__ import annotations

import json
from pathlib import Path

from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import CostModel
from servepilot.plan.costprofile import load_profile
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.gpu_profile.compose import Linearized, Operating, composer, linearize
from servepilot.plan.gpu_profile.table import GpuProfile, gpu_profile_from, is_gpu_profile
from servepilot.plan.hardware import Accelerator
from servepilot.plan.spec import ModelSpec


def read_step_source(path: Path) -> CostModel | GpuProfile:
    """The step-time source a `--profile` file holds."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return load_profile(path)  # says what is wrong with the file
    if is_gpu_profile(document):
        return gpu_profile_from(document, str(path))
    return load_profile(path)


def profile_cost_model(
    profile: GpuProfile,
    spec: ModelSpec,
    accelerator: Accelerator,
    *,
    tp: int,
    weights: WeightDtype,
    at: Operating,
) -> Linearized:
    """The step cost model of `spec` at `tp` from the measured operators, linear around
    the operating point `at`."""
    if accelerator.kind.value == "cpu":
        raise ConfigError(
            f"a GPU profile ({profile.gpu}) cannot time a CPU replica",
            hint="profile CPU replicas with `servepilot calibrate`",
        )
    step = composer(profile, spec, accelerator, tp=tp, where=profile.source, weights=weights)
    return linearize(step, at)
