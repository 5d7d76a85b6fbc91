"""Each layer's KV cache page, as vLLM 0.32's model files declare it.

GQA layers get a FullAttentionSpec (llama.py); DeepSeek's latent an MLAAttentionSpec and the
V3.2 indexer its own cache (deepseek_v2.py); DeepSeek-V4 a sliding window, compressed rows, an
indexer and compressor states per layer (vllm/models/deepseek_v4/, backends/mla/sparse_swa.py).
`kv.py` groups these pages into vLLM's block pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from servepilot.core.errors import ConfigError
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.spec import ModelSpec

# fp8_ds_mla (FlashMLA sparse, DeepSeek-V3.2): 512 fp8 NoPE + 16 B of scales + 64 bf16 RoPE.
# vLLM hard-codes the row size (mla_attention.py, MLAAttention.get_kv_cache_spec).
FP8_DS_MLA_ROW_BYTES = 656
# DeepSeek-V4's fp8_ds_mla row: 448 B NoPE + 128 B RoPE + 8 B scale (deepseek_v4/attention.py).
V4_FP8_ROW_BYTES = 584
# The lightning indexer caches fp8 keys with one fp32 scale per 128 values (Indexer.__init__).
_INDEXER_QUANT_BLOCK = 128
_INDEXER_SCALE_BYTES = 4
# DeepSeek-V4 constants vLLM fixes, not the config: the SWA cache's own block size
# (DeepseekV4SWACache), the compressed layers' kernel block (DeepseekV4SparseMLABackend and
# DeepseekV4IndexerBackend accept only 256), page alignment (576 B for FlashMLA's fp8_ds_mla
# packing, 512 B for plain rows) and the compressor-state blocks (CompressorStateCache).
V4_BLOCK_SIZE = 256
_V4_SWA_BLOCK = 64
_V4_ALIGN_FP8 = 576
_V4_ALIGN_PLAIN = 512
_V4_STATE_BLOCK = {4: 4, 128: 8}
_FP32_BYTES = 4
_REPLICATED = "replicated on every TP rank"


@dataclass(frozen=True, slots=True)
class CachePage:
    """One layer's cache as vLLM's scheduler sees it (a KVCacheSpec)."""

    role: str
    block_size: int
    page_bytes: int
    """Bytes of one block, alignment padding included."""
    window: int | None = None
    """Sliding window in tokens; None for a cache that keeps every token."""
    layer: int = 0
    """The decoder layer it belongs to, which decides its pipeline stage."""


def gqa_pages(
    spec: ModelSpec, kv_dtype: KvDtype, compute: WeightDtype, tp: int, block_size: int
) -> tuple[list[CachePage], str]:
    _refuse_ds_mla(spec, kv_dtype)
    heads = _kv_heads_per_rank(spec, tp)
    elem = kv_dtype.element_bytes(compute)
    # K and V: head_size + head_size_v elements per KV head (FullAttentionSpec).
    page = block_size * heads * 2 * spec.head_dim * elem
    layer = CachePage("attention", block_size, page, spec.sliding_window)
    formula = f"2 x {spec.num_layers} layers x {heads} kv_heads x {spec.head_dim} x {elem} B"
    if tp > spec.num_kv_heads:
        formula += f" ({spec.num_kv_heads} KV heads replicated over TP {tp})"
    elif tp > 1:
        formula += f" ({spec.num_kv_heads} KV heads / TP {tp})"
    if spec.sliding_window is not None:
        formula += f", sliding window {spec.sliding_window} on every layer"
    return _per_layer([layer], spec.num_layers), formula


def _per_layer(pages: Sequence[CachePage], num_layers: int) -> list[CachePage]:
    return [replace(page, layer=i) for i in range(num_layers) for page in pages]


def _refuse_ds_mla(spec: ModelSpec, kv_dtype: KvDtype) -> None:
    if kv_dtype is KvDtype.FP8_DS_MLA:
        raise ConfigError(
            f"{spec.name}: fp8_ds_mla is only read by the sparse-MLA kernels (DeepSeek-V3.2/V4)",
            hint="use --kv-dtype fp8 for an 8-bit KV cache",
        )


def _kv_heads_per_rank(spec: ModelSpec, tp: int) -> int:
    """llama.py's rule: split KV heads over TP ranks, or replicate them when TP exceeds them."""
    total = spec.num_kv_heads
    if tp <= 0 or (total % tp if total >= tp else tp % total):
        raise ConfigError(
            f"{spec.name}: tensor parallel size {tp} does not divide its {total} KV heads "
            "(nor do they divide it)",
            hint="pick a TP size that divides the KV heads or is a multiple of them",
        )
    return max(1, total // tp)


def _latent(spec: ModelSpec) -> tuple[int, int]:
    if spec.mla is None:
        raise ConfigError(f"{spec.name}: an MLA model needs kv_lora_rank and qk_rope_head_dim")
    return spec.mla.kv_lora_rank, spec.mla.qk_rope_head_dim


def mla_pages(
    spec: ModelSpec, kv_dtype: KvDtype, compute: WeightDtype, block_size: int
) -> tuple[list[CachePage], str]:
    _refuse_ds_mla(spec, kv_dtype)
    rank, rope = _latent(spec)
    elem = kv_dtype.element_bytes(compute)
    # One latent per token, num_kv_heads=1 and no separate V (MLAAttentionSpec).
    page = block_size * (rank + rope) * elem
    formula = f"{spec.num_layers} layers x ({rank} + {rope}) x {elem} B (MLA, {_REPLICATED})"
    return _per_layer([CachePage("latent", block_size, page)], spec.num_layers), formula


def _indexer_row_bytes(spec: ModelSpec) -> int:
    if spec.indexer is None:
        raise ConfigError(f"{spec.name}: a sparse-attention model needs index_head_dim")
    dim = spec.indexer.index_head_dim
    return dim + dim // _INDEXER_QUANT_BLOCK * _INDEXER_SCALE_BYTES


def sparse_pages(
    spec: ModelSpec, kv_dtype: KvDtype, compute: WeightDtype, block_size: int
) -> tuple[list[CachePage], str]:
    rank, rope = _latent(spec)
    index = _indexer_row_bytes(spec)
    if kv_dtype.is_fp8:
        # FlashMLA sparse serves every fp8 flavour as fp8_ds_mla (Hopper's default);
        # FlashInfer sparse on Blackwell keeps plain fp8 rows, (rank + rope) x 1 B.
        row, what = FP8_DS_MLA_ROW_BYTES, f"{FP8_DS_MLA_ROW_BYTES} B fp8_ds_mla"
    else:
        elem = kv_dtype.element_bytes(compute)
        row, what = (rank + rope) * elem, f"({rank} + {rope}) x {elem} B"
    # Both caches have the same block size and keep every token, so vLLM puts all of them
    # in one group (UniformTypeKVCacheSpecs) whose block holds each layer's two pages.
    layer = [CachePage("latent", block_size, block_size * row)]
    layer.append(CachePage("indexer", block_size, block_size * index))
    formula = (
        f"{spec.num_layers} layers x ({what} latent + {index} B indexer) "
        f"(sparse MLA, {_REPLICATED})"
    )
    return _per_layer(layer, spec.num_layers), formula


def v4_pages(spec: ModelSpec, kv_dtype: KvDtype) -> tuple[list[CachePage], str]:
    """DeepSeek-V4's caches, layer by layer, in vLLM's registration order.

    Every layer keeps a sliding window of raw rows. A layer compressing c tokens into one
    row (c > 1) adds the compressed rows, 256 / c per block, and its compressor's fp32
    state; c = 4 layers add the lightning indexer's rows and its compressor state."""
    if spec.indexer is None or spec.sliding_window is None or not spec.layer_compress_ratios:
        raise ConfigError(
            f"{spec.name}: DeepSeek-V4 needs compress_ratios, an indexer and a window"
        )
    if kv_dtype in (KvDtype.FP32, KvDtype.FP8_E5M2):
        raise ConfigError(
            f"{spec.name}: vLLM's DeepSeek-V4 kernels take an fp8 (fp8_ds_mla) or bf16 KV cache",
            hint="use --kv-dtype auto (fp8_ds_mla) or bf16",
        )
    # FlashMLA (the CUDA default) stores fp8_ds_mla and maps `auto` to it; bf16 rows need
    # the FlashInfer DSv4 backend (--attention-backend FLASHINFER_MLA_SPARSE_DSV4).
    ds = kv_dtype is KvDtype.AUTO or kv_dtype.is_fp8
    align = _V4_ALIGN_FP8 if ds else _V4_ALIGN_PLAIN
    row = V4_FP8_ROW_BYTES if ds else spec.head_dim * 2
    index_row = _indexer_row_bytes(spec)
    index_dim = spec.indexer.index_head_dim
    pages: list[CachePage] = []
    for i, ratio in enumerate(spec.layer_compress_ratios):
        layer: list[CachePage] = []
        if ratio == 4:
            layer.append(CachePage("indexer", V4_BLOCK_SIZE, pad(64 * index_row, align)))
            layer.append(_compressor_state(ratio, index_dim, align))
        swa = pad(_V4_SWA_BLOCK * row, align)
        layer.append(CachePage("swa", _V4_SWA_BLOCK, swa, spec.sliding_window))
        if ratio > 1:
            compressed = pad(V4_BLOCK_SIZE // ratio * row, align)
            layer.append(CachePage(f"c{ratio}", V4_BLOCK_SIZE, compressed))
            layer.append(_compressor_state(ratio, spec.head_dim, align))
        pages += [replace(page, layer=i) for page in layer]
    return pages, _v4_formula(spec, pages, "fp8_ds_mla" if ds else "bf16")


def _compressor_state(ratio: int, head_dim: int, align: int) -> CachePage:
    """The compressor's running kv + score state: a window of `coff x ratio` tokens, 4 B
    each for 2 x coff x head_dim values; C4 layers overlap two windows (coff = 2)."""
    if ratio not in _V4_STATE_BLOCK:
        raise ConfigError(f"DeepSeek-V4 compress ratio {ratio} is not 1, 4 or 128")
    coff = 2 if ratio == 4 else 1
    block = _V4_STATE_BLOCK[ratio]
    page = pad(block * 2 * coff * head_dim * _FP32_BYTES, align)
    return CachePage(f"state{ratio}", block, page, coff * ratio)


def _v4_formula(spec: ModelSpec, pages: Sequence[CachePage], dtype: str) -> str:
    ratios, page = spec.layer_compress_ratios, {p.role: p.page_bytes for p in pages}
    growing = sum(p.page_bytes for p in pages if p.window is None)
    return (
        f"{ratios.count(4)} C4 layers x ({page.get('c4', 0):,} + {page.get('indexer', 0):,} B "
        f"indexer) + {ratios.count(128)} C128 layers x {page.get('c128', 0):,} B = "
        f"{growing:,} B per {V4_BLOCK_SIZE} tokens ({dtype}); each request also holds "
        f"{len(ratios)} sliding-window ({spec.sliding_window}) pages and compressor states "
        f"for the tokens in flight (DeepSeek-V4, {_REPLICATED})"
    )


def pad(size: int, alignment: int) -> int:
    return cdiv(size, alignment) * alignment


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
