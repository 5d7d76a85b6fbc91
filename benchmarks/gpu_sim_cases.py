"""The GPU validation suite's cases: real vLLM on the lent H200 against `servepilot sim`.

Each engine config is served once (`servepilot up`, dummy weights); each *run* is one
`servepilot bench` invocation, whose levels (a --concurrency or --rate list) are the cases.
Every run is measured twice (the second measurement gives the floor: how far the same case
moves between two measurements on a quiet, dedicated host).

The split is fixed here, before the first judged run: a case is `calibration` (anything may be
fitted to it: the step model's host time, the chunked-prefill mix, MoE and MLA terms) or
`validation` (judged only: nothing is fitted to it). Calibration is, per model, the closed loop
at concurrency 1 and 64 over 1,000-token prompts and one long prompt at concurrency 1; every
other level is validation.

Long-tailed lengths come from a seeded trace (`longtail_trace`): prompt and answer lengths are
log-normal with the medians and sigmas stated in LONGTAIL (ShareGPT-like: most prompts short,
a tail to several thousand tokens), clipped to the model's length, with Poisson arrivals.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DUMMY = {"weights": "dummy"}
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-8b": {"model": {"source": "llama-3.1-8b", **DUMMY},
                 "engine": {"max_model_len": 33792}},
    "llama-8b-fp8": {"model": {"source": "llama-3.1-8b", **DUMMY},
                     "engine": {"max_model_len": 8192, "quantization": "fp8"}},
    # Knobs `tune` explores: a small batch and a small prefill chunk.
    "llama-8b-knobs": {"model": {"source": "llama-3.1-8b", **DUMMY},
                       "engine": {"max_model_len": 8192, "max_num_seqs": 64,
                                  "max_num_batched_tokens": 2048}},
    "qwen2.5-32b": {"model": {"source": "qwen2.5-32b", **DUMMY},
                    "engine": {"max_model_len": 32768}},
    "deepseek-v2-lite": {"model": {"source": "deepseek-v2-lite", **DUMMY},
                         "engine": {"max_model_len": 16384}},
}  # fmt: skip
PROFILES = {"llama-8b": ("llama-3.1-8b", "bf16"), "llama-8b-fp8": ("llama-3.1-8b", "fp8"),
            "llama-8b-knobs": ("llama-3.1-8b", "bf16"), "qwen2.5-32b": ("qwen2.5-32b", "bf16"),
            "deepseek-v2-lite": ("deepseek-v2-lite", "bf16")}  # fmt: skip
"""The operator profile each config is predicted from: (model, dtype) of `servepilot profile`."""

LONGTAIL = {"input_median_tokens": 600, "input_sigma": 1.0, "input_min_tokens": 64,
            "output_median_tokens": 180, "output_sigma": 0.8, "output_min_tokens": 8,
            "output_max_tokens": 1024}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Run:
    """One bench invocation: its levels are cases."""

    config: str
    name: str
    flags: tuple[str, ...]
    levels: tuple[str, ...]
    """The --concurrency or --rate values, one case each (with `trace`: the trace's rate)."""
    calibration: tuple[str, ...] = ()
    """The levels fitted on; the others are judged."""
    trace: dict[str, Any] | None = None
    """A long-tailed trace: {"rate_rps": R, "requests": N, "seed": S, "max_total": T}."""

    def case_names(self) -> list[str]:
        return [f"{self.config}/{self.name}@{level}" for level in self.levels]

    def case_set(self, level: str) -> str:
        return "calibration" if level in self.calibration else "validation"

    def bench_flags(self, trace_path: Path | None) -> list[str]:
        flags = list(self.flags)
        if self.trace is not None:
            assert trace_path is not None
            # A trace replays at its own timestamps only in an open loop: --rate turns it on
            # (its value then only names the level).
            return [*flags, "--workload", "trace", "--trace", str(trace_path),
                    "--requests", str(self.trace["requests"]),
                    "--rate", f"{self.trace['rate_rps']:g}"]  # fmt: skip
        key = "--rate" if self.name.startswith("open") else "--concurrency"
        return [*flags, key, ",".join(self.levels)]


def _closed(config: str, name: str, levels: str, requests: int, inp: int, out: int,
            calibration: tuple[str, ...] = ()) -> Run:  # fmt: skip
    flags = ("--requests", str(requests), "--input-tokens", str(inp), "--output-tokens", str(out))
    return Run(config, name, (*flags, "--warmup", "1"), tuple(levels.split(",")), calibration)


def _open(config: str, name: str, levels: str, requests: int, inp: int, out: int) -> Run:
    flags = ("--requests", str(requests), "--input-tokens", str(inp), "--output-tokens", str(out))
    return Run(config, name, flags, tuple(levels.split(",")))


def _prefix(config: str, concurrency: int, requests: int, prefix: int, inp: int) -> Run:
    flags = ("--workload", "shared_prefix", "--prefix-tokens", str(prefix), "--num-prefixes",
             "4", "--input-tokens", str(inp), "--output-tokens", "128", "--requests",
             str(requests), "--warmup", "1")  # fmt: skip
    return Run(config, f"prefix{prefix}", flags, (str(concurrency),))


def _longtail(config: str, rate: float, requests: int, seed: int, max_total: int) -> Run:
    trace = {"rate_rps": rate, "requests": requests, "seed": seed, "max_total": max_total}
    return Run(config, f"longtail-s{seed}", (), (f"{rate:g}",), trace=trace)


def _model_runs(config: str, *, big: bool, max_len: int) -> list[Run]:
    """The runs of one model; `big` (a 32B model) halves the request counts."""
    k = 2 if big else 1
    longest = min(32000, max_len - 200)
    return [
        _closed(config, "closed-short", "1,4", 8, 1000, 200, calibration=("1",)),
        _closed(config, "closed-mid", "16,64", 128 // k, 1000, 200, calibration=("64",)),
        _closed(config, "closed-high", "256,512", 512 // k, 1000, 200),
        _closed(config, "closed-chat", "8,32", 32, 300, 400),
        _open(config, "open-low", "5,20", 80 // k, 1000, 200),
        _open(config, "open-high", "60,150", 480 // k, 1000, 200),
        _longtail(config, 20.0 / k, 300 // k, 1, max_len),
        _longtail(config, 60.0 / k, 400 // k, 2, max_len),
        _closed(config, "long4k", "1,8", 8, 4000, 128),
        _closed(config, "long-max", "1,4", 4, longest, 64, calibration=("1",)),
        _prefix(config, 32, 256 // k, 3000, 3500),
    ]


def _variant_runs(config: str) -> list[Run]:
    return [
        _closed(config, "closed-short", "1,4", 8, 1000, 200),
        _closed(config, "closed-mid", "16,64", 128, 1000, 200, calibration=("16",)),
        _closed(config, "closed-high", "256", 512, 1000, 200),
        _open(config, "open-high", "40,120", 400, 1000, 200),
        _longtail(config, 30.0, 300, 3, 8192),
        _closed(config, "long4k", "1,8", 8, 4000, 128),
    ]


RUNS: list[Run] = [
    *_model_runs("llama-8b", big=False, max_len=33792),
    *_model_runs("qwen2.5-32b", big=True, max_len=32768),
    *_model_runs("deepseek-v2-lite", big=False, max_len=16384),
    *_variant_runs("llama-8b-fp8"),
    *_variant_runs("llama-8b-knobs"),
]


def cases() -> list[tuple[str, str]]:
    """(case name, set) of every case, in run order."""
    return [(name, run.case_set(level)) for run in RUNS
            for name, level in zip(run.case_names(), run.levels, strict=True)]  # fmt: skip


def longtail_trace(rate_rps: float, requests: int, seed: int, max_total: int) -> list[str]:
    """The seeded long-tailed trace's JSONL lines (LONGTAIL's distributions, Poisson arrivals
    at `rate_rps`); prompt + answer never exceed `max_total` tokens."""
    rng = random.Random(f"gpu-longtail/{seed}")
    spec = LONGTAIL
    at_s, lines = 0.0, []
    for _ in range(requests):
        out = int(spec["output_median_tokens"] * math.exp(rng.gauss(0, spec["output_sigma"])))
        out = min(max(out, spec["output_min_tokens"]), spec["output_max_tokens"])
        inp = int(spec["input_median_tokens"] * math.exp(rng.gauss(0, spec["input_sigma"])))
        inp = min(max(inp, spec["input_min_tokens"]), max_total - out - 64)
        lines.append(json.dumps({"timestamp": round(at_s, 4), "input_tokens": inp,
                                 "output_tokens": out}))  # fmt: skip
        at_s += rng.expovariate(rate_rps)
    return lines


if __name__ == "__main__":
    rows = cases()
    print(f"{len(rows)} cases: {sum(s == 'calibration' for _, s in rows)} calibration, "
          f"{sum(s == 'validation' for _, s in rows)} validation")  # fmt: skip
    for name, which in rows:
        print(f"  {which:11s} {name}")
