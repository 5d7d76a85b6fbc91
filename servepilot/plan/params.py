"""Parameter counts from a model's shape, split by where they live under parallelism.

The counts follow the modules vLLM builds (vllm/model_executor/models/llama.py, qwen3.py,
deepseek_v2.py, vllm/models/deepseek_v4/) and the tensors the checkpoints hold; scales of
quantized weights are bytes of the format (WeightDtype.bytes_per_param), not parameters.

Checked against published totals in tests/unit/test_plan_spec.py: Llama-3.1-8B/70B, Qwen3-32B,
SmolLM2-135M, DeepSeek-V3 (671B + 11.5B MTP), DeepSeek-V3.2 and DeepSeek-V4-Flash (284B).
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.plan.spec import AttentionKind, ModelSpec, ParamCounts

# gate, up and down projections of a SiLU-gated MLP.
_GATED_MATRICES = 3


@dataclass(frozen=True, slots=True)
class _Layer:
    """One decoder layer's parameters, by the same buckets as ParamCounts."""

    attention: int
    dense_mlp: int = 0
    routed_experts: int = 0
    shared_experts: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return (
            self.attention + self.dense_mlp + self.routed_experts + self.shared_experts + self.other
        )


def count_params(spec: ModelSpec) -> ParamCounts:
    """Parameters of `spec`, counted from its shape."""
    layers = [_layer(spec, index) for index in range(spec.num_layers)]
    embedding = spec.vocab_size * spec.hidden_size
    return ParamCounts(
        embedding=embedding,
        lm_head=0 if spec.tie_word_embeddings else embedding,
        attention=sum(layer.attention for layer in layers),
        dense_mlp=sum(layer.dense_mlp for layer in layers),
        routed_experts=sum(layer.routed_experts for layer in layers),
        shared_experts=sum(layer.shared_experts for layer in layers),
        other=sum(layer.other for layer in layers) + spec.hidden_size + _hc_head(spec),
        mtp=spec.mtp_layers * _mtp_module(spec),
    )


def comparable_to_stated(spec: ModelSpec) -> int:
    """The counted total on the same footing as `spec.stated_params_total`: without the MTP
    module unless the stated figure includes it."""
    if spec.params is None:
        raise ValueError(f"{spec.name}: parameters were not counted")
    if spec.stated_params_include_mtp:
        return spec.params.total
    return spec.params.total - spec.params.mtp


def _layer(spec: ModelSpec, index: int) -> _Layer:
    """Decoder layer `index` (the MTP module's layer is index num_layers)."""
    h = spec.hidden_size
    attention = _attention(spec, index)
    norms = 2 * h  # input and post-attention RMSNorm
    moe = spec.moe
    if moe is None or index < moe.dense_layers:
        return _Layer(
            attention=attention,
            dense_mlp=_GATED_MATRICES * h * spec.intermediate_size,
            other=norms + _hyper_connections(spec),
        )
    expert = _GATED_MATRICES * h * moe.expert_intermediate_size
    return _Layer(
        attention=attention,
        routed_experts=moe.routed_experts * expert,
        shared_experts=moe.shared_experts * expert,
        other=norms + _router(spec, index) + _hyper_connections(spec),
    )


def _attention(spec: ModelSpec, index: int) -> int:
    if spec.attention is AttentionKind.MLA_HYBRID:
        return _v4_attention(spec, index)
    if spec.mla is not None:
        return _mla_attention(spec)
    return _gqa_attention(spec)


def _gqa_attention(spec: ModelSpec) -> int:
    h, d = spec.hidden_size, spec.head_dim
    q = spec.num_attention_heads * d
    kv = spec.num_kv_heads * d
    count = h * q + 2 * h * kv + q * h  # q, k, v, o
    if spec.attention_bias:
        count += q + 2 * kv
    if spec.qk_norm:
        count += 2 * d
    return count


def _mla_attention(spec: ModelSpec) -> int:
    """q (low-rank or direct), kv_a_proj_with_mqa, kv_b_proj, o_proj, the lora layernorms,
    and V3.2's lightning indexer."""
    assert spec.mla is not None
    m, h, heads = spec.mla, spec.hidden_size, spec.num_attention_heads
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    if m.q_lora_rank is None:
        q = h * heads * qk_head
    else:
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * heads * qk_head
    kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    kv += m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
    o = heads * m.v_head_dim * h
    return q + kv + o + _v32_indexer(spec)


def _v32_indexer(spec: ModelSpec) -> int:
    """wq_b from the q latent, wk and weights_proj from the hidden state, k_norm (a
    LayerNorm: weight and bias)."""
    if spec.indexer is None or spec.mla is None or spec.mla.q_lora_rank is None:
        return 0
    ix, h = spec.indexer, spec.hidden_size
    wq_b = spec.mla.q_lora_rank * ix.index_n_heads * ix.index_head_dim
    return wq_b + h * ix.index_head_dim + 2 * ix.index_head_dim + h * ix.index_n_heads


def _v4_attention(spec: ModelSpec, index: int) -> int:
    """DeepSeek-V4 (vllm/models/deepseek_v4/attention.py): wq_a, q_norm, wq_b, wkv, kv_norm,
    the grouped wo_a, wo_b and per-head attention sinks; a KV compressor on compressed
    layers and an indexer (with its own compressor) on the C4 ones."""
    assert spec.mla is not None and spec.mla.q_lora_rank is not None and spec.hybrid is not None
    h, d, heads = spec.hidden_size, spec.head_dim, spec.num_attention_heads
    q_lora, o = spec.mla.q_lora_rank, spec.hybrid
    count = h * q_lora + q_lora + q_lora * heads * d + h * d + d
    count += heads * d * o.o_lora_rank + o.o_groups * o.o_lora_rank * h + heads
    ratio = _compress_ratio(spec, index)
    if ratio > 1:
        count += _compressor(spec, ratio, d)
    if ratio == 4 and spec.indexer is not None:
        ix = spec.indexer
        count += q_lora * ix.index_n_heads * ix.index_head_dim + h * ix.index_n_heads
        count += _compressor(spec, ratio, ix.index_head_dim)
    return count


def _compress_ratio(spec: ModelSpec, index: int) -> int:
    # The MTP layer sits past the main layers; vLLM builds it uncompressed.
    if index < len(spec.layer_compress_ratios):
        return spec.layer_compress_ratios[index]
    return 1


def _compressor(spec: ModelSpec, ratio: int, head_dim: int) -> int:
    """vllm/models/deepseek_v4/compressor.py: fused wkv+wgate, the positional `ape`, a norm.
    C4 compresses overlapping windows, so its projections are twice as wide."""
    width = (2 if ratio == 4 else 1) * head_dim
    return 2 * spec.hidden_size * width + ratio * width + head_dim


def _router(spec: ModelSpec, index: int) -> int:
    """The gate's weight, plus the score-correction bias (noaux_tc routing) or, in
    DeepSeek-V4's hash-routed layers, the token-id -> experts table."""
    assert spec.moe is not None
    moe = spec.moe
    count = moe.routed_experts * spec.hidden_size
    if index < moe.hash_routed_layers:
        return count + spec.vocab_size * moe.experts_per_token
    if spec.hf_config.get("topk_method") == "noaux_tc":
        count += moe.routed_experts
    return count


def _hyper_connections(spec: ModelSpec) -> int:
    """DeepSeek-V4's mHC mixing weights, before attention and before the MLP: a
    (2 + hc) * hc by hc * hidden matrix, its bias and three scales each."""
    if spec.hybrid is None:
        return 0
    hc = spec.hybrid.hc_mult
    mix = (2 + hc) * hc
    return 2 * (mix * hc * spec.hidden_size + mix + 3)


def _hc_head(spec: ModelSpec) -> int:
    """DeepSeek-V4 folds the hc streams back into one before the final norm."""
    if spec.hybrid is None:
        return 0
    hc = spec.hybrid.hc_mult
    return hc * hc * spec.hidden_size + hc + 1


def _mtp_module(spec: ModelSpec) -> int:
    """One multi-token-prediction module: a decoder layer plus its input norms and
    projections and the norm before the (shared) head. Its embedding and head share the
    main model's (DeepSeek's README_WEIGHTS.md), so they are not counted again."""
    if spec.mtp_layers == 0:
        return 0
    h = spec.hidden_size
    layer = _layer(spec, spec.num_layers).total
    # enorm, hnorm, shared_head.norm; V3 projects [e; h] with one eh_proj, V4 with e_proj and
    # h_proj: the same 2 h x h either way.
    return layer + 3 * h + 2 * h * h + _hc_head(spec)
