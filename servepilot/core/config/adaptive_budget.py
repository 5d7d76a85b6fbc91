"""fleet.yaml's `autoscale.adaptive_budget` section: seed 003's adaptive batch thresholds, as
the gateway's per-replica admission budget moved with the measured arrival rate.

The seed's example (at peak, QPS > 100, small batches of 8; at low load, QPS < 20, large
batches of 32): above 100 requests/s, 8 requests in flight per replica; below 20, 32. The
defaults are those numbers; the section is off unless `enabled`. vLLM reads its batch limit
(max_num_seqs, max_num_active_seqs) once at start, so what moves is the gateway's budget: what
it lets reach each engine's batch (docs/autoscale.md, "Adaptive budgets")."""

from __future__ import annotations

import enum

from pydantic import Field, model_validator

from servepilot.core.config.section import Section as _Section


class RateBasis(enum.Enum):
    FLEET = "fleet"
    """The requests per second reaching the gateway (the fleet's QPS)."""
    REPLICA = "replica"
    """The same, divided by the replicas ready."""


class AdaptiveBudgetConfig(_Section):
    enabled: bool = False
    """Move each replica's admission budget with the arrival rate, every autoscale tick
    (needs autoscale.enabled: the autoscaler applies it; min_replicas = max_replicas keeps
    the fleet's size fixed)."""

    rate: RateBasis = RateBasis.FLEET
    """`fleet`: the thresholds are in requests/s reaching the gateway; `replica`: per ready
    replica."""

    window_s: int = Field(default=30, ge=1, le=600)
    """The arrival rate is the mean of this many last whole seconds."""

    low_rps: float = Field(default=20.0, gt=0)
    """Below this rate (requests/s): the low band, `low_budget`."""

    peak_rps: float = Field(default=100.0, gt=0)
    """Above this rate (requests/s): the peak band, `peak_budget`."""

    low_budget: int = Field(default=32, ge=1)
    """Requests in flight per replica in the low band (large batches while the load is low)."""

    peak_budget: int = Field(default=8, ge=1)
    """Requests in flight per replica in the peak band (small batches at the peak)."""

    middle_budget: int | None = Field(default=None, ge=1)
    """Requests in flight per replica between the lines; None: halfway between
    low_budget and peak_budget, rounded."""

    hysteresis: float = Field(default=0.1, ge=0, lt=0.5)
    """A line is crossed once the rate is past it by this share (0.1: the peak band is
    entered above 110 req/s and left below 90), so noise near a line does not flip the
    budget back and forth."""

    @model_validator(mode="after")
    def _lines_in_order(self) -> AdaptiveBudgetConfig:
        if self.low_rps >= self.peak_rps:
            raise ValueError(
                f"low_rps ({self.low_rps:g}) must be below peak_rps ({self.peak_rps:g})"
            )
        return self

    @property
    def middle(self) -> int:
        """The budget between the lines."""
        if self.middle_budget is not None:
            return self.middle_budget
        return round((self.low_budget + self.peak_budget) / 2)
