"""The fleet simulator's records: a request on its way through the fleet, and a replica; and
the event queue its parts push onto."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from servepilot.routing.admission import SHARED_TENANT, Ticket
from servepilot.routing.base import RequestView
from servepilot.sim.engine.hostclock import HostClock
from servepilot.sim.engine.records import StepResult
from servepilot.sim.engine.replica import ReplicaModel
from servepilot.sim.engine.request import SimRequest
from servepilot.sim.fleet.liveview import LiveView
from servepilot.sim.fleet.network import HopSampler

Push = Callable[[float, int, object], None]
"""The simulator's event queue: (at_s, kind, what)."""


@dataclass(slots=True, eq=False, init=False)
class FleetRequest(SimRequest):
    """A `SimRequest` (what the engine sees) plus what the gateway and the client know.

    `arrival_s` is the client's send time: the intended one in open loop, so that TTFT and
    E2E count from it (no coordinated omission)."""

    warmup: bool = False
    view: RequestView | None = field(default=None, repr=False)
    """What routing and admission see; built once when the request reaches the gateway."""
    replica: FleetReplica | None = field(default=None, repr=False)
    dispatched_s: float = 0.0
    """When the gateway sent it to `replica`."""
    queued_s: float = 0.0
    """When the engine took it into its scheduler's queue (vLLM's QUEUED moment): after the
    hop to the replica and, with async scheduling, after the step in progress."""
    first_out_s: float = 0.0
    last_out_s: float = 0.0
    """When its API server had streamed its first and its last token (`FleetReplica.stream`)."""
    ticket: Ticket[FleetRequest] | None = field(default=None, repr=False)
    """While it waits in the gateway's admission queue."""
    tenant: str = SHARED_TENANT
    """Whose fair share of the admission queue it counts in."""

    def __init__(
        self,
        request_id: int,
        prompt_tokens: int,
        output_tokens: int,
        arrival_s: float,
        prefix_group: int | None = None,
        prefix_tokens: int = 0,
        priority: int = 1,
        warmup: bool = False,
        view: RequestView | None = None,
        replica: FleetReplica | None = None,
        dispatched_s: float = 0.0,
        ticket: Ticket[FleetRequest] | None = None,
        tenant: str = SHARED_TENANT,
    ) -> None:
        # Written out for the compiled build, as SimRequest's. Not super(): a slots
        # dataclass is a new class, which the zero-argument form does not know.
        SimRequest.__init__(
            self, request_id, prompt_tokens, output_tokens, arrival_s, prefix_group,
            prefix_tokens, priority,
        )  # fmt: skip
        self.warmup = warmup
        self.view = view
        self.replica = replica
        self.dispatched_s = dispatched_s
        self.queued_s = 0.0
        self.first_out_s = 0.0
        self.last_out_s = 0.0
        self.ticket = ticket
        self.tenant = tenant


class ReplicaState(enum.Enum):
    STARTING = "starting"
    """Cold start: not routable until the gateway's health check finds it ready."""
    READY = "ready"
    DRAINING = "draining"
    """Takes no new requests; leaves when its requests are done."""
    STOPPED = "stopped"
    ASLEEP = "asleep"
    """In the warm pool: out of the gateway, its GPU memory freed (sim/fleet/replicas.py)."""


class FleetReplica:
    """One replica: its engine model, its place in the network, and the gateway's view of it.

    `in_flight` is the gateway's own count (always current); `running`, `waiting` and
    `kv_usage` are vLLM's gauges as of the last scrape."""

    __slots__ = (
        "asleep_since_s",
        "asleep_total_s",
        "capacity",
        "deferred",
        "dispatched",
        "engine_ready",
        "hard_capacity",
        "hop",
        "host",
        "in_flight",
        "index",
        "intake_free_s",
        "kv_usage",
        "launched_s",
        "model",
        "ready_s",
        "replica_id",
        "result",
        "running",
        "slots",
        "state",
        "stopped_s",
        "stream_free_s",
        "up_s",
        "view",
        "waiting",
    )

    def __init__(
        self,
        index: int,
        model: ReplicaModel,
        capacity: int,
        hop: HopSampler,
        *,
        ready: bool,
        launched_s: float = 0.0,
    ) -> None:
        self.index = index
        self.replica_id = f"r{index}"
        self.model = model
        self.capacity = capacity
        """Its concurrency budget at the gateway (an adaptive budget moves it)."""
        self.hard_capacity = capacity
        """What its batch and KV cache hold: the most `capacity` is set to."""
        self.hop = hop
        self.intake_free_s = 0.0
        """When its API server is done taking in the requests handed to it so far: it
        tokenises one prompt at a time."""
        self.stream_free_s = 0.0
        """When its API server is done streaming the steps' tokens handed to it so far."""
        self.state = ReplicaState.READY if ready else ReplicaState.STARTING
        self.engine_ready = ready
        self.launched_s = launched_s
        self.ready_s: float | None = launched_s if ready else None
        """When the gateway first found it ready."""
        self.stopped_s: float | None = None
        """When it left the fleet (drained, or cancelled while starting)."""
        self.up_s = launched_s
        """When its engine is (or was) up after its latest cold start or wake."""
        self.asleep_since_s: float | None = None
        """In the warm pool since then; None while not asleep."""
        self.asleep_total_s = 0.0
        """Its time asleep before its latest wake."""
        self.dispatched = 0
        """Requests the gateway sent it."""
        self.in_flight = 0
        self.running = 0
        self.waiting = 0
        self.kv_usage = 0.0
        self.result: StepResult | None = None
        """The step in progress (its outputs are due at its end); None when idle."""
        self.host = HostClock(model.cost, model.async_scheduling)
        """Its engine's launches, and when its steps' tokens left (`FleetSim._step_end`)."""
        self.deferred: list[FleetRequest] = []
        """With async scheduling: requests that reached the engine during the step in
        progress. vLLM scheduled the next step when this one started, so they wait for the
        one after it (`FleetSimulator._step_end`)."""
        self.slots = 0
        """Its share of the admission snapshot's free slots, as last counted."""
        self.view = LiveView(self.replica_id, 0, capacity=capacity)
        """What routing sees of it, updated in place by the gateway."""

    def take_in(self, reach_s: float, intake_s: float) -> float:
        """When a request that reaches its API server at `reach_s` and takes `intake_s` there
        (tokenising its prompt) is handed to the engine: vLLM's API server takes prompts in
        one at a time, so after every one handed to it before."""
        self.intake_free_s = _one_at_a_time(self.intake_free_s, reach_s, intake_s)
        return self.intake_free_s

    def take_deferred(self, out_s: float) -> bool:
        """Hand what reached the engine during its last step to its scheduler, all of it at
        once (vLLM's loop reads its input queue whole, once that step's tokens are out at
        `out_s`); whether there was any."""
        late, self.deferred = self.deferred, []
        for request in late:
            request.queued_s = out_s
            self.model.add(request)
        return bool(late)

    def stream(
        self,
        step: StepResult,
        out_s: float,
        output_s: float,
        live: Callable[[int], FleetRequest | None],
    ) -> float:
        """When the API server has streamed `step`'s tokens, which left the engine at `out_s`
        (`output_s` a token; 0: at once): its event loop detokenises and sends them one
        request after another, a step after the step before, while prompts are tokenised on
        a thread of their own (`take_in`). The requests whose first token it was (`live`: by
        id, None once aborted) are stamped with it."""
        sent_s = out_s
        if output_s:
            work_s = step.tokens * output_s
            sent_s = self.stream_free_s = _one_at_a_time(self.stream_free_s, out_s, work_s)
        for request_id in step.first_tokens:
            request = live(request_id)
            if request is not None:
                request.first_out_s = sent_s
        return sent_s

    def __repr__(self) -> str:
        return f"FleetReplica({self.replica_id}, {self.state.value}, in_flight={self.in_flight})"


def _one_at_a_time(free_s: float, ready_s: float, work_s: float) -> float:
    """When work that is ready at `ready_s` and takes `work_s` is done by a worker that does
    one piece at a time and is free from `free_s`."""
    return (ready_s if ready_s > free_s else free_s) + work_s
