"""Which checkpoint a planned replica serves: the published one, or one in the planned format.

vLLM quantizes 16-bit weights to fp8 as it loads them (`--quantization fp8`), so an fp8 plan
serves the published checkpoint. Every other quantized format (AWQ, GPTQ, int8 W8A8, fp4)
needs a checkpoint already in that format: a preset names a known public one; for anything
else the command carries a placeholder the user must fill in, and says so. vLLM reads such a
checkpoint's method from its config.json, so its command carries no --quantization: a flag
naming another method than the checkpoint's is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class Checkpoint:
    model: str
    """What `vllm serve` takes as the model: a Hugging Face repository, a folder, or a
    placeholder in angle brackets."""
    note: str
    """Where the checkpoint comes from, or what to fill in; "" for the published one."""

    @property
    def is_placeholder(self) -> bool:
        return self.model.startswith("<")


def checkpoint_for(spec: ModelSpec, model_ref: str, weights: WeightDtype) -> Checkpoint:
    """`model_ref`: what the user named the model by (a preset name or a folder)."""
    published = spec.repo_id or model_ref
    if not needs_quantized_checkpoint(spec, weights):
        return Checkpoint(published, "")
    known = dict(spec.quantized_checkpoints).get(weights)
    if known is not None:
        return Checkpoint(
            known, f"{known} is a published {weights.value} checkpoint of {spec.name}"
        )
    placeholder = placeholder_for(spec.name, weights)
    return Checkpoint(
        placeholder,
        f"fill in {placeholder}: servepilot knows no published {weights.value} checkpoint "
        f"of {spec.name}; vLLM cannot make one as it loads {published}, so take one from the "
        f"Hugging Face Hub or make it ({_MAKERS[weights]})",
    )


def placeholder_for(model_name: str, weights: WeightDtype) -> str:
    """What a command (and a planned fleet.yaml's model.source) names a checkpoint to make by."""
    return f"<{weights.value} checkpoint of {model_name}>"


def parse_placeholder(text: str) -> tuple[str, WeightDtype] | None:
    """(model name, format) of a `placeholder_for` text; None for any other text."""
    match = _PLACEHOLDER.fullmatch(text.strip())
    if match is None or match["format"] not in WeightDtype.__members__.values():
        return None
    return match["model"], WeightDtype(match["format"])


_PLACEHOLDER = re.compile(r"<(?P<format>[a-z0-9]+) checkpoint of (?P<model>[^<>]+)>")

# Tools that write a checkpoint vLLM detects the format of (its quantization_config).
_MAKERS: dict[WeightDtype, str] = {
    WeightDtype.INT8: "llm-compressor's W8A8 int8 scheme",
    WeightDtype.FP4: "NVIDIA ModelOpt or llm-compressor, NVFP4",
    WeightDtype.AWQ: "llm-compressor or AutoAWQ, 4-bit AWQ",
    WeightDtype.GPTQ: "llm-compressor or GPTQModel, 4-bit GPTQ",
}


def needs_quantized_checkpoint(spec: ModelSpec, weights: WeightDtype) -> bool:
    """The planned weights are in a format vLLM cannot produce from the published ones."""
    return (
        weights.is_quantized
        and weights is not spec.checkpoint_dtype
        and weights.vllm_quantization is None
    )
