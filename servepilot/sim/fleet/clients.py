"""The simulated clients of a level: which request is sent when, and when the level stops.

Three ways to send, as bench's: a closed loop's workers (each sends its next request when its
last one is answered), an open loop's schedule of send times (the simulator merges it with
its events, in time order), and agentic sessions (`SessionFeed`, started by either loop),
whose next turn is due a wait after its answer reaches the client. A send reaches the gateway
one client hop later (a SEND event). A duration-bound level's deadline is when it stops
sending plus its grace; what is still in flight then is cancelled.

Part of the compiled group of the simulator (core/accel.py): the event loop reads `sending`,
`sends_due` and `deadline_s` at every event.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from servepilot.load.loadplan import LoadPlan
from servepilot.load.slots import ClosedSlots, Slot, open_slots
from servepilot.sim.fleet.agentic import SessionFeed
from servepilot.sim.fleet.members import FleetRequest, Push
from servepilot.sim.fleet.requests import RequestFactory


class SimClients:
    """The level's senders. `start` once, then the simulator asks for the open loop's slots
    (`first_open`, `next_open`), turns a slot that reached the gateway into a request
    (`request`), and tells each answer or failure as it reaches its client (`answered`)."""

    def __init__(self, push: Push, send_kind: int, client_gateway_s: float) -> None:
        self._push = push
        self._send_kind = send_kind
        self._cg = client_gateway_s
        self.plan: LoadPlan | None = None
        self.sending = True
        """False once no more sends will start (sends on their way are `sends_due`)."""
        self.sends_due = 0
        """Sends on their way to the gateway (SEND events not yet handled)."""
        self.deadline_s = math.inf
        """When the level ends, requests in flight or not (a duration-bound level)."""
        self._grace_s = 0.0
        self._closed: ClosedSlots | None = None
        self._feed: SessionFeed | None = None
        """The agentic workload: sessions whose turns follow their answers."""
        self._open: Iterator[Slot] | None = None
        self._factory: RequestFactory | None = None

    def start(
        self,
        plan: LoadPlan,
        jobs: int,
        factory: RequestFactory,
        offsets: Iterator[float] | None,
        sessions: SessionFeed | None,
    ) -> None:
        """The level's first sends. `jobs`: how many the workload has (sessions make theirs
        as turns are due); `offsets`: the open loop's send times, or with `sessions` the
        times new sessions start."""
        self.plan = plan
        self._grace_s = plan.grace_s if plan.duration_s is not None else math.inf
        self._factory = factory
        if sessions is not None:
            self._feed = sessions
            if plan.closed:
                for _ in range(int(plan.load.value)):
                    self._start_session(0.0)
            else:
                assert offsets is not None
                self._open = _session_starts(sessions, offsets)
        elif plan.closed:
            self._closed = ClosedSlots(plan, jobs)
            for _ in range(int(plan.load.value)):
                self._next_closed(0.0)
        else:
            assert offsets is not None
            self._open = open_slots(plan, jobs, offsets)

    def first_open(self) -> Slot | None:
        """The open loop's first send, if there is an open loop and it sends at all."""
        slot = next(self._open, None) if self._open is not None else None
        if slot is None:
            self.sending = (self._closed or self._feed) is not None and self.sending
        return slot

    def next_open(self, now_s: float) -> Slot | None:
        """The open loop's next send after the one sent at `now_s`; None ends its sending."""
        assert self._open is not None
        slot = next(self._open, None)
        if slot is None:
            self.sending = False
            self.deadline_s = min(self.deadline_s, now_s + self._grace_s)
        return slot

    def request(self, slot: Slot, now_s: float) -> FleetRequest:
        """The request `slot` carries, reaching the gateway at `now_s`."""
        assert self._factory is not None
        request = self._factory.make(slot, now_s)
        if self._feed is not None:
            self._feed.sent(request.request_id, slot.request)
        return request

    def answered(self, request: FleetRequest, client_s: float, ok: bool) -> None:
        """`request`'s answer (or failure) reached its client at `client_s`."""
        if self._closed is not None:
            self._next_closed(client_s)
        elif self._feed is not None:
            self._next_turn(request, client_s, ok)

    def _next_turn(self, request: FleetRequest, client_s: float, ok: bool) -> None:
        """The session's next turn, due its wait after the answer reached the client; when
        the session is over, a closed loop starts the next one."""
        feed = self._feed
        assert feed is not None and self.plan is not None
        slot, over = feed.after(request.request_id, client_s, ok)
        if slot is not None:
            self._send(slot, feed.loop.end_s)
        elif over and self.plan.closed:
            self._start_session(client_s)

    def _start_session(self, client_s: float) -> None:
        feed = self._feed
        assert feed is not None
        slot = feed.start(client_s)
        self._send_or_stop(slot, feed.loop.end_s)

    def _next_closed(self, client_s: float) -> None:
        closed = self._closed
        assert closed is not None
        slot = closed.next(client_s)  # sets end_s on its first slot
        self._send_or_stop(slot, closed.end_s)

    def _send_or_stop(self, slot: Slot | None, end_s: float | None) -> None:
        """None: the loop hands out no more slots, and this client stops sending."""
        if slot is None:
            self.sending = False
        else:
            self._send(slot, end_s)

    def _send(self, slot: Slot, end_s: float | None) -> None:
        """A client sends `slot` when it is due; `end_s`: when a duration-bound level stops
        sending (None while unknown)."""
        if end_s is not None and self.deadline_s == math.inf:
            self.deadline_s = end_s + self._grace_s
        self.sends_due += 1
        self._push(slot.send_s + self._cg, self._send_kind, slot)


def _session_starts(feed: SessionFeed, offsets: Iterator[float]) -> Iterator[Slot]:
    """The open loop's sends: a new session's first turn at each arrival, until the level's
    turns are all handed out. Later turns go by the events of their answers."""
    for offset in offsets:
        slot = feed.start(offset)
        if slot is None:
            return
        yield slot
