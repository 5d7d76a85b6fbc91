"""A workload laid out as token counts: the seeded layout both bench and sim send.

`workload_shapes(spec, n)` gives, request for request, the sizes of the `n` requests of a
workload: their lengths, prefix groups, conversation turns, priorities and sessions, drawn
from the seed's named streams. The simulator takes these shapes as they are (millions cost
nothing); bench (`bench.workload.build_workload`) fills the same layout, from the same
streams, with prompt text, so a simulation and a measurement see the same requests.

Sizes are what the workload asked for (`input_tokens`), as the server counts them: bench
sizes a chat message's text so the chat template is inside that count; a BOS token (on
completions) and, for a conversation, the earlier turns come on top (see `history_tokens`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

from servepilot.core.errors import ConfigError
from servepilot.load.trace import TraceLine, load_trace
from servepilot.load.workload import WorkloadKind, WorkloadSpec


class _HasLabels(Protocol):
    """A request record (RequestSpec, RequestShape): a dataclass with these two fields."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def priority(self) -> int | None: ...

    @property
    def session_id(self) -> str | None: ...


_Labelled = TypeVar("_Labelled", bound=_HasLabels)


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
    tenant: str | None = None
    """A trace's tenant (the simulated gateway's fair shares); None: the shared one."""


def workload_shapes(spec: WorkloadSpec, count: int) -> list[RequestShape]:
    """`count` requests (trace: its first `count` lines, or all when it holds fewer)."""
    check_count(count)
    layout = layout_stream(spec)
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
        case WorkloadKind.AGENTIC:
            raise agentic_has_no_list()
    return label_requests(spec, shapes)


def agentic_has_no_list() -> ConfigError:
    return ConfigError(
        "--workload agentic is no list of requests made in advance (each turn carries the "
        "answer before it): `bench` and `sim` send it session by session, this command "
        "cannot"
    )


def check_count(count: int) -> None:
    if count < 0:
        raise ConfigError(f"--requests must be at least 0, got {count}")


def layout_stream(spec: WorkloadSpec) -> random.Random:
    """The stream the layout draws from: its own, so that prompt text, a priority mix or
    sessions never move it."""
    return random.Random(f"{spec.seed}/layout")


def mixed_lengths(spec: WorkloadSpec, count: int, layout: random.Random) -> list[int]:
    # An exact share rather than a draw per request, so even a short run has the asked mix.
    n_long = round(count * spec.long_fraction)
    lengths = [spec.long_tokens] * n_long + [spec.input_tokens] * (count - n_long)
    layout.shuffle(lengths)
    return lengths


def shared_prefix_groups(spec: WorkloadSpec, count: int, layout: random.Random) -> list[int]:
    """Which prefix each request starts with: every prefix equally often, in seeded order."""
    groups = [i % spec.num_prefixes for i in range(count)]
    layout.shuffle(groups)
    return groups


def turn_order(spec: WorkloadSpec, count: int) -> list[tuple[int, int]]:
    """(conversation, turn) in send order: waves of conversations, turn-major in a wave.

    A wave has active_sessions conversations, fewer when fewer requests remain, so a short run
    still holds whole conversations rather than many first turns.
    """
    order: list[tuple[int, int]] = []
    first = 0
    while len(order) < count:
        remaining = count - len(order)
        size = min(spec.active_sessions, math.ceil(remaining / spec.turns))
        wave = range(first, first + size)
        order.extend((session, turn) for turn in range(spec.turns) for session in wave)
        first += size
    return order[:count]


def session_id(spec: WorkloadSpec, conversation: int) -> str:
    return f"conv-{spec.seed}-{conversation}"


def trace_prefix_tokens(spec: WorkloadSpec, lines: Sequence[TraceLine]) -> dict[int, int]:
    """Each prefix group's shared prefix length: at most `shared_prefix_tokens`, and short
    enough for the group's shortest request, so every member can start with all of it."""
    prefix_len: dict[int, int] = {}
    for line in lines:
        if line.prefix_group is not None:
            shortest = min(prefix_len.get(line.prefix_group, line.input_tokens), line.input_tokens)
            prefix_len[line.prefix_group] = min(spec.shared_prefix_tokens, shortest)
    return prefix_len


def trace_start_s(lines: Sequence[TraceLine]) -> float:
    """Replay is relative to the trace's first line."""
    return lines[0].timestamp_s if lines else 0.0


def label_requests(spec: WorkloadSpec, requests: list[_Labelled]) -> list[_Labelled]:
    """Priority classes and session ids, each from its own seeded stream."""
    if spec.priority_mix is not None:
        classes = sorted(spec.priority_mix)
        weights = [spec.priority_mix[c] for c in classes]
        draw = random.Random(f"{spec.seed}/priority")
        requests = [
            # A trace's own priority wins over the mix.
            r
            if r.priority is not None
            else dataclasses.replace(r, priority=_pick(draw, classes, weights))
            for r in requests
        ]
    if spec.sessions is not None:
        draw = random.Random(f"{spec.seed}/sessions")
        requests = [
            dataclasses.replace(r, session_id=f"sess-{spec.seed}-{draw.randrange(spec.sessions)}")
            for r in requests
        ]
    return requests


def _pick(draw: random.Random, classes: list[int], weights: list[float]) -> int:
    return draw.choices(classes, weights)[0]


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
                session_id=session_id(spec, session),
            )
        )  # fmt: skip
    return shapes


def _trace(spec: WorkloadSpec, lines: Sequence[TraceLine]) -> list[RequestShape]:
    prefix_len = trace_prefix_tokens(spec, lines)
    start_s = trace_start_s(lines)
    return [
        RequestShape(
            i, line.input_tokens, line.output_tokens,
            prefix_group=line.prefix_group,
            prefix_tokens=0 if line.prefix_group is None else prefix_len[line.prefix_group],
            at_s=line.timestamp_s - start_s, priority=line.priority, tenant=line.tenant,
        )
        for i, line in enumerate(lines)
    ]  # fmt: skip
