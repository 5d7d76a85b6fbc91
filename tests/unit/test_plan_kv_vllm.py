"""KV cache sizing (servepilot/plan/kv.py) against vLLM itself: these tests rebuild every
layer's KV cache spec with vLLM 0.32's own classes and run vLLM's own grouping and capacity
code on them.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.kv import kv_cache_shape
from servepilot.plan.spec import AttentionKind, ModelSpec
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
)

# --- Oracle: vLLM's own spec classes and capacity code ---------------------------------------


class VllmOracle:
    """Every layer's KV cache spec as vLLM 0.32 builds it, then vLLM's own capacity code.

    Where the cache is a small module of its own, the real module builds its spec:
    DeepseekV32IndexerCache (model_executor/models/deepseek_v2.py), DeepseekV4SWACache
    (v1/attention/backends/mla/sparse_swa.py), CompressorStateCache
    (models/deepseek_v4/compressor.py) and DeepseekV4IndexerCache
    (models/deepseek_v4/attention.py); the head sizes passed to them are those their owners
    compute (Indexer.__init__: 128 fp8 values + 128 // 128 x 4 B scale; DeepseekCompressor:
    2 x coff x head_dim). The specs of layers that need a whole model to construct are
    written out as their get_kv_cache_spec writes them: Attention (FullAttentionSpec /
    SlidingWindowSpec, KV heads per rank as llama.py), MLAAttention (MLAAttentionSpec,
    num_kv_heads=1, state_content_bytes 656 for fp8_ds_mla) and DeepseekV4Attention (the
    compressed MLAAttentionSpec). Each spec then passes through the real backend's
    v1/worker/utils.py customize_attention_spec (block-stride alignment), except
    FlashAttention-MLA's, whose CUDA-only module does not import here (its sparse variant's
    customize_spec is align_blocks_to_rows, applied directly).

    vLLM then runs unchanged: v1/core/kv_cache_utils.py get_kv_cache_configs (grouping and
    num_blocks), generate_scheduler_kv_cache_config and get_kv_cache_capacity (the startup
    log's "KV cache size" and "Maximum concurrency"). The VllmConfig those read is a
    duck-typed stand-in holding only the fields they touch, so a missing one raises.
    """

    def __init__(self) -> None:
        import torch
        from vllm import config
        from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
        from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache
        from vllm.models.deepseek_v4.compressor import CompressorBackend, CompressorStateCache
        from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLABackend
        from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
        from vllm.v1 import kv_cache_interface
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
        from vllm.v1.attention.backends.mla import indexer
        from vllm.v1.attention.backends.mla.flashmla_sparse import FlashMLASparseBackend
        from vllm.v1.attention.backends.mla.sparse_swa import (
            DeepseekSparseSWABackend,
            DeepseekV4SWACache,
        )
        from vllm.v1.attention.backends.mla.sparse_utils import align_blocks_to_rows
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.kv_cache_layout import KVCacheLayout
        from vllm.v1.worker.utils import customize_attention_spec

        self.torch, self.kvi, self.utils, self.config = (
            torch,
            kv_cache_interface,
            kv_cache_utils,
            config,
        )
        self.str_dtype, self.layouts, self.customize = (
            STR_DTYPE_TO_TORCH_DTYPE,
            KVCacheLayout,
            customize_attention_spec,
        )
        self.align_rows = align_blocks_to_rows
        self.modules = SimpleNamespace(
            v32_indexer=DeepseekV32IndexerCache,
            v4_indexer=DeepseekV4IndexerCache,
            swa=DeepseekV4SWACache,
            state=CompressorStateCache,
        )
        self.backends = SimpleNamespace(
            gqa=FlashAttentionBackend,
            sparse=FlashMLASparseBackend,
            v32_indexer=indexer.DeepseekV32IndexerBackend,
            v4_indexer=indexer.DeepseekV4IndexerBackend,
            v4=DeepseekV4FlashMLABackend,
            swa=DeepseekSparseSWABackend,
            state=CompressorBackend,
        )

    def dtype(self, kv: KvDtype, compute: WeightDtype) -> tuple[str, Any]:
        if kv is KvDtype.AUTO:
            return (
                "auto",
                self.torch.float32 if compute is WeightDtype.FP32 else self.torch.bfloat16,
            )
        return kv.vllm_flag, self.str_dtype[kv.vllm_flag]

    def layer_specs(
        self, spec: ModelSpec, kv: KvDtype, compute: WeightDtype, tp: int, block: int
    ) -> dict[str, Any]:
        if spec.attention is AttentionKind.GQA:
            return self._gqa(spec, kv, compute, tp, block)
        if spec.attention is AttentionKind.MLA_HYBRID:
            return self._v4(spec, kv)
        latent = self._latent(spec, kv, compute, block)
        layers: dict[str, Any] = {}
        vllm_config = self.config.VllmConfig(cache_config=self.config.CacheConfig(block_size=block))
        for i in range(spec.num_layers):
            if spec.attention is AttentionKind.MLA_SPARSE:
                assert spec.indexer is not None
                dim = spec.indexer.index_head_dim
                name = f"layers.{i}.attn.indexer.k_cache"
                layers[name] = self._module_spec(
                    vllm_config,
                    self.backends.v32_indexer,
                    lambda name=name, dim=dim: self.modules.v32_indexer(
                        head_dim=dim + dim // 128 * 4,
                        dtype=self.torch.uint8,
                        prefix=name,
                        cache_config=vllm_config.cache_config,
                    ),
                )
            layers[f"layers.{i}.attn"] = latent
        return layers

    def _module_spec(self, vllm_config: Any, backend: Any, build: Any) -> Any:
        with self.config.set_current_vllm_config(vllm_config):
            module = build()
            return self.customize(backend, module.get_kv_cache_spec(vllm_config))

    def _gqa(
        self, spec: ModelSpec, kv: KvDtype, compute: WeightDtype, tp: int, block: int
    ) -> dict[str, Any]:
        flag, dtype = self.dtype(kv, compute)
        common = dict(
            block_size=block,
            num_kv_heads=max(1, spec.num_kv_heads // tp),
            head_size=spec.head_dim,
            dtype=dtype,
            kv_quant_mode=self.kvi.get_kv_quant_mode(flag),
        )
        if spec.sliding_window is None:
            one = self.kvi.FullAttentionSpec(**common)
        else:
            one = self.kvi.SlidingWindowSpec(**common, sliding_window=spec.sliding_window)
        one = self.customize(self.backends.gqa, one)
        return {f"layers.{i}.attn": one for i in range(spec.num_layers)}

    def _latent(self, spec: ModelSpec, kv: KvDtype, compute: WeightDtype, block: int) -> Any:
        assert spec.mla is not None
        flag, dtype = self.dtype(kv, compute)
        sparse = spec.attention is AttentionKind.MLA_SPARSE
        if sparse and kv.is_fp8:
            # FLASHMLA_SPARSE serves every fp8 flavour as fp8_ds_mla
            # (mla_attention.py, _canonicalize_sparse_mla_kv_cache_dtype).
            flag, dtype = "fp8_ds_mla", self.str_dtype["fp8_ds_mla"]
        latent = self.kvi.MLAAttentionSpec(
            block_size=block,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim,
            dtype=dtype,
            cache_dtype_str=flag,
            kv_quant_mode=self.kvi.get_kv_quant_mode(flag),
            state_content_bytes={"fp8_ds_mla": 656}.get(flag),
            is_index_group_leader=sparse,
        )
        if not sparse:
            return latent  # FLASH_ATTN_MLA: no customize_spec, MultipleOf(16) blocks
        if flag == "fp8_ds_mla":
            return self.customize(self.backends.sparse, latent)
        return self.align_rows(latent)  # FLASH_ATTN_MLA_SPARSE (Hopper, bf16)

    def _v4(self, spec: ModelSpec, kv: KvDtype) -> dict[str, Any]:
        """In registration order: indexer cache and its compressor state (C4), the window
        cache, the compressed cache and its compressor state (C4 and C128)."""
        assert spec.indexer is not None and spec.sliding_window is not None
        ds = kv is KvDtype.AUTO or kv.is_fp8
        flag = "fp8_ds_mla" if ds else "bfloat16"
        dtype = self.torch.uint8 if ds else self.torch.bfloat16
        vllm_config = self.config.VllmConfig(
            cache_config=self.config.CacheConfig(block_size=256, cache_dtype=flag)
        )
        cache, index_dim = vllm_config.cache_config, spec.indexer.index_head_dim
        layers: dict[str, Any] = {}

        def add(name: str, backend: Any, build: Any) -> None:
            layers[name] = self._module_spec(vllm_config, backend, lambda: build(name))

        def state(ratio: int, dim: int) -> Any:
            coff = 2 if ratio == 4 else 1
            return lambda name: self.modules.state(
                state_dim=2 * coff * dim,
                dtype=self.torch.float32,
                compress_ratio=ratio,
                prefix=name,
            )

        for i, ratio in enumerate(spec.layer_compress_ratios):
            attn = f"layers.{i}.attn"
            if ratio == 4:
                add(
                    attn + ".indexer.k_cache",
                    self.backends.v4_indexer,
                    lambda name: self.modules.v4_indexer(
                        head_dim=index_dim + index_dim // 128 * 4,
                        dtype=self.torch.uint8,
                        prefix=name,
                        cache_config=cache,
                        compress_ratio=4,
                    ),
                )
                add(
                    attn + ".indexer.compressor.state_cache",
                    self.backends.state,
                    state(4, index_dim),
                )
            add(
                attn + ".swa_cache",
                self.backends.swa,
                lambda name: self.modules.swa(
                    head_dim=spec.head_dim,
                    window_size=spec.sliding_window,
                    dtype=dtype,
                    prefix=name,
                    cache_config=cache,
                ),
            )
            if ratio > 1:
                layers[attn] = self._v4_compressed(spec, ratio, ds, flag, dtype)
                add(
                    attn + ".compressor.state_cache",
                    self.backends.state,
                    state(ratio, spec.head_dim),
                )
        return layers

    def _v4_compressed(self, spec: ModelSpec, ratio: int, ds: bool, flag: str, dtype: Any) -> Any:
        """DeepseekV4Attention.get_kv_cache_spec, written out."""
        compressed = self.kvi.MLAAttentionSpec(
            block_size=256,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=spec.head_dim,
            dtype=dtype,
            tokens_per_state=ratio,
            cache_dtype_str=flag,
            alignment=576 if ds else 512,
            model_version="deepseek_v4",
            kv_quant_mode=self.kvi.get_kv_quant_mode(flag),
            state_content_bytes=584 if ds else None,
        )
        return self.customize(self.backends.v4, compressed)

    def keeps_every_token(self, layer: Any) -> bool:
        return isinstance(layer, self.kvi.FullAttentionSpec)

    def stand_in_config(
        self, max_model_len: int, layout: Any, batched: int, pp: int = 1
    ) -> SimpleNamespace:
        return SimpleNamespace(
            scheduler_config=SimpleNamespace(
                disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=batched
            ),
            attention_config=SimpleNamespace(hisparse_config=None),
            cache_config=SimpleNamespace(
                get_resolved_kv_cache_layout=lambda: layout,
                num_gpu_blocks_override=None,
                prefix_cache_retention_interval=None,
            ),
            model_config=SimpleNamespace(
                max_model_len=max_model_len, original_max_model_len=max_model_len
            ),
            parallel_config=SimpleNamespace(decode_context_parallel_size=1, tensor_parallel_size=1),
            speculative_config=None,
            num_prefill_lookahead_tokens=0,
            # VllmConfig.max_in_flight_tokens: async scheduling on model runner V2 keeps
            # pp + 1 batches in flight (max_concurrent_batches).
            max_in_flight_tokens=(pp + 1) * batched,
        )

    def capacity(
        self,
        spec: ModelSpec,
        layers: dict[str, Any],
        kv_bytes: int,
        max_model_len: int,
        batched: int,
        pp: int = 1,
    ) -> tuple[int, int, int, float]:
        """(num_blocks, bytes per block of the fullest stage, "KV cache size" tokens,
        "Maximum concurrency"), every PP stage given `kv_bytes`."""
        from vllm.distributed.utils import get_pp_indices

        # DeepSeek-V4's indexer backend declares block-outermost layouts (BLHNC first);
        # every other backend here declares none, so vLLM's default preference (LBNHC) wins.
        v4 = spec.attention is AttentionKind.MLA_HYBRID
        layout = self.layouts.BLHNC if v4 else self.layouts.LBNHC
        config = self.stand_in_config(max_model_len, layout, batched, pp)
        stages = [get_pp_indices(spec.num_layers, rank, pp) for rank in range(pp)]
        per_worker = [
            {n: s for n, s in layers.items() if first <= int(n.split(".")[1]) < end}
            for first, end in stages
        ]
        workers = self.utils.get_kv_cache_configs(config, per_worker, [kv_bytes] * pp)
        per_block = max(
            self.utils._pool_bytes_per_block(config, w.kv_cache_groups) for w in workers
        )
        scheduler = self.utils.generate_scheduler_kv_cache_config(workers)
        tokens, concurrency = self.utils.get_kv_cache_capacity(config, scheduler)
        return scheduler.num_blocks, per_block, tokens, concurrency


@pytest.fixture(scope="module")
def vllm_kv() -> VllmOracle:
    pytest.importorskip("vllm")
    return VllmOracle()


ORACLE_CASES = [
    (SMOLLM2, KvDtype.AUTO, WeightDtype.FP32, 1, 1),
    (SMOLLM2, KvDtype.FP8, WeightDtype.BF16, 1, 1),
    (LLAMA_70B, KvDtype.AUTO, WeightDtype.BF16, 4, 1),
    (LLAMA_70B, KvDtype.AUTO, WeightDtype.BF16, 16, 1),
    (LLAMA_70B, KvDtype.AUTO, WeightDtype.BF16, 8, 3),
    (MISTRAL_LIKE, KvDtype.AUTO, WeightDtype.BF16, 2, 1),
    (DEEPSEEK_V3, KvDtype.AUTO, WeightDtype.BF16, 8, 1),
    (DEEPSEEK_V3, KvDtype.FP8, WeightDtype.BF16, 8, 2),
    (DEEPSEEK_V32, KvDtype.FP8, WeightDtype.BF16, 1, 1),
    (DEEPSEEK_V32, KvDtype.AUTO, WeightDtype.BF16, 8, 4),
    (DEEPSEEK_V4_FLASH, KvDtype.AUTO, WeightDtype.BF16, 1, 1),
    (DEEPSEEK_V4_FLASH, KvDtype.BF16, WeightDtype.BF16, 4, 1),
    (DEEPSEEK_V4_FLASH, KvDtype.FP8, WeightDtype.BF16, 8, 2),
    (DEEPSEEK_V4_FLASH, KvDtype.AUTO, WeightDtype.BF16, 8, 3),
]


def _check_against_vllm(
    oracle: VllmOracle, spec: ModelSpec, kv: KvDtype, compute: WeightDtype, tp: int, pp: int = 1
) -> None:
    for batched in (8192, 2048):
        ours = kv_cache_shape(
            spec, kv_dtype=kv, compute_dtype=compute, tp=tp, pp=pp, max_num_batched_tokens=batched
        )
        layers = oracle.layer_specs(spec, kv, compute, tp, ours.block_size_tokens)
        if pp == 1:
            # Bytes per token x block size = the pages of every layer that keeps every
            # token (of every layer, when all of them slide).
            pages = [s.page_size_bytes for s in layers.values() if oracle.keeps_every_token(s)]
            growing = sum(pages or [s.page_size_bytes for s in layers.values()])
            assert ours.bytes_per_token * ours.block_size_tokens == growing
        for kv_bytes in (2 * GIB, 37 * GIB + 12_345):
            for max_model_len in (100, 2001, 32_768, 1 << 20):
                if not ours.fits(kv_bytes, max_model_len):
                    with pytest.raises(ValueError, match="max seq len"):
                        oracle.capacity(spec, layers, kv_bytes, max_model_len, batched, pp)
                    continue
                got = oracle.capacity(spec, layers, kv_bytes, max_model_len, batched, pp)
                assert (ours.num_blocks(kv_bytes), ours.bytes_per_block) == got[:2]
                assert ours.capacity_tokens(kv_bytes, max_model_len) == got[2]
                assert ours.max_concurrency(kv_bytes, max_model_len) == got[3]


@pytest.mark.parametrize(
    ("spec", "kv", "compute", "tp", "pp"),
    ORACLE_CASES,
    ids=[f"{c[0].name}-{c[1].value}-tp{c[3]}-pp{c[4]}" for c in ORACLE_CASES],
)
def test_matches_vllm(
    vllm_kv: VllmOracle, spec: ModelSpec, kv: KvDtype, compute: WeightDtype, tp: int, pp: int
) -> None:
    _check_against_vllm(vllm_kv, spec, kv, compute, tp, pp)


@pytest.mark.parametrize("name", sorted(PRESET_BYTES))
def test_presets_match_vllm(vllm_kv: VllmOracle, name: str) -> None:
    _check_against_vllm(vllm_kv, preset(name), PRESET_BYTES[name][0], WeightDtype.BF16, 1)
