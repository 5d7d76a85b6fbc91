"""A GPU operator profile (schema `servepilot.gpuprofile/v1`, written by the profiler,
servepilot/engine/gpu/profiler.py) read back as typed tables, each answering "how long does
this operator take at this size", interpolated between the measured points.

Interpolation is piecewise linear in the size itself (not its logarithm): a weight-bound
GEMM is flat in tokens and a compute-bound one linear, and both are exact under linear
interpolation. Past the largest measured size, time grows in proportion to the size (every
operator here is linear there); below the smallest, it is the smallest's time (a kernel
does not get cheaper than its launch).
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.core.errors import ConfigError

PROFILE_SCHEMA = "servepilot.gpuprofile/v1"
"""The profile's format, as the stand-alone profiler (servepilot/engine/gpu/profiler.py)
writes it."""

TOKEN_KINDS = ("gemm", "moe", "rmsnorm", "silu_mul")
AXES = ("tokens", "sampled", "decode", "prefill")


@dataclass(frozen=True, slots=True)
class Curve:
    """Measured (size, seconds) points of one operator, sizes ascending."""

    sizes: tuple[float, ...]
    seconds: tuple[float, ...]

    def at(self, size: float) -> float:
        """Seconds at `size`; 0 for size <= 0 (the operator does not run)."""
        if size <= 0:
            return 0.0
        xs, ys = self.sizes, self.seconds
        if size >= xs[-1]:
            return ys[-1] * size / xs[-1]
        if size <= xs[0]:
            return ys[0]
        i = bisect.bisect_right(xs, size)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (size - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class TokenOp:
    """An operator whose time depends on one count (`axis`): tokens of the step, sequences
    sampled, decode tokens, prefill tokens."""

    name: str
    axis: str
    count: int
    curve: Curve


@dataclass(frozen=True, slots=True)
class DecodeAttention:
    """Decode attention over (sequences, context per sequence): one context curve per
    measured batch size, interpolated linearly between batch sizes."""

    name: str
    count: int
    batches: tuple[int, ...]
    by_batch: tuple[Curve, ...]

    def at(self, batch: float, context: float) -> float:
        if batch <= 0 or context <= 0:
            return 0.0
        bs = self.batches
        if batch >= bs[-1]:
            return self.by_batch[-1].at(context) * batch / bs[-1]
        if batch <= bs[0]:
            return self.by_batch[0].at(context)
        i = bisect.bisect_right(bs, batch)
        lo, hi = self.by_batch[i - 1].at(context), self.by_batch[i].at(context)
        return lo + (hi - lo) * (batch - bs[i - 1]) / (bs[i] - bs[i - 1])


@dataclass(frozen=True, slots=True)
class PrefillAttention:
    """Causal prefill attention as a function of query-key pairs (a prompt of t tokens has
    t (t + 1) / 2), so that chunks after cached context are costed by their pairs too."""

    name: str
    count: int
    curve: Curve


@dataclass(frozen=True, slots=True)
class GpuProfile:
    model: str
    dtype: str
    tp: int
    gpu: str
    date: str
    versions: str
    """"torch 2.11.0+cu130, CUDA 13.0"."""
    token_ops: tuple[TokenOp, ...]
    decode_attention: tuple[DecodeAttention, ...]
    prefill_attention: tuple[PrefillAttention, ...]
    step_overhead_s: float | None = None
    """vLLM's host time per step left over beside the GPU's (async scheduling hides most),
    fitted from measured runs (`meta.step_overhead_ms`); None: the nominal figure."""
    prefill_scale: float = 1.0
    """What a step's prefill chunks really add, as a multiple of what the measured operators
    add for them (`meta.prefill_scale`, fitted on a model's long-prompt calibration case):
    vLLM's own prefill path is not the operators alone (DeepSeek-V2-Lite's MLA prefill and
    grouped MoE took about 4x theirs on an H100)."""
    decode_attention_fixed_s: float = 0.0
    decode_attention_scale: float = 1.0
    """vLLM's decode attention a step, as `decode_attention_fixed_s` + this x what the
    measured operators compose (`meta.decode_attention_us` and `meta.decode_attention_scale`,
    read from step traces of vLLM's own kernels: gpu_step_report.attention_fit). The
    operators are not vLLM's kernels: DeepSeek-V2-Lite's MLA is composed as two GEMMs around
    a softmax, which read the latent cache twice, where vLLM's fused kernel reads it once
    (0.54 x the composition at 64-256 decoders); GQA through SDPA ran 1.07 x faster than
    vLLM's paged FlashAttention, with a fixed 0.1-0.3 ms a step more in vLLM's."""
    eager_step_s: float = 0.0
    """The host's time to launch a step that runs without a CUDA graph, kernel by kernel
    (`meta.eager_step_ms`, from a step trace of a burst's first step: no step before it to
    wait for); such a step takes at least this long. 0: not measured."""
    eager_mixed_step_s: float = 0.0
    """The same for such a step that also carries decoders (`meta.eager_mixed_step_ms`):
    vLLM launches the decode path's kernels beside the prefill's. Where not measured,
    `eager_step_s`."""
    eager_host_s: float = 0.0
    eager_host_per_seq_s: float = 0.0
    """The host's time between two eager launches beside the launches themselves, a fixed
    part and a part a sequence (`meta.eager_host_ms`, `meta.eager_host_us_per_seq`: read
    from a burst's traced steps, gpu_step_report.eager_host_fit). 0: not measured."""

    @property
    def source(self) -> str:
        return f"gpu profile: {self.gpu} {self.date[:10]}/{self.model} {self.dtype} tp{self.tp}"


def is_gpu_profile(document: Any) -> bool:
    return isinstance(document, dict) and document.get("schema") == PROFILE_SCHEMA


def load_gpu_profile(path: Path) -> GpuProfile:
    """Read a profile written by the profiler; a bad file is a ConfigError naming the file and
    the operator."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such GPU profile", hint="create one with `servepilot profile`"
        ) from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it as JSON ({exc})") from None
    return gpu_profile_from(document, str(path))


def gpu_profile_from(document: Any, where: str) -> GpuProfile:
    if not is_gpu_profile(document):
        raise ConfigError(f"{where}: schema: expected {PROFILE_SCHEMA!r}")
    try:
        tokens, decode, prefill = _tables(document["operators"])
        meta = document.get("meta", {})
        eager_ms = _meta_number(meta, "eager_step_ms", 0.0)
        return GpuProfile(
            model=str(document["model"]),
            dtype=str(document["dtype"]),
            tp=int(document["tp"]),
            gpu=str(document["gpu"]),
            date=str(document["date"]),
            versions=f"torch {document['torch']}, CUDA {document['cuda']}",
            token_ops=tokens,
            decode_attention=decode,
            prefill_attention=prefill,
            step_overhead_s=_step_overhead_s(meta),
            prefill_scale=_meta_number(meta, "prefill_scale", 1.0, positive=True),
            decode_attention_fixed_s=_meta_number(meta, "decode_attention_us", 0.0) / 1e6,
            decode_attention_scale=_meta_number(meta, "decode_attention_scale", 1.0, positive=True),
            eager_step_s=eager_ms / 1000.0,
            eager_mixed_step_s=_meta_number(meta, "eager_mixed_step_ms", eager_ms) / 1000.0,
            eager_host_s=_meta_number(meta, "eager_host_ms", 0.0) / 1000.0,
            eager_host_per_seq_s=_meta_number(meta, "eager_host_us_per_seq", 0.0) / 1e6,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{where}: not a valid GPU profile ({type(exc).__name__}: {exc})"
        ) from None


def _tables(
    operators: list[dict[str, Any]],
) -> tuple[tuple[TokenOp, ...], tuple[DecodeAttention, ...], tuple[PrefillAttention, ...]]:
    tokens: list[TokenOp] = []
    decode: list[DecodeAttention] = []
    prefill: list[PrefillAttention] = []
    for op in operators:
        name, kind, count = str(op["name"]), op["kind"], int(op["count"])
        points = op["points"]
        if kind in TOKEN_KINDS:
            axis = op.get("axis", "tokens")
            if axis not in AXES:
                raise ValueError(f"{name}: axis {axis!r} is not one of {AXES}")
            tokens.append(TokenOp(name, axis, count, _curve(points, "tokens", name)))
        elif kind == "attn_decode":
            decode.append(_decode(name, count, points))
        elif kind == "attn_prefill":
            pairs = [{"pairs": p["tokens"] * (p["tokens"] + 1) / 2, "us": p["us"]} for p in points]
            prefill.append(PrefillAttention(name, count, _curve(pairs, "pairs", name)))
        else:
            raise ValueError(f"{name}: unknown kind {kind!r}")
    return tuple(tokens), tuple(decode), tuple(prefill)


def _curve(points: list[dict[str, Any]], key: str, name: str) -> Curve:
    pairs = sorted((float(p[key]), float(p["us"]) * 1e-6) for p in points)
    if not pairs:
        raise ValueError(f"{name}: no points")
    for size, seconds in pairs:
        if not (size > 0 and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"{name}: bad point {key}={size}, us={seconds * 1e6}")
    if len({size for size, _ in pairs}) != len(pairs):
        raise ValueError(f"{name}: a {key} value is measured twice")
    return Curve(tuple(s for s, _ in pairs), tuple(t for _, t in pairs))


def _decode(name: str, count: int, points: list[dict[str, Any]]) -> DecodeAttention:
    batches = sorted({int(p["batch"]) for p in points})
    curves = tuple(
        _curve([p for p in points if int(p["batch"]) == b], "context", name) for b in batches
    )
    return DecodeAttention(name, count, tuple(batches), curves)


def _step_overhead_s(meta: Any) -> float | None:
    if not isinstance(meta, dict) or meta.get("step_overhead_ms") is None:
        return None
    return _meta_number(meta, "step_overhead_ms", 0.0) / 1000.0


def _meta_number(meta: Any, key: str, default: float, *, positive: bool = False) -> float:
    """`meta[key]`, a number >= 0 (> 0 when `positive`); `default` where it is not given."""
    value = meta.get(key, default) if isinstance(meta, dict) else default
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not (value > 0 if positive else value >= 0):
        sign = ">" if positive else ">="
        raise ValueError(f"meta.{key}: expected a number {sign} 0, got {value!r}")
    return float(value)
