"""The engine's steps under load, read from every token's arrival (`bench --token-times`):
how long vLLM takes between two outputs, by what the step carried (issue 34).

vLLM streams one token a step to every request it is decoding, so the tokens a step produced
reach the client together. A step's *emission* is the group of chunks that arrived before
any request got a second one (one token a request a step; a chunk that carries two tokens,
vLLM's output collector merging a slow stream's, only hides a step from that request). Per
emission: when it came (the median of its chunks), how many requests got a token, and how
many of those were first tokens (a prefill finished in that step).

The table groups the gaps between emissions by the first tokens the emission carried and
the one after it carried: with async scheduling vLLM launches step k+1 before it hands out
step k's tokens, so a step whose launch is slow (one too large for a CUDA graph, launched
kernel by kernel) delays the tokens of the step before it, too.

    python benchmarks/gpu_step_times.py benchmarks/gpu_runs/<loan>/deepseek-v2-lite/closed-mid/rep1
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from servepilot.bench.token_times import FILE_NAME, read_token_times


@dataclass(frozen=True, slots=True)
class Emission:
    at_s: float
    tokens: int
    first_tokens: int


def emissions(lines: list[dict[str, object]], level: float) -> list[Emission]:
    """The level's emissions, in time order (warm-up requests left out)."""
    chunks: list[tuple[float, int, bool]] = []
    for line in lines:
        if line["load_value"] != level or line["warmup"]:
            continue
        times = line["chunk_s"]
        assert isinstance(times, list)
        index = int(line["index"])  # type: ignore[call-overload]
        chunks += [(float(t), index, i == 0) for i, t in enumerate(times)]
    chunks.sort()
    found: list[Emission] = []
    group: list[tuple[float, int, bool]] = []
    seen: set[int] = set()
    for chunk in chunks:
        if chunk[1] in seen:
            found.append(_emission(group))
            group, seen = [], set()
        group.append(chunk)
        seen.add(chunk[1])
    if group:
        found.append(_emission(group))
    return found


def _emission(group: list[tuple[float, int, bool]]) -> Emission:
    return Emission(statistics.median(t for t, _, _ in group), len(group),
                    sum(first for _, _, first in group))  # fmt: skip


BANDS = ((0, "0"), (1, "1"), (4, "2-4"))


def _band(first_tokens: int) -> str:
    return next((name for most, name in BANDS if first_tokens <= most), "5+")


def gap_table(found: list[Emission]) -> dict[tuple[str, str], list[float]]:
    """Gaps (ms) before each emission, by (first tokens it carried, first tokens the next
    one carried)."""
    table: dict[tuple[str, str], list[float]] = defaultdict(list)
    for prev, cur, nxt in zip(found, found[1:], found[2:], strict=False):
        key = (_band(cur.first_tokens), _band(nxt.first_tokens))
        table[key].append((cur.at_s - prev.at_s) * 1000.0)
    return table


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(folder: Path) -> str:
    lines = read_token_times(folder / FILE_NAME)
    levels = sorted({float(line["load_value"]) for line in lines})  # type: ignore[arg-type]
    out = [f"{folder}"]
    for level in levels:
        found = emissions(lines, level)
        tokens = [e.tokens for e in found]
        out.append(f"  level {level:g}: {len(found)} emissions, tokens a emission median "
                   f"{statistics.median(tokens):.0f}")  # fmt: skip
        out.append("    firsts here / next   n     gap p10   p50   p90 ms")
        for (here, nxt), gaps in sorted(gap_table(found).items()):
            out.append(f"    {here:>5s} / {nxt:<5s} {len(gaps):5d}  {_pct(gaps, 0.1):7.1f} "
                       f"{_pct(gaps, 0.5):5.1f} {_pct(gaps, 0.9):5.1f}")  # fmt: skip
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="bench --out folders")
    args = parser.parse_args()
    for folder in args.folders:
        print(report(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
