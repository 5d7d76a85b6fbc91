"""Config-only models (model.weights: dummy): the folder, the validation, the command line and
the label, on the CPU without vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from servepilot.cli.main import main
from servepilot.core.config import FleetConfig, ModelConfig, Weights, parse_config
from servepilot.core.errors import ConfigError, ModelSourceError
from servepilot.engine import model_source
from servepilot.engine.args import ServerSpec, serve_argv, server_args, vllm_command
from servepilot.engine.dummy_model import (
    MOE_ROUTING_ENV,
    TOKENIZER_FILES,
    dummy_model_folder,
    routes_experts,
)
from servepilot.fleet.replica_launch import replica_command
from servepilot.fleet.up import UpStarted


def fleet(text: str) -> FleetConfig:
    return parse_config(yaml.safe_load(text), origin="fleet.yaml")


@pytest.fixture
def tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for the converted embedded model (its tokenizer files), and a private cache."""
    monkeypatch.setenv("SERVEPILOT_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "embedded"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).write_text(json.dumps({"file": name}), encoding="utf-8")
    (folder / "model.safetensors").write_bytes(b"weights are never copied")
    monkeypatch.setattr(model_source, "ensure_embedded", lambda progress=None: folder)
    return folder


def test_a_preset_becomes_its_config_plus_the_embedded_tokenizer(tokenizer: Path) -> None:
    resolved = model_source.resolve_model(ModelConfig(source="llama-3.1-8b", weights=Weights.DUMMY))
    assert resolved.dummy and resolved.served_name == "llama-3.1-8b"
    config = json.loads((resolved.path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 128256
    names = sorted(p.name for p in resolved.path.iterdir())
    assert names == ["config.json", "special_tokens_map.json", "tokenizer.json",
                     "tokenizer_config.json"]  # fmt: skip
    assert set(names) - {"config.json"} <= set(TOKENIZER_FILES)
    # A second start reuses the same folder as it is.
    again = model_source.resolve_model(
        ModelConfig(source="Meta-Llama/Llama-3.1-8B", weights="dummy")
    )
    assert again.path == resolved.path


@pytest.mark.parametrize(
    "preset", ["qwen2.5-32b", "deepseek-v2-lite", "deepseek-ai/DeepSeek-V2-Lite-Chat"]
)
def test_the_gpu_presets_materialise(tokenizer: Path, preset: str) -> None:
    resolved = model_source.resolve_model(ModelConfig(source=preset, weights=Weights.DUMMY))
    assert (resolved.path / "config.json").is_file() and (
        resolved.path / "tokenizer.json"
    ).is_file()


def test_a_config_only_folder_borrows_the_tokenizer(tokenizer: Path, tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 60000}))
    resolved = model_source.resolve_model(ModelConfig(source=str(folder), weights=Weights.DUMMY))
    assert resolved.served_name == "my-model" and resolved.path != folder
    assert (resolved.path / "tokenizer.json").is_file()
    # With its own tokenizer the folder is served as it is.
    (folder / "tokenizer.json").write_text("{}")
    assert dummy_model_folder(str(folder), lambda: tokenizer) == folder.resolve()


def test_a_vocabulary_smaller_than_the_tokenizers_is_refused(
    tokenizer: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 1000}))
    with pytest.raises(ModelSourceError, match="vocab_size 1000 is smaller"):
        dummy_model_folder(str(folder), lambda: tokenizer)


def test_real_weights_from_a_preset_are_refused_with_the_way_out(tokenizer: Path) -> None:
    with pytest.raises(ModelSourceError, match="is a preset") as err:
        model_source.resolve_model(ModelConfig(source="qwen2.5-32b"))
    assert "model.weights: dummy" in str(err.value)


def test_a_weightless_folder_with_real_weights_says_how_to_serve_it(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelSourceError, match="holds no weights") as err:
        model_source.resolve_model(ModelConfig(source=str(tmp_path)))
    assert "model.weights: dummy" in str(err.value)


def test_fleet_yaml_takes_weights_dummy_and_refuses_anything_else() -> None:
    config = fleet("model:\n  source: llama-3.1-8b\n  weights: dummy\n")
    assert config.model.weights is Weights.DUMMY
    assert FleetConfig().model.weights is Weights.REAL
    with pytest.raises(ConfigError, match=r"model\.weights"):
        fleet("model:\n  weights: random\n")


def test_the_command_line_loads_dummy_weights() -> None:
    config = fleet("model:\n  source: llama-3.1-8b\n  weights: dummy\nhardware:\n  device: gpu\n")
    argv = serve_argv(config, "/m", "llama-3.1-8b")
    assert argv[argv.index("--load-format") + 1] == "dummy"
    real = serve_argv(fleet("hardware:\n  device: gpu\n"), "/m", "x")
    assert "--load-format" not in real
    spec = ServerSpec("/m", "x", "127.0.0.1", 8000, dummy_weights=True)
    assert "--load-format" in server_args(config.engine, spec, config.hardware.device)


def test_moe_models_are_known_by_their_routed_experts(tmp_path: Path) -> None:
    assert routes_experts("deepseek-v2-lite") and routes_experts("deepseek-v3")
    assert not routes_experts("llama-3.1-8b") and not routes_experts("qwen2.5-32b")
    for key, moe in (("num_local_experts", True), ("num_experts", True), ("hidden_size", False)):
        folder = tmp_path / key
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "x", key: 8}))
        assert routes_experts(str(folder)) is moe
    assert not routes_experts(str(tmp_path / "nowhere"))


def test_a_moe_model_with_dummy_weights_routes_uniformly_at_random_wherever_it_runs(
    tokenizer: Path, tmp_path: Path
) -> None:
    moe = fleet("model:\n  source: deepseek-v2-lite\n  weights: dummy\nhardware:\n  device: gpu\n")
    model = model_source.resolve_model(moe.model)
    local = replica_command(moe, model, "127.0.0.1", 8000, ())
    assert local.env[MOE_ROUTING_ENV] == "uniform_random"
    assert f"{MOE_ROUTING_ENV}=uniform_random vllm serve" in vllm_command(moe, "/m", "x")
    source = tmp_path / "fleet.yaml"
    source.write_text(
        "model:\n  source: deepseek-v2-lite\n  weights: dummy\n"
        "hardware:\n  device: gpu\n  accelerator: h100-80\n"
        "kubernetes:\n  model_path: /models/dsv2\n"
    )
    assert main(["k8s", "render", "-c", str(source), "--out", str(tmp_path / "k8s")]) == 0
    objects = yaml.safe_load_all((tmp_path / "k8s" / "vllm.yaml").read_text())
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": MOE_ROUTING_ENV, "value": "uniform_random"} in pod["env"]
    # A dense model, real weights, and a fleet.yaml that says otherwise: nothing added.
    dense = fleet("model:\n  source: llama-3.1-8b\n  weights: dummy\nhardware:\n  device: gpu\n")
    assert (
        MOE_ROUTING_ENV
        not in replica_command(
            dense, model_source.resolve_model(dense.model), "127.0.0.1", 8000, ()
        ).env
    )
    assert MOE_ROUTING_ENV not in vllm_command(fleet("hardware:\n  device: gpu\n"), "/m", "x")
    mine = fleet(
        "model:\n  source: deepseek-v2-lite\n  weights: dummy\nhardware:\n  device: gpu\n"
        f"engine:\n  env: {{{MOE_ROUTING_ENV}: normal_routing}}\n"
    )
    assert replica_command(mine, model, "127.0.0.1", 8000, ()).env[MOE_ROUTING_ENV] == (
        "normal_routing"
    )


def test_up_labels_dummy_weights_in_its_endpoint_text() -> None:
    dummy = UpStarted("http://127.0.0.1:8080", "llama-3.1-8b", (), dummy_weights=True)
    assert "DUMMY weights" in dummy.endpoint_text
    assert "DUMMY" not in UpStarted("http://127.0.0.1:8080", "smollm2", ()).endpoint_text


def test_the_lent_tokenizer_is_padded_to_the_models_vocabulary(tmp_path: Path) -> None:
    """Ids past the embedded tokenizer's 49,152 decode to visible placeholders (a random
    model samples them: before, they streamed as no text), and text tokenises as before."""
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    from servepilot.engine.dummy_model import EMBEDDED_VOCAB, padded_tokenizer
    from servepilot.engine.model_source import embedded_model_dir

    source = embedded_model_dir() / "tokenizer.json"
    if not source.exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    padded = tmp_path / "tokenizer.json"
    padded.write_bytes(padded_tokenizer(source.read_bytes(), 60_000))
    lent, before = Tokenizer.from_file(str(padded)), Tokenizer.from_file(str(source))
    assert lent.get_vocab_size() == 60_000 and before.get_vocab_size() == EMBEDDED_VOCAB
    text = "Hello <50000> world, ünïcödé and digits 12345 <|im_start|>"
    assert lent.encode(text).ids == before.encode(text).ids
    assert lent.decode([EMBEDDED_VOCAB, 1000, 59_999]) == f" <{EMBEDDED_VOCAB}>() <59999>"
    stream = DecodeStream(skip_special_tokens=True)
    assert [stream.step(lent, i) for i in (55_000, 1000)] == [" <55000>", "()"]
    # Before, an id past the vocabulary streamed as nothing.
    assert DecodeStream(skip_special_tokens=True).step(before, 55_000) is None
    # Large enough already, or no BPE vocabulary: left as it is.
    assert padded_tokenizer(source.read_bytes(), EMBEDDED_VOCAB) == source.read_bytes()
    assert padded_tokenizer(b'{"model": {"type": "Unigram"}}', 60_000) == (
        b'{"model": {"type": "Unigram"}}'
    )


def test_a_dummy_folder_lends_a_padded_tokenizer_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from servepilot.engine.model_source import embedded_model_dir

    embedded = embedded_model_dir()
    if not (embedded / "tokenizer.json").exists():
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    monkeypatch.setenv("SERVEPILOT_CACHE", str(tmp_path / "cache"))
    folder = dummy_model_folder("llama-3.1-8b", lambda: embedded)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) == 128_256 and vocab["Ġ<128255>"] == 128_255
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    # The next replica's start finds it as it should be and leaves it.
    assert dummy_model_folder("llama-3.1-8b", lambda: embedded) == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp
