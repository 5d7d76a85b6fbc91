"""The composed decode step against vLLM's, kernel time and wall time a step, from the step
traces of `gpu_step_trace.py` (issue 34).

For each config and level: the kernels' time a step and the span a step (first kernel of the
first profiled step to the last kernel of the last, over the steps: the GPU's time plus the
gaps between steps) against the profile's composition of the same decode step (its decoders
and their context; servepilot/plan/gpu_profile/compose.py), operators alone and with the
per-step overhead.

    python benchmarks/gpu_step_report.py benchmarks/gpu_runs/2026-12-06-step-trace-h100 \\
        --profiles benchmarks/gpu_runs/2026-12-06-sim-validate-h100-cold/profiles
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gpu_sim_cases import PROFILES
from benchmarks.gpu_step_trace import PROMPT_TOKENS
from servepilot.plan.costmodel import GPU_STEP_OVERHEAD_S, StepShape, prefill_pairs
from servepilot.plan.gpu_profile.compose import StepComposer
from servepilot.plan.gpu_profile.table import GpuProfile, load_gpu_profile

STEP = re.compile(r"user_annotation:execute_context_(\d+)\(\d+\)_generation_(\d+)\(\d+\)")
TIMELINE_STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\(\d+\)")
CONTEXT_TOKENS = PROMPT_TOKENS + 10
"""A decoder's context while profiled: the prompt and the few tokens after its prefill."""
ATTENTION_KERNEL = "flash::"
"""In the name of every kernel of vLLM's FlashAttention (FA3 on Hopper: GQA and, with the
FLASH_ATTN backend, MLA), and of no other kernel a step runs."""
GRAPH_MAX_TOKENS = 512
"""The largest step vLLM 0.22 runs as a CUDA graph at the suite's defaults (its largest
capture size: servepilot/plan/memory.py `capture_sizes`); a larger step runs eagerly."""
HOST_BOUND_SLACK_MS = 2.0
"""An eager step whose last kernel ended this soon after its launch's end was paced by the
host (its kernels ran as they were launched)."""


def level_row(step: dict[str, Any], composer: StepComposer) -> dict[str, float]:
    trace = step["trace"]
    decoders = max(int(m.group(2)) for name in trace["annotations"] if (m := STEP.match(name)))
    shape = StepShape(0, 0, decoders, decoders * CONTEXT_TOKENS, 0)
    steps = trace["steps"]
    return {
        "decoders": decoders,
        "kernel_ms": trace["kernel_us"] / steps / 1e3,
        "span_ms": trace["span_us"] / steps / 1e3,
        "operators_ms": composer.gpu_time_s(shape) * 1e3,
        "step_ms": composer.step_time_s(shape) * 1e3,
    }


def burst_row(step: dict[str, Any], composer: StepComposer) -> dict[str, float]:
    """A burst profiled from its first step (`gpu_step_trace.py --burst`): how many steps
    its prefills took, their composed time against vLLM's, and each step's shape.

    The timeline holds each step's launch on the CPU. vLLM schedules one step ahead
    (async scheduling), so a step's launch waits for the GPU to finish the step before the
    one before it: the second launch after the last prefill step marks that step's end."""
    shapes = []
    for launch_ms, _cpu_ms, name in step["trace"]["step_timeline"]:
        m = TIMELINE_STEP.fullmatch(name)
        assert m is not None, f"unknown step annotation {name!r}"
        shapes.append((float(launch_ms), int(m.group(1)), int(m.group(2)), int(m.group(3))))
    last = max(i for i, (_, chunks, _, _) in enumerate(shapes) if chunks)
    composed_ms = 0.0
    for _, chunks, tokens, decoders in shapes[: last + 1]:
        # Fresh prompts cut into chunks: each chunk's attention as if its prompt started
        # in it (a chunk that continues a prompt also reads what came before: a little more).
        pairs = chunks * prefill_pairs(tokens // max(chunks, 1), 0)
        shape = StepShape(tokens, chunks, decoders, decoders * CONTEXT_TOKENS, pairs)
        step_s = composer.step_time_s(shape)
        if tokens + decoders > GRAPH_MAX_TOKENS:  # the simulator's floor (CostModel)
            step_s = max(step_s, composer.profile.eager_step_s)
        composed_ms += step_s * 1e3
    return {
        "in_flight": step["in_flight"],
        "prefill_steps": last + 1,
        "prefill_tokens": sum(tokens for _, _, tokens, _ in shapes[: last + 1]),
        "first_step_seqs": shapes[0][1],
        "measured_ms": shapes[last + 2][0] - shapes[0][0],
        "composed_ms": composed_ms,
        "first_step_host_ms": float(step["trace"]["step_timeline"][0][1]),
    }


def eager_step_ms(config_dirs: list[Path], *, mixed: bool = False) -> float | None:
    """The host's time to launch a step that runs without a CUDA graph: over the `--burst`
    traces in `config_dirs`, the median time vLLM's engine spent in a burst's first step
    (its `execute_model` on the CPU, with no step before it to wait for, and more tokens
    than any graph holds), less what the profiler adds to it (`profiler_ms`). None: no such
    trace.

    `mixed`: the same over the bursts' later eager steps that carry decoders too (the decode
    path's kernels launched beside the prefill's). The median, because on a model whose GPU
    is the slower (Llama-3.1-8B's 8,192-token steps) some of those spans are the host
    waiting for the GPU (8 of 41 took 190-383 ms, the others 18-37)."""
    times = []
    for config_dir in config_dirs:
        for path in sorted(config_dir.glob("c*/step.json")):
            step = json.loads(path.read_text())
            if not _burst(step) or "trace" not in step:
                continue
            timeline = step["trace"]["step_timeline"]
            for _launch_ms, host_ms, name in timeline if mixed else timeline[:1]:
                m = TIMELINE_STEP.fullmatch(name)
                if m is None or int(m.group(2)) + int(m.group(3)) <= GRAPH_MAX_TOKENS:
                    continue
                if (int(m.group(3)) > 0) == mixed:
                    times.append(float(host_ms))
    if not times:
        return None
    return max(0.0, statistics.median(times) - (profiler_ms(config_dirs) or 0.0))


def eager_host_fit(config_dirs: list[Path]) -> tuple[float, float] | None:
    """(ms, us a sequence): the host's time between two launches beside the launch itself,
    a least-squares line by the sequences the next step carries, over the `--burst` traces
    in `config_dirs` whose steps' kernels were joined to them (`step_gpu`). Read after eager
    steps whose GPU was done by the end of their launch (the host the bottleneck: the time
    to the next launch is the host's own, taking the outputs in and scheduling, not a wait
    for the GPU), and not after a burst's first step (no outputs before it). None with
    fewer than three such steps or one sequence count only."""
    points = []
    for config_dir in config_dirs:
        for path in sorted(config_dir.glob("c*/step.json")):
            step = json.loads(path.read_text())
            trace = step.get("trace", {})
            if not _burst(step) or "step_gpu" not in trace:
                continue
            timeline, gpu = trace["step_timeline"], trace["step_gpu"]
            for i in range(1, len(timeline) - 1):
                (launch_ms, host_ms, name), (next_ms, _, next_name) = timeline[i], timeline[i + 1]
                m, n = TIMELINE_STEP.fullmatch(name), TIMELINE_STEP.fullmatch(next_name)
                if m is None or n is None or gpu[i] is None:
                    continue
                eager = int(m.group(2)) + int(m.group(3)) > GRAPH_MAX_TOKENS
                if eager and gpu[i][2] <= launch_ms + host_ms + HOST_BOUND_SLACK_MS:
                    seqs = int(n.group(1)) + int(n.group(3))
                    points.append((seqs, next_ms - launch_ms - host_ms))
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum(
        (x - mean_x) ** 2 for x, _ in points
    )
    return mean_y - slope * mean_x, slope * 1e3


def attention_fit(config_dirs: list[Path], profile: GpuProfile) -> tuple[float, float] | None:
    """(fixed us, scale): vLLM's decode attention a step against what the profile's operators
    compose for it, traced = fixed + scale x composed, a least-squares line over the decode
    traces (not the bursts) in `config_dirs`: per level, the kernels of vLLM's FlashAttention
    (`ATTENTION_KERNEL` in their names: the attention and its split-KV combine, not the KV
    cache writes) a step, at the level's decoders and their context. None with fewer than
    three levels."""
    composer = StepComposer(replace(profile, decode_attention_fixed_s=0.0,
                                    decode_attention_scale=1.0), 0.0, 0.0)  # fmt: skip
    points = []
    for config_dir in config_dirs:
        for path in sorted(config_dir.glob("c*/step.json")):
            step = json.loads(path.read_text())
            if _burst(step) or "trace" not in step:
                continue
            trace = step["trace"]
            decoders = max(int(m.group(2)) for name in trace["annotations"]
                           if (m := STEP.match(name)))  # fmt: skip
            traced_us = sum(k["us"] for k in trace["kernels"] if ATTENTION_KERNEL in k["name"])
            composed_s = composer.decode_attention_s(decoders, CONTEXT_TOKENS)
            points.append((composed_s * 1e6, traced_us / trace["steps"]))
    if len(points) < 3:
        return None
    xs, ys = zip(*points, strict=True)
    scale, fixed = statistics.linear_regression(xs, ys)
    return fixed, scale


def profiler_ms(config_dirs: list[Path]) -> float | None:
    """What the profiler adds to an eagerly run step: a one-prompt burst's TTFT traced (`c1`,
    straight at vLLM) less the same engine's TTFT at one request in flight untraced (its
    warm-up, through the gateway: the gateway's own millisecond or two makes this an
    underestimate). Its median over the folders that have both; None: none has.

    The traced engine records every operator and CUDA call on the CPU: DeepSeek-V2-Lite's
    first step launches about 1,200 kernels one by one, and its traced one-prompt TTFT was
    85.9 ms against 70.9 ms untraced on the same engine."""
    added = []
    for config_dir in config_dirs:
        traced, warm = config_dir / "c1" / "step.json", config_dir / "warmup0" / "results.json"
        if not (traced.exists() and warm.exists()):
            continue
        runs = json.loads(traced.read_text())["results"]
        alone = [r for r in json.loads(warm.read_text())["runs"] if r["load"]["value"] == 1]
        if runs and alone:
            added.append(runs[0]["ttft_ms"]["p50"] - alone[0]["ttft_ms"]["p50"])
    return max(0.0, statistics.median(added)) if added else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--profiles", type=Path, required=True)
    args = parser.parse_args()
    print(f"{'config':18s} {'decoders':>8s} {'kernels':>8s} {'composed':>9s} {'err':>5s} "
          f"{'span':>7s} {'+ step':>7s} {'err':>5s}   (ms a step)")  # fmt: skip
    bursts: list[tuple[str, dict[str, float]]] = []
    for config_dir in sorted(p for p in args.folder.iterdir() if p.is_dir()):
        model, dtype = PROFILES[config_dir.name]
        profile = load_gpu_profile(next(args.profiles.glob(f"*-{model}-{dtype}.json")))
        overhead = profile.step_overhead_s
        composer = StepComposer(profile, 0.0, 0.0,
                                GPU_STEP_OVERHEAD_S if overhead is None else overhead)  # fmt: skip
        levels = [json.loads(p.read_text()) for p in config_dir.glob("c*/step.json")]
        bursts += [(config_dir.name, burst_row(s, composer)) for s in levels if _burst(s)]
        rows = [level_row(s, composer) for s in levels if not _burst(s)]
        for r in sorted(rows, key=lambda r: r["decoders"]):
            ops, step = r["operators_ms"], r["step_ms"]
            print(f"{config_dir.name:18s} {r['decoders']:8d} {r['kernel_ms']:8.2f} {ops:9.2f} "
                  f"{ops / r['kernel_ms'] - 1:+5.0%} {r['span_ms']:7.2f} {step:7.2f} "
                  f"{step / r['span_ms'] - 1:+5.0%}")  # fmt: skip
    if bursts:
        print(
            f"\nbursts, from the first step: {'config':18s} {'in flight':>9s} {'steps':>5s} "
            f"{'tokens':>7s} {'first':>5s} {'host 1st':>8s} {'vLLM':>7s} {'composed':>8s} "
            f"{'err':>5s}  (ms)"
        )
        for config, b in bursts:
            print(
                f"{'':28s} {config:18s} {b['in_flight']:9d} {b['prefill_steps']:5d} "
                f"{b['prefill_tokens']:7d} {b['first_step_seqs']:5d} "
                f"{b['first_step_host_ms']:8.1f} {b['measured_ms']:7.0f} "
                f"{b['composed_ms']:8.0f} {b['composed_ms'] / b['measured_ms'] - 1:+5.0%}"
            )
    return 0


def _burst(step: dict[str, Any]) -> bool:
    """Profiled from the burst's start (`--burst`), not once its prefills were done."""
    return step.get("profile_started_s") == 0.0


if __name__ == "__main__":
    sys.exit(main())
