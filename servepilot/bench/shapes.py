"""A workload's requests as token counts only: what the simulator needs, without prompt text.

`workload_shapes(spec, n)` gives, request for request, the sizes `build_workload(spec,
tokenizer, n)` sends: the same seeds and the same layout streams, so a simulation and a
measurement of one workload see the same lengths, prefix groups, priorities and sessions.
Building text costs a tokenizer pass per prompt; shapes cost nothing, so the simulator can
take millions.

Sizes are what the workload asked for (`input_tokens`); the server adds its chat template or
BOS, and for a conversation the earlier turns, on top (see `history_tokens`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.bench.workload import (
    WorkloadKind,
    WorkloadSpec,
    label_requests,
    mixed_lengths,
    shared_prefix_groups,
    turn_order,
)
from servepilot.core.errors import ConfigError
from servepilot.load.trace import TraceLine, load_trace


@dataclass(frozen=True, slots=True)
class RequestShape:
    index: int
    input_tokens: int
    """The new prompt tokens (multi_turn: this turn's user message)."""
    output_tokens: int
    history_tokens: int = 0
    """multi_turn: tokens of the earlier turns sent before the prompt (user + reply each)."""
    history_messages: int = 0
    """multi_turn: how many earlier messages, each of which the chat template wraps."""
    prefix_group: int | None = None
    prefix_tokens: int = 0
    """Tokens at the start shared with the other requests of `prefix_group`."""
    at_s: float | None = None
    priority: int | None = None
    session_id: str | None = None


def workload_shapes(spec: WorkloadSpec, count: int) -> list[RequestShape]:
    if count < 0:
        raise ConfigError(f"--requests must be at least 0, got {count}")
    layout = random.Random(f"{spec.seed}/layout")
    out = spec.output_tokens
    match spec.kind:
        case WorkloadKind.RANDOM:
            shapes = [RequestShape(i, spec.input_tokens, out) for i in range(count)]
        case WorkloadKind.MIXED:
            lengths = mixed_lengths(spec, count, layout)
            shapes = [RequestShape(i, n, out) for i, n in enumerate(lengths)]
        case WorkloadKind.SHARED_PREFIX:
            groups = shared_prefix_groups(spec, count, layout)
            shapes = [
                RequestShape(
                    i,
                    spec.input_tokens,
                    out,
                    prefix_group=g,
                    prefix_tokens=spec.shared_prefix_tokens,
                )
                for i, g in enumerate(groups)
            ]
        case WorkloadKind.MULTI_TURN:
            shapes = _multi_turn(spec, count)
        case WorkloadKind.TRACE:
            assert spec.trace_path is not None  # checked by WorkloadSpec
            shapes = _trace(spec, load_trace(spec.trace_path)[:count])
    return label_requests(spec, shapes)


def _multi_turn(spec: WorkloadSpec, count: int) -> list[RequestShape]:
    per_turn = spec.input_tokens + spec.output_tokens
    shapes = []
    for i, (session, turn) in enumerate(turn_order(spec, count)):
        history = turn * per_turn
        shapes.append(
            RequestShape(
                i, spec.input_tokens, spec.output_tokens,
                history_tokens=history, history_messages=2 * turn,
                # The conversation so far is a prefix the server can have cached.
                prefix_group=session if turn else None, prefix_tokens=history,
                session_id=f"conv-{spec.seed}-{session}",
            )
        )  # fmt: skip
    return shapes


def _trace(spec: WorkloadSpec, lines: Sequence[TraceLine]) -> list[RequestShape]:
    prefix_len: dict[int, int] = {}
    for line in lines:
        if line.prefix_group is not None:
            shortest = min(prefix_len.get(line.prefix_group, line.input_tokens), line.input_tokens)
            prefix_len[line.prefix_group] = min(spec.shared_prefix_tokens, shortest)
    start_s = lines[0].timestamp_s if lines else 0.0
    return [
        RequestShape(
            i, line.input_tokens, line.output_tokens,
            prefix_group=line.prefix_group,
            prefix_tokens=0 if line.prefix_group is None else prefix_len[line.prefix_group],
            at_s=line.timestamp_s - start_s, priority=line.priority,
        )
        for i, line in enumerate(lines)
    ]  # fmt: skip
