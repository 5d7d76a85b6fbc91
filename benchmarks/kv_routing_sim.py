"""bench_kv_routing.py's runs in the simulator: each policy at --sim-replicas, scaled from the
measured fleet, to check that `servepilot sim` orders the policies as the measurement does."""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_routing import SERVEPILOT, Bench, spawn, tail

Row = dict[str, Any]
EXACT = "+exact"
"""A policy named P+exact runs P on the exact prefix index (the replicas' KV events)."""


@dataclass
class KvBench(Bench):
    sims: list[Row] = field(default_factory=list)
    """The simulated runs."""


def workload(args: argparse.Namespace) -> dict[str, object]:
    return {
        "--workload": "agentic", "--concurrency": args.sessions, "--turns": args.turns,
        "--requests": args.requests, "--warmup": args.warmup,
        "--input-tokens": args.input_tokens, "--output-tokens": args.output_tokens,
        "--system-prompts": args.system_prompts,
        "--system-prompt-tokens": args.system_prompt_tokens, "--tool-tokens": args.tool_tokens,
        "--think-time": args.think_time, "--tool-time": args.tool_time,
        "--return-fraction": args.return_fraction, "--return-gap": args.return_gap,
        "--seed": args.seed, "--slo": f"ttft_p99_ms={args.slo_ttft_ms}",
    }  # fmt: skip


def calibrate(b: KvBench) -> Path:
    """A quick step-time profile of the first replica (idle now) for the simulator."""
    profile: Path = b.args.out / "profile.json"
    argv = [SERVEPILOT, "calibrate", "--url", b.replicas[0], "--quick", "--out", str(profile),
            "--max-prompt-tokens", "2048"]  # fmt: skip
    print(f"calibrating {b.replicas[0]} for the simulator (about 2 minutes)", flush=True)
    if spawn(argv, b.args.out / "calibrate.log").wait() != 0:
        raise SystemExit(f"servepilot calibrate failed:\n{tail(b.args.out / 'calibrate.log')}")
    return profile


def simulate(b: KvBench, policies: list[str], profile: Path | None) -> None:
    """Each policy in the simulator at each of --sim-replicas, scaled from the measured fleet
    (two replicas): sessions and turns per replica kept. Step times from `profile` (else the
    planner's roofline, which on a CPU is rough)."""
    from servepilot.core.config import PolicyName

    known = {p.value for p in PolicyName}
    for replicas in b.args.sim_replicas:
        for policy in policies:
            name = policy.removesuffix(EXACT)
            if name not in known:
                print(f"sim: {policy} is not a servepilot policy: left out", flush=True)
                continue
            run_dir = b.args.out / f"sim-{replicas}-{policy}"
            scale = replicas / len(b.replicas)
            flags = {**workload(b.args), "--concurrency": round(b.args.sessions * scale),
                     "--requests": round(b.args.requests * scale),
                     "--warmup": round(b.args.warmup * scale)}  # fmt: skip
            events = "on" if policy.endswith(EXACT) else "off"
            argv = [SERVEPILOT, "sim", "-c", str(b.args.out / "fleet.yaml"), "--replicas",
                    str(replicas), "--policy", name, "--out", str(run_dir), "--gateways",
                    str(b.args.gateways), "--kv-events", events]  # fmt: skip
            argv += [str(item) for pair in flags.items() for item in pair]
            argv += ["--profile", str(profile)] if profile is not None else []
            run_dir.mkdir(parents=True)
            proc = spawn(argv, run_dir / "sim.log")
            if proc.wait() != 0:
                raise SystemExit(f"servepilot sim failed:\n{tail(run_dir / 'sim.log')}")
            run = json.loads((run_dir / "results.json").read_text())["runs"][0]
            b.sims.append({"policy": policy, "replicas": replicas,
                           "ttft_p50": run["ttft_ms"]["p50"], "rps": run["request_throughput"],
                           "goodput": run["goodput_rps"]})  # fmt: skip


def sim_table(b: KvBench, policies: list[str]) -> str:
    """The simulated runs' TTFT p50 next to the measured one, and whether they order the
    policies the same way (lowest TTFT p50 first)."""
    measured = {p: statistics.median(r["ttft_p50"] for r in b.rows if r["policy"] == p)
                for p in policies if any(r["policy"] == p for r in b.rows)}  # fmt: skip
    lines = []
    for replicas in b.args.sim_replicas:
        simulated = {s["policy"]: s for s in b.sims if s["replicas"] == replicas}
        if not simulated:
            continue
        lines.append(f"sim, {replicas} replicas: " + ", ".join(
            f"{p} TTFT p50 {s['ttft_p50'] or 0:.0f} ms, {s['rps']:.2f} req/s, goodput "
            f"{s['goodput']:.2f} req/s" for p, s in simulated.items()))  # fmt: skip
        both = [p for p in measured if p in simulated]
        by_sim = sorted(both, key=lambda p: simulated[p]["ttft_p50"] or math.inf)
        by_real = sorted(both, key=lambda p: measured[p] or math.inf)
        same = "the same as" if by_sim == by_real else "NOT the same as"
        lines.append(f"  order {' < '.join(by_sim)}: {same} measured ({' < '.join(by_real)})")
    return "\n".join(lines)
