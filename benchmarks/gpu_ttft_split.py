"""Where a measured TTFT goes: the client, the gateway, vLLM's API server, its queue, the GPU.

gpu_sim_validate.py scrapes vLLM's metrics and the gateway's before and after each bench
(`vllm-before.txt`, `vllm-after.txt`). Their difference gives, over the run's requests, the
mean of each stage as each side saw it:

- client TTFT: bench's (results.json, weighted over the run's levels);
- gateway TTFT and queue wait: `servepilot_ttft_seconds`, `servepilot_queue_wait_seconds`;
- vLLM TTFT: `vllm:time_to_first_token_seconds`, from the API server's receipt of a request;
- vLLM queue and prefill: `vllm:request_queue_time_seconds` (waiting in the engine's
  scheduler) and `vllm:request_prefill_time_seconds` (first scheduled to first token);
- the share of prompt tokens vLLM served from its prefix cache (`vllm:prefix_cache_hits`
  over `vllm:prefix_cache_queries`): a random workload should have none.

So: client - gateway TTFT is bench's HTTP and the hop in; gateway TTFT - queue wait - vLLM
TTFT is the gateway's own time and the hop to vLLM; vLLM TTFT - queue - prefill is the API
server (chat template, tokenising, the hand-off to the engine core) and the engine's loop.

    python benchmarks/gpu_ttft_split.py benchmarks/gpu_runs/<folder>

`engine_split` sets a run's split beside `servepilot sim`'s of the same run (gpu_sim_report.py
prints them together).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from servepilot.bench.prefix_cache import CacheCount, hit_rate

STAGES = {
    "gateway TTFT": "servepilot_ttft_seconds",
    "gateway queue": "servepilot_queue_wait_seconds",
    "vLLM TTFT": "vllm:time_to_first_token_seconds",
    "vLLM queue": "vllm:request_queue_time_seconds",
    "vLLM prefill": "vllm:request_prefill_time_seconds",
    "vLLM decode": "vllm:request_decode_time_seconds",
}


def scrape_text(rep: Path, name: str) -> str:
    """`name` (vllm-before or vllm-after) of a measurement, as written or gzipped for the repo."""
    plain = rep / f"{name}.txt"
    if plain.exists():
        return plain.read_text()
    return gzip.decompress((rep / f"{name}.txt.gz").read_bytes()).decode()


def sums(text: str) -> dict[str, float]:
    """Each histogram's `_sum` and `_count` and each counter's `_total`, summed over label
    sets, by sample name."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count", "_total")):
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def cache_hit_pct(rep: Path) -> float | None:
    """The share (%) of prompt tokens vLLM served from its prefix cache during the measurement
    in `rep`, as `servepilot bench` reads it (`bench.prefix_cache`); None where it was not
    scraped (the runs before 2026-12-06) or looked nothing up."""
    counts = []
    for name in ("vllm-before", "vllm-after"):
        try:
            text = scrape_text(rep, name)
        except FileNotFoundError:
            return None
        page = sums(text)
        counts.append(CacheCount(page.get("vllm:prefix_cache_queries_total", 0.0),
                                 page.get("vllm:prefix_cache_hits_total", 0.0)))  # fmt: skip
    rate = hit_rate(counts[0], counts[1])
    return None if rate is None else 100 * rate


def split(rep: Path) -> dict[str, float | None]:
    """Mean ms of each stage over one measurement's requests (warm-up included for vLLM), and
    the share of prompt tokens vLLM served from its prefix cache."""
    before, after = sums(scrape_text(rep, "vllm-before")), sums(scrape_text(rep, "vllm-after"))

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    row: dict[str, float | None] = {}
    row["client TTFT"] = client_ttft_ms(json.loads((rep / "results.json").read_text())["runs"])
    for label, name in STAGES.items():
        count = delta(f"{name}_count")
        row[label] = delta(f"{name}_sum") / count * 1e3 if count > 0 else None
    row["cache hit %"] = cache_hit_pct(rep)
    return row


def client_ttft_ms(runs: list[dict[str, Any]]) -> float:
    """The mean TTFT over a bench or sim result's levels (its `runs`), weighted by requests."""
    n = sum(r["ttft_ms"]["count"] for r in runs)
    return float(sum(r["ttft_ms"]["mean"] * r["ttft_ms"]["count"] for r in runs) / n)


def engine_split(rep: Path, sim_result: Path) -> dict[str, float | None]:
    """A run's mean TTFT in three parts, measured (`split`: vLLM's queue, its prefill, and
    the client's TTFT less both: bench, the gateway, the API server and the wait for the step
    in progress) and simulated (`servepilot sim`'s engine queue and prefill, timed as vLLM's
    histograms time them, and the client's TTFT less both)."""
    measured = split(rep)
    doc = json.loads(sim_result.read_text())
    counts = [run["ttft_ms"]["count"] for run in doc["runs"]]

    def mean(key: str) -> float | None:
        pairs = [(lv.get(key), c) for lv, c in zip(doc["target"]["levels"], counts, strict=True)]
        known = [(v, c) for v, c in pairs if v is not None]
        total = sum(c for _, c in known)
        return sum(v * c for v, c in known) / total if total else None

    def rest(total: float | None, *parts: float | None) -> float | None:
        if total is None or any(p is None for p in parts):
            return None
        return total - sum(p for p in parts if p is not None)

    queue, prefill = mean("engine_queue_ms"), mean("engine_prefill_ms")
    client = client_ttft_ms(doc["runs"])
    m_queue, m_prefill = measured["vLLM queue"], measured["vLLM prefill"]
    return {
        "measured_client_ms": measured["client TTFT"],
        "measured_before_engine_ms": rest(measured["client TTFT"], m_queue, m_prefill),
        "measured_queue_ms": m_queue,
        "measured_prefill_ms": m_prefill,
        "simulated_client_ms": client,
        "simulated_before_engine_ms": rest(client, queue, prefill),
        "simulated_queue_ms": queue,
        "simulated_prefill_ms": prefill,
    }


def split_table(splits: list[dict[str, Any]]) -> str:
    """One line per run (its `engine_split` and a "run" name): the mean TTFT and its three
    parts, measured / simulated."""
    head = (f"{'run (mean ms, measured / simulated)':34s} {'client TTFT':>15s} "
            f"{'outside engine':>15s} {'engine queue':>15s} {'engine prefill':>15s}")  # fmt: skip
    lines = [head]
    for row in splits:
        cells = []
        for part in ("client", "before_engine", "queue", "prefill"):
            m, p = row[f"measured_{part}_ms"], row[f"simulated_{part}_ms"]
            cells.append(f"{_num(m):>7s}/{_num(p):<7s}")
        lines.append(f"{row['run']:34s} " + " ".join(cells))
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    labels = ["client TTFT", *STAGES, "cache hit %"]
    print(f"{'measurement':44s} " + " ".join(f"{x:>13s}" for x in labels))
    for rep in sorted(args.folder.glob("*/*/rep*")):
        scraped = any((rep / f"vllm-after.txt{gz}").exists() for gz in ("", ".gz"))
        if not scraped or not (rep / "results.json").exists():
            continue
        row = split(rep)
        cells = [f"{row[x]:13.1f}" if row[x] is not None else f"{'-':>13s}" for x in labels]
        print(f"{rep.relative_to(args.folder)!s:44s} " + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
