"""The fleet simulator: clients, a gateway and N simulated vLLM replicas, event by event.

One heap holds what is due: replica step ends, requests reaching a replica, answers
reaching the gateway, closed-loop sends, and the gateway's ticker, scrapes, autoscaler and
cold starts. Open-loop sends come from their own schedule, merged in time order; what the
clients send when is `SimClients`' (clients.py). A replica steps again as soon as its step
ends (vLLM's engine loop); an idle one is stepped the moment work reaches it; a request added
during a step waits for the next one.

A request: client -> gateway (fixed hop) -> admission and routing (`SimGateway`, the real
policy objects) -> gateway -> replica (same-node or cross-node hop) -> the replica's
scheduler (`ReplicaModel`) -> its API server, which streams one step's tokens at a time
(`FleetReplica.stream`) -> back the same hops.

Each level runs on a fresh fleet (empty prefix caches), unlike bench, whose levels run one
after another on the same servers.

Speed: `make sim-fast` compiles the modules on a request's path with mypyc (core/accel.py),
written to be fast so (Final constants, written-out __init__s, no bound-method locals);
tests/unit/test_sim_speedups.py pins compiled runs to pure-Python ones.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator
from typing import Final

from servepilot.core import accel
from servepilot.core.errors import ConfigError
from servepilot.core.slo import Slo
from servepilot.load.loadplan import LoadPlan
from servepilot.load.slots import Slot
from servepilot.routing.admission import BUSY_TICK_S
from servepilot.routing.base import RoutingPolicy
from servepilot.scaling.adaptive_budget import AdaptiveBudget
from servepilot.scaling.snapshot import AutoscalePolicy
from servepilot.sim.engine.hostclock import hold_back
from servepilot.sim.fleet.agentic import SessionFeed
from servepilot.sim.fleet.autoscale import AutoscaleHook
from servepilot.sim.fleet.clients import SimClients
from servepilot.sim.fleet.collect import RunCollector
from servepilot.sim.fleet.gateway import SimGateway
from servepilot.sim.fleet.gateways import routing_policy
from servepilot.sim.fleet.intake import ApiIntake
from servepilot.sim.fleet.kvevents import KvEventFeed
from servepilot.sim.fleet.members import FleetReplica, FleetRequest, ReplicaState
from servepilot.sim.fleet.records import FleetSpec, FleetStats, LevelOutcome, Progress
from servepilot.sim.fleet.replicas import FleetReplicas
from servepilot.sim.fleet.requests import RequestFactory
from servepilot.sim.fleet.traffic import JobTable

__all__ = ["FleetSim", "FleetSpec", "FleetStats", "LevelOutcome", "Progress"]

# Event kinds, most frequent first (the loop tests them in this order).
STEP: Final = 0
DELIVER: Final = 1
RELEASE: Final = 2
SEND: Final = 3
TICK: Final = 4
SCRAPE: Final = 5
AUTOSCALE: Final = 6
READY: Final = 7
COLD_TIMEOUT: Final = 8
POOLED: Final = 9
KV_EVENTS: Final = 10
REACH: Final = 11
INTAKE: Final = 12
REFUSAL_S: Final = 0.001
"""The gateway's time to answer a 429/503: a closed loop facing refusals still moves on."""
PROGRESS_EVERY: Final = 1 << 16
_DRAINING: Final = ReplicaState.DRAINING


class FleetSim:
    """One level on a fresh fleet. `run` once."""

    def __init__(
        self,
        spec: FleetSpec,
        *,
        policy: RoutingPolicy | None = None,
        autoscaler: AutoscalePolicy | None = None,
        budget: AdaptiveBudget | None = None,
    ) -> None:
        accel.notice_once(accel.SIM, "servepilot sim")
        self.spec = spec
        gw = spec.gateway
        self._heap: list[tuple[float, int, int, object]] = []
        self._seq = itertools.count()
        feed = None
        if spec.kv_events and spec.scheduler.enable_prefix_caching:
            feed = KvEventFeed(spec.scheduler.block_size, self._push, KV_EVENTS, spec.network,
                               spec.kv_events_delay_s)  # fmt: skip
        self.policy = policy or routing_policy(
            spec, self._now, feed.index if feed is not None else None
        )
        self.kv_feed = feed if self.policy.uses_prefix else None
        """The replicas' KV events and the exact index they keep, while a policy reads it."""
        self.gateway = SimGateway(
            gw, self.policy, self, random.Random(f"{spec.seed}/admit"), self.kv_feed
        )
        self.autoscale = AutoscaleHook(autoscaler, budget) if autoscaler is not None else None
        self._hop_rng = random.Random(f"{spec.seed}/network")
        self._cg = spec.network.client_gateway_s
        self._intake_s = spec.intake_s_per_prompt_token
        self._api = ApiIntake(self._push, self._intake_s, DELIVER, INTAKE)
        self._output_s = spec.output_s_per_token
        self.fleet = FleetReplicas(self.gateway, spec, self._hop_rng, self._push, READY, POOLED)
        self.replicas = self.fleet.all  # every replica ever launched, in launch order
        self.now_s = 0.0
        self._live: dict[int, FleetRequest] = {}  # sent and not answered yet, by id
        self._peak_in_flight = 0
        self.clients = SimClients(self._push, SEND, self._cg)
        self._collector = RunCollector(Slo())
        self._scrape_s = spec.scrape_interval_s or spec.gateway.health_interval_s
        self._tick_gen = 0
        self._tick_due = 0.0
        for _ in range(spec.replicas):
            self.fleet.launch(ready=not spec.start_cold, now_s=0.0)
        for _ in range(spec.warm_pool):
            if spec.start_cold:
                self.fleet.launch(ready=False, now_s=0.0, to_pool=True)
            else:
                self.fleet.launch_asleep(0.0)

    def _now(self) -> float:
        """The simulated clock, for policies that read it (predicted_latency)."""
        return self.now_s

    # ---- replicas ------------------------------------------------------------------------

    def replica_seconds(self, until_s: float) -> float:
        """Replica time awake (a GPU held) from the start to `until_s` (`FleetReplicas`)."""
        return self.fleet.seconds(until_s)[0]

    # ---- what the gateway's decisions do (its Outlet) ------------------------------------

    def send(self, request: FleetRequest, replica: FleetReplica, now_s: float) -> None:
        request.replica = replica
        request.dispatched_s = now_s
        hop = replica.hop.draw()
        if self._intake_s:  # its API server takes it in first (intake.py)
            self._push(now_s + hop, REACH, request)
        elif hop:
            self._push(now_s + hop, DELIVER, request)
        else:
            self._deliver(request, now_s)

    def refuse(self, request: FleetRequest, status: str, now_s: float) -> None:
        self._failed(request, now_s + REFUSAL_S + self._cg, status)

    def queued(self, request: FleetRequest, now_s: float, cold_until_s: float | None) -> None:
        if cold_until_s is not None:
            self._push(cold_until_s, COLD_TIMEOUT, request)
        if self._tick_due > now_s + BUSY_TICK_S:
            # The gateway wakes its idling ticker when a request starts waiting.
            self._tick_gen += 1
            self._tick_due = now_s
            self._push(now_s, TICK, self._tick_gen)

    # ---- events --------------------------------------------------------------------------

    def _push(self, at_s: float, kind: int, obj: object) -> None:
        heapq.heappush(self._heap, (at_s, next(self._seq), kind, obj))

    def _deliver(self, request: FleetRequest, now_s: float) -> None:
        replica = request.replica
        assert replica is not None
        try:
            replica.model.validate(request)
        except ValueError:  # vLLM's 400: longer than max_model_len
            back = replica.hop.draw()
            self._push(now_s + back, RELEASE, request)
            self._failed(request, now_s + back + self._cg, "http_400")
            return
        if replica.result is not None and replica.model.async_scheduling:
            replica.deferred.append(request)
            return
        request.queued_s = now_s
        replica.model.add(request)
        if replica.result is None:
            self._step(replica, now_s)

    def _step(self, replica: FleetReplica, now_s: float, lead_s: float = 0.0) -> None:
        result = replica.model.step(now_s, lead_s)
        replica.result = result
        if result is not None:
            replica.host.launched(result, now_s - lead_s)
            end_s = now_s + result.duration_s
            heapq.heappush(self._heap, (end_s, next(self._seq), STEP, replica))
            kv = self.kv_feed
            if kv is not None:
                kv.published(replica, end_s)
        elif replica.state is _DRAINING:
            self.fleet.retire_if_done(replica, now_s)

    def _step_end(self, replica: FleetReplica, now_s: float) -> None:
        result = replica.result
        assert result is not None
        self._step(replica, now_s, replica.host.lead_s(now_s))
        out_s, gap_s = replica.host.emitted(now_s, replica.result is not None)
        itl = self._collector.itl
        if result.decode_seqs:
            itl.add(gap_s, result.decode_seqs)
        for gap in result.resumed_gaps_s:
            itl.add(gap + out_s - now_s, 1)
        live = self._live
        if out_s > now_s:
            hold_back(result, live.get, out_s - now_s)
        sent_s = replica.stream(result, out_s, self._output_s, live.get)
        for request in result.finished:
            self._finished(request, sent_s)  # type: ignore[arg-type]
        # vLLM's engine loop with async scheduling (EngineCore.step_with_batch_queue) had
        # already scheduled the step starting now when the last one started: what arrived
        # during the last one is scheduled with the step after, or now if the engine idles.
        if replica.take_deferred(out_s) and replica.result is None:
            self._step(replica, now_s)  # all in one step

    def _finished(self, request: FleetRequest, now_s: float) -> None:
        replica = request.replica
        assert replica is not None and request.first_token_s is not None
        back = replica.hop.draw()
        if back:
            heapq.heappush(self._heap, (now_s + back, next(self._seq), RELEASE, request))
        else:
            self._release(request, now_s)
        request.last_out_s = now_s
        delay = back + self._cg
        end_s = now_s + delay
        if not request.warmup:
            self._collector.answered(request, request.first_out_s + delay, end_s)
        del self._live[request.request_id]
        self.clients.answered(request, end_s, True)

    def _release(self, request: FleetRequest, now_s: float) -> None:
        replica = request.replica
        assert replica is not None
        ttfb = None
        if request.first_token_s is not None:
            ttfb = request.first_out_s + (now_s - request.last_out_s) - request.dispatched_s
        self.gateway.release(request, now_s, ttfb)
        if replica.state is _DRAINING:
            self.fleet.retire_if_done(replica, now_s)

    def _failed(self, request: FleetRequest, end_s: float, status: str) -> None:
        if not request.warmup:
            self._collector.fail(request.arrival_s, end_s, status)
        del self._live[request.request_id]
        self.clients.answered(request, end_s, False)

    def _arrive(self, slot: Slot, now_s: float) -> None:
        request = self.clients.request(slot, now_s)
        live = self._live
        live[request.request_id] = request
        # Warm-up requests count, as in bench: they load the fleet as much as measured ones.
        if len(live) > self._peak_in_flight:
            self._peak_in_flight = len(live)
        if self.autoscale is not None:
            self.autoscale.arrivals.add(now_s)
        self.gateway.arrive(request, now_s)

    # ---- the run -------------------------------------------------------------------------

    def run(
        self,
        plan: LoadPlan,
        jobs: JobTable,
        slo: Slo,
        *,
        offsets: Iterator[float] | None = None,
        progress: Callable[[Progress], None] | None = None,
        sessions: SessionFeed | None = None,
    ) -> LevelOutcome:
        """Simulate one level. `offsets`: the open loop's send times (`load.slots.send_times`);
        with `sessions` (the agentic workload, whose `jobs` they make as turns are due), the
        times new sessions start."""
        if sessions is not None:
            jobs = sessions.jobs
        elif not len(jobs):
            raise ConfigError("the workload has no requests")
        if plan.closed == (offsets is not None):
            raise ConfigError("open loop needs arrival offsets; closed loop takes none")
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if self.clients.plan is not None:
            raise RuntimeError("a FleetSim runs one level; build another for the next")
        self._collector = RunCollector(slo)
        kv_block_size = self.kv_feed.block_size if self.kv_feed is not None else None
        factory = RequestFactory(jobs, self.spec.gateway.routing, self.spec.model_name,
                                 self.policy.uses_prefix, kv_block_size)  # fmt: skip
        self._start_timers()
        self.clients.start(plan, len(jobs), factory, offsets, sessions)
        # The requests and steps of a run are freed by reference counting; the cycle collector
        # would only rescan the thousands in flight, again and again (a fifth of the time).
        collecting = gc.isenabled()
        gc.disable()
        try:
            events = self._loop(progress)
            # Requests still in flight when a duration-bound level's grace ran out.
            self._collector.cancel(self._live.values(), self.clients.deadline_s)
            self._live.clear()
            run = self._collector.run(plan.load, self._peak_in_flight)
            if sessions is not None and plan.closed:
                # Sessions wait between turns: the level ran at its load when that many were
                # live (as bench counts it).
                reached = sessions.loop.peak_live >= plan.load.value
                run = run.model_copy(update={"load_reached": reached})
        finally:
            if collecting:
                gc.enable()
        scale_events = len(self.autoscale.events) if self.autoscale is not None else None
        cost = time.perf_counter() - wall0, time.process_time() - cpu0
        stats = self.fleet.stats(self.now_s, events, cost, scale_events, self.kv_feed is not None)
        return LevelOutcome(run, self._collector.with_engine_times(stats))

    def _start_timers(self) -> None:
        spec = self.spec
        self._push(0.0, TICK, 0)
        self._push(self._scrape_s, SCRAPE, None)
        if self.autoscale is not None:
            self._push(spec.autoscale_interval_s, AUTOSCALE, None)

    def _loop(self, progress: Callable[[Progress], None] | None) -> int:
        heap, pop = self._heap, heapq.heappop
        clients = self.clients
        slot = clients.first_open()
        cg = self._cg
        open_s = slot.send_s + cg if slot is not None else math.inf
        live = self._live
        events = 0
        # A worker told "no more slots" ends the closed loop's sending, but others' sends may
        # still be on their way (with fewer requests than workers, all of them are).
        while clients.sending or live or clients.sends_due:
            events += 1
            if not events % PROGRESS_EVERY and progress is not None:
                c = self._collector
                progress(Progress(self.now_s, c.completed, c.failed))
            if heap[0][0] <= open_s:
                now, _, kind, obj = pop(heap)
                if now > clients.deadline_s:
                    break
                self.now_s = now
                if kind == STEP:
                    self._step_end(obj, now)  # type: ignore[arg-type]
                elif kind == DELIVER:
                    self._deliver(obj, now)  # type: ignore[arg-type]
                elif kind == RELEASE:
                    self._release(obj, now)  # type: ignore[arg-type]
                elif kind == SEND:
                    clients.sends_due -= 1
                    self._arrive(obj, now)  # type: ignore[arg-type]
                else:
                    self._timer(kind, obj, now)
                continue
            if open_s > clients.deadline_s:
                break
            self.now_s = open_s
            assert slot is not None
            self._arrive(slot, open_s)
            slot = clients.next_open(open_s)
            open_s = slot.send_s + cg if slot is not None else math.inf
        return events

    def _timer(self, kind: int, obj: object, now_s: float) -> None:
        gateway = self.gateway
        if kind == TICK:
            if obj != self._tick_gen:
                return  # superseded by a wake-up
            self._tick_due = now_s + gateway.tick(now_s)
            self._push(self._tick_due, TICK, self._tick_gen)
        elif kind == SCRAPE:
            gateway.scrape(now_s)
            if self.autoscale is not None:
                self.autoscale.scraped_s = now_s
            self._push(now_s + self._scrape_s, SCRAPE, None)
        elif kind == AUTOSCALE:
            assert self.autoscale is not None
            self.fleet.scale(self.autoscale.decide(gateway, now_s), now_s)
            self._push(now_s + self.spec.autoscale_interval_s, AUTOSCALE, None)
        elif kind == READY:
            self.fleet.ready(obj)  # type: ignore[arg-type]
        elif kind == POOLED:
            self.fleet.pooled(obj, now_s)  # type: ignore[arg-type]
        elif kind == COLD_TIMEOUT:
            gateway.cold_timeout(obj, now_s)  # type: ignore[arg-type]
        elif kind == KV_EVENTS:
            assert self.kv_feed is not None
            self.kv_feed.deliver(obj)  # type: ignore[arg-type]
        elif kind == REACH:
            self._api.reached(obj, now_s)  # type: ignore[arg-type]
        elif kind == INTAKE:
            self._api.start(obj, now_s)  # type: ignore[arg-type]
