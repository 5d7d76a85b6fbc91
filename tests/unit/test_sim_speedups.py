"""The fleet simulator's speed-ups change nothing: each is pinned to what it replaced.

- routing and admission hot paths (`sample_two`, LeastLoad's inlined key, the admission
  controller's prebuilt decisions, RateMeter's inlined decay, the queue's kept depth);
- the simulator's own shortcuts (records built through slot descriptors, inlined uniform hops);
- the compiled core (core/accel.py's group SIM; the loader's own tests: test_accel.py): when a
  build is present, a fleet run gives the same results compiled and in Python.
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest

from servepilot.core.config import AdmissionConfig, ProtectionConfig
from servepilot.routing import LeastLoad
from servepilot.routing.admission import (
    Admission,
    AdmissionController,
    AdmissionQueue,
    AdmissionSnapshot,
    AdmitKind,
    RateMeter,
    Reason,
)
from servepilot.routing.admission.limits import DegradationLevel
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.least_load import load_key, sample_two
from servepilot.sim import SimRequest, StepResult
from servepilot.sim.fleet.liveview import REQUEST_VIEW_SETTERS
from servepilot.sim.fleet.members import FleetRequest
from servepilot.sim.fleet.network import Delay, HopSampler
from servepilot.sim.fleet.requests import new_request_view

ROOT = Path(__file__).resolve().parents[2]


class _OwnBelow(random.Random):
    """Overrides random() only: random.Random then draws through _randbelow_without_getrandbits."""

    def random(self) -> float:
        return super().random()


@pytest.mark.parametrize("rng_type", [random.Random, _OwnBelow])
def test_sample_two_draws_what_random_sample_draws(rng_type: type[random.Random]) -> None:
    for n in [*range(2, 70), 80, 127, 128, 129, 1000]:
        population = list(range(n))
        for seed in range(8):
            ours, theirs = rng_type(seed), rng_type(seed)
            for _ in range(25):
                assert list(sample_two(ours, population)) == theirs.sample(population, 2)
            assert ours.random() == theirs.random()  # the streams stayed in step


def _reference_choose(rng: random.Random, candidates: list[ReplicaView]) -> str:
    """LeastLoad.choose as it was: random.sample and load_key tuples."""
    if len(candidates) == 1:
        return candidates[0].replica_id
    first, second = rng.sample(candidates, 2)
    return (second if load_key(second) < load_key(first) else first).replica_id


def test_least_load_chooses_as_before() -> None:
    pick = random.Random(7)
    kv_values = [0.0, 0.5, 0.5, 0.9, math.nan]
    for seed in range(40):
        policy, reference = LeastLoad(random.Random(seed)), random.Random(seed)
        for _ in range(50):
            views = [
                ReplicaView(
                    f"r{i}",
                    pick.randrange(4),
                    num_requests_waiting=pick.randrange(3),
                    kv_cache_usage=pick.choice(kv_values),
                )
                for i in range(pick.randint(1, 30))
            ]
            chosen = policy.choose(RequestView("m"), views)
            assert chosen == _reference_choose(reference, views)


def test_admission_decisions_are_the_ones_it_built_before() -> None:
    controller = AdmissionController(AdmissionConfig(), ProtectionConfig())
    rng = random.Random(0)
    for priority in (0, 1, 2):
        for level in DegradationLevel:
            snapshot = AdmissionSnapshot((0, 0, 0), 5, 2, 10.0, level, 0.0)
            decision = controller.admit(priority, snapshot, 0.0, rng)
            if decision.kind is AdmitKind.DISPATCH:
                capped = priority == 1 and level >= DegradationLevel.CAP_TOKENS
                cap = ProtectionConfig().degraded_max_tokens if capped else None
                assert decision == Admission(AdmitKind.DISPATCH, Reason.FREE_SLOT, 0, cap)


class _ReferenceMeter(RateMeter):
    """RateMeter's record and rate_per_s as they were, through _decay."""

    def record(self, now_s: float) -> None:
        if self._start_s is None:
            self._start_s = self._last_s = now_s
            return
        now_s = max(now_s, self._last_s)
        self._weight = self._weight * self._decay(now_s - self._last_s) + 1.0
        self._last_s = now_s

    def rate_per_s(self, now_s: float) -> float:
        if self._start_s is None:
            return 0.0
        now_s = max(now_s, self._last_s)
        span_s = now_s - self._start_s
        if span_s <= 0 or self._weight == 0.0:
            return 0.0
        weight = self._weight * self._decay(now_s - self._last_s)
        window_s = -self._tau_s * math.expm1(-span_s / self._tau_s)
        return weight / window_s


def test_rate_meter_gives_the_same_floats_as_before() -> None:
    rng = random.Random(3)
    ours, reference = RateMeter(2.5), _ReferenceMeter(2.5)
    now = 0.0
    for _ in range(5000):
        now += rng.expovariate(100.0) if rng.random() < 0.95 else -0.01  # a clock step back
        if rng.random() < 0.5:
            ours.record(now)
            reference.record(now)
        assert ours.rate_per_s(now) == reference.rate_per_s(now)


def test_admission_queue_depth_is_kept_in_step() -> None:
    rng = random.Random(5)
    queue: AdmissionQueue[int] = AdmissionQueue(10.0, (100.0, 500.0, 2000.0))
    tickets = []
    now = 0.0
    for item in range(4000):
        now += 0.001
        action = rng.random()
        if action < 0.5:
            tickets.append(queue.push(item, rng.randrange(3), now))
        elif action < 0.7 and tickets:
            queue.remove(tickets.pop(rng.randrange(len(tickets))))
        elif action < 0.95:
            queue.pop(now)
        else:
            queue.expired(now)
        assert len(queue) == queue.depth() == sum(queue.depth_by_class())


def test_views_built_through_slots_equal_the_constructors() -> None:
    args = ("m", 400, 100, (1, 2, 3), "s1", 2, 1.25)
    built = new_request_view(*args)
    assert built == RequestView(*args) and repr(built) == repr(RequestView(*args))
    assert len(REQUEST_VIEW_SETTERS) == len(RequestView.__dataclass_fields__)


@pytest.mark.parametrize("cls", [SimRequest, FleetRequest])
def test_written_out_inits_set_every_field_as_the_dataclass_would(cls: type[SimRequest]) -> None:
    request = cls(3, 100, 20, 1.5, 7, 64, 2)
    given = dict(
        request_id=3, prompt_tokens=100, output_tokens=20, arrival_s=1.5, prefix_group=7,
        prefix_tokens=64, priority=2,
    )  # fmt: skip
    for spec in dataclasses.fields(cls):
        default = spec.default if spec.default is not dataclasses.MISSING else None
        assert getattr(request, spec.name) == given.get(spec.name, default), spec.name
    assert cls(3, 100, 20, 1.5).prefix_group is None  # the defaults of the init fields
    values = [0.5, 1.5, 2, 3, 4, 5, 6, 7, 8.5, (9,), (request,), (11,), (12.5,)]
    step = StepResult(*values)  # type: ignore[arg-type]
    assert [getattr(step, f.name) for f in dataclasses.fields(StepResult)] == values


def test_hops_draw_what_random_uniform_draws() -> None:
    ours = HopSampler(Delay(0.0075, 0.015), random.Random(9))
    reference = random.Random(9)
    for _ in range(1000):
        assert ours.draw() == reference.uniform(0.0075, 0.015)
