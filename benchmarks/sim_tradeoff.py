"""The seeds' trade-off, simulated: one 8-GPU node against several, throughput against P99.

Seed 000 sets a single 8-GPU node (P99 <= 350 ms, ~680 QPS) against a 10-node cluster (5,000
QPS, P99 over 420 ms, 15-30 ms cross-node hops), and says fewer than 4 nodes were measured
slower than one. This runs `servepilot sim` on the same question for 1, 2, 3, 4 and 10 nodes,
each node one replica of DeepSeek-V3 (FP8, TP8 + EP8 on 8 x H200, the plan's knobs), at the
same load per node, and prints one markdown table (docs/tradeoff.md explains it).

Assumptions (each one a flag of `servepilot sim`):
- step times: the planner's roofline of DeepSeek-V3 on H200 (no H200 to calibrate on here);
- traffic: Poisson arrivals, prompts of 512 tokens, 32 output tokens, no shared prefixes;
- the gateway sits on node 1 with its replica; the others are one cross-node hop away, 7.5-15
  ms each way (the seed's 15-30 ms round trip); the client's own hop is left out;
- routing: least_load (the gateway's policy, as `servepilot gateway` runs it);
- 60 simulated seconds per load level, seed 1.

    python benchmarks/sim_tradeoff.py [--nodes 1,2,3,4,10] [--per-node 40,80,100,110]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
FLEET = """\
model:
  source: deepseek-v3
hardware:
  device: gpu
  accelerator: h200
  count: 8
engine:
  tensor_parallel_size: 8
  max_model_len: 8192
replicas:
  count: 1
"""


def simulate(nodes: int, per_node: list[int], work: Path) -> list[dict[str, object]]:
    fleet = work / "fleet.yaml"
    fleet.write_text(FLEET)
    out = work / f"nodes-{nodes}"
    rates = ",".join(str(rate * nodes) for rate in per_node)
    argv = [str(BIN / "servepilot"), "sim", "-c", str(fleet), "--replicas", str(nodes),
            "--policy", "least_load", "--input-tokens", "512", "--output-tokens", "32",
            "--rate", rates, "--duration", "60s", "--seed", "1", "--out", str(out)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"servepilot sim failed for {nodes} nodes:\n{done.stderr[-2000:]}")
    runs: list[dict[str, object]] = json.loads((out / "results.json").read_text())["runs"]
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,2,3,4,10", help="node counts to simulate")
    parser.add_argument("--per-node", default="40,80,100,110", help="requests/s per node")
    args = parser.parse_args()
    per_node = [int(v) for v in args.per_node.split(",")]
    print("| nodes | offered req/s | per node | served req/s | output tok/s | "
          "TTFT p50 ms | TTFT p99 ms | E2E p99 ms |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        for nodes in (int(v) for v in args.nodes.split(",")):
            for run in simulate(nodes, per_node, Path(work)):
                offered = float(run["load"]["value"])  # type: ignore[index]
                ttft, e2e = run["ttft_ms"], run["e2e_ms"]
                print(f"| {nodes} | {offered:,.0f} | {offered / nodes:,.0f} | "
                      f"{run['request_throughput']:,.1f} | {run['output_throughput']:,.0f} | "
                      f"{ttft['p50']:,.0f} | {ttft['p99']:,.0f} | "  # type: ignore[index]
                      f"{e2e['p99']:,.0f} |", flush=True)  # type: ignore[index]  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
