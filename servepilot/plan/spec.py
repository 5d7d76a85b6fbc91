"""What the planner knows about a model: the shape numbers memory and speed depend on.

A `ModelSpec` is read from a Hugging Face config.json (a local folder or file) or from a
shipped preset (servepilot/plan/presets/*.json, each with its source). Everything downstream
(KV bytes per token, weight bytes per rank, FLOPs per token) is computed from these fields.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servepilot.plan.dtypes import WeightDtype


class AttentionKind(enum.StrEnum):
    """How a layer's KV cache is shaped (vLLM's KV cache spec classes)."""

    GQA = "gqa"
    """K and V per KV head (MHA and GQA): FullAttentionSpec."""
    MLA = "mla"
    """One compressed latent per token (DeepSeek V2/V3): MLAAttentionSpec."""
    MLA_SPARSE = "mla_sparse"
    """MLA plus a lightning-indexer cache (DeepSeek-V3.2's DSA)."""
    MLA_HYBRID = "mla_hybrid"
    """DeepSeek-V4: sliding-window MLA with compressed (C4/C128) layers and an indexer."""


@dataclass(frozen=True, slots=True)
class MlaShape:
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None


@dataclass(frozen=True, slots=True)
class IndexerShape:
    """DeepSeek sparse attention's lightning indexer."""

    index_n_heads: int
    index_head_dim: int
    index_topk: int


@dataclass(frozen=True, slots=True)
class MoeShape:
    routed_experts: int
    shared_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    dense_layers: int
    """Leading layers with a dense MLP instead of experts (first_k_dense_replace)."""
    hash_routed_layers: int = 0
    """Leading MoE layers routed by a token-id table instead of a learned gate (DeepSeek-V4's
    num_hash_layers): their router is a vocab x experts_per_token lookup table."""


@dataclass(frozen=True, slots=True)
class HybridAttentionShape:
    """DeepSeek-V4's attention extras: the grouped low-rank output projection and the
    hyper-connection streams (mHC) that widen the residual."""

    o_lora_rank: int
    o_groups: int
    hc_mult: int


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters by where they live under parallelism (counts, not bytes)."""

    embedding: int
    lm_head: int
    attention: int
    dense_mlp: int
    routed_experts: int
    shared_experts: int
    other: int
    """Norms and routers (and DeepSeek-V4's hyper-connection mixing weights)."""
    mtp: int = 0
    """Multi-token-prediction modules stored in the checkpoint (DeepSeek's layer 61). vLLM
    loads them only for speculative decoding, so serving memory leaves them out."""

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.dense_mlp
            + self.routed_experts
            + self.shared_experts
            + self.other
            + self.mtp
        )


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    architecture: str
    """The Hugging Face `architectures[0]`, e.g. DeepseekV3ForCausalLM."""
    source: str
    """Where the numbers come from (a URL for presets, a path for local configs)."""
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention: AttentionKind
    checkpoint_dtype: WeightDtype
    """The format the published weights are in (fp8 for DeepSeek-V3)."""
    expert_dtype: WeightDtype | None = None
    """When experts are stored in another format than the rest (DeepSeek-V4: fp4)."""
    mla: MlaShape | None = None
    indexer: IndexerShape | None = None
    moe: MoeShape | None = None
    sliding_window: int | None = None
    layer_compress_ratios: tuple[int, ...] = ()
    """DeepSeek-V4: per layer, how many tokens one cached entry compresses (1 = none)."""
    repo_id: str | None = None
    """The Hugging Face repository the weights are published in (presets), for commands."""
    quantized_checkpoints: tuple[tuple[WeightDtype, str], ...] = ()
    """Published checkpoints of the same model in other weight formats (presets): (format,
    Hugging Face repository), for commands that serve the model quantized."""
    mtp_layers: int = 0
    """Multi-token-prediction modules stored with the checkpoint (not counted in `num_layers`)."""
    hybrid: HybridAttentionShape | None = None
    """DeepSeek-V4 only (attention is MLA_HYBRID)."""
    qk_norm: bool = False
    """Per-head RMSNorm on q and k (Qwen3)."""
    attention_bias: bool = False
    """Bias on the q/k/v projections (Qwen2 always; others when config.json says so)."""
    params: ParamCounts | None = None
    """Counted from the shape; None only while a spec is being built."""
    stated_params_total: int | None = None
    """The total the model card states, to check the count against. Like DeepSeek's cards,
    it leaves out the MTP module(s): compare it with `params.total - params.mtp`."""
    stated_params_include_mtp: bool = False
    """The stated total counts the MTP module(s) too (DeepSeek-V3.2's card: 685B)."""
    hf_config: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """The raw config.json, for model-specific formulas."""

    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def params_total(self) -> int:
        if self.params is None:
            raise ValueError(f"{self.name}: parameters were not counted")
        return self.params.total
