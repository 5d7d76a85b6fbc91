"""The fleet simulator's records: a request on its way through the fleet, and a replica; and
the event queue its parts push onto."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from servepilot.routing.admission import SHARED_TENANT, Ticket
from servepilot.routing.base import RequestView
from servepilot.sim.engine.hostclock import HostClock
from servepilot.sim.engine.records import StepResult
from servepilot.sim.engine.replica import ReplicaModel
from servepilot.sim.engine.request import SimRequest
from servepilot.sim.fleet.liveview import LiveView
from servepilot.sim.fleet.network import HopSampler

INTAKE_BATCH_MAX: Final = 32
"""The most prompts vLLM's API server tokenises in one batch (AsyncMicrobatchTokenizer)."""
INTAKE_WAIT_S: Final = 0.002
"""How long its tokenizer waits for more prompts once one is there (batch_wait_timeout_s)."""
INTAKE_BATCHED_PROMPT_TOKENS: Final = 580
"""What each prompt of a batch beyond its longest costs, in prompt tokens taken in alone: the
twelfth loan's warm-up bursts of 1,000-token prompts (no streaming) took 6.0 ms for one and
2.6 ms more for each further prompt of a batch, where one prompt costs 4.48 us a token
(`benchmarks/gpu_api_timeline_report.py`)."""
STREAM_LOAD_MAX: Final = 0.8
"""The most of its API server's time streaming is taken to hold from its intake. Its intake
slows by (1 - share)^-2: the twelfth loan's batches beside streaming that took 30-50% of the
loop (at 30.6 us a token) took 2.85-3.70 times their idle time (medians, 137 batches), where
(1 - share)^-1 gives 1.4-2.0 and (1 - share)^-2 2.0-4.0."""

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
        "intake_pending",
        "intake_waiting",
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
        "stream_load",
        "stream_load_until_s",
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
        self.intake_waiting: list[FleetRequest] = []
        """Requests at its API server waiting for the next batch of intake (`intake_batch`)."""
        self.intake_pending = False
        """Whether a batch of intake is running or due (the simulator's INTAKE event)."""
        self.stream_free_s = 0.0
        """When its API server is done streaming the steps' tokens handed to it so far."""
        self.stream_load = 0.0
        """The share of its API server's time the last step's streaming took (`stream`)."""
        self.stream_load_until_s = 0.0
        """Until when that share holds: two steps past the last one streamed."""
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

    def reach_api(self, request: FleetRequest) -> bool:
        """`request` reached its API server; whether a batch of intake must be started (none
        is running or due)."""
        self.intake_waiting.append(request)
        if self.intake_pending:
            return False
        self.intake_pending = True
        return True

    def intake_batch(
        self, now_s: float, s_per_prompt_token: float
    ) -> tuple[list[FleetRequest], float]:
        """The requests whose intake starts at `now_s` and how long it takes. vLLM renders chat
        templates and tokenises on one thread, in batches (its AsyncMicrobatchTokenizer: what
        queued while the last batch ran, up to INTAKE_BATCH_MAX), and that thread shares one
        core, through the GIL, with the event loop that streams. A batch takes its longest
        prompt's time (the tokenizer encodes a batch's prompts in parallel), each other prompt
        its own tokens' worth up to INTAKE_BATCHED_PROMPT_TOKENS (its template and its ids, in
        Python), all over the square of the share of the core the streaming leaves (the thread
        waits for the GIL, then for the loop to take its results back, both slowed by the
        streaming). Measured on an H100 (2026-12-07, benchmarks/gpu_api_timeline): a batch of
        1-3 prompts of 1,000 tokens took 5.5-8.8 ms (medians) beside little streaming, 18-24 ms
        beside 10,000-20,000 streamed tokens a second, and requests reached the engine in those
        batches. An empty batch: none waiting, the thread idles."""
        batch = self.intake_waiting[:INTAKE_BATCH_MAX]
        del self.intake_waiting[:INTAKE_BATCH_MAX]
        if not batch:
            self.intake_pending = False
            return batch, 0.0
        longest = 0
        others = 0
        for request in batch:
            tokens = request.prompt_tokens
            longest = max(longest, tokens)
            others += min(tokens, INTAKE_BATCHED_PROMPT_TOKENS)
        tokens = longest + others - min(longest, INTAKE_BATCHED_PROMPT_TOKENS)
        free = 1.0 - (self.stream_load if now_s < self.stream_load_until_s else 0.0)
        return batch, tokens * s_per_prompt_token / (free * free)

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
            if step.duration_s > 0.0:
                self.stream_load = min(STREAM_LOAD_MAX, work_s / step.duration_s)
                self.stream_load_until_s = out_s + 2.0 * step.duration_s
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
