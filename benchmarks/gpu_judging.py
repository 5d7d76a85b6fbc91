"""Which measured GPU cases the validation suite judges, and why a case is left out.

A case is shown and not judged when its measurement is not of what the simulator models:
- cache-warm: vLLM served more of its prompt tokens from its prefix cache than the workload
  itself shares, by more than CACHE_WARM_PCT points, because an earlier run sent the same
  prompts (before 2026-12-06 the runner gave every run bench's default seed). What the
  workload shares is the simulator's hit rate for the same case, from an empty cache: a
  shared-prefix run's own hits (prefix3000: 85%) are judged, as the suite means them to be;
- dummy routing: a mixture of experts served with dummy weights and its own routers, which
  send every token of a batch to nearly the same few experts (random weights map different
  inputs to nearly the same state): DeepSeek-V2-Lite decoded 16 sequences faster than the
  experts that uniformly routed tokens pick can be read at the H100's peak bandwidth
  (docs/benchmarks.md, 2026-12-06 evening). Since then `up` serves such a model with vLLM's
  routing simulator (uniform at random), which vLLM logs at start.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

from benchmarks.gpu_sim_cases import CONFIGS
from servepilot.engine.dummy_model import routes_experts

CACHE_WARM_PCT = 5.0
ROUTING_SIMULATED = "Simulating MoE routing"
"""What vLLM logs when VLLM_MOE_ROUTING_SIMULATION_STRATEGY replaces the model's routers."""


def cache_warm(row: dict[str, Any]) -> bool:
    hit = row.get("cache_hit_pct")
    own = row.get("sim_cache_hit_pct") or 0.0
    return hit is not None and hit > own + CACHE_WARM_PCT


def dummy_routing(config_dir: Path) -> bool:
    """Whether the config in `config_dir` is a MoE with dummy weights that vLLM served with
    the model's own routers (its logs never say the routing was simulated)."""
    model = CONFIGS[config_dir.name]["model"]
    if model.get("weights") != "dummy" or not routes_experts(model["source"]):
        return False
    return not any(ROUTING_SIMULATED in text for text in startup_logs(config_dir))


def startup_logs(config_dir: Path) -> list[str]:
    """The texts of the config's vLLM logs (`r0*.log`, or gzipped as `r0*.log.gz` to keep the
    repository under what one device call carries), in name order."""
    logs = sorted([*config_dir.glob("r0*.log"), *config_dir.glob("r0*.log.gz")])
    return [gzip.decompress(log.read_bytes()).decode(errors="replace") if log.suffix == ".gz"
            else log.read_text(errors="replace") for log in logs]  # fmt: skip


def unjudged(row: dict[str, Any]) -> str | None:
    """Why the case in `row` is shown and not judged; None when it is judged."""
    if cache_warm(row):
        return "warm"
    if row.get("dummy_routing"):
        return "routing"
    return None
