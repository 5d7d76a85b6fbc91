"""One-knob moves: what they change, and which ones cannot change a trial's result.

A move goes `steps` positions up (+1) or down (-1) one knob's ladder. On the x1.5 ladders
of max_num_seqs and max_num_batched_tokens two positions double or halve the value.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.results import LoadMode
from servepilot.tune.score import Measurement
from servepilot.tune.space import Knob, SearchSpace, TrialConfig


@dataclass(frozen=True, slots=True)
class Move:
    knob: Knob
    direction: int
    """+1 up the knob's ladder, -1 down."""
    steps: int
    """Ladder positions; more than the ladder holds goes to its end."""
    why: str


TO_THE_END = 1 << 30

# Seed 004's relief when memory is the limit, in its order.
MEMORY_MOVES = (
    Move(Knob.MAX_MODEL_LEN, -1, TO_THE_END, "cut max_model_len to what the traffic needs"),
    Move(Knob.MAX_NUM_SEQS, -1, 2, "lower max_num_seqs"),
    Move(Knob.GPU_MEMORY_UTILIZATION, +1, 1, "give vLLM more of the GPU's memory"),
    Move(Knob.CPU_KV_CACHE_SPACE_GIB, +1, 1, "give the KV cache more memory"),
    Move(Knob.KV_CACHE_DTYPE, +1, 1, "quantize the KV cache"),
    Move(Knob.WEIGHTS_DTYPE, +1, 1, "quantize the weights to make room for the KV cache"),
)


MEMORY_KNOBS = frozenset(m.knob for m in MEMORY_MOVES if m.knob is not Knob.MAX_NUM_SEQS)
"""Knobs that only buy room for the KV cache: moved as relief, not explored for speed."""


def memory_moves(space: SearchSpace, *, started: bool = False) -> list[Move]:
    """Seed 004's relief, for the knobs the space searches. `started`: the engine ran and
    preempted; vLLM's v1 scheduler reserves no KV for max_model_len, so cutting it then
    frees nothing (it is the relief for a start that runs out of memory)."""
    return [
        m
        for m in MEMORY_MOVES
        if space.axis(m.knob) is not None and not (started and m.knob is Knob.MAX_MODEL_LEN)
    ]


def apply(space: SearchSpace, base: TrialConfig, move: Move) -> TrialConfig | None:
    """`base` moved; None when the knob is not searched or is at the end of its ladder."""
    axis = space.axis(move.knob)
    if axis is None or not base.has(move.knob):
        return None
    value = axis.moved(base.get(move.knob), move.direction * move.steps)
    return None if value is None else base.with_value(move.knob, value)


def between(space: SearchSpace, a: TrialConfig, b: TrialConfig) -> Move | None:
    """The one-knob move from `a` to `b` (None when they differ in more than one knob)."""
    changed = [k for k, v in b.values if not a.has(k) or a.get(k) != v]
    axis = space.axis(changed[0]) if len(changed) == 1 else None
    if axis is None:
        return None
    old, new = axis.index(a.get(axis.knob)), axis.index(b.get(axis.knob))
    if old is None or new is None:
        return None
    direction = 1 if new > old else -1
    return Move(axis.knob, direction, abs(new - old), verb(axis.knob, direction))


def no_op(base: TrialConfig, measured: Measurement, moved: TrialConfig) -> str | None:
    """Why `moved` would measure the same as `base`, if it would.

    In a closed loop no batch holds more requests than the load: when the fleet's budget
    (`capacity`) was not reached at the highest load `base` ran, and the new max_num_seqs is
    not below that load either, no batch of the sweep would differ."""
    knob = Knob.MAX_NUM_SEQS
    changed = [k for k, v in moved.values if not base.has(k) or base.get(k) != v]
    if changed != [knob]:
        return None
    closed = [r.load.value for r in measured.runs if r.load.mode is LoadMode.CONCURRENCY]
    if not closed or len(closed) != len(measured.runs):
        return None
    top = max(closed)
    if measured.capacity >= top and int(moved.get(knob)) >= top:
        return f"changes nothing: no load of the sweep ({top:g} at most) filled a batch"
    return None


def verb(knob: Knob, direction: int) -> str:
    return f"{'raise' if direction > 0 else 'lower'} {knob.value}"
