"""The model specs the KV cache sizing tests share (test_plan_kv.py, test_plan_kv_vllm.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.kv import KvCacheShape, kv_cache_shape
from servepilot.plan.spec import AttentionKind, IndexerShape, MlaShape, ModelSpec

GIB = 2**30


def spec_of(name: str, **fields: Any) -> ModelSpec:
    base: dict[str, Any] = dict(
        name=name,
        architecture="test",
        source="test",
        num_layers=30,
        hidden_size=576,
        num_attention_heads=9,
        num_kv_heads=3,
        head_dim=64,
        intermediate_size=1536,
        vocab_size=49152,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attention=AttentionKind.GQA,
        checkpoint_dtype=WeightDtype.BF16,
    )
    return ModelSpec(**(base | fields))


_MLA = MlaShape(
    kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536
)
# DeepSeek-V4-Flash: layers 0-1 sliding window only, then C4 and C128 alternate
# (huggingface.co/deepseek-ai/DeepSeek-V4-Flash config.json, compress_ratios 0 -> 1).
_V4_RATIOS = (1, 1, *(4 if i % 2 == 0 else 128 for i in range(41)))

SMOLLM2 = spec_of("smollm2-135m")
LLAMA_70B = spec_of(
    "llama-3.1-70b", num_layers=80, num_attention_heads=64, num_kv_heads=8, head_dim=128
)
DEEPSEEK_V3 = spec_of(
    "deepseek-v3",
    num_layers=61,
    num_attention_heads=128,
    num_kv_heads=1,
    head_dim=576,
    attention=AttentionKind.MLA,
    mla=_MLA,
)
DEEPSEEK_V32 = dataclasses.replace(
    DEEPSEEK_V3,
    name="deepseek-v3.2",
    attention=AttentionKind.MLA_SPARSE,
    indexer=IndexerShape(index_n_heads=64, index_head_dim=128, index_topk=2048),
)
DEEPSEEK_V4_FLASH = spec_of(
    "deepseek-v4-flash",
    num_layers=43,
    num_attention_heads=64,
    num_kv_heads=1,
    head_dim=512,
    attention=AttentionKind.MLA_HYBRID,
    indexer=IndexerShape(index_n_heads=64, index_head_dim=128, index_topk=512),
    sliding_window=128,
    layer_compress_ratios=_V4_RATIOS,
)
MISTRAL_LIKE = spec_of("all-layers-slide", num_kv_heads=8, head_dim=128, sliding_window=4096)


def shape_of(spec: ModelSpec, kv: KvDtype = KvDtype.AUTO, **kw: Any) -> KvCacheShape:
    compute = kw.pop("compute", WeightDtype.BF16)
    return kv_cache_shape(spec, kv_dtype=kv, compute_dtype=compute, **kw)


PRESET_BYTES = {
    "smollm2": (KvDtype.AUTO, 23_040),
    "llama-3.1-8b": (KvDtype.AUTO, 2 * 32 * 8 * 128 * 2),
    "llama-3.1-70b": (KvDtype.AUTO, 2 * 80 * 8 * 128 * 2),
    "qwen3-32b": (KvDtype.AUTO, 2 * 64 * 8 * 128 * 2),
    "deepseek-v3": (KvDtype.AUTO, 70_272),
    "deepseek-v3.2": (KvDtype.FP8, 48_068),
    "deepseek-v4-flash": (KvDtype.AUTO, 3_915),
}


def preset(name: str) -> ModelSpec:
    presets = pytest.importorskip("servepilot.plan.presets")
    spec: ModelSpec = presets.load_model(name)
    return spec
