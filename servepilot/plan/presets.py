"""Models by name: the shipped presets, or a local Hugging Face folder / config.json.

Each preset is servepilot/plan/presets/<name>.json: the model's real config.json fields under
"config", where they were taken from under "source" (and "notes"), the published weight
format, and the parameter total the model card states, which tests check the count against.
The files ship inside the package and are read with importlib.resources.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from servepilot.core.errors import ConfigError
from servepilot.core.texttable import TextTable
from servepilot.plan.checkpoint import parse_placeholder
from servepilot.plan.dtypes import WeightDtype, parse_weight_dtype
from servepilot.plan.hf_config import spec_from_hf_config
from servepilot.plan.spec import ModelSpec

_PRESET_DIR = "presets"
_REQUIRED_KEYS = frozenset({"name", "source", "checkpoint_dtype", "stated_params_total", "config"})
_KNOWN_KEYS = _REQUIRED_KEYS | {
    "aliases",
    "notes",
    "repo_id",
    "expert_dtype",
    "stated_params_include_mtp",
    "quantized_checkpoints",
}


def preset_names() -> list[str]:
    """The presets' names, sorted (aliases left out)."""
    return sorted({name for name, _key in _index().values()})


def load_model(name_or_path: str) -> ModelSpec:
    """A preset by name or alias (any case), else a local model folder holding config.json,
    or a config.json file itself.

    Preset names win over paths, as `smollm2` does for `servepilot up`: reach a folder of
    the same name as `./name`."""
    key = name_or_path.strip()
    if key.lower() in _index():
        return load_preset(key)
    quantized = _quantized_source(key)
    if quantized is not None:
        return quantized
    path = Path(key).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ConfigError(
                f"model folder {path} has no config.json",
                hint="pass a Hugging Face model folder (it holds config.json) or a preset: "
                + ", ".join(preset_names()),
            )
        return _load_file(config_file, name=path.resolve().name)
    if path.is_file():
        name = path.resolve().parent.name if path.name == "config.json" else path.stem
        return _load_file(path, name=name)
    raise ConfigError(
        f"unknown model {name_or_path!r}: not a preset, and no such file or folder",
        hint=f"use a preset ({', '.join(preset_names())}) or the path of a local Hugging Face "
        "model folder (or its config.json)",
    )


def preset_config(name: str) -> tuple[str, dict[str, Any]] | None:
    """(preset name, its Hugging Face config.json values) if `name` names a preset, else None:
    what a config-only model folder is written from."""
    entry = _index().get(name.strip().lower())
    if entry is None:
        return None
    file = _preset_dir() / f"{entry[0]}.json"
    config = _read_json(file, what=f"preset {entry[0]}").get("config")
    if not isinstance(config, dict):
        raise _preset_error(f"preset file {file}", "config must be an object")
    return entry[0], config


def load_preset(name: str) -> ModelSpec:
    """The preset called `name` or one of its aliases (any case).

    An alias that is a Hugging Face repository (deepseek-ai/DeepSeek-R1) becomes the spec's
    `repo_id`, so commands serve the checkpoint that was asked for."""
    entry = _index().get(name.strip().lower())
    if entry is None:
        raise ConfigError(
            f"unknown preset {name!r}", hint=f"use one of {', '.join(preset_names())}"
        )
    preset, key = entry
    file = _preset_dir() / f"{preset}.json"
    document = _read_json(file, what=f"preset {preset}")
    spec = _preset_spec(document, where=f"preset file {file}")
    repo_id = key if "/" in key else _optional_str(document.get("repo_id"))
    published = _optional_str(document.get("repo_id"))
    quantized = _quantized_checkpoints(
        document.get("quantized_checkpoints", {}), str(file), release=repo_id, own=published
    )
    return replace(spec, repo_id=repo_id, quantized_checkpoints=quantized)


def _quantized_source(key: str) -> ModelSpec | None:
    """A preset in another format than its published one, named as `plan` names the
    checkpoint a quantized rung serves: a published checkpoint's repository (the spec then
    serves it) or the placeholder of one to make; None for any other name."""
    found = parse_placeholder(key)
    if found is not None:
        name, weights = found
        if name.lower() not in _index():
            return None
        return replace(
            load_preset(name), checkpoint_dtype=weights, repo_id=None, quantized_checkpoints=()
        )
    for alias in _index():
        spec = load_preset(alias)
        for weights, repo in spec.quantized_checkpoints:
            if repo.lower() == key.lower():
                return replace(
                    spec, checkpoint_dtype=weights, repo_id=repo, quantized_checkpoints=()
                )
    return None


def _quantized_checkpoints(
    value: Any, where: str, *, release: str | None, own: str | None
) -> tuple[tuple[WeightDtype, str], ...]:
    """{"awq": {"repo_id": ..., "source": <the model card's URL>, "of": <release>}, ...} ->
    (format, repo) of the checkpoints made from `release` (a format may list several entries,
    one per release). "of" defaults to the preset's repo_id: a checkpoint of DeepSeek-V3-0324
    is not offered for DeepSeek-V3 or DeepSeek-R1, which are other weights of the same shape."""
    if not isinstance(value, Mapping):
        raise _preset_error(where, "quantized_checkpoints must map a weight format to a checkpoint")
    out = []
    for dtype, entries in value.items():
        weights = parse_weight_dtype(str(dtype), field=f"{where} quantized_checkpoints")
        for entry in entries if isinstance(entries, list) else [entries]:
            if (_checkpoint_of(entry, dtype, where) or own) == release:
                out.append((weights, str(entry["repo_id"])))
    return tuple(out)


def _checkpoint_of(entry: Any, dtype: str, where: str) -> str | None:
    """The release a quantized_checkpoints entry was made from; None: the preset's own."""
    keys = ("repo_id", "source")
    ok = isinstance(entry, Mapping) and set(keys) <= entry.keys()
    if not ok or not all(isinstance(entry[k], str) for k in (*keys, *entry.keys() & {"of"})):
        raise _preset_error(where, f"quantized_checkpoints.{dtype} needs repo_id and source")
    return str(entry["of"]) if "of" in entry else None


def _load_file(config_file: Path, *, name: str) -> ModelSpec:
    config = _read_json(config_file, what=str(config_file))
    return spec_from_hf_config(config, name=name, source=str(config_file.resolve()))


def _read_json(file: Path | Traversable, *, what: str) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read {what}: {exc}", hint="check the file exists and is readable"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{what} is not valid JSON: {exc}",
            hint="the file is corrupt; copy config.json again from the model's original folder",
        ) from exc


def _preset_spec(document: Any, *, where: str) -> ModelSpec:
    """A preset document checked field by field; a bad one is a packaging bug, reported as
    such rather than as a traceback."""
    if not isinstance(document, Mapping):
        raise _preset_error(where, "it must hold a JSON object")
    missing = sorted(_REQUIRED_KEYS - document.keys())
    unknown = sorted(document.keys() - _KNOWN_KEYS)
    if missing or unknown:
        raise _preset_error(where, f"missing keys {missing}, unknown keys {unknown}")
    stated = document["stated_params_total"]
    if isinstance(stated, bool) or not isinstance(stated, int) or stated <= 0:
        raise _preset_error(where, f"stated_params_total must be a positive integer: {stated!r}")
    return spec_from_hf_config(
        document["config"],
        name=str(document["name"]),
        source=" ; ".join(_sources(document["source"], where)),
        checkpoint_dtype=str(document["checkpoint_dtype"]),
        expert_dtype=_optional_str(document.get("expert_dtype")),
        stated_params_total=stated,
        stated_params_include_mtp=bool(document.get("stated_params_include_mtp", False)),
    )


def _sources(value: Any, where: str) -> list[str]:
    sources = [value] if isinstance(value, str) else value
    if not isinstance(sources, list) or not sources or not all(isinstance(s, str) for s in sources):
        raise _preset_error(where, "source must be a URL or a list of URLs")
    return sources


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _preset_error(where: str, problem: str) -> ConfigError:
    return ConfigError(
        f"{where} is broken: {problem}",
        hint="reinstall servepilot; the presets ship inside the package",
    )


def _preset_dir() -> Traversable:
    return resources.files("servepilot.plan").joinpath(_PRESET_DIR)


@functools.cache
def _index() -> Mapping[str, tuple[str, str]]:
    """Lower-cased name and aliases -> (preset name, the name or alias as written)."""
    index: dict[str, tuple[str, str]] = {}
    for file in _preset_dir().iterdir():
        if not file.name.endswith(".json"):
            continue
        document = _read_json(file, what=f"preset file {file.name}")
        name = file.name.removesuffix(".json")
        aliases = document.get("aliases", []) if isinstance(document, Mapping) else []
        for key in (name, *map(str, aliases)):
            other, _ = index.setdefault(key.lower(), (name, key))
            if other != name:
                raise _preset_error(f"preset file {file.name}", f"{key!r} also names {other}")
    return index


def preset_table(embedded: str) -> TextTable:
    """Every preset: its size and architecture, and what servepilot can do with it. Only the
    embedded model ships weights, so only it runs on vLLM; the others are shapes."""
    rows = []
    for name in preset_names():
        spec = load_preset(name)
        uses = "up (vLLM), " if name == embedded else "up --engine sim, "
        size = f"{spec.params_total / 1e9:.3g}B"
        rows.append((name, size, spec.architecture, uses + "plan, sim"))
    columns = ("name", "parameters", "architecture", "runs with")
    return TextTable("models", columns, tuple(rows), right=("parameters",))
