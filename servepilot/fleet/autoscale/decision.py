"""What one autoscaler tick decided, as logged, exported and shown by `status`."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.scaling.adaptive_budget import BudgetDecision
from servepilot.scaling.snapshot import ScaleReason
from servepilot.scaling.warm_pool import PoolCounts, PoolPlan


@dataclass(frozen=True, slots=True)
class Decision:
    """One tick's answer, as logged, exported and shown by `status`."""

    at_s: float
    """Unix time."""
    current: int
    """Replicas ready or starting when it was taken."""
    desired: int
    reason: ScaleReason
    detail: str
    pool: str = ""
    """The warm pool, where there is one: replicas held, and what this tick does with it."""
    note: str = ""
    """What the controller holds back, and why (cold starts after failures)."""
    budget: BudgetDecision | None = None
    """The adaptive budget this tick applied (autoscale.adaptive_budget); None: off."""

    @property
    def direction(self) -> str:
        if self.desired == self.current:
            return "hold"
        return "up" if self.desired > self.current else "down"

    def line(self) -> str:
        change = (
            f"{self.current} replicas" if self.direction == "hold"
            else f"{self.current} -> {self.desired} replicas"
        )  # fmt: skip
        pool = f"; warm pool: {self.pool}" if self.pool else ""
        note = f"; {self.note}" if self.note else ""
        b = self.budget
        budget = f"; budget {b.budget} per replica ({b.detail})" if b is not None else ""
        return f"autoscale: {change} ({self.reason.value}: {self.detail}){pool}{budget}{note}"


def pool_text(pool_target: int, counts: PoolCounts, plan: PoolPlan) -> str:
    """`Decision.pool`: empty without a pool, or anything in or on its way to one."""
    if not (pool_target or counts.asleep or counts.refilling):
        return ""
    text = f"{counts.asleep} of {pool_target} held"
    if counts.refilling:
        text += f", {counts.refilling} on the way"
    return text if plan.idle else f"{text}; {plan.describe()}"
