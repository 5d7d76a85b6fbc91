"""The KV cache of one replica, computed the way vLLM 0.32 does, in plain integers.

1. Each layer declares a page, the bytes of one block of tokens (vllm/v1/kv_cache_interface.py);
   the model file picks the spec: FullAttentionSpec (llama.py), MLAAttentionSpec (DeepSeek's
   latent, the V3.2 indexer in deepseek_v2.py) and DeepSeek-V4's window, compressed, indexer
   and compressor-state caches (vllm/models/deepseek_v4/, backends/mla/sparse_swa.py).
2. Layers are grouped (vllm/v1/core/kv_cache_utils.py, get_kv_cache_groups); all groups draw
   same-sized blocks from one pool: num_blocks = bytes // bytes_per_block.
3. A request of max_model_len needs each group's reserved blocks
   (get_max_concurrency_for_kv_cache_config); the log prints "KV cache size:
   int(concurrency x max_model_len) tokens" (get_kv_cache_capacity).

Pipeline stages are split as vLLM splits them. Not modelled: MTP draft layers, decode context
parallelism, HiSparse, the MXFP4 indexer, --num-gpu-blocks-override, and GQA models mixing
window and full layers (a GQA `sliding_window` applies to every layer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from servepilot.core.config import Device
from servepilot.core.errors import ConfigError
from servepilot.core.vllm_defaults import vllm_defaults
from servepilot.plan.dtypes import KvDtype, WeightDtype
from servepilot.plan.kv_pages import (
    V4_BLOCK_SIZE,
    CachePage,
    cdiv,
    gqa_pages,
    mla_pages,
    sparse_pages,
    v4_pages,
)
from servepilot.plan.spec import AttentionKind, ModelSpec

__all__ = ["CachePage", "KvCacheShape", "KvGroup", "kv_cache_shape", "vllm_default_block_size"]

_CPU_MLA_BLOCK_SIZE = 16
"""The only block size vLLM-CPU's reference MLA decode kernel compiles for."""


def vllm_default_block_size(attention: AttentionKind, *, cpu: bool = False) -> int:
    """The block size vLLM picks when --block-size is not given.

    CUDA: FlashAttention (GQA) and FlashAttention-MLA (Hopper) take vLLM's default (16); the
    V3.2 sparse backends and indexer take multiples of 64; DeepSeek-V4's only 256. CPU: vLLM's
    CPU default (128), but the CPU MLA kernel needs 16 and DeepSeek-V4 256
    (vllm/platforms/cpu.py)."""
    if attention is AttentionKind.MLA_HYBRID:
        return V4_BLOCK_SIZE
    default = vllm_defaults(Device.CPU if cpu else Device.GPU, 0).block_size_tokens
    if cpu:
        return default if attention is AttentionKind.GQA else _CPU_MLA_BLOCK_SIZE
    return 64 if attention is AttentionKind.MLA_SPARSE else default


@dataclass(frozen=True, slots=True)
class KvGroup:
    """Layers sharing one block table (a KVCacheGroupSpec)."""

    block_size: int
    window: int | None
    page_bytes: int
    """All member layers' pages: what one block of this group fills."""
    layers: int
    members: tuple[CachePage, ...] = field(default=(), repr=False)

    def blocks_per_request(self, max_model_len: int, in_flight_tokens: int) -> int:
        """The blocks vLLM reserves for one request (`max_memory_usage_bytes` / page).

        A sliding window holds its last `window - 1` tokens plus every token still in flight,
        and one more block because the window rarely starts on a block boundary
        (SlidingWindowSpec.max_admission_blocks_per_request)."""
        if self.window is None:
            return cdiv(max_model_len, self.block_size)
        held = min(self.window - 1 + in_flight_tokens, max_model_len)
        return cdiv(held, self.block_size) + 1


@dataclass(frozen=True, slots=True)
class KvCacheShape:
    """How one rank's KV memory turns into tokens and concurrent requests."""

    block_size_tokens: int
    bytes_per_token: float
    """Per rank, what a token adds once the sequence is long (the groups that keep every
    token); for a model whose layers all slide, the cost of a token inside the window."""
    formula: str
    bytes_per_block: int
    """One block of the shared pool: the widest group's pages."""
    groups: tuple[KvGroup, ...]
    in_flight_tokens: int
    """Tokens scheduled but not yet settled (vLLM's max_in_flight_tokens): sliding-window
    groups keep their blocks."""

    def num_blocks(self, kv_bytes: int) -> int:
        return max(0, kv_bytes) // self.bytes_per_block

    def blocks_per_request(self, max_model_len: int) -> int:
        return sum(g.blocks_per_request(max_model_len, self.in_flight_tokens) for g in self.groups)

    def max_concurrency(self, kv_bytes: int, max_model_len: int) -> float:
        """vLLM's "Maximum concurrency for L tokens per request: X.XXx"."""
        return self.num_blocks(kv_bytes) / self.blocks_per_request(max_model_len)

    def capacity_tokens(self, kv_bytes: int, max_model_len: int | None = None) -> int:
        """vLLM's "KV cache size: N tokens" for `kv_bytes` of KV memory on one rank.

        vLLM prints `int(max_concurrency x max_model_len)`, which depends on max_model_len
        when it is not a multiple of the block size or when some layers slide; pass it to get
        the printed figure. Without it: the token slots of the groups that keep every token."""
        if max_model_len is not None:
            return int(self.max_concurrency(kv_bytes, max_model_len) * max_model_len)
        growing = sum(1 for g in self.groups if g.window is None) or len(self.groups)
        return self.num_blocks(kv_bytes) * self.block_size_tokens // growing

    def request_bytes(self, tokens: int) -> int:
        """Bytes vLLM reserves for one request of `tokens` tokens: whole blocks, and for
        sliding windows only the window plus the tokens in flight."""
        return self.bytes_per_block * self.blocks_per_request(tokens)

    def fits(self, kv_bytes: int, max_model_len: int) -> bool:
        """vLLM's startup check: one request of max_model_len fits beside the null block."""
        usable = kv_bytes - self.bytes_per_block
        return usable > 0 and self.request_bytes(max_model_len) <= usable


def kv_cache_shape(
    spec: ModelSpec,
    *,
    kv_dtype: KvDtype,
    compute_dtype: WeightDtype,
    tp: int = 1,
    block_size: int | None = None,
    max_num_batched_tokens: int = 8192,
    pp: int = 1,
    concurrent_batches: int | None = None,
) -> KvCacheShape:
    """The KV cache of one rank of `spec` under TP `tp` and PP `pp`.

    `block_size` is vLLM's --block-size; None takes vLLM's CUDA default for the model
    (`vllm_default_block_size`). With PP, every stage gets the same number of blocks, set by
    the stage with the most cache (vLLM takes the minimum over workers), so bytes per block
    and per token are that stage's. `concurrent_batches` is vLLM's max_concurrent_batches,
    by default pp + 1 (async scheduling, model runner V2; the V1 runner on CPU also has 2
    at pp 1); with `max_num_batched_tokens` it bounds what sliding windows hold."""
    size = vllm_default_block_size(spec.attention) if block_size is None else block_size
    _check_block_size(spec, size)
    if spec.attention is AttentionKind.GQA:
        pages, formula = gqa_pages(spec, kv_dtype, compute_dtype, tp, size)
    elif spec.attention is AttentionKind.MLA:
        pages, formula = mla_pages(spec, kv_dtype, compute_dtype, size)
    elif spec.attention is AttentionKind.MLA_SPARSE:
        pages, formula = sparse_pages(spec, kv_dtype, compute_dtype, size)
    else:
        pages, formula = v4_pages(spec, kv_dtype)
    # Only DeepSeek-V4's indexer backend asks for a block-outermost layout, which is what
    # lets vLLM pack groups with different page sizes side by side in one block.
    groups = _group(pages, packed=spec.attention is AttentionKind.MLA_HYBRID)
    bytes_per_block = max(
        sum(p.page_bytes for p in g.members if first <= p.layer < end)
        for g in groups
        for first, end in _pp_stages(spec.num_layers, pp)
    )
    growing = [g for g in groups if g.window is None] or list(groups)
    if pp > 1:
        most = max(end - first for first, end in _pp_stages(spec.num_layers, pp))
        formula += f"; PP {pp}: per rank of the largest stage, {most} layers"
    return KvCacheShape(
        block_size_tokens=growing[0].block_size,
        bytes_per_token=bytes_per_block * len(growing) / growing[0].block_size,
        formula=formula,
        bytes_per_block=bytes_per_block,
        groups=groups,
        in_flight_tokens=(concurrent_batches or pp + 1) * max_num_batched_tokens,
    )


def _pp_stages(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """vLLM's get_pp_indices: the layers left over go one each to the stages before the
    last (vllm/distributed/utils.py)."""
    if not 1 <= pp <= num_layers:
        raise ConfigError(f"pipeline parallel size {pp} does not fit {num_layers} layers")
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [(start, start + size) for start, size in zip(starts, sizes, strict=True)]


def _check_block_size(spec: ModelSpec, block_size: int) -> None:
    # Only DeepSeek-V4's rule holds on every platform; V3.2 wants multiples of 64 on CUDA
    # but 16 on CPU, which this module cannot tell apart.
    if block_size <= 0:
        raise ConfigError(f"--block-size must be positive, got {block_size}")
    if spec.attention is AttentionKind.MLA_HYBRID and block_size != V4_BLOCK_SIZE:
        raise ConfigError(
            f"{spec.name}: vLLM's DeepSeek-V4 kernels take a block size of {V4_BLOCK_SIZE} "
            f"only, not {block_size}",
            hint="leave --block-size unset so vLLM picks it",
        )


def _group(pages: Sequence[CachePage], *, packed: bool) -> tuple[KvGroup, ...]:
    """vLLM's get_kv_cache_groups for the cases these models reach.

    Layers of one type (same block size, same window) form one group, however their pages
    differ (UniformTypeKVCacheSpecs). Otherwise only the packed block-outermost layout is
    reachable here (_get_packed_kv_cache_groups)."""
    buckets = _bucket(pages, lambda p: (p.block_size, p.window))
    if len(buckets) == 1:
        return (_make_group(buckets[0]),)
    if not packed:
        raise AssertionError("mixed cache types need vLLM's hybrid page unification")
    return tuple(_packed_groups(buckets))


def _bucket(
    pages: Iterable[CachePage], key: Callable[[CachePage], object]
) -> list[list[CachePage]]:
    """Pages sorted into lists by `key`, in order of first appearance (vLLM's greedy fill)."""
    found: dict[object, list[CachePage]] = {}
    for page in pages:
        found.setdefault(key(page), []).append(page)
    return list(found.values())


def _make_group(pages: Sequence[CachePage]) -> KvGroup:
    return KvGroup(
        block_size=pages[0].block_size,
        window=pages[0].window,
        page_bytes=sum(p.page_bytes for p in pages),
        layers=len(pages),
        members=tuple(pages),
    )


def _packed_groups(buckets: list[list[CachePage]]) -> list[KvGroup]:
    """Split buckets into groups that pack into one block (_get_packed_kv_cache_groups).

    A bucket whose page sizes occur equally often is a repeating pattern; it is cut into
    groups of `repeats` pattern copies, `repeats` chosen to pad the balanced buckets least
    (_approximate_gcd) but no smaller than the largest mixed pattern, which stays whole."""
    by_size = [_bucket(bucket, lambda p: p.page_bytes) for bucket in buckets]
    balanced = [len({len(v) for v in sizes}) == 1 for sizes in by_size]
    widest = [max(len(v) for v in sizes) for sizes in by_size]
    floor = max(
        (w for w, b, s in zip(widest, balanced, by_size, strict=True) if b and len(s) > 1),
        default=0,
    )
    repeats = (
        _approximate_gcd([w for w, b in zip(widest, balanced, strict=True) if b], floor)
        if floor
        else None
    )
    groups: list[KvGroup] = []
    for bucket, sizes, is_balanced, width in zip(buckets, by_size, balanced, widest, strict=True):
        if repeats is None and bucket[0].window is not None:
            # vLLM splits such state buckets to fit the widest block; DeepSeek-V4 never
            # gets here (its two C4 compressor states form a balanced mixed pattern).
            raise AssertionError("packing unpatterned sliding-window buckets is not modelled")
        count = cdiv(width, repeats) if is_balanced and repeats else 1
        if count == 1:
            groups.append(_make_group(bucket))
            continue
        patterns = list(zip(*sizes, strict=True))
        for i in range(count):
            groups.append(_make_group([p for pattern in patterns[i::count] for p in pattern]))
    return groups


def _approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """The divisor that rounds `values` up least; ties go to the larger (vLLM's rule)."""
    low, high = max(1, lower_bound), max(values)
    if low > high:
        return low
    best, best_pad = low, None
    for d in range(low, high + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best
