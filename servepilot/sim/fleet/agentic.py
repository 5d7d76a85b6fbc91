"""The agentic workload's simulated clients: `load.sessions` hands out each session's turns,
and a turn becomes a job only when it is handed out (its previous answer is in).

A turn's answer has exactly `output_tokens` tokens (bench asks for them with ignore_eos), so
its prompt length is known from the session's script; what depends on the answer is when the
turn is sent: its wait after the answer's arrival at the client.

Prefix caching: a session is a prefix group whose prefix is each turn's whole prompt, so a
turn hits the blocks its previous turn computed (the previous prompt; the answer's tokens are
prefilled again, a few blocks) and its own prompt extends the group's chain for the next
turn. Left out: the system prompt that sessions share (the simulated KV pool keeps one chain
per group); it is a small part of a long session's context.
"""

from __future__ import annotations

from servepilot.load.loadplan import LoadPlan
from servepilot.load.sessions import SessionLoop, TurnSlot
from servepilot.load.slots import Slot
from servepilot.load.workload import WorkloadSpec
from servepilot.sim.fleet.traffic import Job, JobTable


class SessionFeed:
    """Turns as the simulator's slots: `start` a session, `after` a request's answer."""

    def __init__(self, plan: LoadPlan, spec: WorkloadSpec, overhead_tokens: int) -> None:
        self.loop = SessionLoop(plan, spec)
        self.jobs = JobTable(())
        self._overhead = overhead_tokens
        self._turn_of_job: dict[int, TurnSlot] = {}
        self._turn_of_request: dict[int, TurnSlot] = {}

    def start(self, now_s: float) -> Slot | None:
        """A new session's first turn, sent at `now_s`; None once the level sends no more."""
        return self._slot(self.loop.start(now_s))

    def sent(self, request_id: int, job: int) -> None:
        """The request `request_id` carries the turn of `job`."""
        self._turn_of_request[request_id] = self._turn_of_job.pop(job)

    def after(self, request_id: int, answered_s: float, ok: bool) -> tuple[Slot | None, bool]:
        """(the session's next turn or None, whether the session is over)."""
        turn = self._turn_of_request.pop(request_id)
        slot = self._slot(self.loop.next(turn, answered_s, ok))
        return slot, slot is None

    def _slot(self, turn: TurnSlot | None) -> Slot | None:
        if turn is None:
            return None
        script = self.loop.scripts[turn.session]
        prompt = script.prompt_tokens(turn.turn)
        index = self.jobs.add(
            Job(
                prompt_tokens=prompt + self._overhead,
                output_tokens=script.answer_tokens,
                prefix_group=turn.session,
                prefix_tokens=prompt + self._overhead,
                session_id=script.session_id,
                routed_tokens=prompt,
            )
        )
        self._turn_of_job[index] = turn
        return Slot(index, turn.send_s, turn.warmup)
