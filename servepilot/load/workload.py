"""What a workload is: its kind and parameters, the `servepilot bench` workload flags.

The spec says what to send; `load.shapes` lays it out as token counts (what the simulator
needs) and `bench.workload` builds prompt text on that layout (what a real client sends), from
the same seeded streams. Kinds:
- random: every prompt `input_tokens` long.
- mixed: short and long prompts mixed: exactly round(count x long_fraction) of them are
  `long_input_tokens` long (by default 4 x input_tokens), at seeded places.
- shared_prefix: `num_prefixes` prefixes of `prefix_tokens` tokens, each followed by its own
  suffix up to `input_tokens` in all; with count = N x M, N prefixes x M suffixes.
- multi_turn: conversations of `turns` turns; each turn carries the earlier ones (user prompt,
  then a synthetic assistant reply of `output_tokens` tokens) as history, so the history is a
  prefix the server can cache. `active_sessions` conversations are interleaved turn by turn.
- agentic: sessions of an agent and its user (see agentic.py): shared system prompts, a
  context that grows by the previous answer and a new user or tool message each turn, waits
  between an answer and the next turn, sessions that leave and come back. The load level
  counts sessions: `concurrency` of them live at a time, or `rate` new ones a second.
- trace: replay of a JSONL trace (see trace.py) at its timestamps.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servepilot.core.errors import ConfigError
from servepilot.load.agentic import AgenticSpec
from servepilot.load.trace import PRIORITIES


class WorkloadKind(enum.StrEnum):
    RANDOM = "random"
    MIXED = "mixed"
    SHARED_PREFIX = "shared_prefix"
    MULTI_TURN = "multi_turn"
    AGENTIC = "agentic"
    TRACE = "trace"


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What to send. Each field names the `servepilot bench` flag it comes from."""

    kind: WorkloadKind = WorkloadKind.RANDOM
    input_tokens: int = 512
    """--input-tokens: prompt length (shared_prefix: prefix included; multi_turn: per turn;
    agentic: each user message)."""
    output_tokens: int = 128
    """--output-tokens: max_tokens of every request, and the length of synthetic replies."""
    seed: int = 0
    """--seed: prompts, mixes and draws all follow from it."""
    long_fraction: float = 0.2
    """--long-fraction (mixed): share of long prompts."""
    long_input_tokens: int | None = None
    """--long-input-tokens (mixed): length of the long prompts; None means 4 x input_tokens."""
    num_prefixes: int = 8
    """--num-prefixes (shared_prefix)."""
    prefix_tokens: int | None = None
    """--prefix-tokens (shared_prefix, trace prefix groups); None means 3/4 of input_tokens."""
    turns: int = 4
    """--turns (multi_turn, agentic): turns per conversation."""
    active_sessions: int = 16
    """--active-sessions (multi_turn): conversations interleaved at a time."""
    trace_path: Path | None = None
    """--trace (trace): the JSONL file to replay."""
    priority_mix: Mapping[int, float] | None = None
    """--priority-mix: weight of each X-Priority class (0, 1, 2), drawn per request."""
    sessions: int | None = None
    """--sessions: spread requests over this many X-Session-Id values (not multi_turn,
    where every conversation is its own session)."""
    agentic: AgenticSpec = field(default_factory=AgenticSpec)
    """The agentic workload's own flags."""

    def __post_init__(self) -> None:
        _at_least(self.input_tokens, 1, "--input-tokens")
        _at_least(self.output_tokens, 1, "--output-tokens")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ConfigError(f"--long-fraction must be in [0, 1], got {self.long_fraction}")
        _at_least(self.long_tokens, 1, "--long-input-tokens")
        _at_least(self.num_prefixes, 1, "--num-prefixes")
        _at_least(self.shared_prefix_tokens, 1, "--prefix-tokens")
        if (
            self.kind is WorkloadKind.SHARED_PREFIX
            and self.shared_prefix_tokens >= self.input_tokens
        ):
            raise ConfigError(
                f"--prefix-tokens ({self.shared_prefix_tokens}) must be less than "
                f"--input-tokens ({self.input_tokens}): the prompt is prefix plus suffix"
            )
        _at_least(self.turns, 1, "--turns")
        _at_least(self.active_sessions, 1, "--active-sessions")
        if self.kind is WorkloadKind.TRACE and self.trace_path is None:
            raise ConfigError("--workload trace needs --trace FILE")
        if self.priority_mix is not None:
            _check_priority_mix(self.priority_mix)
        if self.sessions is not None:
            _at_least(self.sessions, 1, "--sessions")
            if self.kind in (WorkloadKind.MULTI_TURN, WorkloadKind.AGENTIC):
                raise ConfigError(
                    f"--sessions does not apply to --workload {self.kind}: "
                    "every conversation is its own session"
                )

    @property
    def long_tokens(self) -> int:
        return 4 * self.input_tokens if self.long_input_tokens is None else self.long_input_tokens

    @property
    def shared_prefix_tokens(self) -> int:
        if self.prefix_tokens is not None:
            return self.prefix_tokens
        return max(1, 3 * self.input_tokens // 4)


def describe(spec: WorkloadSpec) -> dict[str, Any]:
    """The results file's "workload" section: every parameter that shaped the requests."""
    out: dict[str, Any] = {"kind": str(spec.kind), "seed": spec.seed}
    if spec.kind is not WorkloadKind.TRACE:
        out |= {"input_tokens": spec.input_tokens, "output_tokens": spec.output_tokens}
    match spec.kind:
        case WorkloadKind.MIXED:
            out |= {"long_fraction": spec.long_fraction, "long_input_tokens": spec.long_tokens}
        case WorkloadKind.SHARED_PREFIX:
            out |= {"num_prefixes": spec.num_prefixes, "prefix_tokens": spec.shared_prefix_tokens}
        case WorkloadKind.MULTI_TURN:
            out |= {"turns": spec.turns, "active_sessions": spec.active_sessions}
        case WorkloadKind.AGENTIC:
            out |= {"turns": spec.turns, **spec.agentic.describe()}
        case WorkloadKind.TRACE:
            out |= {"trace": str(spec.trace_path), "prefix_tokens": spec.shared_prefix_tokens}
        case WorkloadKind.RANDOM:
            pass
    if spec.priority_mix is not None:
        out["priority_mix"] = {str(k): v for k, v in sorted(spec.priority_mix.items())}
    if spec.sessions is not None:
        out["sessions"] = spec.sessions
    return out


def parse_priority_mix(text: str) -> dict[int, float]:
    """`0=0.2,1=0.6,2=0.2` (the --priority-mix flag) as {0: 0.2, 1: 0.6, 2: 0.2}."""
    mix: dict[int, float] = {}
    for part in text.split(","):
        key, sep, weight = part.partition("=")
        try:
            if not sep:
                raise ValueError(part)
            mix[int(key)] = float(weight)
        except ValueError as exc:
            raise ConfigError(
                f"--priority-mix {text!r}: expected CLASS=WEIGHT pairs like 0=0.2,1=0.6,2=0.2"
            ) from exc
    _check_priority_mix(mix)
    return mix


def _check_priority_mix(mix: Mapping[int, float]) -> None:
    for cls, weight in mix.items():
        if cls not in PRIORITIES:
            raise ConfigError(f"--priority-mix: class {cls} is not one of 0, 1, 2")
        if not (math.isfinite(weight) and weight >= 0):
            raise ConfigError(f"--priority-mix: weight of class {cls} must be >= 0, got {weight}")
    if not mix or sum(mix.values()) <= 0:
        raise ConfigError("--priority-mix: the weights must add up to more than 0")


def _at_least(value: int, minimum: int, flag: str) -> None:
    if value < minimum:
        raise ConfigError(f"{flag} must be at least {minimum}, got {value}")
