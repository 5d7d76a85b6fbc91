"""Config-only models: a folder vLLM can serve with `--load-format dummy` (random weights).

vLLM needs a config.json and a tokenizer, never the weights, to run an architecture at its
real speed and memory. A preset (plan's published configs) or a folder holding only
config.json becomes `cache_dir()/models/dummy/<name>/`: the config plus the embedded
SmolLM2's tokenizer files. Its 49,152 ids are valid in every larger vocabulary, which is every
preset's; a smaller one is refused, as the ids would index past the embedding.

The random weights sample ids from the model's whole vocabulary, and an id past the lent
tokenizer's decodes to nothing: 62% of Llama-3.1-8B's 128,256 ids streamed as no text, so a
client's first token came a random number of tokens late and short answers often had none
(7 of 16 two-token answers in a burst on 2026-12-06). The lent
tokenizer is therefore padded to the model's vocabulary with placeholder tokens (`PLACEHOLDER`):
each decodes to visible text, and none can come out of encoding text (a BPE vocabulary entry
no merge produces), so prompts tokenise exactly as before.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servepilot.core.errors import ModelSourceError
from servepilot.core.paths import cache_dir
from servepilot.plan.presets import preset_config

MOE_ROUTING_ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"
"""vLLM's routing simulator (0.10 and later): `uniform_random` sends each token to top-k
experts drawn uniformly at random, ignoring the router's logits."""
EXPERT_COUNT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
"""Where a Hugging Face config says how many experts a MoE layer routes to (DeepSeek; Qwen-MoE;
Mixtral and others)."""
EMBEDDED_VOCAB = 49_152
PLACEHOLDER = "Ġ<{id}>"
"""A padded id's vocabulary entry: byte-level BPE's form of " <id>" (Ġ is the space)."""
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
    "vocab.json", "merges.txt", "added_tokens.json",
)  # fmt: skip


def dummy_dir(name: str) -> Path:
    return cache_dir() / "models" / "dummy" / name


def dummy_serving_folder(source: str) -> Path:
    """Where `dummy_model_folder` puts (or finds) `source`'s folder, without writing it: what
    plan's printed command serves, the folder `up` writes."""
    preset = preset_config(source)
    if preset is not None and not Path(source).exists():
        return dummy_dir(preset[0])
    folder = Path(source).expanduser()
    folder = folder.parent if folder.name == "config.json" else folder
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file():
        return folder
    return dummy_dir(folder.name)


def routes_experts(source: str) -> bool:
    """Whether `source` (a preset or a folder with config.json) is a mixture of experts; False
    where it names neither, as other checks say what is wrong with it."""
    preset = preset_config(source)
    try:
        if preset is not None and not Path(source).exists():
            config = preset[1]
        else:
            config = _read_config(_config_folder(Path(source).expanduser()) / "config.json")
    except ModelSourceError:
        return False
    return any(isinstance(config.get(k), int) and config[k] > 1 for k in EXPERT_COUNT_KEYS)


def dummy_routing_env(source: str) -> dict[str, str]:
    """What a MoE model served with random weights needs to run at its real speed.

    Random weights make every layer's router send the tokens of a decode batch to the same few
    experts (rank collapse: deep random networks map different inputs to nearly the same
    state), so a step reads a few experts' weights where a trained model, balanced by its
    training, reads most of them. On an H100, DeepSeek-V2-Lite with dummy weights decoded 16
    sequences in 4.5 ms a token, where reading the experts 16 uniformly routed tokens touch
    (51 of 64 in each of 26 layers, 22.8 GB) takes 6.8 ms at the card's peak bandwidth alone
    (docs/benchmarks.md). vLLM's routing simulator draws the experts uniformly at random
    instead, as vLLM's own MoE benchmarks do. Empty for a dense model."""
    return {MOE_ROUTING_ENV: "uniform_random"} if routes_experts(source) else {}


def dummy_model_folder(source: str, tokenizer_from: Callable[[], Path]) -> Path:
    """The folder to serve `source` (a preset or a folder with config.json) with dummy weights.

    A folder that has its own tokenizer is served as it is; otherwise `tokenizer_from()` (the
    embedded model's folder) lends its tokenizer files to a copy in the cache."""
    preset = preset_config(source)
    if preset is not None and not Path(source).exists():
        name, config = preset
    else:
        folder = _config_folder(Path(source).expanduser())
        if (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file():
            return folder
        name, config = folder.name, _read_config(folder / "config.json")
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and vocab < EMBEDDED_VOCAB:
        raise ModelSourceError(
            f"model {name}'s vocab_size {vocab} is smaller than the embedded tokenizer's "
            f"{EMBEDDED_VOCAB}: its token ids would fall outside the embedding",
            hint="put the model's own tokenizer.json beside its config.json",
        )
    return _materialise(dummy_dir(name), config, tokenizer_from(), vocab)


def _config_folder(path: Path) -> Path:
    folder = path.parent if path.name == "config.json" else path
    if not (folder / "config.json").is_file():
        raise ModelSourceError(
            f"model source {path} is neither a preset nor a folder holding config.json",
            hint="with model.weights: dummy, name a preset (`servepilot models list`) or a "
            "folder with the model's config.json",
        )
    return folder.resolve()


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelSourceError(f"cannot read {path}: {exc}") from exc
    if not isinstance(config, dict) or not ({"architectures", "model_type"} & config.keys()):
        raise ModelSourceError(
            f"{path} is not a Hugging Face model config (it needs `architectures` or `model_type`)"
        )
    return config


def _materialise(
    target: Path, config: dict[str, Any], tokenizer: Path, vocab_size: object = None
) -> Path:
    """Write config.json and the tokenizer files into `target`, replacing it atomically, unless
    it already holds exactly these (several replicas start from one folder)."""
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    files = [tokenizer / n for n in TOKENIZER_FILES if (tokenizer / n).is_file()]
    if not any(f.name == "tokenizer.json" for f in files):
        raise ModelSourceError(f"{tokenizer} has no tokenizer.json to lend a config-only model")
    contents = {f.name: f.read_bytes() for f in files}
    if isinstance(vocab_size, int):
        contents["tokenizer.json"] = padded_tokenizer(contents["tokenizer.json"], vocab_size)
    contents["config.json"] = text.encode("utf-8")
    if _same(target, contents):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        for name, data in contents.items():
            (tmp / name).write_bytes(data)
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        if target.exists():
            os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise ModelSourceError(
            f"cannot write the config-only model folder {target}: {exc}"
        ) from exc
    return target


def padded_tokenizer(tokenizer_json: bytes, vocab_size: int) -> bytes:
    """A byte-level BPE tokenizer.json whose ids run up to `vocab_size`: each missing id a
    `PLACEHOLDER` entry of the BPE vocabulary (no merge builds it, so encoding never yields
    it; decoding gives " <id>"). Anything else, or a vocabulary already that large, as it
    is."""
    document = json.loads(tokenizer_json)
    model = document.get("model", {})
    vocab = model.get("vocab")
    if model.get("type") != "BPE" or not isinstance(vocab, dict):
        return tokenizer_json
    used = [*vocab.values(), *(t["id"] for t in document.get("added_tokens", []))]
    first = max(used, default=-1) + 1
    if first >= vocab_size:
        return tokenizer_json
    for token_id in range(first, vocab_size):
        vocab[PLACEHOLDER.format(id=token_id)] = token_id
    return json.dumps(document, ensure_ascii=False).encode("utf-8")


def _same(target: Path, contents: dict[str, bytes]) -> bool:
    try:
        return all((target / name).read_bytes() == data for name, data in contents.items())
    except OSError:
        return False
