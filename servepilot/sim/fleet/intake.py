"""A replica's API server taking requests in, as the fleet simulator's events.

A request that reaches a replica waits for its API server's next batch of intake: vLLM
renders chat templates and tokenises on one thread, in batches, once its tokenizer has waited
INTAKE_WAIT_S for more (`FleetReplica.reach_api`, `FleetReplica.intake_batch`, which times a
batch). When a batch ends its requests reach the engine, and the next batch gathers what came
meanwhile.
"""

from __future__ import annotations

from servepilot.sim.fleet.members import INTAKE_WAIT_S, FleetReplica, FleetRequest, Push


class ApiIntake:
    """Pushes DELIVER (a request reaches its engine) and INTAKE (a batch is due) events."""

    __slots__ = ("_deliver", "_intake", "_push", "_s_per_prompt_token")

    def __init__(
        self, push: Push, s_per_prompt_token: float, deliver_kind: int, intake_kind: int
    ) -> None:
        self._push = push
        self._s_per_prompt_token = s_per_prompt_token
        self._deliver = deliver_kind
        self._intake = intake_kind

    def reached(self, request: FleetRequest, now_s: float) -> None:
        """`request` reached its replica's API server: a batch starts once the tokenizer has
        waited for more, unless one is running or due."""
        replica = request.replica
        assert replica is not None
        if replica.reach_api(request):
            self._push(now_s + INTAKE_WAIT_S, self._intake, replica)

    def start(self, replica: FleetReplica, now_s: float) -> None:
        """A batch starts at `now_s`. Its requests reach the engine one after another as the
        event loop hands them on: an idle engine starts a step with the first, and the rest
        wait for the next."""
        batch, took_s = replica.intake_batch(now_s, self._s_per_prompt_token)
        if not batch:
            return
        done_s = now_s + took_s
        for request in batch:
            self._push(done_s, self._deliver, request)
        self._push(done_s + INTAKE_WAIT_S, self._intake, replica)
