"""Where a measured TTFT goes: the client, the gateway, vLLM's API server, its queue, the GPU.

gpu_sim_validate.py scrapes vLLM's metrics and the gateway's before and after each bench
(`vllm-before.txt`, `vllm-after.txt`). Their difference gives, over the run's requests, the
mean of each stage as each side saw it:

- client TTFT: bench's (results.json, weighted over the run's levels);
- gateway TTFT and queue wait: `servepilot_ttft_seconds`, `servepilot_queue_wait_seconds`;
- vLLM TTFT: `vllm:time_to_first_token_seconds`, from the API server's receipt of a request;
- vLLM queue and prefill: `vllm:request_queue_time_seconds` (waiting in the engine's
  scheduler) and `vllm:request_prefill_time_seconds` (first scheduled to first token).

So: client - gateway TTFT is bench's HTTP and the hop in; gateway TTFT - queue wait - vLLM
TTFT is the gateway's own time and the hop to vLLM; vLLM TTFT - queue - prefill is the API
server (chat template, tokenising, the hand-off to the engine core) and the engine's loop.

    python benchmarks/gpu_ttft_split.py benchmarks/gpu_runs/<folder>
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

STAGES = {
    "gateway TTFT": "servepilot_ttft_seconds",
    "gateway queue": "servepilot_queue_wait_seconds",
    "vLLM TTFT": "vllm:time_to_first_token_seconds",
    "vLLM queue": "vllm:request_queue_time_seconds",
    "vLLM prefill": "vllm:request_prefill_time_seconds",
    "vLLM decode": "vllm:request_decode_time_seconds",
}


def sums(path: Path) -> dict[str, tuple[float, float]]:
    """Histogram name -> (sum, count) over all its label sets."""
    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            for suffix, slot in (("_sum", 0), ("_count", 1)):
                if sample.name.endswith(suffix):
                    base = sample.name[: -len(suffix)]
                    pair = list(out.get(base, (0.0, 0.0)))
                    pair[slot] += sample.value
                    out[base] = (pair[0], pair[1])
    return out


def split(rep: Path) -> dict[str, float | None]:
    """Mean ms of each stage over one measurement's requests (warm-up included for vLLM)."""
    before, after = sums(rep / "vllm-before.txt"), sums(rep / "vllm-after.txt")
    row: dict[str, float | None] = {}
    runs = json.loads((rep / "results.json").read_text())["runs"]
    n = sum(r["ttft_ms"]["count"] for r in runs)
    row["client TTFT"] = sum(r["ttft_ms"]["mean"] * r["ttft_ms"]["count"] for r in runs) / n
    for label, name in STAGES.items():
        s0, c0 = before.get(name, (0.0, 0.0))
        s1, c1 = after.get(name, (0.0, 0.0))
        row[label] = (s1 - s0) / (c1 - c0) * 1e3 if c1 > c0 else None
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    labels = ["client TTFT", *STAGES]
    print(f"{'measurement':44s} " + " ".join(f"{x:>13s}" for x in labels))
    for rep in sorted(args.folder.glob("*/*/rep*")):
        if not (rep / "vllm-after.txt").exists() or not (rep / "results.json").exists():
            continue
        row = split(rep)
        cells = [f"{row[x]:13.1f}" if row[x] is not None else f"{'-':>13s}" for x in labels]
        print(f"{rep.relative_to(args.folder)!s:44s} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
