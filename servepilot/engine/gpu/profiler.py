"""Time the operators of one engine step on this machine's GPU (PyTorch and the standard
library only, so that this one file runs on a GPU box that has nothing else installed).

    python profiler.py --shapes shapes.json --out gpu-profile.json

`shapes.json` (schema `servepilot.gpushapes/v1`) is written by `servepilot profile
--shapes-only` from a model spec: one entry per operator with its dimensions, how many times
a step runs it (`count`) and the points to time. The output (schema
`servepilot.gpuprofile/v1`) is the same list with a time in microseconds at every point, plus
the GPU's name, the PyTorch and CUDA versions and the date.

How a point is timed: warm up, then rounds of back-to-back calls between two CUDA events,
captured in a CUDA graph where possible (vLLM replays decode steps from graphs, so launch
gaps are not part of a step); rounds repeat until the last three agree within 3%. Weights
and KV caches rotate over enough copies to exceed the L2 cache, as in a real step where each
layer's weights are read once.

Exit codes: 0 written, 2 bad arguments or shapes, 3 no GPU (and no --device cpu).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHAPES_SCHEMA = "servepilot.gpushapes/v1"
PROFILE_SCHEMA = "servepilot.gpuprofile/v1"
EXIT_BAD_INPUT = 2
EXIT_NO_GPU = 3

# Rotate over copies of the operands until they exceed this: H200's L2 is 60 MB, so reading
# 256 MB per round leaves no weight cached from the previous call.
_ROTATE_BYTES = 256 * 2**20
_MAX_COPIES = 64
_ROUND_S = 1.0e-3
_STABLE_REL = 0.03
_MIN_ROUNDS = 3
_MAX_ROUNDS = 12


class NoGpuError(RuntimeError):
    """The profiler needs a CUDA device and none is usable."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=Path, required=True, help="servepilot.gpushapes/v1")
    parser.add_argument("--out", type=Path, required=True, help="the profile to write")
    parser.add_argument(
        "--device", default="cuda", help="cuda (default), or cpu to test the logic only"
    )
    args = parser.parse_args(argv)
    try:
        shapes = json.loads(args.shapes.read_text(encoding="utf-8"))
        check_shapes(shapes)
    except (OSError, ValueError) as exc:
        print(f"profile: {args.shapes}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        profile = run_profile(shapes, device=args.device, log=_log)
    except NoGpuError as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    args.out.write_text(json.dumps(profile, indent=1) + "\n", encoding="utf-8")
    total = sum(len(op["points"]) for op in profile["operators"])
    print(
        f"wrote {args.out}: {len(profile['operators'])} operators, {total} points, "
        f"{profile['elapsed_s']:.0f} s on {profile['gpu']}"
    )
    return 0


def _log(text: str) -> None:
    print(text, flush=True)


def check_shapes(shapes: Any) -> None:
    """Raise ValueError when `shapes` is not a servepilot.gpushapes/v1 document."""
    if not isinstance(shapes, dict) or shapes.get("schema") != SHAPES_SCHEMA:
        raise ValueError(f"expected schema {SHAPES_SCHEMA!r}")
    operators = shapes.get("operators")
    if not isinstance(operators, list) or not operators:
        raise ValueError("operators: expected a non-empty list")
    for op in operators:
        kind = op.get("kind") if isinstance(op, dict) else None
        if kind not in _TIMERS:
            raise ValueError(f"operator {op!r}: kind must be one of {sorted(_TIMERS)}")
        if not isinstance(op.get("points"), list) or not op["points"]:
            raise ValueError(f"operator {op.get('name')}: points: expected a non-empty list")


def run_profile(
    shapes: dict[str, Any], *, device: str = "cuda", log: Callable[[str], None] = _log
) -> dict[str, Any]:
    """Time every point of every operator; the profile document."""
    try:
        import torch
    except ImportError:
        raise NoGpuError("PyTorch is not installed here; run this on the GPU machine") from None
    if device == "cuda" and not torch.cuda.is_available():
        raise NoGpuError(
            "no CUDA GPU is visible to PyTorch (torch.cuda.is_available() is "
            "False); run this on a machine with the target GPU"
        )
    started = time.monotonic()
    dev = torch.device(device)
    operators = []
    for op in shapes["operators"]:
        timer = _TIMERS[op["kind"]]
        points = []
        for point in op["points"]:
            us = timer(torch, dev, op, point, shapes.get("dtype", "bf16"))
            points.append({**point, "us": round(us, 3)})
        operators.append({**op, "points": points})
        log(
            f"{op['name']:>16}: "
            + " ".join(f"{p['us']:.0f}" for p in points[:12])
            + (" ..." if len(points) > 12 else "")
            + " us"
        )
    return {
        "schema": PROFILE_SCHEMA,
        "model": shapes.get("model"),
        "dtype": shapes.get("dtype", "bf16"),
        "tp": shapes.get("tp", 1),
        "gpu": _gpu_name(torch, dev),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%MZ"),
        "method": "CUDA events around back-to-back calls (CUDA graph where capturable), "
        "operands rotated past L2, rounds until 3 agree within 3%",
        "elapsed_s": round(time.monotonic() - started, 1),
        "operators": operators,
    }


def _gpu_name(torch: Any, dev: Any) -> str:
    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    return f"cpu ({platform.processor() or platform.machine()})"


# ---- timing --------------------------------------------------------------------------------


def time_us(torch: Any, dev: Any, call: Callable[[int], object], copies: int) -> float:
    """Median microseconds of one `call(i)` (i cycles over `copies` operand sets)."""
    for i in range(3):
        call(i % copies)
    once = _elapsed_s(torch, dev, lambda: call(0), 1)
    reps = max(copies, min(2000, math.ceil(_ROUND_S / max(once, 1e-7))))
    run = _batched(torch, dev, call, reps, copies)
    rounds: list[float] = []
    while len(rounds) < _MAX_ROUNDS:
        rounds.append(_elapsed_s(torch, dev, run, 1) / reps)
        last = rounds[-_MIN_ROUNDS:]
        if len(last) == _MIN_ROUNDS and max(last) <= min(last) * (1 + _STABLE_REL):
            break
    return statistics.median(rounds[-_MIN_ROUNDS:]) * 1e6


def _batched(
    torch: Any, dev: Any, call: Callable[[int], object], reps: int, copies: int
) -> Callable[[], object]:
    def eager() -> None:
        for i in range(reps):
            call(i % copies)

    if dev.type != "cuda":
        return eager
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            eager()  # warm up on the side stream, as graph capture requires
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            eager()
        graph.replay()
        torch.cuda.synchronize()
        return graph.replay  # type: ignore[no-any-return]
    except RuntimeError:
        torch.cuda.synchronize()
        return eager


def _elapsed_s(torch: Any, dev: Any, fn: Callable[[], object], n: int) -> float:
    if dev.type != "cuda":
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return float(begin.elapsed_time(end)) / 1e3 / n


def _copies(dev: Any, nbytes: int) -> int:
    if dev.type != "cuda":
        return 1  # a CPU run checks the logic only: no cache to defeat
    return max(1, min(_MAX_COPIES, math.ceil(_ROTATE_BYTES / max(nbytes, 1))))


def _float_dtype(torch: Any, dev: Any) -> Any:
    # CPU runs check the logic only; float32 keeps every CPU kernel available.
    return torch.bfloat16 if dev.type == "cuda" else torch.float32


# ---- operators -----------------------------------------------------------------------------


def _gemm(torch: Any, dev: Any, op: dict[str, Any], point: dict[str, Any], dtype: str) -> float:
    """x[m, k] @ W[k, n], `groups` independent ones side by side (MLA's per-head absorption)."""
    m, k, n, groups = int(point["tokens"]), int(op["k"]), int(op["n"]), int(op.get("groups", 1))
    fp8 = dtype == "fp8" and dev.type == "cuda" and groups == 1 and op.get("fp8", True)
    if fp8:
        m = -(-m // 16) * 16  # FP8 tensor-core GEMMs take rows in multiples of 16
    wdt = torch.float8_e4m3fn if fp8 else _float_dtype(torch, dev)
    elem = 1 if fp8 else (2 if wdt == torch.bfloat16 else 4)
    copies = _copies(dev, groups * k * n * elem)
    if groups == 1:
        x = torch.randn(m, k, device=dev).to(wdt)
        ws = [torch.randn(n, k, device=dev).to(wdt).t() for _ in range(copies)]
        if fp8:
            one = torch.ones((), device=dev)
            out = _float_dtype(torch, dev)
            return time_us(
                torch,
                dev,
                lambda i: torch._scaled_mm(x, ws[i], scale_a=one, scale_b=one, out_dtype=out),
                copies,
            )
        return time_us(torch, dev, lambda i: torch.mm(x, ws[i]), copies)
    x = torch.randn(groups, m, k, device=dev, dtype=wdt)
    wb = [torch.randn(groups, k, n, device=dev, dtype=wdt) for _ in range(copies)]
    return time_us(torch, dev, lambda i: torch.bmm(x, wb[i]), copies)


def _moe(torch: Any, dev: Any, op: dict[str, Any], point: dict[str, Any], dtype: str) -> float:
    """Routed experts for `tokens` tokens: each touched expert multiplies its share of the
    tokens through w13 (hidden -> 2 x inter), SiLU-and-multiply, and w2 (inter -> hidden).
    A batched GEMM over the touched experts stands in for vLLM's fused MoE kernel."""
    tokens, experts, top_k = int(point["tokens"]), int(op["experts"]), int(op["top_k"])
    hidden, inter = int(op["k"]), int(op["n"])
    active, per_expert = moe_load(tokens, experts, top_k)
    wdt = _float_dtype(torch, dev)
    x = torch.randn(active, per_expert, hidden, device=dev, dtype=wdt)
    w13 = torch.randn(active, hidden, 2 * inter, device=dev, dtype=wdt)
    w2 = torch.randn(active, inter, hidden, device=dev, dtype=wdt)

    def call(_: int) -> object:
        gate_up = torch.bmm(x, w13)
        act = torch.nn.functional.silu(gate_up[..., :inter]) * gate_up[..., inter:]
        return torch.bmm(act, w2)

    return time_us(torch, dev, call, 1)


def moe_load(tokens: int, experts: int, top_k: int) -> tuple[int, int]:
    """(experts touched, tokens each) when `tokens` tokens each pick `top_k` of `experts`
    uniformly at random: the expected number touched, and the mean load over those."""
    untouched = (1 - top_k / experts) ** tokens
    active = max(1, min(experts, round(experts * (1 - untouched))))
    return active, max(1, math.ceil(tokens * top_k / active))


def _rmsnorm(torch: Any, dev: Any, op: dict[str, Any], point: dict[str, Any], _: str) -> float:
    m, width = int(point["tokens"]), int(op["width"])
    wdt = _float_dtype(torch, dev)
    xs = [torch.randn(m, width, device=dev, dtype=wdt) for _ in range(_copies(dev, m * width * 2))]
    weight = torch.ones(width, device=dev, dtype=wdt)
    norm = getattr(torch.nn.functional, "rms_norm", None)
    if norm is None:
        return time_us(
            torch,
            dev,
            lambda i: xs[i] * torch.rsqrt(xs[i].pow(2).mean(-1, keepdim=True) + 1e-6) * weight,
            len(xs),
        )
    return time_us(torch, dev, lambda i: norm(xs[i], (width,), weight, 1e-6), len(xs))


def _silu_mul(torch: Any, dev: Any, op: dict[str, Any], point: dict[str, Any], _: str) -> float:
    m, width = int(point["tokens"]), int(op["width"])
    wdt = _float_dtype(torch, dev)
    xs = [
        torch.randn(m, 2 * width, device=dev, dtype=wdt) for _ in range(_copies(dev, m * width * 4))
    ]
    silu = torch.nn.functional.silu
    return time_us(torch, dev, lambda i: silu(xs[i][:, :width]) * xs[i][:, width:], len(xs))


def _attention_dims(op: dict[str, Any]) -> tuple[int, int, int, int]:
    """Query heads, KV heads, the q/k head size and the v head size of an attention op."""
    return int(op["heads"]), int(op["kv_heads"]), int(op["qk_dim"]), int(op["v_dim"])


def _attn_decode(torch: Any, dev: Any, op: dict[str, Any], point: dict[str, Any], _: str) -> float:
    """One new query per sequence against `context` cached tokens, `batch` sequences.
    GQA through SDPA's fused kernels; MLA absorbed (every head reads the one latent of
    kv_lora_rank + rope dims, values are its first kv_lora_rank dims) as two batched GEMMs
    around a softmax, the shape FlashMLA computes."""
    b, ctx = int(point["batch"]), int(point["context"])
    heads, kv_heads, qk, v = _attention_dims(op)
    wdt = _float_dtype(torch, dev)
    kv_bytes = b * ctx * kv_heads * (qk + (0 if op.get("latent") else v)) * 2
    copies = _copies(dev, kv_bytes)
    if op.get("latent"):
        q = torch.randn(b, heads, qk, device=dev, dtype=wdt)
        caches = [torch.randn(b, ctx, qk, device=dev, dtype=wdt) for _ in range(copies)]
        scale = 1 / math.sqrt(qk)

        def absorbed(i: int) -> object:
            scores = torch.bmm(q, caches[i].transpose(1, 2)) * scale
            return torch.bmm(torch.softmax(scores, -1), caches[i][:, :, :v])

        return time_us(torch, dev, absorbed, copies)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(b, heads, 1, qk, device=dev, dtype=wdt)
    ks = [torch.randn(b, kv_heads, ctx, qk, device=dev, dtype=wdt) for _ in range(copies)]
    vs = [torch.randn(b, kv_heads, ctx, v, device=dev, dtype=wdt) for _ in range(copies)]
    gqa = heads != kv_heads
    return time_us(torch, dev, lambda i: sdpa(q, ks[i], vs[i], enable_gqa=gqa), copies)


def _attn_prefill(torch: Any, dev: Any, op: dict[str, Any], point: dict[str, Any], _: str) -> float:
    """A causal prefill of `tokens` new tokens (one sequence, nothing cached) through SDPA;
    MLA prefills unabsorbed (qk of nope + rope dims, v of v_head_dim per head)."""
    t = int(point["tokens"])
    heads, kv_heads, qk, v = _attention_dims(op)
    wdt = _float_dtype(torch, dev)
    q = torch.randn(1, heads, t, qk, device=dev, dtype=wdt)
    k = torch.randn(1, kv_heads, t, qk, device=dev, dtype=wdt)
    val = torch.randn(1, kv_heads, t, v, device=dev, dtype=wdt)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = heads != kv_heads
    return time_us(torch, dev, lambda _: sdpa(q, k, val, is_causal=True, enable_gqa=gqa), 1)


_TIMERS: dict[str, Callable[[Any, Any, dict[str, Any], dict[str, Any], str], float]] = {
    "gemm": _gemm,
    "moe": _moe,
    "rmsnorm": _rmsnorm,
    "silu_mul": _silu_mul,
    "attn_decode": _attn_decode,
    "attn_prefill": _attn_prefill,
}


if __name__ == "__main__":
    sys.exit(main())
