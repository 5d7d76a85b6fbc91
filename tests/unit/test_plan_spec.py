"""Model specs: presets, their shapes and parameter counts against published figures (local
files and bad input: test_plan_spec_input.py)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.params import comparable_to_stated
from servepilot.plan.presets import load_model, preset_names
from servepilot.plan.spec import AttentionKind, IndexerShape, MlaShape, ModelSpec, MoeShape
from tests.unit.plan_spec_support import STATED, compressed_tensors, preset_config, spec_from

# --- presets -------------------------------------------------------------------------------


def test_the_presets_are_the_ones_planned() -> None:
    assert preset_names() == sorted(STATED)


@pytest.mark.parametrize("name", sorted(STATED))
def test_preset_parses_with_its_stated_total(name: str) -> None:
    spec = load_model(name)
    assert spec.name == name
    assert spec.params is not None
    assert spec.source.startswith("https://")
    assert spec.stated_params_total == STATED[name]


@pytest.mark.parametrize("name", sorted(STATED))
def test_counted_parameters_within_one_percent_of_the_stated_total(name: str) -> None:
    spec = load_model(name)
    counted = comparable_to_stated(spec)
    assert counted == pytest.approx(STATED[name], rel=0.01)


def test_preset_files_ship_as_package_resources() -> None:
    folder = resources.files("servepilot.plan").joinpath("presets")
    files = sorted(f.name for f in folder.iterdir() if f.name.endswith(".json"))
    assert sorted(file.removesuffix(".json") for file in files) == sorted(STATED)
    for file in files:
        document = json.loads(folder.joinpath(file).read_text(encoding="utf-8"))
        assert document["name"] == file.removesuffix(".json")


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("DeepSeek-R1", "deepseek-v3"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("  DEEPSEEK-V3.2 ", "deepseek-v3.2"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("Qwen/Qwen3-32B", "qwen3-32b"),
        ("SmolLM2-135M-Instruct", "smollm2"),
    ],
)
def test_aliases_any_case(alias: str, name: str) -> None:
    assert load_model(alias).name == name


def test_repo_id_follows_the_alias_asked_for() -> None:
    assert load_model("deepseek-v3").repo_id == "deepseek-ai/DeepSeek-V3"
    assert load_model("deepseek-ai/deepseek-r1").repo_id == "deepseek-ai/DeepSeek-R1"
    assert load_model("llama-3.1-8b").repo_id == "meta-llama/Llama-3.1-8B-Instruct"
    # The embedded model is served from its local folder, never fetched from the Hub.
    assert load_model("smollm2").repo_id is None


def test_smollm2_preset_is_the_embedded_models_config() -> None:
    """The preset must describe what `servepilot up` serves: the converted GGUF's config."""
    converted = Path.home() / ".cache/servepilot/models/smollm2-135m-instruct/config.json"
    if not converted.is_file():
        pytest.skip("the embedded model has not been converted on this machine")
    assert preset_config("smollm2") == json.loads(converted.read_text(encoding="utf-8"))


# --- shapes --------------------------------------------------------------------------------


def test_deepseek_v3_shape() -> None:
    spec = load_model("deepseek-v3")
    assert spec.architecture == "DeepseekV3ForCausalLM"
    assert spec.attention is AttentionKind.MLA
    assert spec.mla == MlaShape(
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        q_lora_rank=1536,
    )
    assert spec.moe == MoeShape(
        routed_experts=256,
        shared_experts=1,
        experts_per_token=8,
        expert_intermediate_size=2048,
        dense_layers=3,
    )
    # vLLM caches one latent of kv_lora_rank + qk_rope_head_dim per token and layer.
    assert (spec.num_kv_heads, spec.head_dim) == (1, 576)
    assert spec.num_layers * spec.head_dim * 2 == 70_272  # planning.md 6.4: bf16 B/token
    assert (spec.num_layers, spec.mtp_layers, spec.vocab_size) == (61, 1, 129_280)
    assert spec.max_position_embeddings == 163_840
    assert spec.checkpoint_dtype is WeightDtype.FP8
    assert spec.expert_dtype is None


def test_deepseek_v3_breakdown_matches_readme_weights() -> None:
    """README_WEIGHTS.md: 0.9B embedding, 0.9B head, MTP module 11.5B unique parameters."""
    params = load_model("deepseek-v3").params
    assert params is not None
    assert params.embedding == params.lm_head == 129_280 * 7168
    assert params.embedding == pytest.approx(0.9e9, rel=0.05)
    assert params.mtp == pytest.approx(11.5e9, rel=0.02)
    assert params.dense_mlp == 3 * 3 * 7168 * 18432


def _fp8_block_scales(spec: ModelSpec) -> int:
    """fp32 `weight_scale_inv` elements of DeepSeek's fp8 checkpoints: one per 128 x 128
    block of every fp8 matrix (embedding, head, router gates, eh_proj, norms and V3.2's
    indexer weights_proj stay 16-bit). The MTP layer is layer 61 and has them too."""
    assert spec.mla is not None and spec.mla.q_lora_rank is not None and spec.moe is not None

    def blocks(rows: int, cols: int) -> int:
        return -(-rows // 128) * -(-cols // 128)

    m, h, heads = spec.mla, spec.hidden_size, spec.num_attention_heads
    q_lora = spec.mla.q_lora_rank
    attention = (
        blocks(q_lora, h)
        + blocks(heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), q_lora)
        + blocks(m.kv_lora_rank + m.qk_rope_head_dim, h)
        + blocks(heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
        + blocks(h, heads * m.v_head_dim)
    )
    if spec.indexer is not None:
        ix = spec.indexer
        attention += blocks(ix.index_head_dim, h)
        attention += blocks(ix.index_n_heads * ix.index_head_dim, q_lora)
    dense = 3 * blocks(spec.intermediate_size, h)
    experts = (spec.moe.routed_experts + spec.moe.shared_experts) * 3 * blocks(2048, h)
    layers = spec.num_layers + spec.mtp_layers
    moe_layers = layers - spec.moe.dense_layers
    return layers * attention + spec.moe.dense_layers * dense + moe_layers * experts


@pytest.mark.parametrize(
    ("name", "checkpoint_elements"),
    [
        # Tensor elements summed over the published safetensors, as listed by public
        # model-inspection reports: deepseek-ai/DeepSeek-R1 (the V3 architecture) and
        # deepseek-ai/DeepSeek-V3.2.
        ("deepseek-v3", 684_531_386_000),
        ("deepseek-v3.2", 685_396_921_376),
    ],
)
def test_deepseek_count_reproduces_the_checkpoint_exactly(
    name: str, checkpoint_elements: int
) -> None:
    """Counted parameters + fp8 block scales + the MTP layer's stored copies of the
    embedding and head (model.layers.61.embed_tokens / shared_head.head) = every element."""
    spec = load_model(name)
    assert spec.params is not None
    copies = spec.params.embedding + spec.params.lm_head
    assert spec.params.total + _fp8_block_scales(spec) + copies == checkpoint_elements


def test_deepseek_v32_adds_the_indexer() -> None:
    spec = load_model("deepseek-v3.2")
    assert spec.attention is AttentionKind.MLA_SPARSE
    assert spec.indexer == IndexerShape(index_n_heads=64, index_head_dim=128, index_topk=2048)
    v3 = load_model("deepseek-v3").params
    assert spec.params is not None and v3 is not None
    # Per layer: wq_b 1536x8192, wk 7168x128, k_norm weight+bias 2x128, weights_proj 7168x64.
    per_layer = 1536 * 8192 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert spec.params.attention - v3.attention == 61 * per_layer


def test_deepseek_v4_flash_shape() -> None:
    spec = load_model("deepseek-v4-flash")
    assert spec.attention is AttentionKind.MLA_HYBRID
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads) == (43, 4096, 64)
    assert (spec.num_kv_heads, spec.head_dim, spec.sliding_window) == (1, 512, 128)
    ratios = spec.layer_compress_ratios
    assert len(ratios) == 43
    assert ratios[:4] == (1, 1, 4, 128)
    assert (ratios.count(1), ratios.count(4), ratios.count(128)) == (2, 21, 20)
    assert spec.indexer == IndexerShape(index_n_heads=64, index_head_dim=128, index_topk=512)
    assert spec.moe is not None
    assert (spec.moe.routed_experts, spec.moe.experts_per_token) == (256, 6)
    assert (spec.moe.dense_layers, spec.moe.hash_routed_layers) == (0, 3)
    assert spec.hybrid is not None and spec.hybrid.hc_mult == 4
    assert spec.checkpoint_dtype is WeightDtype.FP8
    assert spec.expert_dtype is WeightDtype.FP4
    assert spec.max_position_embeddings == 1_048_576
    assert spec.mtp_layers == 1


def test_deepseek_v4_flash_stated_total_leaves_the_mtp_module_out() -> None:
    params = load_model("deepseek-v4-flash").params
    assert params is not None
    assert params.total - params.mtp == pytest.approx(284e9, rel=0.01)
    assert params.total != pytest.approx(284e9, rel=0.02)


def test_llama_8b_exact_count() -> None:
    spec = load_model("llama-3.1-8b")
    assert spec.params is not None and spec.params.total == 8_030_261_248
    assert (spec.num_kv_heads, spec.head_dim, spec.attention) == (8, 128, AttentionKind.GQA)


def test_llama_70b_exact_count() -> None:
    params = load_model("llama-3.1-70b").params
    assert params is not None and params.total == 70_553_706_496


def test_qwen3_32b_non_embedding_count() -> None:
    """The Qwen3-32B card: 32.8B parameters, 31.2B without embeddings."""
    params = load_model("qwen3-32b").params
    assert params is not None
    assert params.total - params.embedding - params.lm_head == pytest.approx(31.2e9, rel=0.01)


def test_smollm2_matches_the_served_model() -> None:
    spec = load_model("smollm2")
    assert spec.params is not None and spec.params.total == 134_515_008
    assert spec.tie_word_embeddings and spec.params.lm_head == 0
    # DESIGN.md: vLLM-CPU caches 30 layers x 3 KV heads x 64 x 2 (K, V) x 2 bytes per token.
    kv_bytes = spec.num_layers * spec.num_kv_heads * spec.head_dim * 2 * 2
    assert kv_bytes == 23_040


def test_deepseek_v2_lite_direct_q_projection() -> None:
    """q_lora_rank null: q projected straight from the hidden state. 15,706,484,224 is the
    element count of deepseek-ai/DeepSeek-V2-Lite's bf16 safetensors."""
    config = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "first_k_dense_replace": 1,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "moe_intermediate_size": 1408,
        "moe_layer_freq": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "topk_method": "greedy",
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": 102400,
    }
    spec = spec_from(config)
    assert spec.mla is not None and spec.mla.q_lora_rank is None
    assert spec.params is not None and spec.params.total == 15_706_484_224
    assert spec.checkpoint_dtype is WeightDtype.BF16


def test_mistral_sliding_window_and_count() -> None:
    """Mistral-7B-v0.1: 7.24B parameters, 4096-token sliding window."""
    config = {
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "max_position_embeddings": 32768,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
        "vocab_size": 32000,
    }
    spec = spec_from(config)
    assert spec.sliding_window == 4096
    assert spec.params is not None
    assert spec.params.total == pytest.approx(7.24e9, rel=0.001)


def test_qwen_sliding_window_only_when_used() -> None:
    config = preset_config("qwen3-32b") | {"sliding_window": 4096}
    assert spec_from(config).sliding_window is None
    assert spec_from(config | {"use_sliding_window": True}).sliding_window == 4096


def test_head_dim_and_kv_heads_default_like_transformers() -> None:
    config = preset_config("llama-3.1-8b")
    del config["num_key_value_heads"]
    spec = spec_from(config)
    assert (spec.num_kv_heads, spec.head_dim) == (32, 4096 // 32)


@pytest.mark.parametrize(
    ("quantization", "dtype"),
    [
        ({"quant_method": "fp8"}, WeightDtype.FP8),
        ({"quant_method": "awq", "bits": 4}, WeightDtype.AWQ),
        ({"quant_method": "gptq", "bits": 4}, WeightDtype.GPTQ),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, WeightDtype.FP4),
        # llm-compressor's W8A8 (RedHatAI's *.w8a8 checkpoints), as vLLM reads it
        (compressed_tensors(8, "int"), WeightDtype.INT8),
        (compressed_tensors(8, "float"), WeightDtype.FP8),
        (compressed_tensors(4, "float"), WeightDtype.FP4),
        (compressed_tensors(4, "int"), WeightDtype.GPTQ),
    ],
)
def test_checkpoint_dtype_from_quantization_config(
    quantization: dict[str, Any], dtype: WeightDtype
) -> None:
    config = preset_config("llama-3.1-8b") | {"quantization_config": quantization}
    assert spec_from(config).checkpoint_dtype is dtype


def test_checkpoint_dtype_from_torch_dtype_or_dtype() -> None:
    config = preset_config("llama-3.1-8b")
    assert spec_from(config | {"torch_dtype": "float16"}).checkpoint_dtype is WeightDtype.FP16
    del config["torch_dtype"]
    assert spec_from(config | {"dtype": "float32"}).checkpoint_dtype is WeightDtype.FP32
    assert spec_from(config).checkpoint_dtype is WeightDtype.BF16
