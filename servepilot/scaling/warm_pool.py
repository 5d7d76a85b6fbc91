"""How a replica count becomes actions when some replicas sleep (vLLM's sleep mode: the
process and its compiled graphs kept, the GPU memory freed).

A policy answers how many replicas should serve or be on their way (`ScaleDecision.replicas`).
With a warm pool of `pool_target` sleeping replicas behind them, the cheapest way there is:

- up: wake sleeping replicas first (seconds), start cold only what the pool cannot give;
- down: put replicas to sleep while the pool is below its target, stop the rest;
- the pool itself: refill it by starting replicas that go to sleep once ready (their cold
  start is paid ahead of the ramp, off the critical path), and stop sleepers beyond it.

Pure: the fleet's controller and the simulator run the same function on their own counts.
"""

from __future__ import annotations

from dataclasses import dataclass

WAKE_S = 0.8
"""vLLM's wake_up of Llama-3.1-8B on an H200, measured: 0.78-0.81 s over three cycles
(benchmarks/gpu_runs/2026-12-04-llama-8b-sleep/sleep-cycles.json). What a policy plans a
wake at where none was measured (`up`'s controller; `sim` unless told)."""


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """One moment of a fleet with a warm pool."""

    active: int
    """Replicas serving or on their way to serve (ready, starting cold, or waking)."""
    asleep: int
    """Replicas asleep, ready to be woken."""
    refilling: int = 0
    """Replicas starting cold that will go to sleep once ready (the pool's refill)."""

    def __post_init__(self) -> None:
        for name in ("active", "asleep", "refilling"):
            if getattr(self, name) < 0:
                raise ValueError(f"PoolCounts.{name} must be >= 0")


@dataclass(frozen=True, slots=True)
class PoolPlan:
    """What to do this tick; at most one of (wake, start) and (sleep, stop) is non-zero in
    each direction, and never both directions at once."""

    wake: int = 0
    """Sleeping replicas to wake into rotation."""
    start: int = 0
    """Replicas to start cold into rotation."""
    sleep: int = 0
    """Serving replicas to drain and put to sleep (into the pool)."""
    stop: int = 0
    """Serving replicas to drain and stop."""
    refill: int = 0
    """Replicas to start cold and put to sleep once ready."""
    drop_asleep: int = 0
    """Sleeping replicas to stop (the pool is above its target)."""

    @property
    def idle(self) -> bool:
        return not (self.wake or self.start or self.sleep or self.stop or self.refill
                    or self.drop_asleep)  # fmt: skip

    def describe(self) -> str:
        parts = [f"{name} {n}" for name, n in (
            ("wake", self.wake), ("start", self.start), ("sleep", self.sleep),
            ("stop", self.stop), ("refill", self.refill), ("drop asleep", self.drop_asleep),
        ) if n]  # fmt: skip
        return ", ".join(parts) or "nothing"


def plan_pool(
    counts: PoolCounts, desired_active: int, pool_target: int, *, cold_refill: bool = True
) -> PoolPlan:
    """The actions that take `counts` to `desired_active` replicas serving (or on their way)
    with `pool_target` asleep or refilling behind them. `pool_target` 0: no pool (plain cold
    starts and stops; replicas already asleep are stopped).

    `cold_refill` False: the pool is refilled only by replicas given back (slept instead of
    stopped), never by a cold start. A cold refill holds a GPU for a cold start and a sleep
    after every wake, as much as the wake saved; refilled by sleeps, the pool costs GPU
    time only for the sleep, and a second rise before a fall finds it emptier."""
    if desired_active < 0 or pool_target < 0:
        raise ValueError("desired_active and pool_target must be >= 0")
    wake = start = sleep = stop = 0
    asleep = counts.asleep
    if desired_active > counts.active:
        wake = min(asleep, desired_active - counts.active)
        start = desired_active - counts.active - wake
        asleep -= wake
    elif desired_active < counts.active:
        excess = counts.active - desired_active
        # Replicas already refilling will fill the pool: only the gap left is slept.
        sleep = min(excess, max(0, pool_target - asleep - counts.refilling))
        stop = excess - sleep
        asleep += sleep
    pooled = asleep + counts.refilling
    refill = max(0, pool_target - pooled) if cold_refill else 0
    drop_asleep = min(asleep, max(0, pooled - pool_target))
    return PoolPlan(wake, start, sleep, stop, refill, drop_asleep)
