"""How long a busy engine's full prefill steps take, read from its tokens' arrival times.

When more prompts wait than one step's token budget holds (a burst at a closed loop's start),
vLLM fills every step to its budget: the running requests' decodes, then as many waiting
prompts as fit. Each such step hands out one token to every decoder and the first token of
each prompt it finished, so the first tokens come in groups, one group a step, and the time
between two groups is a full step's time. The simulator's step model composes the same step
from the profile's operators (`plan.gpu_profile.compose`); where the two differ, the
operators missed part of vLLM's prefill path (the GPU suite found DeepSeek-V2-Lite's
8,192-token steps taking about 90 ms where its operators compose 70).

Read from bench's `--token-times` (`chunk_s` per request, `sent_s`).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

FULL_SHARE: Final = 0.75
"""A group counts as a full step's when it holds at least this share of the largest group's
first tokens (a step whose budget was full: the ramp's last, part-empty step is not)."""


@dataclass(frozen=True, slots=True)
class FullStep:
    period_s: float
    """From the group of first tokens before to this step's group."""
    prompts: int
    """First tokens in this step's group: the prompts it finished."""
    decoders: int
    """Requests decoding when the step before handed out its tokens."""


def full_steps(requests: Sequence[tuple[float, Sequence[float]]]) -> list[FullStep]:
    """The full prefill steps of one load level: each request is (sent_s, its tokens' arrival
    times). The time between two groups of first tokens is taken as a full step's when both
    groups hold at least `FULL_SHARE` of the largest group's first tokens, and a prompt sent
    before the step was scheduled was still waiting after it (so its budget was full)."""
    firsts = sorted(times[0] for _, times in requests if times)
    gaps = [b - a for _, times in requests for a, b in itertools.pairwise(times)]
    if len(firsts) < 2 or not gaps:
        return []
    apart = statistics.median(gaps) / 4  # a step's tokens stream out closer than this
    groups = [[firsts[0]]]
    for t in firsts[1:]:
        if t - groups[-1][-1] > apart:
            groups.append([])
        groups[-1].append(t)
    largest = max(len(g) for g in groups)
    steps = []
    for before, group in itertools.pairwise(groups):
        # Both ends full: the burst's first groups wait for the API server to take the
        # prompts in (a few ms each), not for the engine.
        if min(len(before), len(group)) < FULL_SHARE * largest:
            continue
        at, end = before[-1], group[-1]
        # Left over: sent before this step was scheduled, not finished by it.
        if not any(sent < at and times and times[0] > end for sent, times in requests):
            continue
        decoders = sum(1 for _, times in requests if times and times[0] <= at < times[-1])
        steps.append(FullStep(group[0] - before[0], len(group), decoders))
    return steps
