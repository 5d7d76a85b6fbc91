"""The operators one engine step of a model runs, at the model's real shapes, and the points
at which the profiler times them (schema `servepilot.gpushapes/v1`, read by the profiler,
servepilot/engine/gpu/profiler.py).

Every operator carries `count`: how many times one step runs it (once per layer that has it,
once for the LM head). Shapes are one tensor-parallel rank's: a column-parallel linear's
output and a row-parallel linear's input are divided by `tp`, attention heads too; what vLLM
replicates (MLA's down-projections, the MoE router) is not.

What is approximated, and why (each a documented source of error):
- Rotary embeddings, residual adds, the sampler and embedding lookups are left out: each is
  a pass over a few kilobytes per token, well under 1% of a decode step.
- MoE: the routed experts are timed as one operator over the step's token count (the
  profiler spreads them over the experts a uniform router touches); the shared experts are
  ordinary linears.
- DeepSeek-V4's compressed and sliding-window attention are timed as plain MLA over the
  whole context (an upper bound), its grouped low-rank output projection as one linear.
"""

from __future__ import annotations

from typing import Any

from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.spec import ModelSpec

SHAPES_SCHEMA = "servepilot.gpushapes/v1"
"""The shapes document's format; the stand-alone profiler (servepilot/engine/gpu/profiler.py,
which imports nothing of ours) names it too, and the round trip in test_gpu_profiler.py
holds the two together."""

TOKEN_GRID = tuple(sorted({2**i for i in range(14)} | {3 * 2**i for i in range(12)}))
"""1 .. 8,192 on a log grid with a midpoint per octave (26 points)."""
SAMPLED_GRID = tuple(t for t in TOKEN_GRID if t <= 1024)
"""Sequences sampled in one step (the LM head's rows): at most max_num_seqs."""
PREFILL_GRID = tuple(2**i for i in range(4, 16))
"""Prompt tokens of one causal prefill: 16 .. 32,768."""
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
DECODE_CONTEXTS = (128, 512, 1024, 2048, 4096, 8192, 16384, 32768)
MAX_DECODE_KV_TOKENS = 2**22
"""Batch x context points past this are skipped: 4M tokens of KV per layer is more than a
141 GB GPU holds for any preset, and the time is linear in it well before."""


def step_operators(
    spec: ModelSpec, *, dtype: WeightDtype = WeightDtype.BF16, tp: int = 1
) -> dict[str, Any]:
    """The shapes document for `spec` at `dtype` on one rank of `tp`."""
    if tp < 1 or spec.num_attention_heads % tp:
        raise ValueError(f"tp must divide the {spec.num_attention_heads} attention heads")
    attention = _mla_ops(spec, tp) if spec.mla is not None else _gqa_ops(spec, tp)
    operators = [*attention, *_mlp_ops(spec, tp), *_norm_and_head(spec, tp)]
    return {
        "schema": SHAPES_SCHEMA,
        "model": spec.name,
        "dtype": dtype.value,
        "tp": tp,
        "operators": operators,
    }


def _tokens(values: tuple[int, ...] = TOKEN_GRID) -> list[dict[str, int]]:
    return [{"tokens": t} for t in values]


def _gemm(
    name: str,
    k: int,
    n: int,
    count: int,
    *,
    axis: str = "tokens",
    groups: int = 1,
    fp8: bool = True,
) -> dict[str, Any]:
    grid = SAMPLED_GRID if axis == "sampled" else TOKEN_GRID
    op: dict[str, Any] = {
        "name": name,
        "kind": "gemm",
        "axis": axis,
        "k": k,
        "n": n,
        "count": count,
        "points": _tokens(grid),
    }
    if groups > 1:
        op["groups"] = groups
    if not fp8:
        op["fp8"] = False
    return op


def _attention(
    name: str, heads: int, kv_heads: int, qk: int, v: int, count: int, *, latent: bool = False
) -> list[dict[str, Any]]:
    decode_points = [
        {"batch": b, "context": c}
        for b in DECODE_BATCHES
        for c in DECODE_CONTEXTS
        if b * c <= MAX_DECODE_KV_TOKENS
    ]
    dims = {"heads": heads, "kv_heads": kv_heads, "qk_dim": qk, "v_dim": v, "count": count}
    decode: dict[str, Any] = {
        "name": f"{name}_decode",
        "kind": "attn_decode",
        **dims,
        "points": decode_points,
    }
    if latent:
        decode["latent"] = True
    return [decode]


def _prefill(name: str, heads: int, kv_heads: int, qk: int, v: int, count: int) -> dict[str, Any]:
    return {
        "name": f"{name}_prefill",
        "kind": "attn_prefill",
        "heads": heads,
        "kv_heads": kv_heads,
        "qk_dim": qk,
        "v_dim": v,
        "count": count,
        "points": _tokens(PREFILL_GRID),
    }


def _gqa_ops(spec: ModelSpec, tp: int) -> list[dict[str, Any]]:
    layers, hd = spec.num_layers, spec.head_dim
    heads = spec.num_attention_heads // tp
    kv_heads = max(1, spec.num_kv_heads // tp)  # vLLM replicates KV heads when tp > kv heads
    return [
        _gemm("qkv_proj", spec.hidden_size, (heads + 2 * kv_heads) * hd, layers),
        _gemm("o_proj", heads * hd, spec.hidden_size, layers),
        *_attention("attn", heads, kv_heads, hd, hd, layers),
        _prefill("attn", heads, kv_heads, hd, hd, layers),
    ]


def _mla_ops(spec: ModelSpec, tp: int) -> list[dict[str, Any]]:
    """vLLM's MLA: prefill unabsorbed (kv_b_proj expands the latent), decode absorbed (the
    per-head W_UK and W_UV multiply queries and outputs, attention reads the latent)."""
    assert spec.mla is not None
    mla, layers, hidden = spec.mla, spec.num_layers, spec.hidden_size
    heads = spec.num_attention_heads // tp
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    latent = mla.kv_lora_rank + mla.qk_rope_head_dim
    q_ops = (
        [
            _gemm("qkv_a_proj", hidden, mla.q_lora_rank + latent, layers),
            _gemm("q_b_proj", mla.q_lora_rank, heads * qk, layers),
        ]
        if mla.q_lora_rank
        else [
            _gemm("q_proj", hidden, heads * qk, layers),
            _gemm("kv_a_proj", hidden, latent, layers),
        ]
    )
    return [
        *q_ops,
        _gemm(
            "kv_b_proj",
            mla.kv_lora_rank,
            heads * (mla.qk_nope_head_dim + mla.v_head_dim),
            layers,
            axis="prefill",
        ),
        _gemm("w_uk", mla.qk_nope_head_dim, mla.kv_lora_rank, layers, axis="decode", groups=heads),
        _gemm("w_uv", mla.kv_lora_rank, mla.v_head_dim, layers, axis="decode", groups=heads),
        _gemm("o_proj", heads * mla.v_head_dim, hidden, layers),
        *_attention("mla", heads, 1, latent, mla.kv_lora_rank, layers, latent=True),
        _prefill("mla", heads, heads, qk, mla.v_head_dim, layers),
    ]


def _mlp_ops(spec: ModelSpec, tp: int) -> list[dict[str, Any]]:
    hidden = spec.hidden_size
    moe = spec.moe
    dense_layers = spec.num_layers if moe is None else moe.dense_layers
    ops: list[dict[str, Any]] = []
    if dense_layers and spec.intermediate_size:
        inter = spec.intermediate_size // tp
        ops += [
            _gemm("gate_up_proj", hidden, 2 * inter, dense_layers),
            _silu("silu_mul", inter, dense_layers),
            _gemm("down_proj", inter, hidden, dense_layers),
        ]
    if moe is None:
        return ops
    moe_layers = spec.num_layers - moe.dense_layers
    inter = moe.expert_intermediate_size // tp
    ops += [
        _gemm("router", hidden, moe.routed_experts, moe_layers, fp8=False),
        {
            "name": "experts",
            "kind": "moe",
            "axis": "tokens",
            "experts": moe.routed_experts,
            "top_k": moe.experts_per_token,
            "k": hidden,
            "n": inter,
            "count": moe_layers,
            "points": _tokens(),
        },
    ]
    if moe.shared_experts:
        shared = moe.shared_experts * inter
        ops += [
            _gemm("shared_gate_up", hidden, 2 * shared, moe_layers),
            _silu("shared_silu_mul", shared, moe_layers),
            _gemm("shared_down", shared, hidden, moe_layers),
        ]
    return ops


def _silu(name: str, width: int, count: int) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "silu_mul",
        "axis": "tokens",
        "width": width,
        "count": count,
        "points": _tokens(),
    }


def _norm_and_head(spec: ModelSpec, tp: int) -> list[dict[str, Any]]:
    return [
        {
            "name": "rmsnorm",
            "kind": "rmsnorm",
            "axis": "tokens",
            "width": spec.hidden_size,
            "count": 2 * spec.num_layers + 1,
            "points": _tokens(),
        },
        _gemm("lm_head", spec.hidden_size, -(-spec.vocab_size // tp), 1, axis="sampled", fp8=False),
    ]
