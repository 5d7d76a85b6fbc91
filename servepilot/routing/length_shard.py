"""Length sharding: short and long prompts on separate replica groups, with load compensation."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

from mypy_extensions import mypyc_attr

from servepilot.core.config import RoutingConfig
from servepilot.routing.base import ReplicaView, RequestView, RoutingPolicy
from servepilot.routing.bounded_load import replica_load
from servepilot.routing.least_load import LeastLoad

SHORT = "short"
LONG = "long"
GROUPS = (SHORT, LONG)


def compensation_share(
    home_utilisation: float, other_utilisation: float, max_share: float
) -> float:
    """Share of the home group's traffic to move to the other group.

    The difference of the groups' mean utilisations, capped at `max_share`: a small imbalance
    moves little, and no imbalance, however large, moves more than the cap (the groups exist
    to keep long prefills away from short requests, so compensation must stay marginal).
    """
    return max(0.0, min(max_share, home_utilisation - other_utilisation))


def utilisation(views: Sequence[ReplicaView]) -> float:
    """Mean over the replicas of (in flight + queued) / concurrency budget."""
    return sum(replica_load(view) / max(1, view.capacity) for view in views) / len(views)


@mypyc_attr(allow_interpreted_subclasses=True)
class LengthShard:
    """Static sharding by prompt length, then dynamic compensation by live load.

    Phase 1: a prompt of at least `length_boundary_tokens` (estimated) goes to the long group,
    any other to the short group. Phase 2: when that home group's mean utilisation is above
    the other group's, a random share of its requests (`compensation_share`, at most
    `compensation_max_share`) goes to the other group instead. Both directions are allowed, as
    in the seed design: an idle short group may absorb a little of a long burst, and the cap
    bounds what that costs the short requests. A home group with no candidate (none routable,
    or every one at its concurrency budget) sends everything to the other group, which is not
    counted as compensation: a free slot is used rather than left idle while requests queue.

    Groups: a replica labelled `short` or `long` (`ReplicaView.group`) is in that group; any
    other is placed the first time it is seen, in the group further below its target size
    (long: `long_group_share` of the known replicas, at least one and leaving at least one
    short when two or more are known), and stays there: candidates come and go as replicas
    fill up, and reshuffling would throw away the prefix caches each group has built.

    Lending: a group that has had no prompts of its own for `group_idle_s` lends its replicas
    to the other group (the home group's policy then chooses among all candidates). Without
    it, a workload with no long prompts would leave the long group idle; with it, the groups
    separate again as soon as a long prompt arrives.

    Within a group, `inner` policies (one per group, built by the factory, so each keeps its
    own state) choose; power-of-two least load by default.
    """

    name = "length_shard"

    def __init__(
        self,
        config: RoutingConfig,
        rng: random.Random,
        inner: Callable[[], RoutingPolicy] | None = None,
    ) -> None:
        self._boundary_tokens = config.length_boundary_tokens
        self._long_share = config.long_group_share
        self._max_share = config.compensation_max_share
        self._chars_per_token = config.chars_per_token
        self._rng = rng
        build = inner if inner is not None else lambda: LeastLoad(rng)
        self._inner: dict[str, RoutingPolicy] = {group: build() for group in GROUPS}
        self.uses_prefix: bool = any(policy.uses_prefix for policy in self._inner.values())
        self._members: dict[str, str] = {}
        self._routed = dict.fromkeys(GROUPS, 0)
        self._compensated = 0
        self._lent = 0
        self._idle_s = config.group_idle_s
        self._last_seen_s = dict.fromkeys(GROUPS, -math.inf)

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        by_group = self._split(candidates)
        home = LONG if self._prompt_tokens(request) >= self._boundary_tokens else SHORT
        other = LONG if home == SHORT else SHORT
        self._last_seen_s[home] = max(self._last_seen_s[home], request.arrival_s)
        if request.arrival_s - self._last_seen_s[other] > self._idle_s and by_group[other]:
            self._routed[home] += 1
            self._lent += 1
            return self._inner[home].choose(request, candidates)
        group = self._target_group(home, by_group)
        self._routed[group] += 1
        return self._inner[group].choose(request, by_group[group])

    def forget(self, replica_id: str) -> None:
        self._members.pop(replica_id, None)
        for policy in self._inner.values():
            policy.forget(replica_id)

    def stats(self) -> Mapping[str, float]:
        merged: dict[str, float] = {
            "shard_short": float(self._routed[SHORT]),
            "shard_long": float(self._routed[LONG]),
            "shard_compensated": float(self._compensated),
            "shard_lent": float(self._lent),
        }
        for policy in self._inner.values():
            for key, value in policy.stats().items():
                merged[key] = merged.get(key, 0.0) + value
        return merged

    def group_of(self, replica_id: str) -> str | None:
        """The group the replica is in, or None if it has not been seen (or was forgotten)."""
        return self._members.get(replica_id)

    def _prompt_tokens(self, request: RequestView) -> float:
        if request.prompt_tokens > 0:
            return float(request.prompt_tokens)
        return request.prompt_chars / self._chars_per_token

    def _target_group(self, home: str, by_group: Mapping[str, list[ReplicaView]]) -> str:
        other = LONG if home == SHORT else SHORT
        if not by_group[home]:
            return other
        if not by_group[other]:
            return home
        share = compensation_share(
            utilisation(by_group[home]), utilisation(by_group[other]), self._max_share
        )
        if share > 0.0 and self._rng.random() < share:
            self._compensated += 1
            return other
        return home

    def _split(self, candidates: Sequence[ReplicaView]) -> dict[str, list[ReplicaView]]:
        members = self._members
        unplaced: list[str] = []
        for view in candidates:
            label = view.group.lower() if view.group else None
            if label in GROUPS:
                members[view.replica_id] = label
            elif view.replica_id not in members:
                unplaced.append(view.replica_id)
        # Sorted, so placement does not depend on the order the snapshot lists replicas in.
        for replica_id in sorted(unplaced):
            members[replica_id] = self._placement()
        by_group: dict[str, list[ReplicaView]] = {SHORT: [], LONG: []}
        for view in candidates:
            by_group[members[view.replica_id]].append(view)
        return by_group

    def _placement(self) -> str:
        """The group a newly seen, unlabelled replica joins."""
        known = len(self._members) + 1
        if known < 2:
            return SHORT
        target_long = min(known - 1, max(1, round(known * self._long_share)))
        long_count = sum(1 for group in self._members.values() if group == LONG)
        short_count = len(self._members) - long_count
        long_deficit = target_long - long_count
        short_deficit = (known - target_long) - short_count
        return LONG if long_deficit > short_deficit else SHORT
