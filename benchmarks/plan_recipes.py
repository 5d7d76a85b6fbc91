"""The planner's preset answers against vLLM's own numbers (part of `make bench-plan`).

1. KV bytes per token of each GQA / MLA preset against the page size vLLM 0.32's own spec
   classes compute (vllm/v1/kv_cache_interface.py: FullAttentionSpec, MLAAttentionSpec).
   DeepSeek-V3.2's indexer and V4's grouped caches are checked against vLLM's grouping code in
   tests/unit/test_plan_kv.py.
2. DeepSeek-V3/R1 in FP8 against vLLM's recipe (vllm-project/recipes DeepSeek/DeepSeek-V3.md):
   8 x H200 serves it with TP8 + EP; 8 x H100 (640 GB) cannot hold the ~685 GB of weights,
   and 16 H100 need PP (or TP16) across two nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.config import TrafficConfig
from servepilot.core.slo import Slo
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.hardware import get_accelerator
from servepilot.plan.kv import kv_cache_shape
from servepilot.plan.planner import make_plan
from servepilot.plan.presets import load_model
from servepilot.plan.request import PlanRequest
from servepilot.plan.spec import AttentionKind

BLOCK = 16


@dataclass(frozen=True)
class Check:
    what: str
    planned: str
    expected: str

    @property
    def ok(self) -> bool:
        return self.planned == self.expected


def kv_checks(models: tuple[str, ...]) -> list[Check]:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

    checks = []
    for name in models:
        spec = load_model(name)
        for tp in (1, 8) if spec.num_kv_heads % 8 == 0 or spec.num_kv_heads == 1 else (1,):
            ours = kv_cache_shape(
                spec, kv_dtype=KvDtype.AUTO, compute_dtype=WeightDtype.BF16, tp=tp, block_size=BLOCK
            ).bytes_per_token
            if spec.attention is AttentionKind.GQA:
                heads = max(1, spec.num_kv_heads // tp)
                page = FullAttentionSpec(
                    block_size=BLOCK, num_kv_heads=heads, head_size=spec.head_dim,
                    dtype=torch.bfloat16,
                ).page_size_bytes  # fmt: skip
            else:
                page = MLAAttentionSpec(
                    block_size=BLOCK, num_kv_heads=1, head_size=spec.head_dim, dtype=torch.bfloat16
                ).page_size_bytes
            theirs = page * spec.num_layers / BLOCK
            checks.append(
                Check(f"{name} KV B/token, bf16, TP{tp}", f"{ours:,.0f}", f"{theirs:,.0f}")
            )
    return checks


def recipe_checks() -> list[Check]:
    out = []
    for acc, nodes, expected in (("h200", 1, "fits TP8+EP8"), ("h100", 1, "does not fit"),
                                 ("h100", 2, "fits TP8+PP2+EP8")):  # fmt: skip
        spec = load_model("deepseek-v3")
        plan = make_plan(
            PlanRequest(
                model=spec, model_ref="deepseek-v3", accelerator=get_accelerator(acc), count=8,
                nodes=nodes, weights_dtype=WeightDtype.FP8, kv_dtype=KvDtype.AUTO,
                traffic=TrafficConfig(), slo=Slo(),
            )
        )  # fmt: skip
        got = f"fits {plan.option.parallelism.describe()}" if plan.fits else "does not fit"
        out.append(Check(f"DeepSeek-V3 FP8 on {nodes} x 8 {acc}", got, expected))
    return out


def table(checks: list[Check]) -> str:
    lines = [f"{'check':<38} {'servepilot plan':>18} {'vLLM':>18}  ok"]
    for c in checks:
        lines.append(f"{c.what:<38} {c.planned:>18} {c.expected:>18}  {'yes' if c.ok else 'NO'}")
    return "\n".join(lines)
