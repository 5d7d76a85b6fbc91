"""Oscillation on a flat load, ruled out: a replica count found too few for a load is not gone
back to while the load is as high.

Utilisation is not linear in the load near a replica's capacity (latency, and with it the
requests in flight, climbs steeply), so a rule that removes a replica when the ones left would
stay "under the line" by linear scaling removes one too many, finds the rest over the line and
adds it back, again and again, on a load that never changed. The memory notes the arrival rate
at which each count had to be left upward (with every replica ready: during a cold start the
backlog says nothing about the count), and floors a step down above every count noted at a
rate the fleet sees again (within `margin`). It forgets nothing by time: a count too few for
a load stays too few for it; a lower load lifts the floor.
"""

from __future__ import annotations

from servepilot.core.errors import ConfigError
from servepilot.scaling.snapshot import FleetSnapshot, ScaleDecision, ScaleReason

RATE_WINDOW_S = 60
"""The seconds of arrivals whose mean is "the load"."""
RECENT_WINDOW_S = 10
RAMP_RATIO = 1.25
"""A load is steady when its last RECENT_WINDOW_S seconds' mean lies within RAMP_RATIO of its
minute's, over a whole minute of arrivals. Only a steady load is noted: on a ramp (or just
after a start, the minute not yet full) the minute's mean still holds the lighter load before
it, and a count noted "too few" at that would stay too few for that lighter load after the
ramp: the fleet would never come back down. The 10 s mean's noise on a flat load (at 15 req/s,
a 25% excess is three standard deviations) leaves flat loads noted."""


class TooFewMemory:
    """Counts left upward, each with the lowest arrival rate (req/s) it was too few for."""

    def __init__(self, margin: float = 0.9) -> None:
        if not 0.0 < margin <= 1.0:
            raise ConfigError(f"the too-few memory's margin must be in (0, 1], got {margin}")
        self.margin = margin
        self._too_few: dict[int, float] = {}

    @staticmethod
    def rate(snapshot: FleetSnapshot) -> float:
        return _mean(snapshot, RATE_WINDOW_S)

    def note(self, snapshot: FleetSnapshot, wanted: int) -> None:
        """The policy answered `wanted` for this snapshot: a step up from a fleet with every
        replica ready, on a steady load, marks its count too few for that load."""
        if not _steady(snapshot):
            return
        have, rate = snapshot.provisioned, self.rate(snapshot)
        # No arrivals counted (a snapshot without them): nothing to tie the count to.
        if wanted > have and not snapshot.starting and rate > 0:
            self._too_few[have] = min(self._too_few.get(have, rate), rate)

    def floor(self, snapshot: FleetSnapshot) -> int:
        """The fewest replicas a step down may leave: one above every count too few for a load
        at least `margin` of today's."""
        rate = self.rate(snapshot)
        counts = [n for n, at in self._too_few.items() if rate >= self.margin * at]
        return max(counts) + 1 if counts else 0

    def steady(self, snapshot: FleetSnapshot, decision: ScaleDecision) -> ScaleDecision:
        """`decision` with a step down floored, and noted: what a policy answers."""
        have, want = snapshot.provisioned, decision.replicas
        floor = self.floor(snapshot)
        if want < have and want < floor:
            kept = min(have, floor)
            detail = (
                f"{decision.detail}; {floor - 1} were too few for {self.rate(snapshot):.1f} req/s"
            )
            decision = ScaleDecision(kept, ScaleReason.TOO_FEW, detail)
        self.note(snapshot, decision.replicas)
        return decision


def _mean(snapshot: FleetSnapshot, window_s: int) -> float:
    recent = snapshot.arrivals_per_s[-window_s:]
    return sum(recent) / len(recent) if recent else 0.0


def _steady(snapshot: FleetSnapshot) -> bool:
    if len(snapshot.arrivals_per_s) < RATE_WINDOW_S:
        return False
    rate, recent = _mean(snapshot, RATE_WINDOW_S), _mean(snapshot, RECENT_WINDOW_S)
    return rate / RAMP_RATIO <= recent <= rate * RAMP_RATIO
