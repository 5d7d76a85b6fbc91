"""The agentic workload's sessions: what each one sends, turn by turn, and when.

`session_script(spec, i)` is session i's plan, drawn from its own seeded stream (so session i
is the same whichever other sessions a run holds): its system prompt, and for each turn the
new message's length, whether it is a tool's result, and the wait after the previous answer.
Turn t's prompt is the system prompt, every earlier turn's message and answer, then its own
message (`prompt_tokens`): all of it but the new message is a prefix the server may have
cached.

`SessionLoop` hands out the turns of a load level, for bench's clients and sim's alike. A
session's next turn is due its wait after the previous answer arrived, so it is handed out
only then (`next`); a session that ends (its last turn answered, or a turn failed: the agent
gives up) frees its place. Closed loop: `concurrency` sessions live at a time, each new one
started when one ends (`start`). Open loop: a new session starts at each arrival of the
schedule (`rate` sessions a second). Warm-up, `max_requests` and `duration_s` count turns,
as `load.slots` counts requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import NamedTuple

from servepilot.load.loadplan import LoadPlan
from servepilot.load.shapes import session_id
from servepilot.load.slots import ClosedSlots
from servepilot.load.workload import WorkloadSpec


@dataclass(frozen=True, slots=True)
class Turn:
    new_tokens: int
    """The new message: the user's (`input_tokens`) or a tool's result (`tool_tokens`)."""
    tool: bool
    wait_s: float
    """After the previous answer arrived; 0 for the first turn."""
    returning: bool = False
    """The session was away (`return_gap_s`) before this turn."""


@dataclass(frozen=True, slots=True)
class SessionScript:
    session: int
    session_id: str
    system_prompt: int
    """Which of the shared system prompts the session starts with."""
    system_tokens: int
    answer_tokens: int
    turns: tuple[Turn, ...]

    def history_tokens(self, turn: int) -> int:
        """What turn `turn` sends before its own message: the system prompt, then each earlier
        turn's message and answer."""
        earlier = self.turns[:turn]
        return self.system_tokens + sum(t.new_tokens + self.answer_tokens for t in earlier)

    def prompt_tokens(self, turn: int) -> int:
        return self.history_tokens(turn) + self.turns[turn].new_tokens


def session_script(spec: WorkloadSpec, session: int) -> SessionScript:
    agentic = spec.agentic
    draw = random.Random(f"{spec.seed}/agentic/{session}")
    system = draw.randrange(agentic.system_prompts)
    # Every draw is made whatever its outcome, so a parameter changes only what it governs.
    leaves, leave_at = draw.random(), draw.randrange(1, spec.turns) if spec.turns > 1 else 0
    returns_at = leave_at if spec.turns > 1 and leaves < agentic.return_fraction else None
    turns = [Turn(spec.input_tokens, tool=False, wait_s=0.0)]
    for index in range(1, spec.turns):
        tool = draw.random() < agentic.tool_fraction
        wait = draw.expovariate(1.0)  # in units of the mean
        mean_s = agentic.tool_s if tool else agentic.think_s
        returning = index == returns_at
        turns.append(
            Turn(
                agentic.tool_tokens if tool else spec.input_tokens,
                tool=tool,
                wait_s=wait * mean_s + (agentic.return_gap_s if returning else 0.0),
                returning=returning,
            )
        )
    return SessionScript(
        session, session_id(spec, session), system, agentic.system_prompt_tokens,
        spec.output_tokens, tuple(turns),
    )  # fmt: skip


class TurnSlot(NamedTuple):
    """One turn to send."""

    session: int
    turn: int
    send_s: float
    """When it is due: the session's start, or the previous answer plus the turn's wait."""
    warmup: bool


class SessionLoop:
    """The turns of one level (module docstring); times are the caller's clock."""

    def __init__(self, plan: LoadPlan, spec: WorkloadSpec) -> None:
        self._spec = spec
        self._turns = ClosedSlots(plan, 1)
        """Counts the turns (warm-up, quota, duration) as the closed loop counts requests."""
        self.scripts: dict[int, SessionScript] = {}
        """The live sessions' scripts."""
        self.started = 0
        self.peak_live = 0

    @property
    def measured(self) -> int:
        return self._turns.measured

    @property
    def stopped(self) -> bool:
        """The level's measured turns are all handed out: nothing more starts."""
        return self._turns.stopped

    @property
    def end_s(self) -> float | None:
        """A duration-bound level hands out no turn due at or after this (known from its first
        measured turn on)."""
        return self._turns.end_s

    def start(self, now_s: float) -> TurnSlot | None:
        """A new session's first turn, sent at `now_s`; None once the level sends no more."""
        warmup = self._take(now_s)
        if warmup is None:
            return None
        session = self.started
        self.started += 1
        self.scripts[session] = session_script(self._spec, session)
        self.peak_live = max(self.peak_live, len(self.scripts))
        return TurnSlot(session, 0, now_s, warmup)

    def next(self, slot: TurnSlot, answered_s: float, ok: bool = True) -> TurnSlot | None:
        """The turn after `slot`, whose answer arrived (`ok`) or failed at `answered_s`; None
        when the session is over (then it is forgotten)."""
        script = self.scripts[slot.session]
        turn = slot.turn + 1
        if ok and turn < len(script.turns):
            send_s = answered_s + script.turns[turn].wait_s
            warmup = self._take(send_s)
            if warmup is not None:
                return TurnSlot(slot.session, turn, send_s, warmup)
        del self.scripts[slot.session]
        return None

    def _take(self, send_s: float) -> bool | None:
        """Count one turn due at `send_s`: whether it is warm-up; None when the level is over."""
        slot = self._turns.next(send_s)
        return None if slot is None else slot.warmup
