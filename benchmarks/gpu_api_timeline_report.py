"""Where a request's time goes inside vLLM's API server, from a GPU loan's API timeline.

`gpu_api_timeline/` is a vLLM plugin that stamps each request at five points of vLLM's API
server and engine core (`servepilot_api_timeline.py` says which). With it loaded,
`gpu_sim_validate.py` measured a config's runs; this report joins the stamps to bench's
requests and prints, per run and level, the mean / median of each stage of a TTFT:

    sent -> create        bench, the gateway, uvicorn and the request's parsing
    create -> render      the chat template and the tokenizer (one thread, in batches)
    render -> add_in      the event loop hands the request on
    add_out -> queued     the engine core reads it in (between its steps)
    queued -> scheduled   the engine's queue
    scheduled -> first    its prefill, to the end of the step with its first token
    first -> processed    the output processor takes the token
    processed -> chunk    the stream generator yields it
    chunk -> client       the way back (the gateway's relay, or none)

and the tokenizer's batches: their size and time against the streaming beside them (the
output processor's tokens a second in that window), from which the fleet simulator's intake
(`FleetReplica.intake_batch`) is set; with `--steps RUN@LEVEL`, the engine's steps while that
level ran, on its core's clock, by the first tokens and outputs they carried.

    python benchmarks/gpu_api_timeline_report.py benchmarks/gpu_runs/2026-12-07-api-timeline-h100 \
        [--steps open-high/rep1@40]

Requests are matched to bench's in order: vLLM's stamps sorted by `create`, bench's runs in
the order measured (the summary's, warm-ups first), each run's levels in order, each level's
requests by send time.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import itertools
import json
import statistics
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

STAGES = [
    ("sent", "create"),
    ("create", "render"),
    ("render", "add_in"),
    ("add_out", "queued"),
    ("queued", "scheduled"),
    ("scheduled", "first_engine"),
    ("first_engine", "first_proc"),
    ("first_proc", "first_chunk"),
    ("first_chunk", "client"),
]
WARMUPS = ("warmup0", "warmup1")
SAME_BATCH_S = 0.0015
"""Renders this close together came out of one tokenizer batch."""

Stamps = dict[str, float]


def read_timeline(lines: Iterable[str]) -> tuple[list[Stamps], list[dict[str, Any]]]:
    """(each request's stamps, joined by its id, that reached its first chunk; the output
    processor's calls). The engine core's ids carry a suffix of vLLM's own ("-xxxxxxxx")."""
    stamps: dict[str, Stamps] = defaultdict(dict)
    calls = []
    for line in lines:
        record = json.loads(line)
        if "po" in record:
            calls.append(record)
            continue
        rid = record.pop("rid", None)
        if rid is None:
            continue
        if "queued" in record or "first_engine" in record:
            rid = rid.rsplit("-", 1)[0]
        for key, value in record.items():
            if value is not None:
                stamps[rid].setdefault(key, value)
    joined = [s for s in stamps.values() if "create" in s and "first_chunk" in s]
    return sorted(joined, key=lambda s: s["create"]), calls


def match(folder: Path, config: str, requests: list[Stamps]) -> dict[str, list[Stamps]]:
    """Each measured level's requests (warm-ups left out), by "run/repN@level", with bench's
    send and first-token times moved onto vLLM's clock (per level, by its first request)."""
    summary = json.loads(next(folder.glob("summary-*.json")).read_text())
    runs = next(item for item in summary if item["config"] == config)["runs"]
    names = list(WARMUPS) + [
        f"{r['run']}{'-direct' if r.get('direct') else ''}/rep{r['rep']}" for r in runs
    ]
    out: dict[str, list[Stamps]] = {}
    at = 0
    for name in names:
        rows = _requests(folder / config / name)
        levels: list[str] = []
        for row in rows:
            if row["load_value"] not in levels:
                levels.append(row["load_value"])
        rows.sort(key=lambda r: (levels.index(r["load_value"]), float(r["sent_s"])))
        chunk, at = requests[at : at + len(rows)], at + len(rows)
        if len(chunk) < len(rows):
            raise SystemExit(f"{name}: {len(rows)} requests in bench, {len(chunk)} left in vLLM's")
        offsets: dict[str, float] = {}
        for row, stamp in zip(rows, chunk, strict=True):
            level = row["load_value"]
            offset = offsets.setdefault(level, stamp["create"] - float(row["sent_s"]))
            if name in WARMUPS or row["warmup"] == "true" or row["ok"] != "true":
                continue
            sent = float(row["sent_s"]) + offset
            joined = {**stamp, "sent": sent, "client": sent + float(row["ttft_ms"]) / 1e3}
            out.setdefault(f"{name}@{level}", []).append(joined)
    return out


def _requests(run: Path) -> list[dict[str, str]]:
    plain = run / "requests.csv"
    text = plain.read_text() if plain.exists() else gzip.decompress(
        (run / "requests.csv.gz").read_bytes()).decode()  # fmt: skip
    return list(csv.DictReader(io.StringIO(text)))


def stage_table(levels: dict[str, list[Stamps]]) -> str:
    head = f"{'run@level (mean/median ms)':34s}" + "".join(f"{b[:12]:>14s}" for _, b in STAGES)
    lines = [head + f"{'client TTFT':>14s}"]
    for name, rows in levels.items():
        cells = [_mean_median([(r[b] - r[a]) * 1e3 for r in rows if a in r and b in r])
                 for a, b in STAGES]  # fmt: skip
        ttft = _mean_median([(r["client"] - r["sent"]) * 1e3 for r in rows])
        lines.append(f"{name:34s}" + "".join(f"{c:>14s}" for c in cells) + f"{ttft:>14s}")
    return "\n".join(lines)


def _mean_median(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.mean(values):.1f}/{statistics.median(values):.1f}"


def batches(requests: list[Stamps], calls: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """The tokenizer's batches, in order: (requests, seconds from its start, the output
    processor's tokens a second meanwhile). A batch starts when the one before it ended or
    its first request came, whichever is later."""
    by_render = sorted(requests, key=lambda s: s["render"])
    groups: list[list[Stamps]] = []
    for stamp in by_render:
        if groups and stamp["render"] - groups[-1][-1]["render"] < SAME_BATCH_S:
            groups[-1].append(stamp)
        else:
            groups.append([stamp])
    calls = sorted(calls, key=lambda c: c["po"])
    out, last_end = [], 0.0
    for group in groups:
        end = group[-1]["render"]
        start = max(last_end, min(s["create"] for s in group))
        if end > start:
            tokens = sum(c["n"] for c in calls if start <= c["po"] < end)
            out.append((len(group), end - start, tokens / (end - start)))
        last_end = end
    return out


def warmups(folder: Path, config: str, requests: list[Stamps]) -> list[Stamps]:
    """The warm-up bursts' requests (the first measured, before any run's)."""
    count = sum(len(_requests(folder / config / name)) for name in WARMUPS)
    return requests[:count]


def idle_cost(rows: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(seconds for a batch of one prompt, seconds more for each further prompt): the median
    of the one-prompt batches, and the least-squares slope over all of them."""
    one = statistics.median(took for n, took, _ in rows if n == 1)
    sizes = [n - 1 for n, _, _ in rows]
    took = [t for _, t, _ in rows]
    mean_n, mean_t = statistics.mean(sizes), statistics.mean(took)
    spread = sum((n - mean_n) ** 2 for n in sizes)
    more = sum((n - mean_n) * (t - mean_t) for n, t in zip(sizes, took, strict=True)) / spread
    return one, more


def slowdown_table(
    rows: list[tuple[int, float, float]], idle: tuple[float, float], s_per_token: float
) -> str:
    """Each batch's time over its idle cost (`idle_cost`), by the share of the API server the
    streaming beside it took (tokens a second x `s_per_token`), a tenth at a time."""
    one, more = idle
    cells: dict[float, list[float]] = defaultdict(list)
    for n, took, rate in rows:
        share = rate * s_per_token
        if 0.05 <= share < 0.9:
            cells[round(share, 1)].append(took / (one + more * (n - 1)))
    lines = [f"{'share':>6s} {'batches':>8s} {'slowdown':>9s} {'1/(1-s)':>8s} {'1/(1-s)^2':>10s}"]
    for share, ratios in sorted(cells.items()):
        lines.append(f"{share:6.1f} {len(ratios):8d} {statistics.median(ratios):9.2f} "
                     f"{1 / (1 - share):8.2f} {1 / (1 - share) ** 2:10.2f}")  # fmt: skip
    return "\n".join(lines)


def batch_table(rows: list[tuple[int, float, float]]) -> str:
    sizes = [(1, 1), (2, 3), (4, 8), (9, 16), (17, 32)]
    rates = [(0, 2000), (2000, 6000), (6000, 10000), (10000, 20000)]
    lines = [f"{'batch':>6s} " + "".join(f"{f'{lo}-{hi} tok/s':>18s}" for lo, hi in rates)]
    for low, high in sizes:
        cells = []
        for lo, hi in rates:
            took = [s * 1e3 for n, s, r in rows if low <= n <= high and lo <= r < hi]
            cells.append(f"{statistics.median(took):.1f} ms ({len(took)})" if took else "-")
        lines.append(f"{f'{low}-{high}':>6s} " + "".join(f"{c:>18s}" for c in cells))
    return "\n".join(lines)


def engine_steps(rows: list[Stamps], calls: list[dict[str, Any]]) -> list[tuple[int, int, float]]:
    """The engine's steps while a level's requests (`rows`) ran, on the engine core's clock:
    (first tokens in the step, outputs in it, seconds since the step before's outputs). With
    async scheduling the next step is launched before a step's outputs are out, so a gap is a
    step's time once the engine is busy."""
    low = min(r["create"] for r in rows)
    high = max(r["client"] for r in rows)
    outputs: dict[float, int] = defaultdict(int)
    for call in calls:
        if low <= call["po"] <= high and call["ts"] is not None:
            outputs[call["ts"]] += call["n"]
    firsts: dict[float, int] = defaultdict(int)
    for row in rows:
        firsts[row["first_engine"]] += 1
    stamps = sorted(outputs)
    return [(firsts[b], outputs[b], b - a) for a, b in itertools.pairwise(stamps)]


def step_table(steps: list[tuple[int, int, float]]) -> str:
    """Median step time (count) by first tokens in the step and outputs, 50 at a time."""
    cells: dict[tuple[int, int], list[float]] = defaultdict(list)
    for prefills, outputs, gap_s in steps:
        cells[(min(prefills, 3), outputs // 50 * 50)].append(gap_s * 1e3)
    lines = [f"{'first tokens':>12s} {'outputs':>9s} {'steps':>6s} {'median ms':>10s}"]
    for (prefills, low), gaps in sorted(cells.items()):
        if len(gaps) >= 8:
            name = f"{prefills}+" if prefills == 3 else str(prefills)
            lines.append(f"{name:>12s} {f'{low}-{low + 49}':>9s} {len(gaps):6d} "
                         f"{statistics.median(gaps):10.1f}")  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--config", default="llama-8b-fp8")
    parser.add_argument(
        "--steps",
        action="append",
        default=[],
        metavar="RUN@LEVEL",
        help="also print the engine's step times while that level ran (e.g. open-high/rep1@40)",
    )
    parser.add_argument(
        "--us-per-token",
        type=float,
        default=30.6,
        help="the API server's time per streamed token, for the streaming's share (default: "
        "the eleventh loan's host, read from its token arrivals)",
    )
    args = parser.parse_args()
    with gzip.open(args.folder / "timeline" / "api.jsonl.gz", "rt") as lines:
        requests, calls = read_timeline(lines)
    levels = match(args.folder, args.config, requests)
    print(stage_table(levels))
    for name in args.steps:
        if name not in levels:
            raise SystemExit(f"--steps {name}: not a measured level ({', '.join(levels)})")
        print(f"\nthe engine's steps during {name} (its core's clock)")
        print(step_table(engine_steps(levels[name], calls)))
    print("\nthe tokenizer's batches: median time (count), by size and the streaming beside them")
    found = batches(requests, calls)
    print(batch_table(found))
    warm = batches(warmups(args.folder, args.config, requests), calls)
    idle = idle_cost(warm)
    print(f"\nthe warm-up bursts' {len(warm)} batches: one prompt {idle[0] * 1e3:.1f} ms "
          f"(median), {idle[1] * 1e3:.2f} ms more a further one (least squares)")  # fmt: skip
    print(f"each batch over that, by the streaming's share of the server at "
          f"{args.us_per_token} us a streamed token:")  # fmt: skip
    print(slowdown_table(found, idle, args.us_per_token / 1e6))
    return 0


if __name__ == "__main__":
    sys.exit(main())
