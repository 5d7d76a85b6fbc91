"""What `servepilot profile` does: the shapes of a model's step, timed by profiler.py in this
process (the same file a GPU box without servepilot runs by itself), written as JSON."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servepilot.core.errors import ConfigError
from servepilot.engine.gpu import profiler
from servepilot.plan.dtypes import WeightDtype, parse_weight_dtype
from servepilot.plan.gpu_profile.shapes import step_operators
from servepilot.plan.presets import load_model

PROFILE_DTYPES = (WeightDtype.BF16, WeightDtype.FP8)
PROFILER_FILE = Path(profiler.__file__)
"""The stand-alone profiler: copy it to the GPU machine with a shapes file."""


def model_shapes(model: str, dtype: str, tp: int) -> dict[str, Any]:
    """The shapes document of `model` (a preset or a config folder) at `dtype` and `tp`."""
    weights = parse_weight_dtype(dtype, field="--dtype")
    if weights not in PROFILE_DTYPES:
        raise ConfigError(f"--dtype {dtype}: profiles are taken in bf16 or fp8")
    spec = load_model(model)
    try:
        return step_operators(spec, dtype=weights, tp=tp)
    except ValueError as exc:
        raise ConfigError(f"--tp {tp}: {exc}") from None


def measure(shapes: dict[str, Any], *, device: str, log: Callable[[str], None]) -> dict[str, Any]:
    """The profile document; raises profiler.NoGpuError where no GPU can run it."""
    return profiler.run_profile(shapes, device=device, log=log)


def write_json(document: dict[str, Any], path: Path) -> None:
    """Written to a temporary file and renamed: a reader never sees half a profile."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
