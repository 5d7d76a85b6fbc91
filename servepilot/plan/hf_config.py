"""Read a Hugging Face config.json into a `ModelSpec`.

Three families, told apart by `architectures[0]`:
- GQA decoders (Llama, Mistral, Qwen2, Qwen3): K and V per KV head.
- DeepSeek V2/V3/V3.2: MLA (one compressed latent per token) and DeepSeekMoE; V3.2 adds the
  lightning indexer of its sparse attention.
- DeepSeek-V4: sliding-window attention over one shared K=V head, compressed (C4/C128) layers
  with an indexer on the C4 ones, hyper-connections; read the way vLLM's deepseek_v4 model
  reads it (vllm/models/deepseek_v4/attention.py, compressor.py).

Like vLLM (`ModelConfig.get_head_size`, `get_num_kv_heads`), an MLA model gets one KV head of
`kv_lora_rank + qk_rope_head_dim` elements: the latent each token caches per layer. A
calculator that forgets MLA is then off by 2x (K and V), not by the 71x of 128 full heads.

Every problem with the file is a `ConfigError` naming the model, where it came from, and the
field, never a KeyError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servepilot.core.errors import ConfigError
from servepilot.plan.dtypes import WeightDtype, parse_weight_dtype
from servepilot.plan.params import count_params
from servepilot.plan.spec import (
    AttentionKind,
    HybridAttentionShape,
    IndexerShape,
    MlaShape,
    ModelSpec,
    MoeShape,
)

GQA_ARCHITECTURES = frozenset(
    {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}
)
MLA_ARCHITECTURES = frozenset(
    {"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM"}
)
V4_ARCHITECTURE = "DeepseekV4ForCausalLM"
SUPPORTED_ARCHITECTURES = (*sorted(GQA_ARCHITECTURES | MLA_ARCHITECTURES), V4_ARCHITECTURE)

# quantization_config.quant_method values whose weight format is known without more fields.
_QUANT_METHODS = {
    "fp8": WeightDtype.FP8,
    "awq": WeightDtype.AWQ,
    "gptq": WeightDtype.GPTQ,
    "mxfp4": WeightDtype.FP4,
}
# NVIDIA ModelOpt checkpoints name the format in quant_algo instead.
_MODELOPT_ALGOS = {"FP8": WeightDtype.FP8, "NVFP4": WeightDtype.FP4}
# llm-compressor's (compressed-tensors) name it per group of layers: the weights' bits and
# number type. 4-bit integers are its W4A16 (GPTQ/AWQ-style groups of 128).
_COMPRESSED_TENSORS = {
    (8, "int"): WeightDtype.INT8,
    (8, "float"): WeightDtype.FP8,
    (4, "int"): WeightDtype.GPTQ,
    (4, "float"): WeightDtype.FP4,
}
_DTYPE_HINT = "pass the weight format explicitly (--weights-dtype bf16|fp8|int8|awq|gptq|fp4)"


class _Fields:
    """Typed access to one config.json; every failure names the model and the field."""

    def __init__(self, config: Mapping[str, Any], *, name: str, source: str) -> None:
        self.config = config
        self.where = source if name == source else f"{name} ({source})"

    def error(self, problem: str, hint: str) -> ConfigError:
        return ConfigError(f"{self.where}: {problem}", hint=hint)

    def missing(self, key: str) -> ConfigError:
        return self.error(
            f"config.json has no `{key}`",
            f"add {key} to the config.json (copy it from the model's original config)",
        )

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def integer(self, key: str, *, default: int | None = None, minimum: int = 1) -> int:
        """A required integer (or `default` when absent or null), at least `minimum`."""
        value = self.config.get(key)
        if value is None:
            if default is not None:
                return default
            raise self.missing(key)
        # bool is an int subclass; `true` is never a size.
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(
                f"`{key}` must be an integer >= {minimum}, not {value!r}",
                f"fix {key} in the config.json",
            )
        return value

    def optional_int(self, key: str) -> int | None:
        return self.integer(key) if self.has(key) else None

    def flag(self, key: str, *, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"`{key}` must be true or false, not {value!r}", f"fix {key}")
        return value

    def int_list(self, key: str, *, length: int) -> tuple[int, ...]:
        """The first `length` entries of a list of non-negative integers."""
        value = self.config.get(key)
        if value is None:
            raise self.missing(key)
        if not isinstance(value, list) or len(value) < length:
            raise self.error(
                f"`{key}` must be a list of at least {length} integers (one per layer)",
                f"fix {key} in the config.json (copy it from the model's original config)",
            )
        items = value[:length]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in items):
            raise self.error(f"`{key}` must hold non-negative integers", f"fix {key}")
        return tuple(items)


def spec_from_hf_config(
    config: Mapping[str, Any],
    *,
    name: str,
    source: str,
    checkpoint_dtype: str | WeightDtype | None = None,
    expert_dtype: str | WeightDtype | None = None,
    stated_params_total: int | None = None,
    stated_params_include_mtp: bool = False,
) -> ModelSpec:
    """The spec of the model `config` (a parsed config.json) describes, parameters counted.

    `checkpoint_dtype` / `expert_dtype` override what the file says (presets state them);
    `stated_params_total` is the model card's headline count, kept to check against
    (`stated_params_include_mtp`: whether that count includes the MTP module)."""
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"{source}: config.json must hold a JSON object, not {type(config).__name__}",
            hint="pass the config.json of a Hugging Face decoder-only transformer",
        )
    fields = _Fields(config, name=name, source=source)
    architecture = _architecture(fields)
    if architecture in GQA_ARCHITECTURES:
        spec = _gqa_spec(fields, name, source, architecture)
    elif architecture in MLA_ARCHITECTURES:
        spec = _mla_spec(fields, name, source, architecture)
    else:
        spec = _v4_spec(fields, name, source)
    weights, experts = _dtypes(fields, checkpoint_dtype, expert_dtype)
    spec = replace(
        spec,
        checkpoint_dtype=weights,
        expert_dtype=experts if spec.moe is not None else None,
        stated_params_total=stated_params_total,
        stated_params_include_mtp=stated_params_include_mtp,
        hf_config=dict(config),
    )
    return replace(spec, params=count_params(spec))


def _architecture(fields: _Fields) -> str:
    architectures = fields.config.get("architectures")
    if not isinstance(architectures, list) or not architectures:
        raise fields.error(
            "config.json has no `architectures` list",
            "pass the config.json of a decoder-only transformer; it names its class in "
            '`architectures`, e.g. ["LlamaForCausalLM"]',
        )
    architecture = str(architectures[0])
    if architecture not in SUPPORTED_ARCHITECTURES:
        known = ", ".join(SUPPORTED_ARCHITECTURES)
        raise fields.error(
            f"architecture {architecture} is not one servepilot can plan",
            f"pass a config.json of a decoder-only transformer servepilot knows ({known}), "
            "or use a preset (servepilot plan --model deepseek-v3, ...)",
        )
    return architecture


def _common(fields: _Fields, name: str, source: str, architecture: str) -> dict[str, Any]:
    """The fields every family has, under their usual config.json names."""
    return {
        "name": name,
        "architecture": architecture,
        "source": source,
        "num_layers": fields.integer("num_hidden_layers"),
        "hidden_size": fields.integer("hidden_size"),
        "num_attention_heads": fields.integer("num_attention_heads"),
        "vocab_size": fields.integer("vocab_size"),
        "max_position_embeddings": fields.integer("max_position_embeddings"),
        # Every supported family's config class defaults to untied (Llama, Qwen, DeepSeek).
        "tie_word_embeddings": fields.flag("tie_word_embeddings", default=False),
        # Replaced by _dtypes once the family is known; a placeholder keeps the spec whole.
        "checkpoint_dtype": WeightDtype.BF16,
    }


def _gqa_spec(fields: _Fields, name: str, source: str, architecture: str) -> ModelSpec:
    common = _common(fields, name, source, architecture)
    heads = common["num_attention_heads"]
    kv_heads = fields.integer("num_key_value_heads", default=heads)
    if heads % kv_heads:
        raise fields.error(
            f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})",
            "fix num_key_value_heads: each KV head serves a whole group of query heads",
        )
    hidden = common["hidden_size"]
    if not fields.has("head_dim") and hidden % heads:
        raise fields.error(
            f"config.json has no `head_dim` and hidden_size ({hidden}) is not a multiple of "
            f"num_attention_heads ({heads})",
            "add head_dim to the config.json",
        )
    # Qwen2/Qwen3 ship a sliding_window they only use with use_sliding_window=true; Mistral's
    # applies whenever it is set.
    uses_window = architecture == "MistralForCausalLM" or fields.flag(
        "use_sliding_window", default=False
    )
    return ModelSpec(
        **common,
        num_kv_heads=kv_heads,
        head_dim=fields.integer("head_dim", default=hidden // heads),
        intermediate_size=fields.integer("intermediate_size"),
        attention=AttentionKind.GQA,
        sliding_window=fields.optional_int("sliding_window") if uses_window else None,
        qk_norm=architecture == "Qwen3ForCausalLM",
        attention_bias=architecture == "Qwen2ForCausalLM"
        or fields.flag("attention_bias", default=False),
    )


def _mla_spec(fields: _Fields, name: str, source: str, architecture: str) -> ModelSpec:
    mla = MlaShape(
        kv_lora_rank=fields.integer("kv_lora_rank"),
        qk_rope_head_dim=fields.integer("qk_rope_head_dim"),
        qk_nope_head_dim=fields.integer("qk_nope_head_dim"),
        v_head_dim=fields.integer("v_head_dim"),
        # DeepSeek-V2-Lite projects q straight from the hidden state (q_lora_rank null).
        q_lora_rank=fields.optional_int("q_lora_rank"),
    )
    sparse = architecture == "DeepseekV32ForCausalLM"
    return ModelSpec(
        **_common(fields, name, source, architecture),
        num_kv_heads=1,
        head_dim=mla.kv_lora_rank + mla.qk_rope_head_dim,
        intermediate_size=fields.integer("intermediate_size"),
        attention=AttentionKind.MLA_SPARSE if sparse else AttentionKind.MLA,
        mla=mla,
        indexer=_indexer(fields) if sparse else None,
        moe=_deepseek_moe(fields),
        mtp_layers=fields.integer("num_nextn_predict_layers", default=0, minimum=0),
    )


def _indexer(fields: _Fields) -> IndexerShape:
    return IndexerShape(
        index_n_heads=fields.integer("index_n_heads"),
        index_head_dim=fields.integer("index_head_dim"),
        index_topk=fields.integer("index_topk"),
    )


def _deepseek_moe(fields: _Fields) -> MoeShape | None:
    """DeepSeekMoE: routed + shared experts in every layer after `first_k_dense_replace`."""
    if not fields.has("n_routed_experts"):
        return None
    # vLLM puts experts in layer i when i >= first_k_dense_replace and i % moe_layer_freq == 0;
    # every DeepSeek release has freq 1, and the counts here assume it.
    if fields.integer("moe_layer_freq", default=1) != 1:
        raise fields.error(
            "moe_layer_freq other than 1 is not supported (every layer after "
            "first_k_dense_replace is counted as an MoE layer)",
            "use a DeepSeek V2/V3 config.json, which has moe_layer_freq 1",
        )
    return MoeShape(
        routed_experts=fields.integer("n_routed_experts"),
        shared_experts=fields.integer("n_shared_experts", default=0, minimum=0),
        experts_per_token=fields.integer("num_experts_per_tok"),
        expert_intermediate_size=fields.integer("moe_intermediate_size"),
        dense_layers=fields.integer("first_k_dense_replace", default=0, minimum=0),
        hash_routed_layers=fields.integer("num_hash_layers", default=0, minimum=0),
    )


def _v4_spec(fields: _Fields, name: str, source: str) -> ModelSpec:
    common = _common(fields, name, source, V4_ARCHITECTURE)
    head_dim = fields.integer("head_dim")
    rope = fields.integer("qk_rope_head_dim")
    heads = common["num_attention_heads"]
    hybrid = HybridAttentionShape(
        o_lora_rank=fields.integer("o_lora_rank"),
        o_groups=fields.integer("o_groups"),
        hc_mult=fields.integer("hc_mult"),
    )
    if heads % hybrid.o_groups or rope >= head_dim:
        raise fields.error(
            f"o_groups ({hybrid.o_groups}) must divide num_attention_heads ({heads}) and "
            f"qk_rope_head_dim ({rope}) must be smaller than head_dim ({head_dim})",
            "fix o_groups / qk_rope_head_dim in the config.json",
        )
    moe = _deepseek_moe(fields)
    if moe is None:
        raise fields.error(
            "config.json has no `n_routed_experts`", "add n_routed_experts (DeepSeek-V4: 256)"
        )
    # The cached entry is one K=V vector of head_dim: rope part plus the rest, which plays
    # the role of MLA's latent (kv_lora_rank) for KV-size formulas.
    mla = MlaShape(
        kv_lora_rank=head_dim - rope,
        qk_rope_head_dim=rope,
        qk_nope_head_dim=head_dim - rope,
        v_head_dim=head_dim,
        q_lora_rank=fields.integer("q_lora_rank"),
    )
    ratios = fields.int_list("compress_ratios", length=common["num_layers"])
    return ModelSpec(
        **common,
        num_kv_heads=fields.integer("num_key_value_heads", default=1),
        head_dim=head_dim,
        # Every V4 layer is an MoE layer; there is no dense MLP width.
        intermediate_size=fields.integer("intermediate_size", default=0, minimum=0),
        attention=AttentionKind.MLA_HYBRID,
        mla=mla,
        indexer=_indexer(fields),
        moe=moe,
        sliding_window=fields.integer("sliding_window"),
        # config.json writes 0 for a plain sliding-window layer; vLLM treats it as ratio 1.
        layer_compress_ratios=tuple(max(1, r) for r in ratios),
        mtp_layers=fields.integer("num_nextn_predict_layers", default=0, minimum=0),
        hybrid=hybrid,
    )


def _dtypes(
    fields: _Fields,
    checkpoint_dtype: str | WeightDtype | None,
    expert_dtype: str | WeightDtype | None,
) -> tuple[WeightDtype, WeightDtype | None]:
    """The published weights' format, and the experts' when it differs (DeepSeek-V4)."""
    weights = (
        _explicit(checkpoint_dtype, "checkpoint_dtype")
        if checkpoint_dtype is not None
        else _file_dtype(fields)
    )
    if expert_dtype is not None:
        return weights, _explicit(expert_dtype, "expert_dtype")
    quant = fields.config.get("quantization_config")
    # V4 names it at the top level; V4.1 inside quantization_config.
    for holder in (fields.config, quant if isinstance(quant, Mapping) else {}):
        value = holder.get("expert_dtype")
        if value is not None:
            return weights, _explicit(str(value), f"{fields.where}: expert_dtype")
    return weights, None


def _explicit(value: str | WeightDtype, field: str) -> WeightDtype:
    return value if isinstance(value, WeightDtype) else parse_weight_dtype(value, field=field)


def _compressed_tensors(quant: Mapping[str, Any]) -> WeightDtype | None:
    """The weights' format of a compressed-tensors checkpoint when every group agrees."""
    groups = quant.get("config_groups")
    found = set()
    for group in groups.values() if isinstance(groups, Mapping) else ():
        weights = group.get("weights") if isinstance(group, Mapping) else None
        if not isinstance(weights, Mapping) or not isinstance(weights.get("num_bits"), int):
            return None  # per-layer bits (a mapping) are more than one format
        found.add(_COMPRESSED_TENSORS.get((weights["num_bits"], str(weights.get("type")))))
    return found.pop() if len(found) == 1 else None


def _file_dtype(fields: _Fields) -> WeightDtype:
    quant = fields.config.get("quantization_config")
    if isinstance(quant, Mapping):
        method = str(quant.get("quant_method", "")).lower()
        if method in _QUANT_METHODS:
            return _QUANT_METHODS[method]
        algo = str(quant.get("quant_algo", "")).upper()
        if method == "modelopt" and algo in _MODELOPT_ALGOS:
            return _MODELOPT_ALGOS[algo]
        if method == "compressed-tensors" and (found := _compressed_tensors(quant)):
            return found
        raise fields.error(
            f"quantization_config.quant_method {method or None!r} is not a format servepilot "
            "can size",
            _DTYPE_HINT,
        )
    # Newer transformers write `dtype`, older `torch_dtype`. Without either, vLLM serves in
    # bf16 (it also downcasts fp32 checkpoints), so that is the planning default.
    for key in ("torch_dtype", "dtype"):
        value = fields.config.get(key)
        if value is not None:
            return _explicit(str(value), f"{fields.where}: {key}")
    return WeightDtype.BF16
