"""The out-of-sample cases of sim_validation.py: drawn from a seed, none like calibrate's probes.

Kinds in turn: closed loop, open loop, shared prefixes on each, short/long mixes on each.
Closed-loop concurrency is stratified (1-2, 3-6, 7-16, 17-32, 33-64) so that 1-64 is covered;
open-loop rates are drawn over 0.5-10 requests/s; prompts over 16-2,048 tokens and answers
over 8-512, log-uniformly. Each case is then fitted to the replica (max_model_len, 80% of
the KV cache) and to a time budget (CASE_BUDGET_S per measurement, so the suite takes
30-40 minutes on a 2-core machine): fewer requests first, then shorter answers (long answers
at high concurrency are capped), then shorter prompts. Finally no prompt length, answer
length or (concurrency, prompt) pair may be one calibrate's probes use: `draw_cases` checks
against calibrate's own probe plan for this replica (full and quick) and raises otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from benchmarks.bench_sim import ENGINE

TEMPLATE_TOKENS = 30
"""What SmolLM2's chat template adds to every prompt (inside --input-tokens)."""
MIN_TEXT_TOKENS = 3
"""bench refuses a prompt that the template fills: the shortest prompt is 33 tokens."""
KV_TOKENS = 93_184
"""The replica's KV cache (2 GiB of this model)."""
CASE_BUDGET_S = 28.0
"""Rough wall time one measurement of a case may take (the suite's 30-40 minutes)."""
KINDS = ("closed", "open", "prefix-closed", "prefix-open", "mixed-closed", "mixed-open")


# ---- the cases ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    """One drawn case, before it becomes flags."""

    kind: str
    concurrency: int | None
    rate_rps: float | None
    input_tokens: int
    output_tokens: int
    requests: int
    long_input_tokens: int | None = None
    prefix_tokens: int | None = None
    prefixes: int | None = None

    @property
    def name(self) -> str:
        load = f"c{self.concurrency}" if self.concurrency else f"r{self.rate_rps:g}"
        extra = f"-long{self.long_input_tokens}" if self.long_input_tokens else ""
        extra += f"-pre{self.prefix_tokens}x{self.prefixes}" if self.prefix_tokens else ""
        return f"{self.kind}-{load}-in{self.input_tokens}{extra}-out{self.output_tokens}"

    def flags(self) -> tuple[str, ...]:
        out = ["--input-tokens", str(self.input_tokens), "--output-tokens",
               str(self.output_tokens), "--requests", str(self.requests)]  # fmt: skip
        out += ["--concurrency", str(self.concurrency)] if self.concurrency else []
        out += ["--rate", f"{self.rate_rps:g}"] if self.rate_rps else []
        if self.long_input_tokens:
            out += ["--workload", "mixed", "--long-input-tokens", str(self.long_input_tokens),
                    "--long-fraction", "0.25"]  # fmt: skip
        if self.prefix_tokens:
            out += ["--workload", "shared_prefix", "--prefix-tokens", str(self.prefix_tokens),
                    "--num-prefixes", str(self.prefixes)]  # fmt: skip
        return tuple(out)


def _step_s(batch: float) -> float:
    """A rough decode step of this machine (bf16 on AMX), only to size the cases."""
    return 0.05 + 0.0018 * batch


def estimated_s(shape: Shape) -> float:
    """About how long one measurement of the case takes: to keep the suite's length."""
    prompt = (shape.long_input_tokens or shape.input_tokens) + TEMPLATE_TOKENS
    prefill_s = 0.0006 * prompt
    if shape.concurrency:
        waves = math.ceil(shape.requests / shape.concurrency)
        return waves * (shape.concurrency * prefill_s + shape.output_tokens
                        * _step_s(shape.concurrency))  # fmt: skip
    assert shape.rate_rps
    return shape.requests / shape.rate_rps + shape.output_tokens * _step_s(8) + prefill_s


def probe_shapes() -> tuple[set[int], set[int], set[tuple[int, int]]]:
    """Prompt lengths, answer lengths and (decoders, prompt) pairs of calibrate's probes on
    this replica (full and quick plans)."""
    from servepilot.calibrate.probe import Limits, make_plan

    limits = Limits(ENGINE["max_num_batched_tokens"], ENGINE["max_model_len"], KV_TOKENS, 1024)
    prompts, outputs, pairs = set(), {1}, set()
    for quick in (False, True):
        plan = make_plan(limits, quick=quick)
        prompts |= set(plan.prefill_lengths)
        for wave in plan.waves:
            prompts |= {wave.prompt_tokens, *wave.injections}
            outputs.add(wave.output_tokens)
            pairs.add((wave.decoders, wave.prompt_tokens))
    return prompts, outputs, pairs


def overlaps(shape: Shape) -> list[str]:
    prompts, outputs, pairs = probe_shapes()
    found = [f"prompt {n}" for n in (shape.input_tokens, shape.long_input_tokens) if n in prompts]
    found += [f"answer {shape.output_tokens}"] if shape.output_tokens in outputs else []
    if shape.concurrency and (shape.concurrency, shape.input_tokens) in pairs:
        found.append(f"wave of {shape.concurrency} x {shape.input_tokens}")
    return found


def _avoid(value: int, taken: set[int]) -> int:
    while value in taken:
        value += 1
    return value


def _log_int(rng: random.Random, low: int, high: int) -> int:
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def draw_shape(kind: str, rng: random.Random, stratum: int) -> Shape:
    """One case of `kind`; closed-loop concurrency is stratified so 1-64 is covered."""
    prompts, outputs, _ = probe_shapes()
    low, high = ((1, 2), (3, 6), (7, 16), (17, 32), (33, 64))[stratum % 5]
    output = _avoid(_log_int(rng, 8, 512), outputs)
    prompt = _log_int(rng, 16, 2048)
    closed = kind.endswith("closed")
    concurrency = rng.randint(low, high) if closed else None
    rate = None if closed else round(math.exp(rng.uniform(math.log(0.5), math.log(10))), 2)
    long_input = prefix = prefixes = None
    if kind.startswith("mixed"):
        prompt, long_input = _log_int(rng, 16, 128), _log_int(rng, 512, 2000)
    if kind.startswith("prefix"):
        prompt = max(prompt, 128)
        prefix, prefixes = int(prompt * rng.uniform(0.5, 0.9)), rng.randint(1, 4)
    # Fit the model's length, the KV cache and the time budget: shorten the answer first
    # (long answers at high concurrency are capped), then the prompts, then the count.
    shape = Shape(kind, concurrency, rate, prompt, output, 64, long_input, prefix, prefixes)
    return _fit(shape, prompts, outputs)


def _fit(shape: Shape, prompts: set[int], outputs: set[int]) -> Shape:
    def longest(s: Shape) -> int:
        return (s.long_input_tokens or s.input_tokens) + TEMPLATE_TOKENS + s.output_tokens

    while longest(shape) > ENGINE["max_model_len"]:
        shape = dataclasses.replace(shape, output_tokens=max(8, shape.output_tokens // 2))
        if longest(shape) > ENGINE["max_model_len"]:
            shape = _scale_prompt(shape, 0.8)
    width = shape.concurrency or 16
    while width * longest(shape) > 0.8 * KV_TOKENS:
        shape = _scale_prompt(shape, 0.8)
    floor = max(8, shape.concurrency or 0)
    if shape.rate_rps:
        # Keep the open loop below saturation: answers within about 200 tokens/s.
        out = min(shape.output_tokens, max(8, int(200 / shape.rate_rps)))
        count = max(16, min(64, int(shape.rate_rps * CASE_BUDGET_S * 0.7)))
        shape = dataclasses.replace(shape, output_tokens=out, requests=count)
    while estimated_s(shape) > CASE_BUDGET_S and shape.requests > floor:
        shape = dataclasses.replace(shape, requests=max(floor, shape.requests - 8))
    while estimated_s(shape) > CASE_BUDGET_S and shape.output_tokens > 8:
        shape = dataclasses.replace(shape, output_tokens=max(8, int(shape.output_tokens * 0.8)))
    while estimated_s(shape) > CASE_BUDGET_S and shape.input_tokens > 16:
        shape = _scale_prompt(shape, 0.8)
    # --input-tokens counts the chat template, as the server does: leave the text some tokens,
    # and each shared-prefix prompt some of its own after the prefix.
    prompt = _avoid(max(shape.input_tokens, TEMPLATE_TOKENS + MIN_TEXT_TOKENS), prompts)
    prefix = shape.prefix_tokens and min(shape.prefix_tokens, prompt - TEMPLATE_TOKENS - 8)
    return dataclasses.replace(shape, input_tokens=prompt, prefix_tokens=prefix,
                               output_tokens=_avoid(shape.output_tokens, outputs),
                               long_input_tokens=shape.long_input_tokens and _avoid(
                                   shape.long_input_tokens, prompts))  # fmt: skip


def _scale_prompt(shape: Shape, factor: float) -> Shape:
    prompt = max(16, int(shape.input_tokens * factor))
    long_input = shape.long_input_tokens and max(prompt + 1, int(shape.long_input_tokens * factor))
    prefix = shape.prefix_tokens and max(8, int(shape.prefix_tokens * factor))
    return dataclasses.replace(shape, input_tokens=prompt, long_input_tokens=long_input,
                               prefix_tokens=prefix)  # fmt: skip


def draw_cases(count: int, seed: int) -> list[Shape]:
    rng = random.Random(seed)
    shapes = [draw_shape(KINDS[i % len(KINDS)], rng, i // len(KINDS) + i) for i in range(count)]
    bad = {s.name: found for s in shapes if (found := overlaps(s))}
    if bad:
        raise AssertionError(f"cases overlap calibrate's probes: {bad}")
    return shapes
