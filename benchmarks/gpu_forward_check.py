"""Check the composition on a GPU: time a whole Llama decode step (every layer in sequence,
one CUDA graph) built from the same PyTorch operators that profiler.py times one by one.
The composed time (the sum of the isolated operators, servepilot/plan/gpu_profile/
compose.py) should match it: this measures what running the operators in sequence adds or
saves (caches, launch gaps) that timing them alone cannot see.

PyTorch and the standard library only (runs on a GPU box without servepilot):

    python3 gpu_forward_check.py --out forward.json     # Llama-3.1-8B's shapes, BF16

Rotary embeddings and the KV append are left out, as in the profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

LLAMA_8B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
            "inter": 14336, "vocab": 128256}  # fmt: skip
POINTS = ((1, 1024), (8, 1024), (32, 1024), (64, 1024), (128, 1024), (256, 1024), (64, 4096))


def build(torch: Any, dims: dict[str, int], batch: int, context: int) -> Any:
    """A decode step over `batch` sequences of `context` cached tokens: the callable."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    h, hd, nh, nkv = dims["hidden"], dims["head_dim"], dims["heads"], dims["kv_heads"]
    inter = dims["inter"]

    def weight(k: int, n: int) -> Any:
        return (torch.randn(n, k, device=dev, dtype=dt) * 0.02).t()

    layers = [
        {
            "qkv": weight(h, (nh + 2 * nkv) * hd),
            "o": weight(nh * hd, h),
            "gate_up": weight(h, 2 * inter),
            "down": weight(inter, h),
            "k": torch.randn(batch, nkv, context, hd, device=dev, dtype=dt),
            "v": torch.randn(batch, nkv, context, hd, device=dev, dtype=dt),
        }
        for _ in range(dims["layers"])
    ]
    head = weight(h, dims["vocab"])
    x0 = torch.randn(batch, h, device=dev, dtype=dt)
    norm_w = torch.ones(h, device=dev, dtype=dt)
    f = torch.nn.functional

    def step() -> Any:
        x = x0
        for layer in layers:
            y = f.rms_norm(x, (h,), norm_w, 1e-6)
            qkv = torch.mm(y, layer["qkv"])
            q = qkv[:, : nh * hd].view(batch, nh, 1, hd)
            attn = f.scaled_dot_product_attention(q, layer["k"], layer["v"], enable_gqa=True)
            x = x + torch.mm(attn.reshape(batch, nh * hd), layer["o"])
            y = f.rms_norm(x, (h,), norm_w, 1e-6)
            gate_up = torch.mm(y, layer["gate_up"])
            act = f.silu(gate_up[:, :inter]) * gate_up[:, inter:]
            x = x + torch.mm(act, layer["down"])
        return torch.mm(f.rms_norm(x, (h,), norm_w, 1e-6), head)

    return step


def time_step_us(torch: Any, step: Any) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        begin.record()
        for _ in range(10):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 100.0)  # ms per 10 -> us per one
    return float(sorted(times)[len(times) // 2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        print("PyTorch is not installed", file=sys.stderr)
        return 3
    if not torch.cuda.is_available():
        print("no CUDA GPU is visible to PyTorch", file=sys.stderr)
        return 3
    rows = []
    for batch, context in POINTS:
        us = time_step_us(torch, build(torch, LLAMA_8B, batch, context))
        rows.append({"batch": batch, "context": context, "us": round(us, 1)})
        print(f"batch {batch:>4} context {context:>5}: {us:8.1f} us", flush=True)
        torch.cuda.empty_cache()
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "model": "llama-3.1-8b", "dtype": "bf16", "points": rows}  # fmt: skip
    args.out.write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
